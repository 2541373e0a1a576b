"""What the batches read ahead of the model did to a table's key state, so that a checkpoint
can leave it out.

The pipeline processes batches before the model consumes them (prefetch, parallel map): at
a checkpoint, the counts, admissions, last-seen times, table clock and sketch counters hold
the effects of batches the model has not trained on. A run restored from it reads those
batches again, and would count them twice. So the key processor records, per training
batch, what the batch changed (:class:`BatchEffects`) until the model has consumed it (the
batch's ``seq`` released), and :meth:`ReadAheadJournal.rolled_back` computes the key state as
if only consumed batches had been processed:

- counts: each key's count less what batches in flight added (counting commutes);
- admissions: a key that got its row in a batch in flight goes back to counted (or, counted
  in a sketch or seen only in flight, to not being in the index) — unless a consumed batch
  processed after it used the row (out-of-order processing: its update trained the row);
- last-seen times and the clock: every batch processed since the oldest one in flight is
  undone (the values it overwrote written back, newest first), then the consumed ones among
  them applied again (``max``), in order;
- sketch counters: likewise, with :meth:`CountMinSketch.undo` and ``add``.

The evaluation channel reads the keys admitted in flight as unknown (:meth:`hidden_keys`),
as it would read them from a checkpoint.

With a sequential map and prefetch (batches processed and consumed in order) every recorded
batch is in flight and the result is exactly the state after the consumed batches. Records
live while their batch is in flight, so memory is bounded by the read-ahead depth.

An eviction changes what the records refer to: it drops the evicted keys from them, and a
cleared sketch drops the sketch records (the clear wiped those counts already).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sparseflow.ops.count_min import CountMinSketch, SketchUndo
from sparseflow.ops.hash_index import COUNT_MAX, HashIndex


@dataclasses.dataclass
class BatchEffects:
    """What one training batch changed in a key processor.

    Attributes:
      seq: the batch's sequence number.
      keys: int64 ``[U]``, the batch's unique keys.
      rows: int32 ``[U]``, their logical rows after the batch (-1: no row).
      counted: int64 ``[U]``, what the batch added to each key's count in the index, or
        None (nothing: counting stopped, or keys counted in a sketch).
      admitted: int64, the keys that got a row in this batch.
      admitted_from_sketch: those keys were counted in the sketch (they leave the index on
        roll-back) rather than in the index (they stay, counted).
      sketch: the sketch update of the batch's not-admitted keys, or None.
      timestamp: the batch's timestamp, or None.
      last_seen_before: int64 ``[U]``, ``last_seen[rows]`` before the batch (rows >= 0 only
        meaningful); None without a timestamp.
      clock_before: the table clock before the batch.
      consumed: the model has read the batch.
    """

    seq: int
    keys: np.ndarray
    rows: np.ndarray
    counted: np.ndarray | None
    admitted: np.ndarray
    admitted_from_sketch: bool
    sketch: SketchUndo | None
    timestamp: int | None
    last_seen_before: np.ndarray | None
    clock_before: np.int64
    consumed: bool = False


@dataclasses.dataclass
class RolledBack:
    """A key processor's state as after the consumed batches only (copies, but for
    ``last_seen`` when nothing was in flight)."""

    keys: np.ndarray       # int64, every key in the index
    rows: np.ndarray       # int32, its row (-1: counted, not admitted)
    counts: np.ndarray     # int32
    last_seen: np.ndarray  # int64, by row
    clock: np.int64
    sketch: CountMinSketch | None


class ReadAheadJournal:
    """The :class:`BatchEffects` of every training batch processed since the oldest one the
    model has not consumed, in processing order. Not thread-safe: the key processor calls it
    under its lock."""

    def __init__(self):
        self._batches: list[BatchEffects] = []
        self._hidden: np.ndarray | None = None   # cache of hidden_keys(); None: stale

    def __len__(self) -> int:
        return len(self._batches)

    def record(self, effects: BatchEffects) -> None:
        """Adds a processed batch (newest)."""
        self._batches.append(effects)
        self._hidden = None

    def consumed(self, seq: int) -> None:
        """Marks batch ``seq`` consumed (or abandoned); forgets the batches no batch in
        flight precedes."""
        for effects in self._batches:
            if effects.seq == seq:
                effects.consumed = True
                self._hidden = None
                break
        drop = 0
        while drop < len(self._batches) and self._batches[drop].consumed:
            drop += 1
        if drop:
            del self._batches[:drop]

    def clear(self) -> None:
        """Forgets every batch (a restore replaced the state they changed)."""
        self._batches.clear()
        self._hidden = None

    def in_flight_rows(self) -> np.ndarray:
        """int32: the logical rows the batches in flight hold (>= 0)."""
        parts = [e.rows[e.rows >= 0] for e in self._batches if not e.consumed]
        return np.concatenate(parts) if parts else np.zeros(0, np.int32)

    def evicted(self, keys: np.ndarray) -> None:
        """Keys left the index: the records no longer refer to them (their counts and rows
        are gone; a key seen again starts afresh, counted by the batch that sees it)."""
        if keys.shape[0] == 0:
            return
        self._hidden = None
        for e in self._batches:
            gone = np.isin(e.keys, keys)
            if gone.any():
                e.rows = np.where(gone, np.int32(-1), e.rows)
                if e.counted is not None:
                    e.counted = np.where(gone, 0, e.counted)
                e.admitted = e.admitted[~np.isin(e.admitted, keys)]

    def hidden_keys(self) -> np.ndarray:
        """int64, sorted: the keys that own a row only because of batches in flight (what
        :meth:`rolled_back` takes back). The evaluation channel reads them as unknown, as
        it reads them from a checkpoint: what it sees does not depend on how far the
        pipeline has read ahead."""
        if self._hidden is None:
            if self._batches:
                to_counted, to_leave = self._admissions_to_undo()
                self._hidden = np.unique(np.concatenate([to_counted, to_leave]))
            else:
                self._hidden = np.zeros(0, np.int64)
        return self._hidden

    def sketch_cleared(self) -> None:
        """The sketch was zeroed: nothing of the recorded sketch updates is left to undo."""
        for e in self._batches:
            e.sketch = None

    def rolled_back(self, keys: np.ndarray, rows: np.ndarray, counts: np.ndarray,
                    last_seen: np.ndarray, clock: np.int64,
                    sketch: CountMinSketch | None) -> RolledBack:
        """The state without the effects of the batches in flight.

        Args:
          keys, rows, counts: the index's entries (copies; changed and returned).
          last_seen: the per-row last-seen array (not changed; returned as it is when no
            batch is in flight: read it under the key processor's lock).
          clock: the table clock.
          sketch: the live sketch (not changed), or None.

        Returns:
          A :class:`RolledBack` (entries of keys back to no count dropped).
        """
        batches = self._batches
        if not any(not e.consumed for e in batches):   # nothing in flight: the live times
            return RolledBack(keys, rows, counts, last_seen, clock,
                              sketch.copy() if sketch is not None else None)
        in_flight = [e for e in batches if not e.consumed]
        counted = [e for e in in_flight if e.counted is not None]
        undo_admitted, leave_index = self._admissions_to_undo()
        touched = np.concatenate([e.keys for e in counted] + [undo_admitted, leave_index])
        if touched.shape[0]:
            uniq, inverse = np.unique(touched, return_inverse=True)
            n_counted = sum(e.keys.shape[0] for e in counted)
            delta = np.bincount(inverse[:n_counted], minlength=uniq.shape[0],
                                weights=np.concatenate([e.counted for e in counted])
                                if counted else None)
            lookup = HashIndex(uniq.shape[0])
            lookup.insert(uniq, np.arange(uniq.shape[0], dtype=np.int32))
            at = lookup.lookup(keys)
            hit = at >= 0
            # Saturated counts stay saturated: what was added is unknown there.
            live = counts[hit].astype(np.int64)
            back = np.where(live >= COUNT_MAX, live,
                            np.maximum(live - delta[at[hit]].astype(np.int64), 0))
            counts[hit] = back.astype(np.int32)
            in_undo = np.zeros(uniq.shape[0], np.bool_)
            in_undo[np.searchsorted(uniq, undo_admitted)] = True
            rows[hit] = np.where(in_undo[at[hit]], np.int32(-1), rows[hit])
            in_leave = np.zeros(uniq.shape[0], np.bool_)
            in_leave[np.searchsorted(uniq, leave_index)] = True
            keep = ~hit
            keep[hit] = ~in_leave[at[hit]] & ((rows[hit] >= 0) | (counts[hit] > 0))
            keys, rows, counts = keys[keep], rows[keep], counts[keep]
        last_seen, clock = self._times_rolled_back(last_seen.copy(), clock)
        if sketch is not None:
            sketch = sketch.copy()
            for e in reversed(batches):
                if e.sketch is not None:
                    sketch.undo(e.sketch)
            for e in batches:
                if e.consumed and e.sketch is not None:
                    sketch.add(e.sketch.keys, e.sketch.weights)
        return RolledBack(keys, rows, counts, last_seen, clock, sketch)

    def _admissions_to_undo(self):
        """Keys admitted by batches in flight whose rows no later consumed batch used:
        ``(back to counted, out of the index)`` (counted in the index, or in the sketch)."""
        to_counted, to_leave = [], []
        used_later = np.zeros(0, np.int64)   # keys of consumed batches processed later
        for e in reversed(self._batches):
            if e.consumed:
                used_later = np.concatenate([used_later, e.keys[e.rows >= 0]])
                continue
            undo = e.admitted[~np.isin(e.admitted, used_later)]
            (to_leave if e.admitted_from_sketch else to_counted).append(undo)
        empty = np.zeros(0, np.int64)
        return (np.concatenate(to_counted) if to_counted else empty,
                np.concatenate(to_leave) if to_leave else empty)

    def _times_rolled_back(self, last_seen: np.ndarray, clock: np.int64):
        """Last-seen times and clock without the batches in flight: every recorded batch
        undone, newest first, then the consumed ones applied again in order."""
        stamped = [e for e in self._batches if e.timestamp is not None]
        for e in reversed(stamped):
            held = e.rows >= 0
            last_seen[e.rows[held]] = e.last_seen_before[held]
            clock = e.clock_before
        for e in stamped:
            if e.consumed:
                held = e.rows[e.rows >= 0]
                np.maximum.at(last_seen, held, np.int64(e.timestamp))
                clock = max(clock, np.int64(e.timestamp))
        return last_seen, np.int64(clock)
