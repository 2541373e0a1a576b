"""The fast tier's kernels (``pipeline/tier_cache.py``, ``embed/row_tiers.py``): the choice
of victims, a batch's placement, and the swaps' row copies at the homes, each one call per
batch and table, without the GIL.

The victim choice was numpy: a mask of eligible slots, their indices, their scores, a
partition and a sort, five passes and three temporaries of the tier's size per batch and
table; a tier of a million slots spent ~15 ms a batch there, ten million ~185 ms
(BENCHMARKS.md, "choosing the fast tier's victims"). The kernel counts the scores when their
range is narrow (a histogram and a stable placement) and otherwise keeps the ``n`` best in a
heap. The placement and the row copies were a few dozen numpy calls per batch and table,
each holding the GIL the training step's own calls wait for.
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


# A score range up to this many buckets per candidate (plus a floor) is counted, not heaped.
_BUCKETS_PER_CANDIDATE = 4
_MIN_BUCKETS = 1024
# Beyond this many candidates per victim (a tier far larger than a batch's misses) the heap's
# one pass beats the histogram's three.
_CANDIDATES_PER_VICTIM = 64


@numba.njit(**_JIT)
def select_victims(pins, row_in, last_used, uses, lfu, resident, n, out, marks):
    """The ``n`` slots a batch may empty first, and how many it may empty at all.

    A slot may be emptied when it holds a row (``row_in >= 0``), no batch pins it
    (``pins == 0``) and it is not one of ``resident`` (the batch's own resident slots).
    One pass over the slots finds them, their scores' range, and keeps the first of them
    (in slot order) in a buffer of at most 64 per victim. Scores spanning a range not much
    wider than the candidates (LRU clocks: a batch's slots share one; LFU counts) are counted
    when there are at most 64 candidates per victim: a histogram of the buffer, then a stable
    placement. Otherwise a heap keeps the ``n`` best seen in a second pass, O(n) memory.

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
      marks: bool per slot, all False: scratch the caller keeps, so that telling the batch's
        own slots apart costs one write per slot of ``resident`` instead of a sort and a
        search per candidate. All False again on return.

    Returns:
      The number of slots that may be emptied (``eligible``).
    """
    n_slots = row_in.shape[0]
    for i in range(resident.shape[0]):
        s = resident[i]
        if 0 <= s < n_slots:
            marks[s] = True
    cap = min(n_slots, _CANDIDATES_PER_VICTIM * n)
    candidates = np.empty(cap, np.int32)
    scores = np.empty(cap, np.int64)
    eligible = 0
    low = 0
    high = 0
    for s in range(n_slots):
        r = row_in[s]
        if r < 0 or pins[s] != 0 or marks[s]:
            continue
        score = uses[r] if lfu else last_used[s]
        if eligible < cap:
            candidates[eligible] = s
            scores[eligible] = score
        if eligible == 0 or score < low:
            low = score
        if eligible == 0 or score > high:
            high = score
        eligible += 1
    wanted = min(n, eligible)
    # Scores below 0 (never the cache's clocks or counts) take the heap: ``high - low`` of
    # scores of both signs could wrap around int64. Counting needs every candidate in the
    # buffer: at most 64 per victim, so at most its size.
    if wanted == 0:
        pass
    elif (low >= 0 and high - low < _BUCKETS_PER_CANDIDATE * eligible + _MIN_BUCKETS
            and eligible <= _CANDIDATES_PER_VICTIM * wanted):
        _counted_victims(candidates[:eligible], scores[:eligible], low, high, wanted, out)
    else:
        _heap_victims(pins, row_in, last_used, uses, lfu, marks, wanted, out)
    for i in range(resident.shape[0]):
        s = resident[i]
        if 0 <= s < n_slots:
            marks[s] = False
    return eligible


@numba.njit(**_JIT)
def _counted_victims(candidates, scores, low, high, wanted, out):
    """:func:`select_victims` by a histogram of the candidates' scores and a stable
    placement (``candidates`` in slot order)."""
    counts = np.zeros(high - low + 1, np.int32)   # slots are int32: so is any count
    for i in range(candidates.shape[0]):
        counts[scores[i] - low] += 1
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
    for i in range(candidates.shape[0]):
        b = scores[i] - low
        if b > threshold or (b == threshold and quota == 0):
            continue
        out[starts[b]] = candidates[i]
        starts[b] += 1
        if b == threshold:
            quota -= 1


@numba.njit(**_JIT)
def _heap_victims(pins, row_in, last_used, uses, lfu, marks, wanted, out):
    """:func:`select_victims` by a max-heap of the ``wanted`` best candidates seen."""
    heap_scores = np.empty(wanted, np.int64)
    heap_slots = np.empty(wanted, np.int64)
    size = 0
    for s in range(row_in.shape[0]):
        r = row_in[s]
        if r < 0 or pins[s] != 0 or marks[s]:
            continue
        score = uses[r] if lfu else last_used[s]
        if size < wanted:
            heap_scores[size] = score
            heap_slots[size] = s
            _sift_up(heap_scores, heap_slots, size)
            size += 1
        elif _before(score, s, heap_scores[0], heap_slots[0]):
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


@numba.njit(**_JIT)
def find_slots(rows, slot_of, slots, missing, resident):
    """A batch's rows against the fast tier: ``slots[i] = slot_of[rows[i]]`` (-1 where
    ``rows[i]`` is negative: a key without a row); the positions of the rows without a slot
    go to ``missing``, the slots of those with one to ``resident``, each in batch order.

    Args:
      rows: int32 ``[U]`` logical rows, -1 for keys without a row.
      slot_of: int32 per logical row, its slot (-1: at home).
      slots, missing, resident: int32 ``[>= U]`` outputs.

    Returns:
      ``(missing rows, resident rows, bad)``: how much of ``missing`` and ``resident`` is
      filled, and -1, or the first position of a row past ``slot_of`` (the outputs are then
      incomplete).
    """
    n_missing = 0
    n_resident = 0
    n_rows = slot_of.shape[0]
    for i in range(rows.shape[0]):
        r = rows[i]
        if r < 0:
            slots[i] = -1
            continue
        if r >= n_rows:
            return n_missing, n_resident, i
        s = slot_of[r]
        slots[i] = s
        if s < 0:
            missing[n_missing] = i
            n_missing += 1
        else:
            resident[n_resident] = s
            n_resident += 1
    return n_missing, n_resident, -1


@numba.njit(**_JIT)
def commit_slots(rows, slots, missing, victims, new_slots, slot_of, row_in, last_used, clock,
                 uses, lfu, gen, out_rows, out_gens, in_rows):
    """Records a batch's placement: the rows in ``victims`` leave (at home from now on; their
    rows and generations go to ``out_rows`` and ``out_gens``), the missing rows
    (``rows[missing]``, copied to ``in_rows``) enter ``new_slots`` (free slots, then the
    victims), and every row of the batch is stamped, in batch order, with the clock's next
    ticks from ``clock`` on (LRU; ``ops/lru_list.py`` lists the slots in that order) and
    counted (LFU).

    Args:
      rows, slots: the batch's int32 rows and slots (:func:`find_slots`); the missing
        rows' slots are filled in.
      missing: int32 positions in ``rows`` of the rows entering.
      victims: int32 slots emptied for them.
      new_slots: int32 ``[len(missing)]`` slots they enter.
      slot_of, row_in, last_used, uses, gen: the cache's state (``uses`` may be empty under
        LRU); ``lfu`` counts uses.
      clock: the first LRU stamp (the batch's rows, -1 aside, take ``clock, clock + 1,
        ...``).
      out_rows, out_gens: ``[len(victims)]`` outputs; ``in_rows``: ``[len(missing)]``.
    """
    for i in range(victims.shape[0]):
        r = row_in[victims[i]]
        out_rows[i] = r
        out_gens[i] = gen[r]
        slot_of[r] = -1
    for j in range(missing.shape[0]):
        r = rows[missing[j]]
        s = new_slots[j]
        in_rows[j] = r
        slot_of[r] = s
        row_in[s] = r
        slots[missing[j]] = s
    for i in range(rows.shape[0]):
        r = rows[i]
        if r < 0:
            continue
        last_used[slots[i]] = clock
        clock += 1
        if lfu:
            uses[r] += 1


@numba.njit(**_JIT)
def first_outside(rows, n_rows):
    """The first position of ``rows`` outside ``[0, n_rows)``, or -1."""
    for i in range(rows.shape[0]):
        if rows[i] < 0 or rows[i] >= n_rows:
            return i
    return -1


@numba.njit(**_JIT)
def read_rows(storage, rows, out):
    """``out[i] = storage[rows[i]]``, every column. Returns -1, or (nothing read) the first
    position of ``rows`` outside the storage."""
    bad = first_outside(rows, storage.shape[0])
    if bad >= 0:
        return bad
    for i in range(rows.shape[0]):
        r = rows[i]
        for j in range(storage.shape[1]):
            out[i, j] = storage[r, j]
    return -1


@numba.njit(**_JIT)
def write_rows(storage, rows, values):
    """``storage[rows[i]] = values[i]``, every column (a row given twice keeps its last
    values). Returns -1, or (nothing written) the first position of ``rows`` outside the
    storage."""
    bad = first_outside(rows, storage.shape[0])
    if bad >= 0:
        return bad
    for i in range(rows.shape[0]):
        r = rows[i]
        for j in range(storage.shape[1]):
            storage[r, j] = values[i, j]
    return -1


@numba.njit(**_JIT)
def write_back_and_read(storage, gen, out_rows, out_gens, out_values, in_rows, in_values):
    """A swap at the homes: each row leaving the fast tier is written home, unless it was
    handed to a new key since its plan was made (``gen[row] != out_gens[i]``: its home holds
    the new key's initial values); then the homes of the rows entering are read into
    ``in_values``. The rows are the cache's (inside the storage)."""
    for i in range(out_rows.shape[0]):
        r = out_rows[i]
        if gen[r] != out_gens[i]:
            continue
        for j in range(storage.shape[1]):
            storage[r, j] = out_values[i, j]
    read_rows(storage, in_rows, in_values)


@numba.njit(**_JIT)
def forget_rows(rows, slot_of, row_in, gen, uses, lfu, freed):
    """Drops ``rows`` (handed to new keys, each in ``[0, len(slot_of))``: see
    :func:`first_outside`) from the fast tier: their slots are freed (listed in ``freed``,
    int32 ``[>= len(rows)]``), their generations bumped (a queued write-back of their old
    contents is then dropped) and, under LFU, their use counts reset. Returns how many slots
    were freed."""
    n_freed = 0
    for i in range(rows.shape[0]):
        r = rows[i]
        s = slot_of[r]
        if s >= 0:
            freed[n_freed] = s
            n_freed += 1
            row_in[s] = -1
            slot_of[r] = -1
        gen[r] += 1
        if lfu:
            uses[r] = 0
    return n_freed


@numba.njit(**_JIT)
def free_slots_from(row_in, start, n, out):
    """The first ``n`` free slots (``row_in < 0``) at or after ``start``, into ``out``
    (int32 ``[>= n]``). Returns ``(how many, where the scan stopped)``: every slot from
    ``start`` up to that point now holds a row or is among them. With ``start`` at or below
    the lowest free slot these are the tier's lowest free slots; a scan per batch over the
    whole tier cost O(slots) until it filled."""
    found = 0
    s = start
    n_slots = row_in.shape[0]
    while s < n_slots and found < n:
        if row_in[s] < 0:
            out[found] = s
            found += 1
        s += 1
    return found, s
