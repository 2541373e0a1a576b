"""Per-batch key kernels: dedup with restore, admission counting and key → row assignment.

Pure functions over numpy arrays (see ``hash_index`` for the index layout). A batch's keys are
deduplicated by one :func:`dedup_tables` call over every table; each table's key processor
then calls :func:`assign_batch` (room check, :func:`assign_rows`, marks) once per batch.
"""

from __future__ import annotations

import numba
import numpy as np

from sparseflow.ops.hash_index import (COUNT_MAX, EMPTY, UNADMITTED, find_or_empty_slot,
                                       home_slot)
from sparseflow.ops.prefetch import prefetch_for_write

_JIT = dict(nogil=True, cache=True, error_model="numpy", boundscheck=False)

# Indices into the int64 ``state`` array that assign_rows mutates.
STATE_INDEX_SIZE = 0   # occupied index slots
STATE_NEXT_ROW = 1     # rows [0, next_row) have been handed out at least once
STATE_ROW_LIMIT = 2    # rows available in the table
STATE_FREE_TOP = 3     # entries used in the free-row stack
STATE_LEN = 4

# assign_batch's answer when the index must grow before the batch's keys fit.
NEEDS_INDEX_ROOM = -(2**62)

# Keys ahead whose index slot assign_rows prefetches.
SLOT_PREFETCH_AHEAD = 16


@numba.njit(**_JIT)
def scratch_slots(n_keys: int) -> int:
    """Power-of-two scratch size for deduplicating ``n_keys`` keys (load <= 0.5); a
    kernel, so that compiled ops size their scratch too."""
    size = 16
    while size < 2 * n_keys:
        size *= 2
    return size


_FIBONACCI = np.uint64(0x9E3779B97F4A7C15)


@numba.njit(**_JIT)
def dedup(keys, seg_ends, seg_coefs, scratch_keys, scratch_tags, generation, uniq, restore,
          weight):
    """Deduplicates ``keys`` in first-occurrence order.

    Args:
      keys: int64[N].
      seg_ends: int64[S], exclusive end of each segment (one per feature spec) in ``keys``.
      seg_coefs: int32[S], the count each occurrence in that segment adds (faae_coefficient).
      scratch_keys, scratch_tags: int64[P] with P a power of two >= 2N. A slot is in use for
        this call iff ``scratch_tags[s] >> 32 == generation``; its low 32 bits hold the unique
        position. Stamping with a fresh ``generation`` per call (per table under
        :func:`dedup_tables`; 1 .. 2^31-1) replaces clearing.
      generation: this call's stamp; the caller zeroes the tags before reusing a stamp.
      uniq: int64[N] out, unique keys in its first U entries.
      restore: int32[N] out, ``keys[i] == uniq[restore[i]]``.
      weight: int64[N] out, weighted occurrences of each unique key in its first U entries.

    Returns:
      U, the number of unique keys.
    """
    mask = np.int64(scratch_keys.shape[0] - 1)
    shift = np.uint64(64)
    p = scratch_keys.shape[0]
    while p > 1:
        p >>= 1
        shift -= np.uint64(1)
    stamp = np.int64(generation) << np.int64(32)
    n_unique = 0
    seg = 0
    n = keys.shape[0]
    # Past ~16k keys the scratch outgrows L2: fetch the slots of keys a few places ahead.
    prefetch = scratch_keys.shape[0] > 32768
    for i in range(n):
        while i >= seg_ends[seg]:
            seg += 1
        if prefetch and i + SLOT_PREFETCH_AHEAD < n:
            ahead = np.int64((np.uint64(keys[i + SLOT_PREFETCH_AHEAD]) * _FIBONACCI) >> shift)
            prefetch_for_write(scratch_tags, ahead)
            prefetch_for_write(scratch_keys, ahead)
        k = keys[i]
        # Fibonacci hashing: one multiply, top bits; spreads sequential keys well.
        s = np.int64((np.uint64(k) * _FIBONACCI) >> shift) if shift < np.uint64(64) else 0
        while True:
            tag = scratch_tags[s]
            if (tag >> np.int64(32)) != generation:
                scratch_keys[s] = k
                scratch_tags[s] = stamp | n_unique
                uniq[n_unique] = k
                weight[n_unique] = seg_coefs[seg]
                restore[i] = n_unique
                n_unique += 1
                break
            if scratch_keys[s] == k:
                pos = tag & np.int64(0xFFFFFFFF)
                restore[i] = pos
                weight[pos] += seg_coefs[seg]
                break
            s = (s + 1) & mask
    return n_unique


@numba.njit(**_JIT)
def table_bounds(seg_ends, table_segs):
    """Where each table's keys lie in a batch's joined keys, and the most any table has.

    Args:
      seg_ends: int64[S], exclusive end of each segment in the keys.
      table_segs: int64[T], exclusive end of each table's segments in ``seg_ends``.

    Returns:
      ``(starts, ends, longest)``: int64 ``[T]`` table ``t``'s keys are
      ``keys[starts[t]:ends[t]]``; ``longest`` the largest ``ends - starts`` (0 for no
      tables). The one walk of the tables' bounds: dedup's and routing's scratch sizes,
      routing's table starts (in Python these were eight small-array numpy calls a batch,
      ~10 us per Keras layer and step on an owner).
    """
    n_tables = table_segs.shape[0]
    starts = np.zeros(n_tables, np.int64)
    ends = np.zeros(n_tables, np.int64)
    longest = 0
    previous = 0
    for t in range(n_tables):
        end = seg_ends[table_segs[t] - 1] if table_segs[t] > 0 else 0
        starts[t] = previous
        ends[t] = end
        longest = max(longest, end - previous)
        previous = end
    return starts, ends, longest


@numba.njit(**_JIT)
def dedup_tables(keys, seg_ends, seg_coefs, table_segs, scratch_keys, scratch_tags,
                 generation, uniq, restore, weight, n_unique):
    """:func:`dedup` of every table of a batch in one call: table ``t``'s keys are the
    segments ``table_segs[t-1] .. table_segs[t]`` (0 for ``t`` = 0) of ``keys``.

    One call instead of one per table: the scratch stays in the cache from one table to the
    next (a table's row assignment, between two per-table calls, evicted it and doubled the
    dedup's time), and the Python around 26 calls goes.

    Args:
      keys, seg_ends, seg_coefs: as :func:`dedup`, every table's segments in table order.
      table_segs: int64[T], exclusive end of each table's segments in ``seg_ends``.
      scratch_keys, scratch_tags: as :func:`dedup`, sized for the largest table's keys.
      generation: table ``t`` stamps ``generation + t``; the caller reserves T stamps.
      uniq, restore, weight: as :func:`dedup`, ``[N]``: a table whose keys are
        ``keys[a:b]`` writes ``uniq[a:a + U]``, ``weight[a:a + U]`` and ``restore[a:b]``
        (indices into its own unique keys).
      n_unique: int64[T] out, each table's unique keys U.
    """
    seg_start = 0
    key_start = 0
    for t in range(table_segs.shape[0]):
        seg_end = table_segs[t]
        key_end = seg_ends[seg_end - 1] if seg_end > seg_start else key_start
        local_ends = seg_ends[seg_start:seg_end] - key_start
        n_unique[t] = dedup(keys[key_start:key_end], local_ends, seg_coefs[seg_start:seg_end],
                            scratch_keys, scratch_tags, generation + t,
                            uniq[key_start:key_end], restore[key_start:key_end],
                            weight[key_start:key_end])
        seg_start = seg_end
        key_start = key_end


@numba.njit(**_JIT)
def _admits(count, threshold):
    return threshold < 0 or count >= threshold


@numba.njit(**_JIT)
def _saturating_add(count, add):
    total = np.int64(count) + add
    return COUNT_MAX if total > COUNT_MAX else np.int32(total)


@numba.njit(**_JIT)
def rows_needed(idx_keys, idx_rows, idx_counts, uniq, weight, n_unique, threshold):
    """How many new rows a training call of :func:`assign_rows` would allocate (read-only)."""
    needed = 0
    for u in range(n_unique):
        s = find_or_empty_slot(idx_keys, idx_rows, uniq[u])
        r = idx_rows[s]
        if r >= 0:
            continue
        count = weight[u] if r == EMPTY else np.int64(idx_counts[s]) + weight[u]
        if _admits(count, threshold):
            needed += 1
    return needed


@numba.njit(**_JIT)
def assign_rows(idx_keys, idx_rows, idx_counts, uniq, weight, n_unique, train, threshold,
                free_rows, state, out_rows, new_positions):
    """Maps unique keys to rows; on the training channel, counts and admits them.

    Training channel: each key's count += its weighted occurrences; a key whose count reaches
    ``threshold`` (or any key when ``threshold`` < 0, admission off) takes a free row — first
    from the ``free_rows`` stack, else the next never-used row. Keys still below the threshold
    are kept in the index as UNADMITTED (counted) and read row -1. Eval channel: read-only,
    unknown and unadmitted keys read -1.

    The caller guarantees room: the index can take ``n_unique`` more keys under its load limit,
    and (training) at least :func:`rows_needed` rows are available.

    Args:
      idx_keys, idx_rows, idx_counts: the index arrays.
      uniq, weight: unique keys and their weighted occurrences (first ``n_unique`` entries).
      train: training channel.
      threshold: access threshold, < 0 for admission off.
      free_rows: int32 stack of reusable rows (``state[STATE_FREE_TOP]`` entries valid).
      state: int64[STATE_LEN], see the STATE_* constants; updated in place.
      out_rows: int32[>= n_unique] out, the row of each unique key or -1.
      new_positions: int32[>= n_unique] out, positions u whose row was just allocated.

    Returns:
      The number of newly allocated rows (entries written to ``new_positions``).
    """
    n_new = 0
    capacity = idx_keys.shape[0]
    for u in range(n_unique):
        # The index is far larger than the caches: fetch the slot of a later key now so that
        # several misses are in flight (as the optimizer kernels do for rows).
        if u + SLOT_PREFETCH_AHEAD < n_unique:
            prefetch_for_write(idx_keys, home_slot(uniq[u + SLOT_PREFETCH_AHEAD], capacity))
        k = uniq[u]
        s = find_or_empty_slot(idx_keys, idx_rows, k)
        r = idx_rows[s]
        if not train:
            out_rows[u] = r if r >= 0 else -1
            continue
        if threshold == 0:  # admit everything, stop counting (Rec SDK's set_threshold(0))
            count = np.int32(0) if r == EMPTY else idx_counts[s]
        elif r == EMPTY:
            count = _saturating_add(0, weight[u])
        else:
            count = _saturating_add(idx_counts[s], weight[u])
        if r < 0 and _admits(count, threshold):
            top = state[STATE_FREE_TOP]
            if top > 0:
                r = free_rows[top - 1]
                state[STATE_FREE_TOP] = top - 1
            else:
                r = np.int32(state[STATE_NEXT_ROW])
                state[STATE_NEXT_ROW] += 1
            new_positions[n_new] = u
            n_new += 1
        elif r == EMPTY:
            r = UNADMITTED
        if idx_rows[s] == EMPTY:
            state[STATE_INDEX_SIZE] += 1
            idx_keys[s] = k
        idx_rows[s] = r
        idx_counts[s] = count
        out_rows[u] = r if r >= 0 else -1
    return n_new


@numba.njit(**_JIT)
def assign_batch(idx_keys, idx_rows, idx_counts, uniq, weight, n_unique, train, threshold,
                 free_rows, state, out_rows, new_positions, last_seen, timestamp,
                 has_timestamp, dirty, last_seen_before, index_room, max_index_keys):
    """One batch's key-side work on a table after its dedup, in one call: room check,
    :func:`assign_rows`, then (training) the batch's timestamps and changed-row marks.

    In order: with fewer free rows than unique keys, :func:`rows_needed` decides whether
    the batch fits (if not, nothing changes); training, the index must have room for every
    unique key (if not, nothing changes: the caller grows it and calls again); rows are
    assigned; ``last_seen_before`` (when
    it has room for the keys) records ``last_seen`` of each key's row as it was; training
    with a timestamp sets a newly allocated row's ``last_seen`` to it and raises every row's
    to at least it; training marks every row ``dirty``.

    Args:
      idx_keys .. new_positions: as :func:`assign_rows`.
      last_seen: int64 per row; must cover every row the call may allocate.
      timestamp: the batch's timestamp (used when ``has_timestamp``).
      dirty: bool per row, as ``last_seen``.
      last_seen_before: int64 ``[n_unique]`` out, or empty to skip.
      index_room: keys the index holds under its load limit.
      max_index_keys: the most keys the index will ever hold (-1: unknown); it needs room
        for no more.

    Returns:
      The number of newly allocated rows; ``-1 - needed`` when the table has fewer free
      rows than the ``needed`` new ones; :data:`NEEDS_INDEX_ROOM` when the index must grow
      first (nothing changed in either case).
    """
    if train:
        free = state[STATE_ROW_LIMIT] - state[STATE_NEXT_ROW] + state[STATE_FREE_TOP]
        if free < n_unique:
            needed = rows_needed(idx_keys, idx_rows, idx_counts, uniq, weight, n_unique,
                                 threshold)
            if needed > free:
                return -1 - needed
        keys_after = state[STATE_INDEX_SIZE] + n_unique
        if max_index_keys >= 0 and keys_after > max_index_keys:
            keys_after = max_index_keys
        if keys_after > index_room:
            return NEEDS_INDEX_ROOM
    n_new = assign_rows(idx_keys, idx_rows, idx_counts, uniq, weight, n_unique, train,
                        threshold, free_rows, state, out_rows, new_positions)
    record = last_seen_before.shape[0] >= n_unique
    if record or train:
        for u in range(n_unique):
            # The per-row arrays are as large as the table: fetch a later key's entries now
            # (this is their first touch in the batch; after_assign finds them cached).
            if u + SLOT_PREFETCH_AHEAD < n_unique:
                ahead = out_rows[u + SLOT_PREFETCH_AHEAD]
                if ahead >= 0:
                    prefetch_for_write(last_seen, ahead)
                    prefetch_for_write(dirty, ahead)
            if record:
                r = out_rows[u]
                last_seen_before[u] = last_seen[r if r >= 0 else 0]
    if train:
        after_assign(out_rows, new_positions, n_unique, n_new, last_seen, timestamp,
                     has_timestamp, dirty)
    return n_new


@numba.njit(**_JIT)
def after_assign(rows, new_positions, n_unique, n_new, last_seen, timestamp, has_timestamp,
                 dirty):
    """A training batch's row marks once its rows are assigned: with a timestamp, a newly
    allocated row's ``last_seen`` is set to it (a reused row must not inherit its old key's
    age) and every row's raised to at least it; every row is marked ``dirty``."""
    if has_timestamp:
        for k in range(n_new):
            last_seen[rows[new_positions[k]]] = timestamp
        touch_rows(last_seen, rows, n_unique, timestamp)
    mark_rows(dirty, rows[:n_unique])


@numba.njit(**_JIT)
def touch_rows(last_seen, rows, n, timestamp):
    """last_seen[row] = max(last_seen[row], timestamp) for each of the first n rows >= 0."""
    for u in range(n):
        r = rows[u]
        if r >= 0 and last_seen[r] < timestamp:
            last_seen[r] = timestamp


@numba.njit(**_JIT)
def mark_rows(marks, rows):
    """marks[row] = True for each row >= 0 of ``rows``."""
    for u in range(rows.shape[0]):
        r = rows[u]
        if r >= 0:
            marks[r] = True


@numba.njit(**_JIT)
def stale_keys(idx_keys, idx_rows, last_seen, clock, threshold):
    """Keys that own a row whose ``clock - last_seen[row] >= threshold`` (eviction candidates).

    Args:
      idx_keys, idx_rows: the index arrays.
      last_seen: int64[rows], each row's last training timestamp.
      clock: the table clock (largest timestamp seen).
      threshold: eviction threshold, >= 0.

    Returns:
      int64 array of keys, in slot order.
    """
    n = 0
    for s in range(idx_keys.shape[0]):
        r = idx_rows[s]
        if r >= 0 and clock - last_seen[r] >= threshold:
            n += 1
    out = np.empty(n, np.int64)
    j = 0
    for s in range(idx_keys.shape[0]):
        r = idx_rows[s]
        if r >= 0 and clock - last_seen[r] >= threshold:
            out[j] = idx_keys[s]
            j += 1
    return out
