"""Exact per-feature counting over streamed int64 keys.

A :class:`FeatureCounter` holds one feature's exact key -> (count, latest timestamp) table (see
:mod:`sparseflow.ops.stats_kernels`) and a few row counters. Its memory is the table: about
21 bytes per distinct key (32 with timestamps) at the 0.75 load limit, up to 1.5x that right
after a growth step; batches are counted and dropped. Partial counters (per file, per worker)
combine exactly with :meth:`FeatureCounter.merge`.
"""

from __future__ import annotations

import numpy as np

from sparseflow.ops import stats_kernels
from sparseflow.ops.hash_index import MAX_CAPACITY, MAX_LOAD, slots_for
from sparseflow.stats import report
from sparseflow.validation import is_int


def _int_array(x, name: str) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim != 1 or not (a.dtype.kind in "iu" or a.size == 0):
        raise ValueError(f"Argument `{name}` must be a 1-D integer array. "
                         f"Received: {a.dtype} of shape {a.shape}")
    if a.dtype.kind == "u" and a.size and a.max() > np.iinfo(np.int64).max:
        raise ValueError(f"Argument `{name}` holds values past int64.")
    return np.ascontiguousarray(a, np.int64)


def check_batch(keys, row_lengths, timestamps, null_rows, timed: bool):
    """Checks one batch for a counter's ``update``.

    Returns:
      (int64 keys, rows, empty rows, int64 times (``keys`` itself when untimed: a kernel
      argument not read), the batch's latest time or None).

    Raises:
      TypeError, ValueError: as :meth:`FeatureCounter.update`.
    """
    keys = _int_array(keys, "keys")
    n = keys.shape[0]
    if not is_int(null_rows) or null_rows < 0:
        raise ValueError(f"Argument `null_rows` must be >= 0. Received: {null_rows!r}")
    if row_lengths is None:
        rows, empty = n, 0
    else:
        lengths = _int_array(row_lengths, "row_lengths")
        if lengths.size and lengths.min() < 0 or int(lengths.sum()) != n:
            raise ValueError(f"Argument `row_lengths` must be >= 0 and sum to the "
                             f"{n} keys. Received a sum of {int(lengths.sum())}.")
        rows, empty = lengths.shape[0], int(np.count_nonzero(lengths == 0))
    if (timestamps is None) == timed:
        raise ValueError("Argument `timestamps` is required by a timed counter and refused "
                         "by an untimed one." if timed else
                         "Argument `timestamps` was given to an untimed counter; create it "
                         "with timed=True.")
    latest = None
    if timed:
        times = _int_array(timestamps, "timestamps")
        if times.shape[0] != n:
            raise ValueError(f"Argument `timestamps` must have one value per key ({n}). "
                             f"Received: {times.shape[0]}")
        if n:
            latest = int(times.max())
    else:
        times = keys   # not read by the kernel
    return keys, rows, empty, times, latest


def add_row_counts(counter, other) -> None:
    """Adds ``other``'s rows, null and empty rows, total keys and clock to ``counter`` (the
    part of a merge both counters share)."""
    counter.rows += other.rows
    counter.null_rows += other.null_rows
    counter.empty_rows += other.empty_rows
    counter.total_keys += other.total_keys
    if other.clock is not None:
        counter.clock = other.clock if counter.clock is None else max(counter.clock,
                                                                      other.clock)


def check_result_options(timed: bool, top_k, max_threshold, eviction_window, dim,
                         optimizer) -> None:
    """:func:`check_options`, and an ``eviction_window`` only for a ``timed`` counter.

    Raises:
      ValueError: as :func:`check_options`, or a window for an untimed counter.
    """
    check_options(top_k, max_threshold, eviction_window, dim, optimizer)
    if eviction_window is not None and not timed:
        raise ValueError("Argument `eviction_window` needs timestamps; this counter is "
                         "not timed.")


_ONE_EACH = np.zeros(0, np.int64)   # add_keys: one occurrence per key


class FeatureCounter:
    """Exact counts of one feature's keys, fed batch by batch.

    Attributes (read-only):
      rows: rows seen (null rows included).
      null_rows: rows whose value was null (passed in by the reader).
      empty_rows: multi-hot rows with no keys.
      total_keys: key occurrences.
      distinct_keys: distinct keys.
      clock: the largest timestamp seen (None before the first timestamp, or when not timed).
      timed: whether per-key latest timestamps are kept.
    """

    def __init__(self, timed: bool = False, expected_keys: int = 1024):
        """An empty counter.

        Args:
          timed: keep each key's latest timestamp (then every :meth:`update` needs timestamps).
          expected_keys: distinct keys to size the table for (it grows as needed).

        Raises:
          ValueError: ``expected_keys`` < 0.
        """
        if expected_keys < 0:
            raise ValueError(f"Argument `expected_keys` must be >= 0. Received: {expected_keys!r}")
        self.timed = bool(timed)
        self.rows = 0
        self.null_rows = 0
        self.empty_rows = 0
        self.total_keys = 0
        self.distinct_keys = 0
        self.clock = None
        self._slots = self._table(slots_for(expected_keys))

    def _table(self, capacity: int) -> np.ndarray:
        if capacity > MAX_CAPACITY:
            raise ValueError(f"A key table of {capacity} slots exceeds the maximum of "
                             f"{MAX_CAPACITY}.")
        return np.zeros((capacity, 3 if self.timed else 2), np.int64)

    @property
    def capacity(self) -> int:
        """Slots in the key table."""
        return self._slots.shape[0]

    @property
    def nbytes(self) -> int:
        """Bytes held by the key table."""
        return self._slots.nbytes

    def _room(self) -> int:
        return int(MAX_LOAD * self.capacity) - self.distinct_keys

    def _grow(self, at_least: int) -> None:
        capacity = min(max(slots_for(at_least), int(self.capacity * 1.5)), MAX_CAPACITY)
        if capacity <= self.capacity:
            raise ValueError(f"A key table cannot hold more than "
                             f"{int(MAX_LOAD * MAX_CAPACITY)} distinct keys.")
        old = self._slots
        self._slots = self._table(capacity)
        stats_kernels.rehash(old, self._slots)

    def _add(self, keys, counts, times) -> None:
        start = 0
        n = keys.shape[0]
        while True:
            start, added = stats_kernels.add_keys(self._slots, keys, counts, times, start,
                                                  self._room())
            self.distinct_keys += int(added)
            if start >= n:
                return
            self._grow(self.distinct_keys + 1)

    def update(self, keys, row_lengths=None, timestamps=None, null_rows: int = 0) -> None:
        """Counts one batch.

        Args:
          keys: int64 [n], the batch's keys (multi-hot rows flattened, nulls already removed).
          row_lengths: None for a single-valued column (one key per non-null row), else int
            [r], the number of keys of each non-null row (sums to n; 0: an empty row).
          timestamps: int64 [n], each key's timestamp (its row's); required when ``timed``,
            refused otherwise.
          null_rows: rows of this batch whose value was null (not in ``keys``/``row_lengths``).

        Raises:
          ValueError: arrays that are not 1-D integers, ``row_lengths`` that do not sum to n,
            ``timestamps`` of another length, ``timestamps`` given (or missing) against
            ``timed``, ``null_rows`` < 0.
        """
        keys, rows, empty, times, latest = check_batch(keys, row_lengths, timestamps,
                                                       null_rows, self.timed)
        n = keys.shape[0]
        if latest is not None:
            self.clock = latest if self.clock is None else max(self.clock, latest)
        self._add(keys, _ONE_EACH, times)
        self.rows += rows + int(null_rows)
        self.null_rows += int(null_rows)
        self.empty_rows += empty
        self.total_keys += n

    def entries(self):
        """(keys, counts, latest timestamps) int64 arrays [distinct_keys], in table order (the
        timestamps are zeros when not ``timed``)."""
        return stats_kernels.collect_entries(self._slots)

    def merge(self, other: "FeatureCounter") -> None:
        """Adds ``other``'s counts to this counter (rows, keys, per-key counts and latest
        timestamps, clock); ``other`` is unchanged.

        Raises:
          TypeError: ``other`` is not a FeatureCounter.
          ValueError: ``other`` differs in ``timed``.
        """
        if not isinstance(other, FeatureCounter):
            raise TypeError(f"Argument `other` must be a FeatureCounter. "
                             f"Received: {type(other).__name__}")
        if other.timed != self.timed:
            raise ValueError("Cannot merge a timed counter with an untimed one.")
        keys, counts, times = other.entries()
        self._add(keys, counts, times)
        add_row_counts(self, other)

    def result(self, top_k: int = 20, max_threshold: int = 10, eviction_window: int | None = None,
               dim: int = 16, optimizer: str = "adam", *, clock: int | None = None,
               encoding: str = "int", multi_hot: bool = False) -> dict:
        """The feature's entry of the stats document (see :mod:`sparseflow.stats.report`).

        Args:
          top_k: how many most frequent keys to list, >= 0.
          max_threshold: N >= 1, admission thresholds 1..N.
          eviction_window: W >= 1 for the ``eviction`` entry (keys with clock - latest < W),
            or None to leave it out. Needs a timed counter.
          dim: embedding dimension, >= 1.
          optimizer: ``sgd`` | ``adagrad`` | ``adam`` | ``ftrl``.
          clock: the eviction clock; default: the largest timestamp this counter saw (a
            dataset-wide clock may be later: rows where this feature is null).
          encoding, multi_hot: recorded in the entry.

        Returns:
          The feature dict.

        Raises:
          ValueError: an argument out of range, an unknown optimizer, ``eviction_window`` on
            an untimed counter.
        """
        check_result_options(self.timed, top_k, max_threshold, eviction_window, dim,
                             optimizer)
        keys, counts, times = self.entries()
        bucket_keys, bucket_traffic, kept_keys, kept_traffic = \
            stats_kernels.summarize_counts(counts, int(max_threshold))
        top_keys, top_counts = top_entries(keys, counts, int(top_k))
        eviction = None
        if eviction_window is not None:
            now = clock if clock is not None else self.clock
            now = 0 if now is None else int(now)
            # clock - last < W, written so that it cannot overflow for last <= clock.
            alive = int(np.count_nonzero(times > now - int(eviction_window))) \
                if now - int(eviction_window) >= np.iinfo(np.int64).min else times.shape[0]
            eviction = {"window": int(eviction_window), "clock": now, "keys_alive": alive}
        return report.feature_section(
            encoding=encoding, multi_hot=multi_hot, rows=self.rows, null_rows=self.null_rows,
            empty_rows=self.empty_rows, total_keys=self.total_keys,
            distinct_keys=self.distinct_keys, bucket_keys=bucket_keys,
            bucket_traffic=bucket_traffic, top_keys=top_keys, top_counts=top_counts,
            kept_keys=kept_keys, kept_traffic=kept_traffic, eviction=eviction, dim=int(dim),
            optimizer=optimizer)


def _check_int(name: str, value, low: int) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
        raise ValueError(f"Argument `{name}` must be an int >= {low}. Received: {value!r}")


def check_options(top_k, max_threshold, eviction_window, dim, optimizer) -> None:
    """Checks the options of :meth:`FeatureCounter.result`.

    Raises:
      ValueError: ``top_k`` < 0, ``max_threshold`` < 1, ``eviction_window`` neither None nor
        >= 1, ``dim`` < 1 (each must be an int), an unknown ``optimizer``.
    """
    _check_int("top_k", top_k, 0)
    _check_int("max_threshold", max_threshold, 1)
    if eviction_window is not None:
        _check_int("eviction_window", eviction_window, 1)
    _check_int("dim", dim, 1)
    report.optimizer_slots(optimizer)


def top_entries(keys: np.ndarray, counts: np.ndarray, k: int):
    """The ``k`` most frequent keys, count descending then key ascending.

    Args:
      keys, counts: int64 [d] distinct keys and their counts.
      k: >= 0.

    Returns:
      (keys, counts) int64 arrays [min(k, d)].
    """
    d = keys.shape[0]
    if k <= 0 or d == 0:
        return keys[:0], counts[:0]
    if d > k:
        # Only keys whose count reaches the k-th largest can be in the top k (ties included).
        kth = np.partition(counts, d - k)[d - k]
        pick = np.flatnonzero(counts >= kth)
        keys, counts = keys[pick], counts[pick]
    order = np.lexsort((keys, -counts))[:k]
    return keys[order], counts[order]
