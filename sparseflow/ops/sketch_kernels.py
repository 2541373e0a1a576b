"""Fixed-memory sketch kernels for approximate feature statistics.

Three structures, each a few plain numpy arrays whose size is fixed at construction (see
:class:`sparseflow.stats.approx.ApproxFeatureCounter`, which owns them):

HyperLogLog (distinct keys)::

    registers  uint8[2^p]    p = precision

  Each key is hashed to 64 bits, ``h = mix64(key ^ salt)`` (:func:`key_hash`; ``mix64`` is
  :func:`sparseflow.ops.hash_index.mix64`, a bijection, so distinct keys never share a hash).
  The top ``p`` bits pick a register; the register keeps the maximum over its keys of the
  rank (1 + leading zeros) of the remaining ``q = 64 - p`` bits, at most ``q + 1``.
  :func:`hll_estimate` is Ertl's improved raw estimator ("New cardinality estimation
  algorithms for HyperLogLog sketches", 2017, algorithm 6): it works from the histogram of the
  register values, needs no empirical bias tables, and folds the small-range (linear counting)
  regime into one formula, so it has no switch-over bias. Relative standard error about
  ``1.04 / sqrt(2^p)`` over the whole range (0.81 % at p = 14). Merging is the register-wise
  maximum, so a merged sketch equals the one-pass sketch exactly.

Count-min sketch, plain (linear) update (per-key counts)::

    counters  uint32[depth, width]   the table of a :class:`~sparseflow.ops.count_min.CountMinSketch`
    seeds     uint64[depth]

  :func:`cms_count_offer` adds ``w`` to every row's counter of each key (saturating at
  2^32 - 1), with the columns of :func:`sparseflow.ops.count_min.cms_column`, so the table is
  read back with ``CountMinSketch.estimate``. The plain update (not the conservative update of
  ``count_min.cms_add``) keeps the table linear: tables of partial counts add up
  (:func:`saturating_add`) to exactly the table of one pass.

Heavy-hitter candidates (the keys with the largest count-min estimates)::

    hh_keys   int64[H]    a min-heap on hh_vals: the candidates
    hh_vals   int64[H]    each candidate's estimate at its latest offer
    hh_slot   int64[H]    each candidate's slot in hh_index
    hh_index  int64[S]    open-addressing key -> heap position + 1 (0: free); S a power of 2 >= 2H
    hh_meta   int64[1]    the number of candidates

  After each key's count-min update the key is offered with its new estimate: a candidate's
  value is raised, a new key enters while there is room or when its estimate beats the
  heap's minimum (which it then evicts). Estimates only grow, so the minimum only grows, and a
  key that is not a candidate at the end has a true count <= the final minimum: every key
  whose true count exceeds that minimum is a candidate.

Distinct sample (bottom-hash sample of distinct keys, with their exact counts)::

    table     int64[S, 3]  per slot: key, count (0: free), latest timestamp; S = 2^k >= 2K
    meta      int64[2]     level L, keys held

  A key is in the sample iff its sample hash ``g = mix64(h ^ SAMPLE_SALT)`` has its top ``L``
  bits zero (probability 2^-L, independent of how often it occurs). When a new key would make
  it hold more than ``K`` keys, ``L`` grows by one and the keys that no longer qualify are
  dropped. ``L`` only grows, so a key in the sample at the end has been in it since its first
  occurrence: its count and latest timestamp are exact. The sample is a uniform sample of the
  distinct keys (not of the occurrences), so the share of sampled keys with a property
  estimates the share of all distinct keys with it. Merging (:func:`sample_merge`) ends with the
  same level and entries as one pass over both inputs.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from sparseflow.ops.count_min import cms_column, stage_columns
from sparseflow.ops.hash_index import mix64
from sparseflow.ops.stats_kernels import log2_floor

_JIT = dict(nogil=True, cache=True, error_model="numpy", boundscheck=False)

SAMPLE_SALT = np.uint64(0x5851F42D4C957F2D)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_COUNTER_MAX = np.int64(2**32 - 1)
_MAX_LEVEL = 63
PREFETCH_AHEAD = 8


@numba.njit(**_JIT)
def key_hash(key, salt):
    """The 64-bit hash (uint64) of an int64 key for the HyperLogLog and the sample."""
    return mix64(np.uint64(key) ^ salt)


@numba.njit(**_JIT)
def salt_for(seed, which):
    """A hash salt (uint64) derived from ``seed`` (int64 >= 0) and a small int ``which``."""
    return mix64(np.uint64(seed) * _GOLDEN + np.uint64(which) * np.uint64(0xD6E8FEB86659FD93))


# --- HyperLogLog ------------------------------------------------------------------------------

@numba.njit(**_JIT)
def _hll_add(registers, p, h):
    idx = np.int64(h >> np.uint64(64 - p))
    w = h << np.uint64(p)
    q = 64 - p
    rank = 1
    top = np.uint64(1) << np.uint64(63)
    while rank <= q and (w & top) == np.uint64(0):
        w = w << np.uint64(1)
        rank += 1
    if registers[idx] < rank:
        registers[idx] = rank


@numba.njit(**_JIT)
def hll_update(registers, p, salt, keys):
    """Adds ``keys`` (int64 [n]) to the HyperLogLog ``registers`` (uint8 [2^p])."""
    for i in range(keys.shape[0]):
        _hll_add(registers, p, key_hash(keys[i], salt))


@numba.njit(**_JIT)
def _sigma(x):
    if x == 1.0:
        return np.inf
    y = 1.0
    z = x
    while True:
        x = x * x
        z_old = z
        z += x * y
        y += y
        if z == z_old:
            return z


@numba.njit(**_JIT)
def _tau(x):
    if x == 0.0 or x == 1.0:
        return 0.0
    y = 1.0
    z = 1.0 - x
    while True:
        x = math.sqrt(x)
        z_old = z
        y *= 0.5
        z -= (1.0 - x) ** 2 * y
        if z == z_old:
            return z / 3.0


@numba.njit(**_JIT)
def hll_estimate(registers, p):
    """Ertl's improved raw estimate (float) of the distinct keys added to ``registers``."""
    m = registers.shape[0]
    q = 64 - p
    hist = np.zeros(q + 2, np.float64)
    for j in range(m):
        hist[registers[j]] += 1.0
    z = m * _tau(1.0 - hist[q + 1] / m)
    for k in range(q, 0, -1):
        z = 0.5 * (z + hist[k])
    z += m * _sigma(hist[0] / m)
    return m * (m / (2.0 * math.log(2.0))) / z


# --- count-min (plain update) and heavy-hitter candidates ------------------------------------

@numba.njit(**_JIT)
def _hh_find(hh_keys, hh_index, key):
    """Slot of hh_index holding ``key``, else the free slot where it would go."""
    mask = hh_index.shape[0] - 1
    s = np.int64(mix64(np.uint64(key)) & np.uint64(mask))
    while True:
        pos = hh_index[s]
        if pos == 0 or hh_keys[pos - 1] == key:
            return s
        s = (s + 1) & mask


@numba.njit(**_JIT)
def _hh_unindex(hh_keys, hh_slot, hh_index, s):
    """Frees slot ``s`` of hh_index, shifting later entries of its probe run back."""
    mask = hh_index.shape[0] - 1
    i = s
    j = s
    while True:
        j = (j + 1) & mask
        pos = hh_index[j]
        if pos == 0:
            break
        k = np.int64(mix64(np.uint64(hh_keys[pos - 1])) & np.uint64(mask))
        # The entry at j stays unless its home is cyclically outside (i, j].
        if i <= j:
            stays = i < k <= j
        else:
            stays = k > i or k <= j
        if stays:
            continue
        hh_index[i] = pos
        hh_slot[pos - 1] = i
        i = j
    hh_index[i] = 0


@numba.njit(**_JIT)
def _hh_swap(hh_keys, hh_vals, hh_slot, hh_index, a, b):
    ka = hh_keys[a]
    va = hh_vals[a]
    sa = hh_slot[a]
    hh_keys[a] = hh_keys[b]
    hh_vals[a] = hh_vals[b]
    hh_slot[a] = hh_slot[b]
    hh_keys[b] = ka
    hh_vals[b] = va
    hh_slot[b] = sa
    hh_index[hh_slot[a]] = a + 1
    hh_index[hh_slot[b]] = b + 1


@numba.njit(**_JIT)
def _hh_sift_down(hh_keys, hh_vals, hh_slot, hh_index, i, size):
    while True:
        left = 2 * i + 1
        if left >= size:
            return
        child = left
        if left + 1 < size and hh_vals[left + 1] < hh_vals[left]:
            child = left + 1
        if hh_vals[child] >= hh_vals[i]:
            return
        _hh_swap(hh_keys, hh_vals, hh_slot, hh_index, i, child)
        i = child


@numba.njit(**_JIT)
def _hh_sift_up(hh_keys, hh_vals, hh_slot, hh_index, i):
    while i > 0:
        parent = (i - 1) // 2
        if hh_vals[parent] <= hh_vals[i]:
            return
        _hh_swap(hh_keys, hh_vals, hh_slot, hh_index, i, parent)
        i = parent


@numba.njit(**_JIT)
def hh_offer(hh_keys, hh_vals, hh_slot, hh_index, hh_meta, key, est):
    """Offers ``key`` with estimate ``est`` to the candidates (see the module docstring)."""
    cap = hh_keys.shape[0]
    size = hh_meta[0]
    s = _hh_find(hh_keys, hh_index, key)
    pos = hh_index[s]
    if pos != 0:
        p = pos - 1
        if est > hh_vals[p]:
            hh_vals[p] = est
            _hh_sift_down(hh_keys, hh_vals, hh_slot, hh_index, p, size)
        return
    if size < cap:
        hh_keys[size] = key
        hh_vals[size] = est
        hh_slot[size] = s
        hh_index[s] = size + 1
        hh_meta[0] = size + 1
        _hh_sift_up(hh_keys, hh_vals, hh_slot, hh_index, size)
        return
    if est <= hh_vals[0]:
        return
    _hh_unindex(hh_keys, hh_slot, hh_index, hh_slot[0])
    hh_keys[0] = key
    hh_vals[0] = est
    s = _hh_find(hh_keys, hh_index, key)   # the shift may have moved the free slot
    hh_slot[0] = s
    hh_index[s] = 1
    _hh_sift_down(hh_keys, hh_vals, hh_slot, hh_index, 0, size)


@numba.njit(**_JIT)
def cms_count_offer(counters, seeds, keys, weights, hh_keys, hh_vals, hh_slot, hh_index,
                    hh_meta):
    """Plain count-min update, then offers each key to the heavy-hitter candidates.

    For each i in order: every row's counter of ``keys[i]`` grows by ``weights[i]``
    (saturating at 2^32 - 1); the key is then offered with its new estimate (the minimum over
    rows).

    Args:
      counters: uint32 [depth, width], C-contiguous; updated in place.
      seeds: uint64 [depth], the row seeds of the sketch.
      keys: int64 [n].
      weights: int64 [n], each >= 0, or int64 [0] for a weight of 1 per key.
      hh_keys, hh_vals, hh_slot, hh_index, hh_meta: the candidates (module docstring).
    """
    depth = counters.shape[0]
    n = keys.shape[0]
    unit = weights.shape[0] == 0
    ring = np.empty((PREFETCH_AHEAD, depth), np.int64)
    for i in range(min(n, PREFETCH_AHEAD)):
        stage_columns(counters, seeds, keys[i], ring, i)
    for i in range(n):
        slot = i % PREFETCH_AHEAD
        w = np.int64(1) if unit else weights[i]
        low = _COUNTER_MAX
        for r in range(depth):
            col = ring[slot, r]
            c = np.int64(counters[r, col])
            c = _COUNTER_MAX if w >= _COUNTER_MAX - c else c + w
            counters[r, col] = np.uint32(c)
            if c < low:
                low = c
        key = keys[i]
        if i + PREFETCH_AHEAD < n:
            stage_columns(counters, seeds, keys[i + PREFETCH_AHEAD], ring, slot)
        hh_offer(hh_keys, hh_vals, hh_slot, hh_index, hh_meta, key, low)


@numba.njit(**_JIT)
def saturating_add(counters, other):
    """counters += other, element-wise, saturating at 2^32 - 1 (uint32 [depth, width])."""
    for r in range(counters.shape[0]):
        for j in range(counters.shape[1]):
            c = np.int64(counters[r, j]) + np.int64(other[r, j])
            counters[r, j] = np.uint32(c if c < _COUNTER_MAX else _COUNTER_MAX)


@numba.njit(**_JIT)
def hh_rebuild(counters, seeds, candidates, hh_keys, hh_vals, hh_slot, hh_index, hh_meta):
    """Empties the candidates, then offers each of ``candidates`` (int64 [c], repeats allowed)
    with its current count-min estimate, in order."""
    hh_index[:] = 0
    hh_meta[0] = 0
    depth = counters.shape[0]
    width = counters.shape[1]
    for i in range(candidates.shape[0]):
        key = candidates[i]
        low = _COUNTER_MAX
        for r in range(depth):
            c = np.int64(counters[r, cms_column(seeds[r], key, width)])
            if c < low:
                low = c
        hh_offer(hh_keys, hh_vals, hh_slot, hh_index, hh_meta, key, low)


# --- distinct sample --------------------------------------------------------------------------

@numba.njit(**_JIT)
def _sample_hash(key, salt):
    return mix64(key_hash(key, salt) ^ SAMPLE_SALT)


@numba.njit(**_JIT)
def _qualifies(g, level):
    return level == 0 or (g >> np.uint64(64 - level)) == np.uint64(0)


@numba.njit(**_JIT)
def _sample_find(table, key, g):
    mask = table.shape[0] - 1
    s = np.int64(g & np.uint64(mask))
    while True:
        if table[s, 1] == 0 or table[s, 0] == key:
            return s
        s = (s + 1) & mask


@numba.njit(**_JIT)
def _sample_raise(table, meta, salt, level):
    """Raises the level to ``level`` and drops the keys that no longer qualify (rebuilds)."""
    size = meta[1]
    keep_k = np.empty(size, np.int64)
    keep_c = np.empty(size, np.int64)
    keep_t = np.empty(size, np.int64)
    n = 0
    for s in range(table.shape[0]):
        if table[s, 1] != 0 and _qualifies(_sample_hash(table[s, 0], salt), level):
            keep_k[n] = table[s, 0]
            keep_c[n] = table[s, 1]
            keep_t[n] = table[s, 2]
            n += 1
    table[:, 1] = 0
    for i in range(n):
        s = _sample_find(table, keep_k[i], _sample_hash(keep_k[i], salt))
        table[s, 0] = keep_k[i]
        table[s, 1] = keep_c[i]
        table[s, 2] = keep_t[i]
    meta[0] = level
    meta[1] = n


@numba.njit(**_JIT)
def _sample_add(table, meta, capacity, salt, key, count, t):
    """Adds ``count`` occurrences of ``key`` last seen at ``t`` when it qualifies; raises the
    level while a new key would take the sample past ``capacity`` keys."""
    g = _sample_hash(key, salt)
    while True:
        level = meta[0]
        if not _qualifies(g, level):
            return
        s = _sample_find(table, key, g)
        if table[s, 1] != 0:
            table[s, 1] += count
            if table[s, 2] < t:
                table[s, 2] = t
            return
        if meta[1] < capacity:
            table[s, 0] = key
            table[s, 1] = count
            table[s, 2] = t
            meta[1] += 1
            return
        if level >= _MAX_LEVEL:
            return
        _sample_raise(table, meta, salt, level + 1)


@numba.njit(**_JIT)
def hll_sample_update(registers, p, salt, table, meta, capacity, keys, times, timed):
    """Adds ``keys`` (int64 [n]) to the HyperLogLog and to the distinct sample.

    Args:
      registers: uint8 [2^p]; p: the precision; salt: uint64, the key-hash salt.
      table, meta: the sample (module docstring); capacity: K, the most keys it holds.
      keys: int64 [n]; times: int64 [n], each key's timestamp (read only when ``timed``).
    """
    for i in range(keys.shape[0]):
        key = keys[i]
        _hll_add(registers, p, key_hash(key, salt))
        _sample_add(table, meta, capacity, salt, key, 1, times[i] if timed else 0)


@numba.njit(**_JIT)
def sample_merge(table, meta, capacity, salt, other, other_level):
    """Adds the sample ``other`` (int64 [S, 3], at level ``other_level``) into ``table``."""
    if meta[0] < other_level:
        _sample_raise(table, meta, salt, other_level)
    for s in range(other.shape[0]):
        if other[s, 1] != 0:
            _sample_add(table, meta, capacity, salt, other[s, 0], other[s, 1], other[s, 2])


@numba.njit(**_JIT)
def approx_summary(sample_counts, scale, heavy_counts, cutoff, max_threshold):
    """Frequency summaries from a distinct sample (light keys) and the heavy candidates.

    A sampled key with count < ``cutoff`` stands for ``scale`` keys; a candidate with estimate
    >= ``cutoff`` stands for itself (every key whose count is >= ``cutoff`` is a candidate).

    Args:
      sample_counts: int64 [k], the exact counts of the sampled keys (>= 1).
      scale: float, distinct keys / sampled keys.
      heavy_counts: int64 [h], the candidates' count-min estimates.
      cutoff: int >= 1.
      max_threshold: N >= 1.

    Returns:
      float64 arrays (bucket_keys [64], bucket_traffic [64], below_keys [N + 1],
      below_traffic [N + 1], heavy_kept [N + 1]): keys and occurrences per log2 count bucket;
      the keys with count < t and their occurrences; the candidates with estimate >= t
      (index 0 unused).
    """
    bucket_keys = np.zeros(64, np.float64)
    bucket_traffic = np.zeros(64, np.float64)
    below_keys = np.zeros(max_threshold + 1, np.float64)
    below_traffic = np.zeros(max_threshold + 1, np.float64)
    heavy_kept = np.zeros(max_threshold + 1, np.float64)
    # at[c] for c < N: weight of keys with count exactly c (c >= 1); counts >= N are not needed.
    at_keys = np.zeros(max_threshold + 1, np.float64)
    at_traffic = np.zeros(max_threshold + 1, np.float64)
    heavy_at = np.zeros(max_threshold + 1, np.float64)
    for i in range(sample_counts.shape[0]):
        c = sample_counts[i]
        if c >= cutoff:
            continue
        b = log2_floor(c)
        bucket_keys[b] += scale
        bucket_traffic[b] += scale * c
        if c < max_threshold:
            at_keys[c] += scale
            at_traffic[c] += scale * c
    for i in range(heavy_counts.shape[0]):
        c = heavy_counts[i]
        if c < cutoff or c < 1:
            continue
        b = log2_floor(c)
        bucket_keys[b] += 1.0
        bucket_traffic[b] += c
        t = c if c < max_threshold else max_threshold
        heavy_at[t] += 1.0
        if c < max_threshold:
            at_keys[c] += 1.0
            at_traffic[c] += c
    k = 0.0
    w = 0.0
    for t in range(1, max_threshold + 1):
        below_keys[t] = k
        below_traffic[t] = w
        k += at_keys[t]
        w += at_traffic[t]
    h = 0.0
    for t in range(max_threshold, 0, -1):
        h += heavy_at[t]
        heavy_kept[t] = h
    return bucket_keys, bucket_traffic, below_keys, below_traffic, heavy_kept
