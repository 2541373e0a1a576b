"""Exact key counting for feature statistics: an open-addressing int64 key -> count table.

Layout: one record per slot in a C-contiguous int64 array ``slots[capacity, width]``::

    slots[s, 0]   the key
    slots[s, 1]   how many times it was seen (0: the slot is free)
    slots[s, 2]   the largest timestamp it was seen with (width 3 only, when timestamps are
                  counted)

16 bytes per slot without timestamps (21.3 bytes per key at the maximum load of 0.75), 24 with
them (32 bytes per key). Any int64 is a valid key: a free slot is marked by a zero count, not by
a sentinel key (an occupied slot always has a count >= 1). Homing and probing are those of
:mod:`sparseflow.ops.hash_index` (:func:`~sparseflow.ops.hash_index.home_slot`, linear
probing); counting never deletes, so there is no backward shifting here.

The kernels are pure functions over the arrays; :class:`sparseflow.stats.counts.FeatureCounter`
sizes and grows them. :func:`add_keys` stops before the key that would take the table past
its load limit and reports how far it got, so the owner grows the table and resumes: the table never holds more than ``limit`` keys, whatever the batch size.
"""

from __future__ import annotations

import numba
import numpy as np

from sparseflow.ops.hash_index import home_slot

_JIT = dict(nogil=True, cache=True, error_model="numpy", boundscheck=False)

N_BUCKETS = 64   # log2 buckets of an int64 count: bucket i holds counts in [2^i, 2^(i+1) - 1]


@numba.njit(**_JIT)
def _find(slots, key):
    """Slot holding ``key``, else the free slot where it would go."""
    capacity = slots.shape[0]
    i = home_slot(key, capacity)
    while True:
        if slots[i, 1] == 0 or slots[i, 0] == key:
            return i
        i += 1
        if i == capacity:
            i = 0


@numba.njit(**_JIT)
def add_keys(slots, keys, counts, times, start, room):
    """Adds ``counts[i]`` occurrences of ``keys[i]`` (one each when ``counts`` is empty: a
    batch's raw keys; a counter's distinct keys and counts when merging), last seen at
    ``times[i]``, from position ``start``; stops before the (room + 1)-th new key.

    Args:
      slots: int64 [capacity, 2 or 3] table: key, count (0: free slot), latest time (width 3).
      keys: int64 [n].
      counts: int64 [n] (>= 1), or [0] for one occurrence each.
      times: int64 [n] (read only when ``slots`` has width 3).
      start: the first position of ``keys`` to count.
      room: how many new keys may still be added.

    Returns:
      (next position, new keys added): next position is ``n`` when every key was counted,
      else the position of the new key that did not fit (grow the table and resume there).
    """
    timed = slots.shape[1] > 2
    weighted = counts.shape[0] > 0
    added = 0
    for i in range(start, keys.shape[0]):
        s = _find(slots, keys[i])
        if slots[s, 1] == 0:
            if added == room:
                return i, added
            added += 1
            slots[s, 0] = keys[i]
            if timed:
                slots[s, 2] = times[i]
        elif timed and slots[s, 2] < times[i]:
            slots[s, 2] = times[i]
        slots[s, 1] += counts[i] if weighted else 1
    return keys.shape[0], added


@numba.njit(**_JIT)
def rehash(old, slots):
    """Moves every entry of ``old`` into the empty table ``slots`` (same width)."""
    for s in range(old.shape[0]):
        if old[s, 1] != 0:
            t = _find(slots, old[s, 0])
            for j in range(old.shape[1]):
                slots[t, j] = old[s, j]


@numba.njit(**_JIT)
def collect_entries(slots):
    """(keys, counts, times) int64 arrays of every entry, in slot order (times: zeros when
    ``slots`` has width 2)."""
    n = 0
    for s in range(slots.shape[0]):
        if slots[s, 1] != 0:
            n += 1
    keys = np.empty(n, np.int64)
    counts = np.empty(n, np.int64)
    times = np.zeros(n, np.int64)
    timed = slots.shape[1] > 2
    j = 0
    for s in range(slots.shape[0]):
        if slots[s, 1] != 0:
            keys[j] = slots[s, 0]
            counts[j] = slots[s, 1]
            if timed:
                times[j] = slots[s, 2]
            j += 1
    return keys, counts, times


@numba.njit(**_JIT)
def log2_floor(count):
    """floor(log2(count)) of an int64 count >= 1, in integer arithmetic."""
    b = 0
    c = count >> 1
    while c > 0:
        b += 1
        c >>= 1
    return b


@numba.njit(**_JIT)
def summarize_counts(counts, max_threshold):
    """Frequency histogram and admission thresholds of per-key counts, in one pass.

    Args:
      counts: int64 [d] per-key counts, each >= 1.
      max_threshold: N >= 1.

    Returns:
      (bucket_keys, bucket_traffic, kept_keys, kept_traffic), int64 arrays:
      ``bucket_keys[i]`` / ``bucket_traffic[i]`` (length 64): the number of keys whose count is
      in [2^i, 2^(i+1) - 1] and the sum of their counts; ``kept_keys[t]`` / ``kept_traffic[t]``
      (length N + 1, index 0 unused, 0): the number of keys with count >= t and the sum of
      their counts.
    """
    bucket_keys = np.zeros(N_BUCKETS, np.int64)
    bucket_traffic = np.zeros(N_BUCKETS, np.int64)
    # at[t] for t < N: keys with count exactly t; at[N]: keys with count >= N.
    at_keys = np.zeros(max_threshold + 1, np.int64)
    at_traffic = np.zeros(max_threshold + 1, np.int64)
    for i in range(counts.shape[0]):
        c = counts[i]
        b = log2_floor(c)
        bucket_keys[b] += 1
        bucket_traffic[b] += c
        t = c if c < max_threshold else max_threshold
        at_keys[t] += 1
        at_traffic[t] += c
    kept_keys = np.zeros(max_threshold + 1, np.int64)
    kept_traffic = np.zeros(max_threshold + 1, np.int64)
    k = np.int64(0)
    w = np.int64(0)
    for t in range(max_threshold, 0, -1):
        k += at_keys[t]
        w += at_traffic[t]
        kept_keys[t] = k
        kept_traffic[t] = w
    return bucket_keys, bucket_traffic, kept_keys, kept_traffic
