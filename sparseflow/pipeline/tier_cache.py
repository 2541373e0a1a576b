"""Which rows of a table sit in its fast tier, and the moves that put a batch's rows there.

A tiered table keeps a home for every logical row in a slow tier and a few fast slots that
cache some of them: the device slots over host homes (``rows_on="device"`` with
``host_vocabulary_size > 0``), or the host slots over disk homes (``ssd_vocabulary_size > 0``).
A batch carries logical rows; its step maps them to fast slots (:meth:`TierCache.place`, at
the gather): rows already resident keep their slot; missing rows take free slots, then the
slots no batch needs, least recently used (``policy="lru"``) or least frequently used
(``"lfu"``) first. The moves are queued as :class:`SwapPlan`s; the training step pops every
queued plan (:meth:`TierCache.pop_plans`) and executes them — every swap out (fast → home)
before every swap in (home → fast) — before its gather.

Read-ahead: the input pipeline, which processes batches ahead of the step (``prefetch``, a
parallel map), makes the same choice for each batch early (:meth:`TierCache.prefetch`) when
the fast tier has room for it without moving rows another batch holds, so that the step
mostly finds its rows placed. Such a placement is only a hint: it holds its slots until the
batch's step claims them, or until a step that lacks room takes them back (the batch is then
placed again at its own step). So the fast tier needs room for the rows of the batches one
step gathers (Rec SDK sizes it for two consecutive batches), never for every batch the
pipeline reads ahead, and nothing waits for room: an evaluation iterator re-initialized with
batches still read ahead, or a session closed while the pipeline reads ahead, leaves nothing
that blocks.

Executing plans early is safe: a plan only moves rows out of slots no batch holds and into
slots it took from no one. A batch's slots stay pinned from its step's claim until its gather
(an evaluation batch: :meth:`TierCache.release`) or, for a training batch, until its update
(:meth:`TierCache.settle`, from the sparse optimizer). So no plan moves a training batch's row
between its gather and its update, however many lookups of the table one session run holds. A
training batch whose update never runs (its lookup fetched without the train op) stays pinned
until the next update settles every released batch; the full-tier error says so.

A row whose key was evicted may still sit in a slot; when the key processor hands the row to a
new key, :meth:`TierCache.forget` frees its slot and bumps the row's generation, so that a
queued write-back of the old contents (a plan made before the reuse) is dropped instead of
overwriting the new row's initial values at home.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from sparseflow.ops import lru_list, tier_kernels
from sparseflow.pipeline.catch_up_lock import CatchUpLock

POLICIES = ("lru", "lfu")
# A batch read ahead this many sequence numbers behind a claimed one was abandoned (its
# iterator re-initialized or its session closed): what the cache still keeps for it is dropped.
ABANDONED_AFTER = 4096
_NO_USES = np.zeros(0, np.int64)   # LRU scores need no use counts


class CacheFullError(RuntimeError):
    """The fast tier cannot hold the unique rows of the batches a step gathers (and those of
    gathered training batches waiting for their update)."""


@dataclass(frozen=True)
class SwapPlan:
    """The moves of one batch: rows ``out_rows`` leave slots ``out_slots`` (written back to
    their homes unless their generation changed since, see ``out_gens``), then rows
    ``in_rows`` enter slots ``in_slots``."""

    out_slots: np.ndarray   # int32
    out_rows: np.ndarray    # int32
    out_gens: np.ndarray    # int64: the rows' generation when the plan was made
    in_slots: np.ndarray    # int32
    in_rows: np.ndarray     # int32


class TierCache:
    """The residency of ``rows`` logical rows in ``slots`` fast slots.

    Args:
      table_name: for messages.
      slots: fast slots, >= 1.
      rows: logical rows (every row the table can hold).
      policy: "lru" (victims least recently used) or "lfu" (least frequently placed).
      size_hint: how the message of :class:`CacheFullError` names the fast tier's size, e.g.
        ``"device_vocabulary_size=1000 (host_vocabulary_size=9000)"``.
    """

    def __init__(self, table_name: str, slots: int, rows: int, policy: str = "lru",
                 size_hint: str | None = None):
        if policy not in POLICIES:
            raise ValueError(f"Argument `policy` must be one of {POLICIES}. Received: "
                             f"{policy!r}")
        self.table_name = table_name
        self.slots = int(slots)
        self.policy = policy
        self.size_hint = size_hint or f"{self.slots} slots"
        self.slot_of = np.full(int(rows), -1, np.int32)      # row -> slot, -1: at home
        self.gen = np.zeros(int(rows), np.int64)             # bumped when a row is reused
        self.uses = np.zeros(int(rows), np.int64) if policy == "lfu" else None
        self.row_in = np.full(self.slots, -1, np.int32)      # slot -> row, -1: free
        self.last_used = np.zeros(self.slots, np.int64)      # LRU clock per slot
        self.pins = np.zeros(self.slots, np.int32)           # batches holding each slot
        self._pinned: dict[int, np.ndarray] = {}             # seq -> slots its step claimed
        self._read_ahead: dict[int, np.ndarray] = {}         # seq -> slots placed early
        self._training: dict[int, bool] = {}                 # seq -> a training batch?
        self._released: list[int] = []                       # gathered, not yet settled
        self._clock = 0
        self._n_free = self.slots
        self._first_free = 0   # no slot below it is free
        # LRU: the slots holding a row, oldest stamp first (ops/lru_list.py); the victims
        # are the first unpinned ones. LFU scores change with every placement: it scans.
        self._lru = lru_list.empty(self.slots) if policy == "lru" else None
        self._plans: deque[SwapPlan] = deque()
        # Slots a queued plan moves a row into (not executed yet). Only a slot placed early
        # and taken back can be emptied again before its plan runs: its row never arrived,
        # so the queued move in is cancelled instead of writing the slot back.
        self._entering = np.zeros(self.slots, np.bool_)
        self._marks = np.zeros(self.slots, np.bool_)         # select_victims' scratch
        # Batches released while another thread held the lock (the pipeline's, placing a
        # batch early): applied by the lock's next holder.
        self._deferred: deque[int] = deque()
        self.lock = CatchUpLock(lambda: bool(self._deferred), self._apply_deferred)
        self.swapped_in = 0
        self.swapped_out = 0
        self.hits = 0

    def prefetch(self, rows: np.ndarray, seq: int, training: bool = True) -> None:
        """The input pipeline's early placement of a batch read ahead: its rows are moved
        into the fast tier now if there is room without moving rows that another batch holds
        (claimed or placed early); otherwise nothing happens and its step places it. Never
        raises for want of room.

        Args:
          rows: int32 ``[U]`` distinct logical rows, -1 for keys without a row.
          seq: the batch's sequence number.
          training: a training batch (its step keeps its slots pinned until its update) or an
            evaluation one.

        Raises:
          IndexError: a row past the table's logical rows; no row moved.
        """
        rows = np.asarray(rows, np.int32)
        with self.lock:
            seq = int(seq)
            self._training[seq] = bool(training)
            slots = self._assign(rows, take_back=False)
            if slots is not None:
                used = slots[rows >= 0]
                self.pins[used] += 1
                self._read_ahead[seq] = slots

    def place(self, rows: np.ndarray, seq: int, training: bool | None = None) -> np.ndarray:
        """The step's claim of a batch's fast slots (before its gather): the slots placed
        early, or slots chosen now, taking back slots placed early for other batches when
        the tier has no other room. The slots stay pinned until :meth:`release` (an
        evaluation batch) or :meth:`settle` after release (a training batch).

        Args:
          rows: int32 ``[U]`` distinct logical rows, -1 for keys without a row.
          seq: the batch's sequence number.
          training: a training batch or an evaluation one; None: as the pipeline said
            (:meth:`prefetch`), else training.

        Returns:
          int32 ``[U]`` slots (-1 where ``rows`` is -1).

        Raises:
          CacheFullError: the rows missing from the fast tier exceed its free slots plus the
            slots no claimed batch holds; no row moved.
          IndexError: a row past the table's logical rows; no row moved.
        """
        rows = np.asarray(rows, np.int32)
        with self.lock:
            seq = int(seq)
            if len(self._training) > 2 * ABANDONED_AFTER:
                self._drop_abandoned(seq - ABANDONED_AFTER)
            if training is None:
                training = self._training.get(seq, True)
            # Claimed already (another gather of the batch), or placed early: its rows sit
            # in their slots. (The batch's rows may be padded with -1 past the unique ones.)
            early = self._read_ahead.pop(seq, None)
            if seq in self._pinned or early is not None:
                slots, _, resident = self._find(rows)
                if seq in self._pinned:
                    return slots
                self.last_used[resident] = np.arange(self._clock,
                                                     self._clock + resident.shape[0])
                self._clock += resident.shape[0]
                if self._lru is not None:
                    lru_list.touch(*self._lru, resident)
                self._pinned[seq] = resident
            else:
                slots = self._assign(rows, take_back=True)
                self.pins[slots[rows >= 0]] += 1
                self._pinned[seq] = slots[slots >= 0]
            self._training[seq] = bool(training)
            return slots

    def _assign(self, rows: np.ndarray, take_back: bool) -> np.ndarray | None:
        """Slots for ``rows``, queueing the plan that moves the missing ones in; the caller
        pins them. Without room: None, or with ``take_back`` the slots placed early for
        other batches are taken back (furthest ahead first) and, if that is not enough,
        CacheFullError. The caller holds :attr:`lock`."""
        slots, missing, resident = self._find(rows)
        n, n_resident = missing.shape[0], resident.shape[0]
        take_free, first_free = self._free_slots(n)
        n_victims = n - take_free.shape[0]
        victims = np.zeros(0, np.int32)
        if n_victims:
            victims, eligible = self._victims(resident, n_victims)
            if eligible < n_victims:
                if not take_back:
                    return None
                victims, eligible = self._take_back(resident, n_victims)
            if eligible < n_victims:
                if n + n_resident > self.slots:   # no placement could hold the batch
                    need = (f"a batch has {n + n_resident} distinct rows ({n} of them not "
                            f"in the fast tier), more than its {self.slots} slots "
                            f"({self.size_hint})")
                else:
                    need = (f"a batch needs {n} rows moved into the fast tier, but only "
                            f"{take_free.shape[0] + eligible} of its {self.slots} slots "
                            f"({self.size_hint}) are free or unused by the "
                            f"{len(self._pinned)} batches in flight")
                raise CacheFullError(
                    f"Table `{self.table_name}`: {need}. Raise the fast tier's size "
                    f"to at least the unique keys of the batches one step reads (batches "
                    f"the pipeline reads ahead give their slots back). (A training batch "
                    f"stays in flight from its gather until its sparse optimizer's update: "
                    f"fetching a training lookup without the train op keeps its batch "
                    f"pinned until the next update; {len(self._released)} gathered batches "
                    f"await theirs.)")
        new_slots = np.concatenate([take_free, victims])
        out_rows = np.empty(victims.shape[0], np.int32)
        out_gens = np.empty(victims.shape[0], np.int64)
        in_rows = np.empty(n, np.int32)
        lfu = self.uses is not None
        tier_kernels.commit_slots(rows, slots, missing, victims, new_slots, self.slot_of,
                                  self.row_in, self.last_used, self._clock,
                                  self.uses if lfu else _NO_USES, lfu, self.gen, out_rows,
                                  out_gens, in_rows)
        self._clock += n + n_resident   # a tick per row placed
        if self._lru is not None:
            lru_list.touch(*self._lru, slots)
        self._n_free -= take_free.shape[0]
        self._first_free = first_free
        leaving = victims
        arriving = self._entering[victims]
        if arriving.any():   # rows that never arrived: no write-back, and no move in
            self._cancel_moves_in(victims[arriving])
            stay = ~arriving
            leaving, out_rows, out_gens = victims[stay], out_rows[stay], out_gens[stay]
        self.hits += n_resident
        self.swapped_in += n
        self.swapped_out += leaving.shape[0]
        if n:
            self._plans.append(SwapPlan(out_slots=leaving, out_rows=out_rows,
                                        out_gens=out_gens, in_slots=new_slots, in_rows=in_rows))
            self._entering[new_slots] = True
        return slots

    def _free_slots(self, n: int) -> tuple[np.ndarray, int]:
        """The ``n`` lowest free slots (fewer if fewer are free), scanning from the lowest
        that may be free, and the lowest that may be free once they are filled (the caller,
        holding :attr:`lock`, records it when it fills them)."""
        if not (n and self._n_free):
            return np.zeros(0, np.int32), self._first_free
        out = np.empty(min(n, self._n_free), np.int32)
        found, stop = tier_kernels.free_slots_from(self.row_in, self._first_free,
                                                   out.shape[0], out)
        return out[:found], int(stop)

    def _find(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(slots, missing, resident)`` of a batch's rows (:func:`tier_kernels.find_slots`):
        each row's slot (-1: none), the positions of the rows at home, the slots of the
        others, in batch order.

        Raises:
          IndexError: a row past the table's logical rows.
        """
        u = rows.shape[0]
        slots = np.empty(u, np.int32)
        missing = np.empty(u, np.int32)
        resident = np.empty(u, np.int32)
        n, n_resident, bad = tier_kernels.find_slots(rows, self.slot_of, slots, missing,
                                                     resident)
        if bad >= 0:
            self._raise_outside(rows, bad)
        return slots, missing[:n], resident[:n_resident]

    def _cancel_moves_in(self, slots: np.ndarray) -> None:
        """Drops the queued moves into ``slots`` (their rows, placed early for a batch whose
        placement was taken back, are wanted elsewhere first). The caller holds :attr:`lock`."""
        drop = np.zeros(self.slots, np.bool_)
        drop[slots] = True
        for i, plan in enumerate(self._plans):
            keep = ~drop[plan.in_slots]
            if not keep.all():
                self._plans[i] = SwapPlan(plan.out_slots, plan.out_rows, plan.out_gens,
                                          plan.in_slots[keep], plan.in_rows[keep])
        self._entering[slots] = False

    def _drop_abandoned(self, before: int) -> None:
        """Forgets batches read ahead with a sequence number below ``before`` that no step
        claimed (their early slots are unpinned). The caller holds :attr:`lock`."""
        for seq in [s for s in self._training if s < before and s not in self._pinned]:
            self._training.pop(seq)
            slots = self._read_ahead.pop(seq, None)
            if slots is not None:
                self.pins[slots[slots >= 0]] -= 1

    def _take_back(self, resident: np.ndarray, needed: int) -> tuple[np.ndarray, int]:
        """Unpins the slots placed early for other batches, the batch furthest ahead first,
        until ``needed`` slots may be emptied; returns :meth:`_victims` then. Those batches
        are placed again at their steps. The caller holds :attr:`lock`."""
        newest_claim = max(self._pinned, default=-1)
        # Batches read ahead furthest from the step first (an abandoned one, from an
        # iterator re-initialized since, is behind every claim: it goes early too).
        order = sorted(self._read_ahead, key=lambda s: -abs(s - newest_claim))
        # Counting only (the choice comes once), up to the slots needed.
        eligible = self._victims(resident, 0, needed)[1]
        for seq in order:
            if eligible >= needed:
                break
            slots = self._read_ahead.pop(seq)
            self.pins[slots[slots >= 0]] -= 1
            eligible = self._victims(resident, 0, needed)[1]
        return self._victims(resident, needed)

    def _victims(self, resident: np.ndarray, n: int,
                 enough: int = 0) -> tuple[np.ndarray, int]:
        """The ``n`` slots to empty first, and how many slots may be emptied: those
        holding a row, pinned by no batch and not among ``resident`` (the batch's own),
        counted up to ``max(n, enough)`` (exact below that). Oldest (LRU: a batch's rows
        in batch order) or least placed (LFU: ties by slot) first; fewer than ``n`` when
        fewer may be emptied. One kernel
        call: LRU walks its list from the oldest slot (``ops/lru_list.py``), LFU scans every
        slot (``ops/tier_kernels.py``)."""
        out = np.empty(n, np.int32)
        resident = resident.astype(np.int32, copy=False)
        try:
            if self._lru is not None:
                eligible = lru_list.victims(*self._lru, self.pins, self._marks, resident, n,
                                            enough, out)
                if eligible < 0:
                    raise RuntimeError(f"Table `{self.table_name}`: the fast tier's LRU list "
                                       f"is broken (a cycle); no row moved.")
            else:
                eligible = tier_kernels.select_victims(
                    self.pins, self.row_in, self.last_used, self.uses, True, resident, n, out,
                    self._marks)
        except BaseException:
            self._marks[:] = False   # a marked slot would never be a victim again
            raise
        return out[:min(n, eligible)], int(eligible)

    def release(self, seq: int) -> None:
        """Marks batch ``seq`` gathered: an evaluation batch's slots are unpinned now, a
        training batch's at :meth:`settle`, after its update.

        It runs between the step's gather and what reads the gathered rows, so it does not
        wait while the input pipeline's thread holds the lock (placing a batch early, ~0.1
        ms): the lock's next holder applies it first (a settle, a claim, a placement)."""
        if not self.lock.acquire_now():
            self._deferred.append(int(seq))
            return
        try:
            self._release(int(seq))
        finally:
            self.lock.release()

    def _release(self, seq: int) -> None:
        if seq not in self._pinned:
            return
        if self._training.get(seq, True):
            self._released.append(seq)
        else:
            self._unpin(seq)

    def _apply_deferred(self) -> None:
        """Applies the releases left for the lock's holder (the caller)."""
        while self._deferred:
            self._release(self._deferred.popleft())

    def settle(self) -> None:
        """Unpins the slots of every released batch (their updates have run)."""
        with self.lock:
            self._settle()

    def _settle(self) -> None:
        for seq in self._released:
            self._unpin(seq)
        self._released.clear()

    def _unpin(self, seq: int) -> None:
        used = self._pinned.pop(seq, None)
        self._training.pop(seq, None)
        if used is not None:
            self.pins[used] -= 1

    def pop_plans(self) -> list[SwapPlan]:
        """Every queued plan, oldest first, to execute in this order."""
        with self.lock:
            plans = list(self._plans)
            self._plans.clear()
            self._entering[:] = False   # the caller executes them before any later plan
        return plans

    def forget(self, rows: np.ndarray) -> np.ndarray:
        """Drops ``rows`` from the cache (rows handed to new keys): frees their slots and
        bumps their generation, so a queued write-back of their old contents is dropped.
        The caller holds :attr:`lock`.

        Returns:
          the int32 slots freed.

        Raises:
          IndexError: a row outside the table's logical rows; nothing changed.
        """
        rows = np.ascontiguousarray(rows, np.int32)
        bad = tier_kernels.first_outside(rows, self.slot_of.shape[0])
        if bad >= 0:
            self._raise_outside(rows, bad)
        freed = np.empty(rows.shape[0], np.int32)
        lfu = self.uses is not None
        n = tier_kernels.forget_rows(rows, self.slot_of, self.row_in, self.gen,
                                     self.uses if lfu else _NO_USES, lfu, freed)
        self._n_free += n
        if n:
            self._first_free = min(self._first_free, int(freed[:n].min()))
            if self._lru is not None:
                lru_list.unlink(*self._lru, freed[:n])
        return freed[:n]

    def _raise_outside(self, rows: np.ndarray, bad: int) -> None:
        raise IndexError(f"Table `{self.table_name}`: row {int(rows[bad])} is outside its "
                         f"{self.slot_of.shape[0]:,} logical rows (0 .. "
                         f"{self.slot_of.shape[0] - 1}); the fast tier is unchanged.")

    def reset(self) -> None:
        """Empties the cache (a restore rewrote every home): every slot free, no plan, no
        batch pinned or placed early; every row's generation bumped."""
        with self.lock:
            self.slot_of[:] = -1
            self.row_in[:] = -1
            self._n_free = self.slots
            self._first_free = 0
            if self._lru is not None:
                lru_list.clear(*self._lru)
            self.pins[:] = 0
            self.gen += 1
            if self.uses is not None:
                self.uses[:] = 0
            self._pinned.clear()
            self._read_ahead.clear()
            self._training.clear()
            self._released.clear()
            self._plans.clear()
            self._entering[:] = False

    def resident(self) -> tuple[np.ndarray, np.ndarray]:
        """(slots, rows) of every occupied slot. The caller holds :attr:`lock` and has
        executed every queued plan (else a slot may still hold its previous row)."""
        slots = np.flatnonzero(self.row_in >= 0).astype(np.int32)
        return slots, self.row_in[slots]

    @property
    def hit_rate(self) -> float:
        """Share of placed rows that were already resident."""
        total = self.hits + self.swapped_in
        return self.hits / total if total else 1.0

    def stats(self) -> dict:
        """``resident_rows``, ``hit_rate``, ``rows_swapped_in``, ``rows_swapped_out``."""
        with self.lock:
            return {"resident_rows": int(np.count_nonzero(self.row_in >= 0)),
                    "hit_rate": self.hit_rate, "rows_swapped_in": self.swapped_in,
                    "rows_swapped_out": self.swapped_out}
