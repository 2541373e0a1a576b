"""The fast tier's choice of victims (``pipeline/tier_cache.py``), in one kernel call.

The choice was numpy: a mask of eligible slots, their indices, their scores, a partition and
a sort, five passes and three temporaries of the tier's size per batch and table; a tier of
a million slots spent ~15 ms a batch there, ten million ~185 ms (BENCHMARKS.md, "choosing
the fast tier's victims"). The kernel counts the scores when their range is narrow (a
histogram and a stable placement) and otherwise keeps the ``n`` best in a heap.
"""

from __future__ import annotations

import numba
import numpy as np

_JIT = dict(nogil=True, cache=True, error_model="numpy", boundscheck=False)
# Each loop below writes out its slot's test (``row_in >= 0``, ``pins == 0``) and score: a
# helper returning both, even with ``inline="always"``, made the choice 3-10x slower
# (bench_tier_victims.py).


@numba.njit(**_JIT)
def _before(score_a, slot_a, score_b, slot_b):
    # Victims go oldest (or least used) first, ties by slot.
    return score_a < score_b or (score_a == score_b and slot_a < slot_b)


@numba.njit(**_JIT)
def _sift_down(scores, slots, size, i):
    """Restores the max-heap (by :func:`_before`) below position ``i``."""
    while True:
        largest = i
        left = 2 * i + 1
        right = left + 1
        if left < size and _before(scores[largest], slots[largest], scores[left], slots[left]):
            largest = left
        if right < size and _before(scores[largest], slots[largest], scores[right],
                                     slots[right]):
            largest = right
        if largest == i:
            return
        scores[i], scores[largest] = scores[largest], scores[i]
        slots[i], slots[largest] = slots[largest], slots[i]
        i = largest


@numba.njit(**_JIT)
def _sift_up(scores, slots, i):
    while i > 0:
        parent = (i - 1) // 2
        if not _before(scores[parent], slots[parent], scores[i], slots[i]):
            return
        scores[i], scores[parent] = scores[parent], scores[i]
        slots[i], slots[parent] = slots[parent], slots[i]
        i = parent


@numba.njit(**_JIT)
def _holds(sorted_slots, s):
    """Whether ``s`` is in the sorted array ``sorted_slots`` (binary search)."""
    lo, hi = 0, sorted_slots.shape[0]
    while lo < hi:
        mid = (lo + hi) // 2
        if sorted_slots[mid] < s:
            lo = mid + 1
        else:
            hi = mid
    return lo < sorted_slots.shape[0] and sorted_slots[lo] == s


# A score range up to this many buckets per candidate (plus a floor) is counted, not heaped.
_BUCKETS_PER_CANDIDATE = 4
_MIN_BUCKETS = 1024
# Beyond this many candidates per victim (a tier far larger than a batch's misses) the heap's
# one pass beats the histogram's three.
_CANDIDATES_PER_VICTIM = 64


@numba.njit(**_JIT)
def select_victims(pins, row_in, last_used, uses, lfu, resident, n, out):
    """The ``n`` slots a batch may empty first, and how many it may empty at all.

    A slot may be emptied when it holds a row (``row_in >= 0``), no batch pins it
    (``pins == 0``) and it is not one of ``resident`` (the batch's own resident slots).
    Scores spanning a range not much wider than the candidates (LRU clocks: a batch's slots
    share one; LFU counts) are counted when there are at most 64 candidates per victim: a
    histogram, then a stable placement, O(slots + range). Otherwise a heap keeps the ``n``
    best seen in one pass, O(n) memory.

    Args:
      pins: int32 per slot, batches holding it.
      row_in: int32 per slot, its row (-1: free).
      last_used: int64 per slot, the LRU clock (scores under LRU).
      uses: int64 per row, placements (scores under LFU; may be empty under LRU).
      lfu: score by ``uses[row_in[slot]]`` instead of ``last_used[slot]``.
      resident: int32 slots the batch keeps (values outside ``[0, slots)`` are ignored).
      n: victims wanted, >= 0.
      out: int32 ``[>= n]``; receives ``min(n, eligible)`` victims, lowest score first,
        ties by slot.

    Returns:
      The number of slots that may be emptied (``eligible``).
    """
    n_slots = row_in.shape[0]
    keep = np.unique(resident)   # sorted, each slot once
    eligible = 0
    low = 0
    high = 0
    for s in range(n_slots):
        r = row_in[s]
        if r < 0 or pins[s] != 0:
            continue
        score = uses[r] if lfu else last_used[s]
        if eligible == 0 or score < low:
            low = score
        if eligible == 0 or score > high:
            high = score
        eligible += 1
    for i in range(keep.shape[0]):
        s = keep[i]
        if 0 <= s < n_slots and row_in[s] >= 0 and pins[s] == 0:
            eligible -= 1
    wanted = min(n, eligible)
    if wanted == 0:
        return eligible
    # Scores below 0 (never the cache's clocks or counts) take the heap: ``high - low`` of
    # scores of both signs could wrap around int64.
    if (low >= 0 and high - low < _BUCKETS_PER_CANDIDATE * eligible + _MIN_BUCKETS
            and eligible <= _CANDIDATES_PER_VICTIM * wanted):
        _counted_victims(pins, row_in, last_used, uses, lfu, keep, low, high, wanted, out)
    else:
        _heap_victims(pins, row_in, last_used, uses, lfu, keep, wanted, out)
    return eligible


@numba.njit(**_JIT)
def _counted_victims(pins, row_in, last_used, uses, lfu, keep, low, high, wanted, out):
    """:func:`select_victims` by a histogram of the scores and a stable placement."""
    n_slots = row_in.shape[0]
    counts = np.zeros(high - low + 1, np.int32)   # slots are int32: so is any count
    for s in range(n_slots):
        r = row_in[s]
        if r < 0 or pins[s] != 0:
            continue
        counts[(uses[r] if lfu else last_used[s]) - low] += 1
    for i in range(keep.shape[0]):
        s = keep[i]
        if 0 <= s < n_slots and row_in[s] >= 0 and pins[s] == 0:
            counts[(uses[row_in[s]] if lfu else last_used[s]) - low] -= 1
    # Every score below the threshold bucket goes; of the threshold's, the lowest slots.
    # The counts up to it become each bucket's next place in ``out``.
    taken = 0
    threshold = 0
    while True:
        count = counts[threshold]
        counts[threshold] = taken
        if taken + count >= wanted:
            break
        taken += count
        threshold += 1
    quota = wanted - taken
    starts = counts
    for s in range(n_slots):
        r = row_in[s]
        if r < 0 or pins[s] != 0:
            continue
        b = (uses[r] if lfu else last_used[s]) - low
        if b > threshold or (b == threshold and quota == 0):
            continue
        if _holds(keep, s):
            continue
        out[starts[b]] = s
        starts[b] += 1
        if b == threshold:
            quota -= 1


@numba.njit(**_JIT)
def _heap_victims(pins, row_in, last_used, uses, lfu, keep, wanted, out):
    """:func:`select_victims` by a max-heap of the ``wanted`` best candidates seen."""
    heap_scores = np.empty(wanted, np.int64)
    heap_slots = np.empty(wanted, np.int64)
    size = 0
    for s in range(row_in.shape[0]):
        r = row_in[s]
        if r < 0 or pins[s] != 0:
            continue
        score = uses[r] if lfu else last_used[s]
        # The batch's own slots are few: looked up only for a slot that would enter.
        if size < wanted:
            if _holds(keep, s):
                continue
            heap_scores[size] = score
            heap_slots[size] = s
            _sift_up(heap_scores, heap_slots, size)
            size += 1
        elif _before(score, s, heap_scores[0], heap_slots[0]) and not _holds(keep, s):
            heap_scores[0] = score
            heap_slots[0] = s
            _sift_down(heap_scores, heap_slots, size, 0)
    # Heap sort in place: the largest goes last, leaving the victims in order.
    for end in range(size - 1, 0, -1):
        heap_scores[0], heap_scores[end] = heap_scores[end], heap_scores[0]
        heap_slots[0], heap_slots[end] = heap_slots[end], heap_slots[0]
        _sift_down(heap_scores, heap_slots, end, 0)
    for i in range(size):
        out[i] = heap_slots[i]
