"""Numba kernel that fills freshly admitted table rows with their initial values.

Rows are allocated lazily, possibly by several tf.data batches at once, so the initial values of
a key must not depend on which row it got or on the order keys arrived. A sequential RNG would
make them depend on both; instead every key gets its own counter-based stream:

    base(seed, key) = mix64(mix64(seed ^ SEED_SALT) ^ key)
    draw c of key   = mix64(base + (c + 1) * GOLDEN)          (c = 0, 1, 2, ...)

which is exactly a splitmix64 generator seeded with ``base``: no shared state, identical output
for the same (seed, key) on any thread, in any row, in any call. ``mix64`` is a bijection of
64-bit words, so distinct keys of one seed always get distinct bases.

A row consumes its key's stream front to back, so the first ``d`` values of a key do not depend
on ``dim`` (a table with dim 8 holds the prefix of the same key's dim-16 row).

This module must not import TensorFlow: it runs inside tf.data workers and in tools that never
load TF. It is pure numpy + numba.
"""

from __future__ import annotations

import numba
import numpy as np

# Distribution codes passed to the kernel (an int is cheaper to dispatch on than a str in numba).
KIND_CONSTANT = 0
KIND_NORMAL = 1
KIND_TRUNCATED_NORMAL = 2
KIND_UNIFORM = 3

KIND_CODES = {
    "constant": KIND_CONSTANT,
    "normal": KIND_NORMAL,
    "truncated_normal": KIND_TRUNCATED_NORMAL,
    "uniform": KIND_UNIFORM,
}

# splitmix64 constants (Steele, Lea & Flood 2014; the "Mix13" finaliser variant).
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)
# Separates the seed's domain from the key's before they are combined, so seed s / key k and
# seed k / key s do not share a stream.
_SEED_SALT = np.uint64(0xD1B54A32D192ED03)
_SHIFT_30 = np.uint64(30)
_SHIFT_27 = np.uint64(27)
_SHIFT_31 = np.uint64(31)
_SHIFT_11 = np.uint64(11)
_TWO_POW_MINUS_53 = 1.0 / 9007199254740992.0
_TWO_PI = 2.0 * np.pi
# TF's truncated normal redraws any standard draw with |z| >= 2 (random_op.cc, truncate_value).
_TRUNCATE_AT = 2.0


@numba.njit(nogil=True, cache=True, inline="always")
def _mix64(z):
    """splitmix64's finaliser: a bijective avalanche of a uint64."""
    z = (z ^ (z >> _SHIFT_30)) * _MUL1
    z = (z ^ (z >> _SHIFT_27)) * _MUL2
    return z ^ (z >> _SHIFT_31)


@numba.njit(nogil=True, cache=True, inline="always")
def _unit(bits):
    """Uniform float64 in [0, 1) from the top 53 bits (all a double's mantissa can hold)."""
    return np.float64(bits >> _SHIFT_11) * _TWO_POW_MINUS_53


# Acklam's rational approximation of the standard normal quantile (relative error < 1.15e-9,
# far below float32's 6e-8 resolution). Central region: one rational function, no libm call.
_A = (-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
      1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00)
_B = (-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
      6.680131188303472e+01, -1.328068155288572e+01)
_C = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
      -2.549671010050969e+00, 4.374664141464968e+00, 2.938163982698783e+00)
_D = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
      3.754408661907416e+00)
_P_LOW = 0.02425
_P_HIGH = 1.0 - _P_LOW
# Phi(-2) and Phi(2): TF's truncated normal keeps standard draws in (-2, 2); drawing u uniformly
# between these and inverting gives exactly that conditional distribution, with no rejection.
_PHI_MINUS_2 = 0.022750131948179195
_PHI_PLUS_2 = 0.9772498680518208


# The quantile is split in its two regions so that the fill loop can evaluate the central one
# for every value without a branch (it vectorises) and redo only the few values in the tails.
# Each keeps the exact float64 operations of Acklam's scalar formula, so a value does not depend
# on which loop computed it.
@numba.njit(nogil=True, cache=True, inline="always")
def _ndtri_central(u):
    """Standard normal quantile of u in [_P_LOW, _P_HIGH] (Acklam's central rational).

    Branch-free. Outside that range it is finite (its denominator is > 0 on all of [0, 1]) but not
    the quantile: callers redo those u with :func:`_ndtri_tail`."""
    q = u - 0.5
    r = q * q
    return (((((((_A[0] * r + _A[1]) * r + _A[2]) * r + _A[3]) * r + _A[4]) * r + _A[5]) * q)
            / (((((_B[0] * r + _B[1]) * r + _B[2]) * r + _B[3]) * r + _B[4]) * r + 1.0))


@numba.njit(nogil=True, cache=True, inline="always")
def _ndtri_tail(u):
    """Standard normal quantile of u in (0, _P_LOW) or (_P_HIGH, 1) (Acklam's tail rational).

    The lower and upper tail are one formula applied to u or 1 - u, negated for the upper one; they
    are selected rather than branched on (which tail a value is in is a coin flip)."""
    low = u < _P_LOW
    q = np.sqrt(-2.0 * np.log(u if low else 1.0 - u))
    z = ((((((_C[0] * q + _C[1]) * q + _C[2]) * q + _C[3]) * q + _C[4]) * q + _C[5])
         / ((((_D[0] * q + _D[1]) * q + _D[2]) * q + _D[3]) * q + 1.0))
    return z if low else -z


@numba.njit(nogil=True, cache=True)
def key_base(seed, key):
    """Per-key stream base for ``seed`` and ``key`` (both uint64). Exposed for tests."""
    return _mix64(_mix64(seed ^ _SEED_SALT) ^ key)


# Values per block of the inverse-CDF fill: its scratch (~29 KiB) stays in L1 and the vectorised
# loop gets long runs whatever the dim.
_BLOCK_VALUES = 1024


# error_model="numpy": no ZeroDivisionError check on each float division (that branch keeps the
# loop from vectorising). None of these denominators can be 0: the central one is >= 1.1e-4 on
# [_P_LOW, _P_HIGH] (and > 0 on [0, 1]), the tails' are >= 1.
@numba.njit(nogil=True, cache=True, error_model="numpy")
def _fill_inverse_cdf(storage, rows, keys, seed_mixed, u_low, u_width, a, b, dim, slot_values):
    """:func:`fill_rows` for the normal kinds: value c of a key is ``a + b * ndtri(u_c)`` with
    ``u_c = u_low + u_width * (unit(draw c) + 2^-53)``.

    Works on blocks of rows, flattened so that one branch-free loop (splitmix, u and the central
    rational) runs over up to _BLOCK_VALUES values and vectorises. That loop writes the central
    formula for every value and flags those in the tails (~5 % of the values for normal, ~0.3 %
    for truncated normal); the flagged ones are then gathered (skipping 8 flags at a time) and
    recomputed with the tail formula, and the block is copied into its rows.
    """
    n = rows.shape[0]
    n_slots = slot_values.shape[0]
    block_rows = max(1, _BLOCK_VALUES // max(dim, 1))
    size = block_rows * dim
    # Offset of draw c from the key's base: splitmix64's state after c + 1 steps of GOLDEN.
    steps = np.empty(dim, np.uint64)
    step = np.uint64(0)
    for j in range(dim):
        step += _GOLDEN
        steps[j] = step
    states = np.empty(size, np.uint64)
    us = np.empty(size, np.float64)
    values = np.empty(size, np.float32)
    tails = np.empty(size, np.intp)
    # One byte per value, read 8 at a time as a uint64 word (padding bytes stay 0).
    flags = np.zeros((size + 7) & ~7, np.uint8)
    flag_words = flags.view(np.uint64)
    for first in range(0, n, block_rows):
        last = min(first + block_rows, n)
        m = (last - first) * dim
        k = 0
        for i in range(first, last):
            base = _mix64(seed_mixed ^ keys[i])
            for j in range(dim):
                states[k + j] = base + steps[j]
            k += dim
        n_tail = 0
        for k in range(m):
            # +2^-53 keeps u above 0, so the lower tail's log is finite. (For normal, u is 1.0
            # when the draw's top 53 bits are all ones, a 2^-53 chance; that value is NaN.)
            u = u_low + u_width * (_unit(_mix64(states[k])) + _TWO_POW_MINUS_53)
            us[k] = u
            values[k] = np.float32(a + b * _ndtri_central(u))
            tail = (u < _P_LOW) | (u > _P_HIGH)
            flags[k] = tail
            n_tail += tail
        if n_tail:
            # Gather the tail values' indices (one branch per 8 values, not per value: for
            # normal a per-value branch mispredicted on every tail value), then redo them.
            n_gathered = 0
            for w in range((m + 7) >> 3):
                if flag_words[w]:
                    for k in range(w << 3, min((w << 3) + 8, m)):
                        tails[n_gathered] = k
                        n_gathered += flags[k]
            for t in range(n_gathered):
                k = tails[t]
                values[k] = np.float32(a + b * _ndtri_tail(us[k]))
        k = 0
        for i in range(first, last):
            row = storage[rows[i]]
            for j in range(dim):
                row[j] = values[k + j]
            k += dim
            for s in range(n_slots):
                start = dim * (1 + s)
                value = slot_values[s]
                for j in range(dim):
                    row[start + j] = value


@numba.njit(nogil=True, cache=True)
def fill_rows(storage, rows, keys, kind, a, b, upper, seed, dim, slot_values):
    """Writes the initial values of ``keys[i]`` into ``storage[rows[i]]`` for every i.

    No argument checking happens here (the Python wrapper
    :func:`sparseflow.embed.initializers.init_rows` does it once per call); numba does not bounds
    check, so a bad row index would corrupt memory.

    Args:
      storage: float32 [capacity, dim * (1 + n_slots)], C-contiguous, written in place.
      rows: int32/int64 [n], row of each key, each in [0, capacity).
      keys: uint64 [n] (int64 keys viewed as uint64).
      kind: one of the ``KIND_*`` codes.
      a, b: float64 parameters as in ``InitSpec`` (value / mean,stddev / minval,maxval).
      upper: float32, the largest float32 below ``b`` for uniform (keeps values in [a, b) after
        rounding to float32 as TF does); ignored for other kinds.
      seed: uint64 seed.
      dim: int, width of the weight block.
      slot_values: float32 [n_slots], constant written to each slot block.

    Returns:
      None.
    """
    n = rows.shape[0]
    n_slots = slot_values.shape[0]
    # Hoisted out of the loop: it is the same for every key of this call.
    seed_mixed = _mix64(seed ^ _SEED_SALT)
    const_value = np.float32(a)
    lower = np.float32(a)
    width = b - a
    if kind != KIND_CONSTANT and kind != KIND_UNIFORM:  # normal, truncated normal
        # Inverse CDF: one uniform per value, no libm call in the central 95 %; Box-Muller
        # (log, sqrt, sin, cos per pair) was 4x slower and dominated row allocation.
        if kind == KIND_TRUNCATED_NORMAL:
            u_low, u_width = _PHI_MINUS_2, _PHI_PLUS_2 - _PHI_MINUS_2
        else:
            u_low, u_width = 0.0, 1.0
        _fill_inverse_cdf(storage, rows, keys, seed_mixed, u_low, u_width, a, b, dim, slot_values)
        return
    for i in range(n):
        row = storage[rows[i]]
        state = _mix64(seed_mixed ^ keys[i])
        if kind == KIND_CONSTANT:
            for j in range(dim):
                row[j] = const_value
        else:  # KIND_UNIFORM
            for j in range(dim):
                state += _GOLDEN
                v = np.float32(a + width * _unit(_mix64(state)))
                # a + width*u < b in float64, but rounding to float32 can land on b (or just below
                # the float32 nearest to a); clamp to TF's half-open [minval, maxval).
                if width > 0.0:
                    if v > upper:
                        v = upper
                    if v < lower:
                        v = lower
                row[j] = v
        for s in range(n_slots):
            start = dim * (1 + s)
            value = slot_values[s]
            for j in range(dim):
                row[start + j] = value
