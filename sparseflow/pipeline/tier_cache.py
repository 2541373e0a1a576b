"""Which rows of a table sit in its fast tier, and the moves that put a batch's rows there.

A tiered table keeps a home for every logical row in a slow tier and a few fast slots that
cache some of them: the device slots over host homes (``rows_on="device"`` with
``host_vocabulary_size > 0``), or the host slots over disk homes (``ssd_vocabulary_size > 0``).
Per batch, in the input pipeline, :meth:`TierCache.place` maps the batch's unique rows to fast
slots: rows already resident keep their slot; missing rows take free slots, then the slots no
batch in flight needs, least recently used (``policy="lru"``) or least frequently used
(``"lfu"``) first. The moves are queued as :class:`SwapPlan`s; the training step pops every
queued plan (:meth:`TierCache.pop_plans`) and executes them — every swap out (fast → home)
before every swap in (home → fast) — before its gather.

Executing plans of batches still in the prefetch buffer early is safe: a plan only moves rows
out of slots no batch in flight uses and into slots it took from no one in flight. A batch's
slots stay pinned from placement until its step has gathered them and, for a training batch,
updated them: the gather marks the batch released (:meth:`TierCache.release`), which unpins
an evaluation batch's slots at once (nothing will write them) and leaves a training batch's
pinned until :meth:`TierCache.settle` (the sparse optimizer, after its update). So no plan
moves a training batch's row between its gather and its update, however many lookups of the
table one session run holds. A training batch whose update never runs (its lookup fetched
without the train op) stays pinned until the next update settles every released batch; the
full-tier error says so.

A row whose key was evicted may still sit in a slot; when the key processor hands the row to a
new key, :meth:`TierCache.forget` frees its slot and bumps the row's generation, so that a
queued write-back of the old contents (a plan made before the reuse) is dropped instead of
overwriting the new row's initial values at home.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

import numpy as np

POLICIES = ("lru", "lfu")


class CacheFullError(RuntimeError):
    """The fast tier cannot hold the unique rows of the batches in flight."""


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
        self.pins = np.zeros(self.slots, np.int32)           # batches in flight per slot
        self._pinned: dict[int, np.ndarray] = {}             # seq -> slots it pinned
        self._training: dict[int, bool] = {}                 # seq -> a training batch?
        self._released: list[int] = []                       # gathered, not yet settled
        self._clock = 0
        self._n_free = self.slots
        self._plans: deque[SwapPlan] = deque()
        self.lock = threading.Lock()
        self.swapped_in = 0
        self.swapped_out = 0
        self.hits = 0

    def place(self, rows: np.ndarray, seq: int, training: bool = True) -> np.ndarray:
        """Fast slots for a batch's unique rows, queueing the moves that make them resident.

        Args:
          rows: int32 ``[U]`` distinct logical rows, -1 for keys without a row.
          seq: the batch's sequence number (its slots stay pinned until it is settled).
          training: a training batch (its slots stay pinned after its gather, until its
            update has run) or an evaluation one (unpinned at its gather).

        Returns:
          int32 ``[U]`` slots (-1 where ``rows`` is -1).

        Raises:
          CacheFullError: the rows missing from the fast tier exceed its free slots plus the
            slots no batch in flight needs; nothing changed.
        """
        rows = np.asarray(rows, np.int32)
        with self.lock:
            valid = rows >= 0
            slots = np.full(rows.shape[0], -1, np.int32)
            slots[valid] = self.slot_of[rows[valid]]
            missing = np.flatnonzero(valid & (slots < 0))
            resident = slots[valid & (slots >= 0)]
            n = missing.shape[0]
            # Scanning for free slots costs O(slots): only while some are free (until the
            # tier first fills, and after forget / reset).
            take_free = (np.flatnonzero(self.row_in < 0)[:n] if n and self._n_free
                         else np.zeros(0, np.int64))
            n_victims = n - take_free.shape[0]
            victims = np.zeros(0, np.int32)
            if n_victims:
                candidates = self._candidates(resident)
                if candidates.shape[0] < n_victims:
                    raise CacheFullError(
                        f"Table `{self.table_name}`: a batch needs {n} rows moved into the "
                        f"fast tier, but only {take_free.shape[0] + candidates.shape[0]} of "
                        f"its {self.slots} slots ({self.size_hint}) are free or unused by the "
                        f"{len(self._pinned)} batches in flight. Raise the fast tier's size "
                        f"to at least the unique keys of the batches in flight, or prefetch "
                        f"fewer batches. (A training batch stays in flight from its placement "
                        f"until its sparse optimizer's update: fetching a training lookup "
                        f"without the train op keeps its batch pinned until the next update; "
                        f"{len(self._released)} gathered batches await theirs.)")
                victims = self._victims(candidates, n_victims)
            out_rows = self.row_in[victims].copy()
            self.slot_of[out_rows] = -1
            new_slots = np.concatenate([take_free.astype(np.int32), victims])
            self._n_free -= take_free.shape[0]
            in_rows = rows[missing]
            self.slot_of[in_rows] = new_slots
            self.row_in[new_slots] = in_rows
            slots[missing] = new_slots
            used = slots[valid]
            self.pins[used] += 1
            self._pinned[int(seq)] = used
            self._training[int(seq)] = bool(training)
            self.last_used[used] = self._clock
            self._clock += 1
            if self.uses is not None:
                self.uses[rows[valid]] += 1
            self.hits += int(resident.shape[0])
            self.swapped_in += int(n)
            self.swapped_out += int(victims.shape[0])
            if n:
                self._plans.append(SwapPlan(out_slots=victims, out_rows=out_rows,
                                            out_gens=self.gen[out_rows].copy(),
                                            in_slots=new_slots, in_rows=in_rows))
            return slots

    def _candidates(self, resident: np.ndarray) -> np.ndarray:
        """Slots that may be emptied: holding a row, pinned by no batch, not one of the
        batch's own resident rows."""
        eligible = (self.pins == 0) & (self.row_in >= 0)
        eligible[resident] = False
        return np.flatnonzero(eligible)

    def _victims(self, candidates: np.ndarray, n: int) -> np.ndarray:
        """The ``n`` candidates to evict: oldest (LRU) or least placed (LFU) first, ties by
        slot. A partition (O(slots)), then only those sorted."""
        if self.uses is not None:
            score = self.uses[self.row_in[candidates]]
        else:
            score = self.last_used[candidates]
        if n < candidates.shape[0]:
            pick = np.argpartition(score, n - 1)[:n]
        else:
            pick = np.arange(candidates.shape[0])
        pick = pick[np.lexsort((candidates[pick], score[pick]))]
        return candidates[pick].astype(np.int32)

    def release(self, seq: int) -> None:
        """Marks batch ``seq`` gathered: an evaluation batch's slots are unpinned now, a
        training batch's at :meth:`settle`, after its update."""
        with self.lock:
            seq = int(seq)
            if seq not in self._pinned:
                return
            if self._training.get(seq, True):
                self._released.append(seq)
            else:
                self._unpin(seq)

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
        return plans

    def forget(self, rows: np.ndarray) -> np.ndarray:
        """Drops ``rows`` from the cache (rows handed to new keys): frees their slots and
        bumps their generation, so a queued write-back of their old contents is dropped.
        The caller holds :attr:`lock`.

        Returns:
          the int32 slots freed.
        """
        rows = np.asarray(rows, np.int32)
        slots = self.slot_of[rows]
        slots = slots[slots >= 0]
        self.slot_of[rows] = -1
        self.row_in[slots] = -1
        self._n_free += slots.shape[0]
        self.gen[rows] += 1
        if self.uses is not None:
            self.uses[rows] = 0
        return slots

    def reset(self) -> None:
        """Empties the cache (a restore rewrote every home): every slot free, no plan, no
        batch pinned; every row's generation bumped."""
        with self.lock:
            self.slot_of[:] = -1
            self.row_in[:] = -1
            self._n_free = self.slots
            self.pins[:] = 0
            self.gen += 1
            if self.uses is not None:
                self.uses[:] = 0
            self._pinned.clear()
            self._training.clear()
            self._released.clear()
            self._plans.clear()

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
