"""The key processor: one per table, it owns key → row.

Called from the ``tf.data`` pipeline (through ``tf.numpy_function``) once per table per batch,
after one :func:`dedup_batch` call has deduplicated every table's keys of the batch
(:meth:`KeyProcessor.process_unique`; :meth:`KeyProcessor.process` dedups one table itself).
It counts keys for admission, refreshes timestamps and maps keys to rows, allocating and
initialising rows for newly admitted keys. A lock serialises calls for
one table (``num_parallel_calls`` may run several batches at once); the numba kernels release
the GIL so that other tables and TensorFlow proceed meanwhile.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np

from sparseflow.ops import key_kernels as kk
from sparseflow.ops.count_min import CountMinSketch
from sparseflow.ops.hash_index import HashIndex
from sparseflow.ops.table_registry import DRAIN
from sparseflow.pipeline.catch_up_lock import CatchUpLock
from sparseflow.pipeline.read_ahead import BatchEffects, ReadAheadJournal, RolledBack


INT64_MAX = 2**63 - 1

# Batches read after a batch that was never read, before it counts as abandoned: far more
# than any prefetch depth plus parallel calls keeps in flight.
ABANDONED_AFTER = 4096


class TableFullError(RuntimeError):
    """A table has no free row for a newly admitted key."""


class SendCountOverflowError(ValueError):
    """More unique keys in one batch than the static ``send_count`` allows."""


@dataclass
class BatchResult:
    """What one call produces: the row of each unique key and the restore vector."""

    rows: np.ndarray      # int32[U] (or [padded_length] with trailing -1 under static shapes)
    restore: np.ndarray   # int32[N]
    n_new: int            # rows allocated by this call
    seq: int = -1         # the batch's sequence number; -1 when in-flight tracking is off


@dataclass(frozen=True)
class EvictionResult:
    """What one eviction did."""

    keys_removed: int
    keys_left: int
    rows_free: int        # rows a new key can take now
    rows_waiting: int     # freed rows held until the batches in flight are consumed


class BatchScratch:
    """A batch's working memory for the key kernels: the dedup scratch (``keys``, ``tags``,
    ``generation``) and the batch's key arrays (:meth:`joined_keys`, :meth:`dedup_outputs`).

    One is lent to one call at a time by :func:`borrow_scratch` and reused by the next, so
    its pages stay resident and the dedup scratch stays in the cache. Shared by every table
    of a batch: one L2-sized buffer stays warm instead of one per table evicting each other
    (dedup was 2x slower with 26 per-table buffers).
    """

    def __init__(self):
        self.keys = np.zeros(0, np.int64)
        self.tags = np.zeros(0, np.int64)
        self.generation = 0
        self._batch = np.zeros(0, np.int64)   # joined keys, uniq, weight, restore (int32)

    def fit(self, n_keys: int) -> "BatchScratch":
        """Grows the dedup scratch to deduplicate ``n_keys`` keys of one table
        (``key_kernels.dedup``); returns self."""
        size = kk.scratch_slots(n_keys)
        if self.tags.shape[0] < size:
            self.keys = np.zeros(size, np.int64)
            self.tags = np.zeros(size, np.int64)
            self.generation = 0
        return self

    def next_generation(self, count: int = 1) -> int:
        """The first of ``count`` fresh stamps (the next ``count`` values from it)."""
        if self.generation + count >= 2**31:  # stamps wrap: clear once every 2^31 stamps
            self.tags[:] = 0
            self.generation = 0
        first = self.generation + 1
        self.generation += count
        return first

    def _parts(self, n: int) -> list[np.ndarray]:
        """The batch buffer as four int64 ``[n]`` parts, grown (never shrunk) to hold them."""
        if self._batch.shape[0] < 4 * n:
            self._batch = np.zeros(4 * max(n, self._batch.shape[0] // 2), np.int64)
        m = self._batch.shape[0] // 4
        return [self._batch[i * m:i * m + n] for i in range(4)]

    def joined_keys(self, parts: list[np.ndarray]) -> np.ndarray:
        """``parts`` (int32 or int64 arrays) flattened and joined as int64 in this scratch;
        valid while it is borrowed and until the next :meth:`joined_keys`."""
        n = sum(p.size for p in parts)
        out = self._parts(n)[0]
        if parts:
            np.concatenate([p.reshape(-1) for p in parts], out=out, casting="same_kind")
        return out

    def dedup_outputs(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(uniq int64[n], weight int64[n], restore int32[n])`` in this scratch, apart from
        the joined keys of the same ``n``."""
        _, uniq, weight, restore = self._parts(n)
        return uniq, weight, restore.view(np.int32)[:n]


class _ScratchPool:
    """Scratches lent to one call at a time, most recently returned first.

    Not per Python thread: TensorFlow runs a numpy function on its own threads and may drop
    the thread's Python state after each call, which freed per-thread scratch, so every batch
    allocated its buffers afresh and paid a page fault for each of their pages (about 250 a
    26-table batch through a YAML job's reader). The pool holds as many scratches as calls ever
    ran at once (a parallel map's).
    """

    def __init__(self):
        self._free: list[BatchScratch] = []
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def borrow(self):
        with self._lock:
            scratch = self._free.pop() if self._free else BatchScratch()
        try:
            yield scratch
        finally:
            with self._lock:
                self._free.append(scratch)


_POOL = _ScratchPool()


def borrow_scratch():
    """A context manager lending a :class:`BatchScratch` to the calling code until it exits;
    what the scratch holds must not be used after that."""
    return _POOL.borrow()


def dedup_keys(keys: np.ndarray, seg_ends: np.ndarray, seg_coefs: np.ndarray):
    """A batch's distinct keys in first-occurrence order, with weighted counts.

    Args:
      keys: int64 ``[n]``, the keys of every segment concatenated.
      seg_ends: int64 ``[S]``, exclusive end of each segment in ``keys``.
      seg_coefs: int32 ``[S]``, what one occurrence in each segment counts (a feature's
        ``faae_coefficient``; a received key's occurrences in multi-worker training).

    Returns:
      ``(uniq, restore, weight, U)``: int64 ``uniq[:U]`` the distinct keys, int32 ``restore[n]``
      with ``keys[i] == uniq[restore[i]]``, int64 ``weight[:U]`` each key's weighted count.
    """
    batch = dedup_batch(keys, seg_ends, seg_coefs, np.array([seg_ends.shape[0]], np.int64))
    return batch.uniq, batch.restore, batch.weight, int(batch.n_unique[0])


@dataclass
class BatchKeys:
    """Every table's keys of one batch deduplicated by one kernel call (:func:`dedup_batch`).

    Table ``t``'s keys are ``keys[starts[t]:ends[t]]``; its unique keys and their weighted
    counts ``uniq`` / ``weight[starts[t]:starts[t] + n_unique[t]]``; ``restore[starts[t]:
    ends[t]]`` indexes them. ``restore`` is every table's restore vector, concatenated in
    table order.
    """

    uniq: np.ndarray       # int64[N]
    restore: np.ndarray    # int32[N]
    weight: np.ndarray     # int64[N]
    n_unique: np.ndarray   # int64[T]
    starts: np.ndarray     # int64[T]
    ends: np.ndarray       # int64[T]

    def table(self, t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """Table ``t``'s ``(uniq, restore, weight, U)``, views, as :func:`dedup_keys` gives."""
        a, b = int(self.starts[t]), int(self.ends[t])
        return self.uniq[a:b], self.restore[a:b], self.weight[a:b], int(self.n_unique[t])


def dedup_batch(keys: np.ndarray, seg_ends: np.ndarray, seg_coefs: np.ndarray,
                table_segs: np.ndarray, scratch: BatchScratch | None = None) -> BatchKeys:
    """Every table's keys of a batch deduplicated in one kernel call.

    Args:
      keys: int64 ``[N]``, every table's segments concatenated, in table order.
      seg_ends: int64 ``[S]``, exclusive end of each segment in ``keys``.
      seg_coefs: int32 ``[S]``, each segment's count per occurrence.
      table_segs: int64 ``[T]``, exclusive end of each table's segments in ``seg_ends``.
      scratch: a borrowed :class:`BatchScratch`: the kernel works in it and the result's
        ``uniq``, ``weight`` and ``restore`` live in it (valid while it is borrowed; ``keys``
        may be its :meth:`~BatchScratch.joined_keys`). None: a scratch is borrowed for the
        call and the result gets arrays of its own.

    Returns:
      A :class:`BatchKeys`.
    """
    keys = np.ascontiguousarray(keys, np.int64)
    n = keys.shape[0]
    if scratch is None:
        with borrow_scratch() as lent:
            return _dedup_into(keys, seg_ends, seg_coefs, table_segs, lent,
                               np.empty(n, np.int64), np.empty(n, np.int64),
                               np.empty(n, np.int32))
    return _dedup_into(keys, seg_ends, seg_coefs, table_segs, scratch,
                       *scratch.dedup_outputs(n))


def _dedup_into(keys, seg_ends, seg_coefs, table_segs, scratch: BatchScratch, uniq, weight,
                restore) -> BatchKeys:
    """:func:`dedup_batch`'s kernel call, writing ``uniq``, ``weight`` and ``restore``."""
    starts, table_ends, longest = kk.table_bounds(seg_ends, table_segs)
    n_unique = np.zeros(table_segs.shape[0], np.int64)
    scratch.fit(longest)
    kk.dedup_tables(keys, seg_ends, seg_coefs, table_segs, scratch.keys, scratch.tags,
                    scratch.next_generation(table_segs.shape[0]), uniq, restore, weight,
                    n_unique)
    return BatchKeys(uniq, restore, weight, n_unique, starts, table_ends)


def process_tables(processors: list, keys: np.ndarray, seg_ends: np.ndarray,
                   seg_coefs: np.ndarray, table_segs: np.ndarray, train: bool,
                   timestamp: int | None = None, pad_tos: list | None = None,
                   scratch: BatchScratch | None = None):
    """A batch's keys of every table through their key processors: one :func:`dedup_batch`
    call, then each table's :meth:`KeyProcessor.process_unique`, in table order.

    Args:
      processors: the tables' ``KeyProcessor``s, in table order.
      keys, seg_ends, seg_coefs, table_segs: as :func:`dedup_batch`.
      train, timestamp: as :meth:`KeyProcessor.process`.
      pad_tos: per table, ``pad_to`` (static shapes), or None.
      scratch: as :func:`dedup_batch` (then the results' ``restore`` live in it too).

    Returns:
      ``(BatchKeys, [BatchResult per table])``.

    Raises:
      As :meth:`KeyProcessor.process`.
    """
    batch = dedup_batch(keys, seg_ends, seg_coefs, table_segs, scratch)
    pad_tos = pad_tos or [None] * len(processors)
    return batch, [p.process_unique(*batch.table(t), train, timestamp, pad_tos[t])
                   for t, p in enumerate(processors)]


class KeyProcessor:
    """Maps raw int64 keys of one table to row offsets.

    Args:
      table_name: for error messages.
      row_limit: rows the table can hold (capacity).
      access_threshold: admission threshold; None or < 0 turns admission off.
      init_rows: callback ``(rows int32[k], keys int64[k]) -> None`` that initialises freshly
        allocated rows (weights from the table's initializer, slots reset) before any batch
        that uses them is released.
      capacity_hint: initial index size, in keys.
      size_hint: how to fix a full table, for the error message.
      sketch: count not-yet-admitted keys in this fixed-memory count-min sketch instead of the
        index (used while the access threshold is > 0); it is cleared at every eviction.
      tracked_rows: dynamic expansion: rows the per-row arrays (last-seen times, checkpoint
        marks) cover at first; they grow (doubling) as rows past them are handed out, so a
        ``row_limit`` of 2^31 - 1 costs nothing up front. None: ``row_limit`` rows, fixed.
      prefetch_rows: tiered tables: callback ``(rows int32[U], seq, train) -> None`` that
        places a batch's unique logical rows in the fast tier early if room allows (its step
        claims its fast slots at its gather, ``embed/row_tiers.py``); in-flight tracking is
        then always on.
    """

    def __init__(self, table_name: str, row_limit: int, access_threshold: int | None,
                 init_rows: Callable[[np.ndarray, np.ndarray], None],
                 capacity_hint: int = 1024, size_hint: str = "device_vocabulary_size",
                 sketch: CountMinSketch | None = None, *, tracked_rows: int | None = None,
                 prefetch_rows: Callable[[np.ndarray, int, bool], None] | None = None):
        self.table_name = table_name
        self.threshold = -1 if access_threshold is None else int(access_threshold)
        self.sketch = sketch
        self._init_rows = init_rows
        self.size_hint = size_hint   # the argument a full-table error tells users to raise
        self.index = HashIndex(max(1, min(capacity_hint, row_limit)))
        self.state = np.zeros(kk.STATE_LEN, np.int64)
        self.state[kk.STATE_ROW_LIMIT] = row_limit
        self.free_rows = np.zeros(0, np.int32)
        tracked = row_limit if tracked_rows is None else max(1, min(tracked_rows, row_limit))
        self.last_seen = np.zeros(tracked, np.int64)
        self.clock = np.int64(-(2**63))
        # Releases the model's gather made and updates its optimizer reported while the lock
        # was held (by the input pipeline's thread, processing the next batch), in the order
        # they came: applied by the next holder (CatchUpLock). Entries: (method, arguments).
        self._released: collections.deque = collections.deque()
        # What compiled ops did (ops/batch_ops.py: batches released, updates run), queued in
        # the table's registry entry; applied like the deferred releases. (entry, whether a
        # release drains) once attached.
        self._kernel_events = None
        self.lock = CatchUpLock(self.has_deferred_releases, self._apply_released)
        # In-flight tracking (on for a table that trains: the table turns it on): every call
        # gets a sequence number; the model's gather releases it. Rows freed by an eviction
        # wait in the quarantine until no batch processed before that eviction is still
        # outstanding, and what training batches not yet released changed is kept in the
        # journal, so that a checkpoint leaves it out (read_ahead.py).
        self._prefetch_rows = prefetch_rows
        self.track_in_flight = prefetch_rows is not None
        self._next_seq = 0
        self._max_released = -1
        self._outstanding: set[int] = set()
        self._quarantine: list[tuple[int, np.ndarray]] = []   # (first seq after, rows)
        self.journal = ReadAheadJournal()
        self.evictions = 0
        self.keys_evicted = 0
        # Since the last checkpoint: rows a training batch touched (their weights, slots,
        # counts or last-seen may have changed) and keys evicted (tombstones).
        self.dirty = np.zeros(tracked, np.bool_)
        self.tombstones: list[np.ndarray] = []

    # -- per batch -------------------------------------------------------------------------

    def process(self, keys: np.ndarray, seg_ends: np.ndarray, seg_coefs: np.ndarray,
                train: bool, timestamp: int | None = None,
                pad_to: int | None = None) -> BatchResult:
        """Processes one batch of keys for this table.

        Args:
          keys: int64[N], the batch's keys of every feature spec of this table, concatenated.
          seg_ends: int64[S], exclusive end of each spec's keys in ``keys``.
          seg_coefs: int32[S], each spec's ``faae_coefficient``.
          train: training channel (counts, admits, allocates) or eval channel (read-only).
          timestamp: the batch's timestamp (training channel), or None.
          pad_to: static shapes: pad ``rows`` with -1 to this length.

        Returns:
          A :class:`BatchResult`.

        Raises:
          TableFullError: admitted keys need more rows than are free; nothing was changed.
          SendCountOverflowError: more unique keys than ``pad_to``.
        """
        # Dedup reads only the batch and a scratch borrowed for the call: outside the table
        # lock, so that batches in flight under a parallel map overlap it.
        return self.process_unique(*dedup_keys(keys, seg_ends, seg_coefs), train, timestamp,
                                   pad_to)

    def process_unique(self, uniq: np.ndarray, restore: np.ndarray, weight: np.ndarray,
                       n_unique: int, train: bool, timestamp: int | None = None,
                       pad_to: int | None = None) -> BatchResult:
        """:meth:`process` of a batch already deduplicated (:func:`dedup_keys`, or one
        table of :func:`dedup_batch`).

        Args:
          uniq, restore, weight, n_unique: as :func:`dedup_keys` returns them.
          train, timestamp, pad_to: as :meth:`process`.

        Returns:
          A :class:`BatchResult` (its ``restore`` is ``restore``).

        Raises:
          As :meth:`process`.
        """
        out_len = n_unique if pad_to is None else pad_to
        if n_unique > out_len:
            raise SendCountOverflowError(
                f"Table `{self.table_name}`: a batch has {n_unique} unique keys, more than the "
                f"{pad_to} rows that the send_count of its lookups allow (their sum). Set "
                f"`send_count` so that the sum over the table's lookups is >= {n_unique}, or "
                f"use init(use_dynamic=True).")
        rows = np.full(out_len, -1, np.int32)
        new_pos = np.empty(n_unique, np.int32)
        seq = -1
        record = train and self.track_in_flight
        has_timestamp = train and timestamp is not None
        ts = np.int64(timestamp) if has_timestamp else np.int64(0)
        before = np.empty(n_unique if record and has_timestamp else 0, np.int64)
        with self.lock:
            sketch_undo = None
            from_sketch = train and self.sketch is not None and self.threshold > 0
            if from_sketch:
                n_new, sketch_undo = self._assign_with_sketch(uniq, weight, n_unique, rows,
                                                              new_pos, record)
                self.cover_rows(int(self.state[kk.STATE_NEXT_ROW]))
                if before.shape[0]:
                    before[:] = self.last_seen[np.maximum(rows[:n_unique], 0)]
                kk.after_assign(rows, new_pos, n_unique, n_new, self.last_seen, ts,
                                has_timestamp, self.dirty)
            else:
                if train:
                    # The kernel writes the last-seen and marks of the rows it allocates.
                    self.cover_rows(int(self.state[kk.STATE_NEXT_ROW]) + n_unique)
                # With admission off every key in the index owns a row: the index never
                # needs room for more keys than the table has rows.
                max_keys = -1 if self.threshold >= 0 else self.row_limit
                room = self.index.room
                while True:
                    self.state[kk.STATE_INDEX_SIZE] = self.index.size
                    n_new = kk.assign_batch(
                        self.index.keys, self.index.rows, self.index.counts, uniq, weight,
                        n_unique, train, self.threshold, self.free_rows, self.state, rows,
                        new_pos, self.last_seen, ts, has_timestamp, self.dirty, before,
                        room, max_keys)
                    if n_new != kk.NEEDS_INDEX_ROOM:
                        break
                    # Only the training channel inserts, so only it ever grows the index.
                    self.index.reserve(n_unique, None if max_keys < 0 else max_keys)
                    # An index at its largest size takes the keys past its load limit.
                    room = self.index.room if self.index.room > room else INT64_MAX
                if n_new < 0:   # the kernel found too few free rows; nothing changed
                    raise self._full_error(-1 - n_new)
            self.index.size = int(self.state[kk.STATE_INDEX_SIZE])
            if not train and len(self.journal):
                # Keys only batches read ahead admitted read as unknown, as from a
                # checkpoint: evaluation does not depend on how far the pipeline has read.
                hidden = self.journal.hidden_keys()
                if hidden.shape[0]:
                    rows[:n_unique][np.isin(uniq[:n_unique], hidden)] = -1
            if record:
                effects = self._effects(uniq, weight, n_unique, rows, new_pos, n_new,
                                        from_sketch, sketch_undo, timestamp, before)
            if n_new:
                positions = new_pos[:n_new]
                self._init_rows(rows[positions], uniq[positions])
            if has_timestamp and ts > self.clock:
                self.clock = ts
            if self.track_in_flight:
                seq = self._next_seq
                self._next_seq += 1
                self._outstanding.add(seq)
                if record:
                    effects.seq = seq
                    self.journal.record(effects)
            if self._prefetch_rows is not None:
                # Never raises nor waits for room: the step claims the fast slots it needs.
                self._prefetch_rows(rows[:n_unique], seq, train)
        return BatchResult(rows=rows, restore=restore, n_new=int(n_new), seq=seq)

    # -- eviction --------------------------------------------------------------------------

    def consume(self, seq: int) -> None:
        """Marks batch ``seq`` read by the model for checkpoints only (the read-ahead journal
        forgets it: a checkpoint now keeps what it changed), while it stays in flight for
        eviction: rows evicted meanwhile wait in the quarantine until :meth:`release`.
        For a batch whose update runs after it was read (a multi-rank TF2 step's, released
        once its update has run)."""
        if seq < 0:
            return
        with self.lock:
            self.journal.consumed(int(seq))

    def release(self, seq: int, drain: bool = True) -> None:
        """Marks batch ``seq`` read by the model.

        Args:
          seq: the batch's sequence number (-1: untracked, ignored).
          drain: also free quarantined rows no batch in flight still needs. A lookup whose
            gradient an optimizer applies passes False: the rows must stay out of use until
            that update has run (:meth:`drain`, called by the optimizer after it).
        """
        if seq < 0:
            return
        # A numpy-function gather calls this (a compiled one queues its releases in the
        # registry, applied the same way); the input pipeline's thread holds the lock while it
        # processes the next batch of this table. Waiting for it put that processing on the
        # step's critical path (0.3 ms per 26-table step, BENCHMARKS.md): the release is
        # left to the lock's next holder instead, which applies it before anything else.
        if not self.lock.acquire_now():
            self._released.append((self._release, (int(seq), bool(drain))))
            return
        try:
            self._release(int(seq), drain)
        finally:
            self.lock.release()

    def _release(self, seq: int, drain: bool) -> None:
        self._outstanding.discard(seq)
        self.journal.consumed(seq)
        self._max_released = max(self._max_released, seq)
        # A batch this far behind the newest one read was abandoned (an iterator
        # re-initialized with batches still in its prefetch buffer, a stopped run): its
        # counts stay, as if it had been read.
        stale = [s for s in self._outstanding if s < self._max_released - ABANDONED_AFTER]
        for s in stale:
            self._outstanding.discard(s)
            self.journal.consumed(s)
        if drain:
            self._drain_quarantine()

    def take_kernel_events(self, entry, drain: Callable[[], bool]) -> None:
        """Applies, from now on, what compiled ops queue in ``entry`` (a ``TableEntry``), at
        the next lock entry: released batches, as deferred releases (``drain()`` says whether
        each frees quarantined rows, as :meth:`release`'s ``drain``), and updates, as
        :meth:`updated` (the ops mark the rows themselves in :attr:`dirty`, which the entry
        points at and which therefore changes only in place). Idempotent."""
        with self.lock:
            self._kernel_events = (entry, drain)
            entry.publish_marks(self.dirty)

    def has_deferred_releases(self) -> bool:
        """Whether releases or compiled ops' events wait to be applied (by the lock's next
        holder)."""
        return bool(self._released) or (self._kernel_events is not None
                                         and self._kernel_events[0].has_events())

    def _apply_released(self) -> None:
        """Applies the releases deferred while another thread held the lock and what
        compiled ops queued (the caller holds it)."""
        while self._released:
            method, args = self._released.popleft()
            method(*args)
        if self._kernel_events is None:
            return
        entry, drain = self._kernel_events
        events, newest_unqueued, drain_unqueued = entry.take_events()
        if not (events.shape[0] or newest_unqueued >= 0 or drain_unqueued):
            return
        drains = bool(drain())
        # In queue order: a DRAIN frees rows only as far as the batches released before it
        # allow (a batch released after it may still wait for its own update).
        for event in events.tolist():
            if event == DRAIN:
                self._drain_quarantine()
            else:
                self._release(event, drains)
        # What a full queue could not hold came after what it held, in an order now lost:
        # the drain first, while those batches still count as in flight (it frees less).
        if drain_unqueued:
            self._drain_quarantine()
        if newest_unqueued >= 0:
            # Every batch up to that one counts as read (gathers run in batch order but for
            # a parallel map's reordering).
            warnings.warn(f"Table `{self.table_name}`: compiled gathers released more "
                          f"batches than the event queue holds before its key processor ran; "
                          f"batches up to {newest_unqueued} count as read.", RuntimeWarning,
                          stacklevel=2)
            for seq in sorted(s for s in self._outstanding if s <= newest_unqueued):
                self._release(seq, drains)

    def drain(self) -> None:
        """Frees quarantined rows that no batch in flight still needs (after an update)."""
        with self.lock:
            self._drain_quarantine()

    def updated(self, rows: np.ndarray) -> None:
        """An optimizer changed ``rows`` (int32, -1 skipped): marks them changed for the next
        incremental checkpoint and frees quarantined rows no batch in flight still needs.

        Like :meth:`release`, it does not wait while another thread holds the lock (the
        pipeline's, processing the next batch): the lock's next holder applies it first, in
        order with the releases (a checkpoint's marks therefore include it). A device
        table's update calls it at the end of the step. A table read by compiled gathers
        gets their releases through its registry queue: there it reports as a compiled
        update does, its marks set in place and its drain queued after those releases (its
        own batch's among them)."""
        if self._kernel_events is not None:
            kk.mark_rows(self.dirty, rows)   # a fixed-capacity table's marks never move
            self._kernel_events[0].queue_drain()
            return
        if not self.lock.acquire_now():
            # A copy: the caller's array may be a numpy function's view of a tensor that TF
            # frees once the function returns.
            self._released.append((self._updated, (np.array(rows, np.int32),)))
            return
        try:
            self._updated(rows)
        finally:
            self.lock.release()

    def _updated(self, rows: np.ndarray) -> None:
        kk.mark_rows(self.dirty, rows)
        if self._quarantine:
            self._drain_quarantine()

    def evict(self, eviction_threshold: int) -> EvictionResult:
        """Removes every key with ``clock - last_seen >= eviction_threshold``.

        Their rows wait until every batch processed before now has been consumed (a batch in a
        prefetch buffer still reads them), then return to the free list; a key that takes one
        later gets fresh initial values and reset slots.

        Args:
          eviction_threshold: in the timestamps' unit (seconds), >= 0.

        Returns:
          An :class:`EvictionResult`.
        """
        with self.lock:
            stale = kk.stale_keys(self.index.keys, self.index.rows, self.last_seen,
                                  self.clock, np.int64(eviction_threshold))
            freed = self.index.delete(stale)
            self.tombstones.append(stale[freed >= 0])
            self.journal.evicted(stale[freed >= 0])
            freed = freed[freed >= 0]
            self.state[kk.STATE_INDEX_SIZE] = self.index.size
            if freed.shape[0]:
                self._quarantine.append((self._next_seq, freed.astype(np.int32)))
                self._drain_quarantine()
            if self.sketch is not None:  # counting restarts: bounds the total between clears
                self.sketch.clear()
                self.journal.sketch_cleared()
            self.evictions += 1
            self.keys_evicted += int(freed.shape[0])
            return EvictionResult(keys_removed=int(freed.shape[0]), keys_left=self.size,
                                  rows_free=self.rows_free, rows_waiting=self.rows_waiting)

    def cover_rows(self, n: int) -> None:
        """Makes the per-row arrays (last-seen, checkpoint marks) cover rows ``[0, n)``,
        doubling them when they fall short (dynamic expansion only; a fixed table's cover all
        its rows from the start). The caller holds :attr:`lock`."""
        tracked = self.last_seen.shape[0]
        if n <= tracked or tracked >= self.row_limit:
            return
        size = min(max(n, 2 * tracked), self.row_limit)
        last_seen = np.zeros(size, np.int64)
        last_seen[:tracked] = self.last_seen
        dirty = np.zeros(size, np.bool_)
        dirty[:tracked] = self.dirty
        self.last_seen, self.dirty = last_seen, dirty
        if self._kernel_events is not None:
            self._kernel_events[0].publish_marks(dirty)

    def take_marks(self) -> np.ndarray:
        """The checkpoint marks so far (a copy), then none: a new window starts. In place:
        compiled updates write the array. The caller holds :attr:`lock`."""
        marks = self.dirty.copy()
        # Only what was copied is cleared: a row a compiled update marks meanwhile stays
        # marked for the next window.
        self.dirty[marks] = False
        return marks

    def mark_saved(self) -> None:
        """Starts a new incremental-checkpoint window: nothing is dirty, no tombstones."""
        self.dirty[:] = False
        self.tombstones = []

    def reset_in_flight(self) -> None:
        """Forgets batches in flight and quarantined rows (a restore replaces every row)."""
        self._released.clear()
        if self._kernel_events is not None:
            self._kernel_events[0].take_events()
        self._outstanding.clear()
        self._quarantine.clear()
        self.journal.clear()

    def consumed_state(self) -> RolledBack:
        """The key state (index entries, last-seen, clock, sketch) as after only the batches
        the model has consumed: copies, the effects of batches in flight (read ahead) left
        out (``read_ahead.py``). The caller holds :attr:`lock`."""
        keys, rows, counts = self.index.entries()
        return self.journal.rolled_back(keys, rows, counts, self.last_seen, self.clock,
                                        self.sketch)

    def in_flight_rows(self) -> np.ndarray:
        """int32 logical rows that training batches in flight hold. The caller holds
        :attr:`lock`."""
        return self.journal.in_flight_rows()

    def _effects(self, uniq, weight, n_unique, rows, new_pos, n_new, from_sketch,
                 sketch_undo, timestamp, last_seen_before) -> BatchEffects:
        """What the training batch being processed changes (``seq`` set by the caller);
        ``last_seen_before``: its rows' last-seen before the batch (empty without a
        timestamp)."""
        # Copies: the batch's arrays may live in a scratch the next batch reuses.
        keys = uniq[:n_unique].copy()
        # A view: the batch's own array, which nothing writes once its rows are assigned
        # (a tiered table's placement no longer overwrites it).
        logical = rows[:n_unique]
        counted = None
        if not from_sketch and self.threshold != 0:   # threshold 0 stops counting
            counted = weight[:n_unique].copy()
        before = last_seen_before if timestamp is not None else None
        return BatchEffects(seq=-1, keys=keys, rows=logical, counted=counted,
                            admitted=keys[new_pos[:n_new]], admitted_from_sketch=from_sketch,
                            sketch=sketch_undo, timestamp=timestamp, last_seen_before=before,
                            clock_before=np.int64(self.clock))

    def _drain_quarantine(self) -> None:
        oldest = min(self._outstanding) if self._outstanding else self._next_seq
        while self._quarantine and self._quarantine[0][0] <= oldest:
            _, rows = self._quarantine.pop(0)
            self._push_free(rows)

    def _push_free(self, rows: np.ndarray) -> None:
        top = int(self.state[kk.STATE_FREE_TOP])
        if self.free_rows.shape[0] < top + rows.shape[0]:
            grown = np.zeros(max(top + rows.shape[0], 2 * self.free_rows.shape[0]), np.int32)
            grown[:top] = self.free_rows[:top]
            self.free_rows = grown
        self.free_rows[top:top + rows.shape[0]] = rows
        self.state[kk.STATE_FREE_TOP] = top + rows.shape[0]

    @property
    def rows_waiting(self) -> int:
        """Evicted rows not yet reusable because batches from before the eviction are in flight."""
        with self.lock:
            return sum(rows.shape[0] for _, rows in self._quarantine)

    @property
    def batches_in_flight(self) -> int:
        """Batches processed whose rows the model has not gathered yet (tracking on only)."""
        with self.lock:
            return len(self._outstanding)

    def _assign_with_sketch(self, uniq, weight, n_unique, rows, new_pos, undoable):
        """Training-channel assignment when not-yet-admitted keys are counted in the sketch:
        keys in the index own rows; an absent key is admitted once its estimated count
        reaches the threshold, else only its count (in the sketch) grows. Returns the
        number of new rows and, if ``undoable``, the sketch update's ``SketchUndo``."""
        keys, weights = uniq[:n_unique], weight[:n_unique]
        found = self.index.lookup(keys)
        absent = np.flatnonzero(found < 0)
        rows[:n_unique] = found
        if absent.shape[0] == 0:
            return 0, None
        absent_keys, absent_weights = keys[absent], weights[absent]
        # Conservative update: after add, a key's estimate is its estimate now + its weight.
        admit = self.sketch.estimate(absent_keys) + absent_weights >= self.threshold
        n_admit = int(np.count_nonzero(admit))
        self._raise_if_full(n_admit)  # before the sketch or the index change
        undo = None
        if undoable:
            _, undo = self.sketch.add_undoable(absent_keys[~admit], absent_weights[~admit])
        else:
            self.sketch.add(absent_keys[~admit], absent_weights[~admit])
        self.index.reserve(n_admit)
        self.state[kk.STATE_INDEX_SIZE] = self.index.size
        if n_admit:
            admitted = absent[admit].astype(np.int32)
            sub_rows = np.empty(n_admit, np.int32)
            sub_new = np.empty(n_admit, np.int32)
            kk.assign_rows(self.index.keys, self.index.rows, self.index.counts,
                           keys[admitted], weights[admitted], n_admit, True, np.int64(-1),
                           self.free_rows, self.state, sub_rows, sub_new)
            rows[admitted] = sub_rows
            new_pos[:n_admit] = admitted
        return n_admit, undo

    def _raise_if_full(self, needed: int) -> None:
        if needed > self.rows_free:
            raise self._full_error(needed)

    def _full_error(self, needed: int) -> TableFullError:
        """The error of a batch that admits ``needed`` new keys into too few free rows."""
        available = self.rows_free
        limit = int(self.state[kk.STATE_ROW_LIMIT])
        waiting = (f" ({self.rows_waiting} evicted rows wait for the batches in flight to be "
                   f"consumed)" if self.rows_waiting else "")
        return TableFullError(
            f"Table `{self.table_name}` is full: it holds {self.size} keys in {limit} rows "
            f"and a batch admits {needed} new keys but only {available} rows are free"
            f"{waiting}. "
            f"Set `{self.size_hint}` to at least {limit - available + needed} (more to leave "
            f"room for growth), raise `access_threshold`, or enable eviction.")

    # -- statistics ------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Keys that own a row."""
        with self.lock:   # one view: a deferred release may move rows to the free list
            return int(self.state[kk.STATE_NEXT_ROW] - self.state[kk.STATE_FREE_TOP]
                       - self.rows_waiting)

    @property
    def keys_counted(self) -> int | None:
        """Keys counted for admission that own no row yet; None when a sketch counts them."""
        if self.sketch is not None:
            return None
        with self.lock:
            return self.index.size - self.size

    @property
    def rows_free(self) -> int:
        """Rows that a newly admitted key could take."""
        with self.lock:   # a deferred release may free evicted rows
            return int(self.state[kk.STATE_ROW_LIMIT] - self.state[kk.STATE_NEXT_ROW]
                       + self.state[kk.STATE_FREE_TOP])

    @property
    def rows_ever_used(self) -> int:
        """Rows ``[0, rows_ever_used)`` have been handed out at least once; the rest never."""
        return int(self.state[kk.STATE_NEXT_ROW])

    @property
    def tiered(self) -> bool:
        """Whether the table keeps a fast tier over homes (its steps claim fast slots)."""
        return self._prefetch_rows is not None

    @property
    def row_limit(self) -> int:
        """Rows the table can hold."""
        return int(self.state[kk.STATE_ROW_LIMIT])

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Rows of ``keys`` without counting or allocating (-1 for none)."""
        with self.lock:
            return self.index.lookup(keys)

    def admitted(self):
        """(keys int64, rows int32) of every key that owns a row, in index order."""
        with self.lock:
            keys, rows, _ = self.index.entries(admitted_only=True)
        return keys, rows
