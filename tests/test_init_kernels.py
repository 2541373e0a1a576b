"""fill_rows is bit-identical to the original scalar kernel (kept here verbatim as a reference).

The kernel's output is pinned: every table's initial values come from it, so a faster kernel
must write exactly the same float32 bits for every kind, key, dim, seed and slot layout.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest

from sparseflow.ops import init_kernels
from sparseflow.ops.init_kernels import (KIND_CONSTANT, KIND_NORMAL, KIND_TRUNCATED_NORMAL,
                                         KIND_UNIFORM)

# ------------------------------------------------------------------------------------------------
# Reference: the original one-value-at-a-time kernel, copied verbatim (names prefixed _ref).

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)
_SEED_SALT = np.uint64(0xD1B54A32D192ED03)
_SHIFT_30 = np.uint64(30)
_SHIFT_27 = np.uint64(27)
_SHIFT_31 = np.uint64(31)
_SHIFT_11 = np.uint64(11)
_TWO_POW_MINUS_53 = 1.0 / 9007199254740992.0
_A = (-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
      1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00)
_B = (-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
      6.680131188303472e+01, -1.328068155288572e+01)
_C = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
      -2.549671010050969e+00, 4.374664141464968e+00, 2.938163982698783e+00)
_D = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
      3.754408661907416e+00)
_P_LOW = 0.02425
_PHI_MINUS_2 = 0.022750131948179195
_PHI_PLUS_2 = 0.9772498680518208


@numba.njit(nogil=True, inline="always")
def _ref_mix64(z):
    z = (z ^ (z >> _SHIFT_30)) * _MUL1
    z = (z ^ (z >> _SHIFT_27)) * _MUL2
    return z ^ (z >> _SHIFT_31)


@numba.njit(nogil=True, inline="always")
def _ref_unit(bits):
    return np.float64(bits >> _SHIFT_11) * _TWO_POW_MINUS_53


@numba.njit(nogil=True, inline="always")
def _ref_ndtri(u):
    if u < _P_LOW:
        q = np.sqrt(-2.0 * np.log(u))
        return ((((((_C[0] * q + _C[1]) * q + _C[2]) * q + _C[3]) * q + _C[4]) * q + _C[5])
                / ((((_D[0] * q + _D[1]) * q + _D[2]) * q + _D[3]) * q + 1.0))
    if u > 1.0 - _P_LOW:
        q = np.sqrt(-2.0 * np.log(1.0 - u))
        return -((((((_C[0] * q + _C[1]) * q + _C[2]) * q + _C[3]) * q + _C[4]) * q + _C[5])
                 / ((((_D[0] * q + _D[1]) * q + _D[2]) * q + _D[3]) * q + 1.0))
    q = u - 0.5
    r = q * q
    return (((((((_A[0] * r + _A[1]) * r + _A[2]) * r + _A[3]) * r + _A[4]) * r + _A[5]) * q)
            / (((((_B[0] * r + _B[1]) * r + _B[2]) * r + _B[3]) * r + _B[4]) * r + 1.0))


@numba.njit(nogil=True)
def reference_fill_rows(storage, rows, keys, kind, a, b, upper, seed, dim, slot_values):
    n = rows.shape[0]
    n_slots = slot_values.shape[0]
    seed_mixed = _ref_mix64(seed ^ _SEED_SALT)
    const_value = np.float32(a)
    lower = np.float32(a)
    width = b - a
    for i in range(n):
        row = storage[rows[i]]
        state = _ref_mix64(seed_mixed ^ keys[i])
        if kind == KIND_CONSTANT:
            for j in range(dim):
                row[j] = const_value
        elif kind == KIND_UNIFORM:
            for j in range(dim):
                state += _GOLDEN
                v = np.float32(a + width * _ref_unit(_ref_mix64(state)))
                if width > 0.0:
                    if v > upper:
                        v = upper
                    if v < lower:
                        v = lower
                row[j] = v
        else:
            if kind == KIND_TRUNCATED_NORMAL:
                u_low, u_width = _PHI_MINUS_2, _PHI_PLUS_2 - _PHI_MINUS_2
            else:
                u_low, u_width = 0.0, 1.0
            for j in range(dim):
                state += _GOLDEN
                u = u_low + u_width * (_ref_unit(_ref_mix64(state)) + 1.1102230246251565e-16)
                row[j] = np.float32(a + b * _ref_ndtri(u))
        for s in range(n_slots):
            start = dim * (1 + s)
            value = slot_values[s]
            for j in range(dim):
                row[start + j] = value


# ------------------------------------------------------------------------------------------------

# (kind, a, b): a few parameterisations of each kind, including degenerate ones.
KINDS = [
    (KIND_CONSTANT, 0.25, 0.0),
    (KIND_CONSTANT, -3.0, 7.0),
    (KIND_NORMAL, 0.0, 1.0),
    (KIND_NORMAL, 0.5, 2.0),
    (KIND_NORMAL, -1.0, 1e-3),
    (KIND_TRUNCATED_NORMAL, 0.0, 1.0),
    (KIND_TRUNCATED_NORMAL, 1.0, 0.5),
    (KIND_TRUNCATED_NORMAL, 0.0, 0.00707),
    (KIND_UNIFORM, -1.0, 1.0),
    (KIND_UNIFORM, -0.3, 0.7),
    (KIND_UNIFORM, 2.0, 2.0),       # zero width: no clamping
    (KIND_UNIFORM, 1.0, 1.0000001),  # width below float32 resolution: clamping matters
]
DIMS = [1, 3, 8, 16, 17, 64]
SEEDS = [0, 42, 2**63 + 12345, 2**64 - 1]


def _keys(n, seed):
    keys = np.random.default_rng(seed).integers(-2**63, 2**63 - 1, n, dtype=np.int64)
    keys[:6] = [0, -1, 1, -2**63, 2**63 - 1, -5]
    keys[6:200] = np.arange(-97, 97)[:max(0, min(n, 200) - 6)]
    return keys


def _upper(kind, b):
    if kind == KIND_UNIFORM:
        return np.nextafter(np.float32(b), np.float32(-np.inf))
    return np.float32(0.0)


def _fill_both(kind, a, b, seed, dim, keys, slot_values, rows, capacity):
    width = dim * (1 + len(slot_values))
    args = (rows, keys.view(np.uint64), kind, float(a), float(b), _upper(kind, b),
            np.uint64(seed), dim, np.asarray(slot_values, np.float32))
    new = np.full((capacity, width), 9.0, np.float32)
    old = np.full((capacity, width), 9.0, np.float32)
    init_kernels.fill_rows(new, *args)
    reference_fill_rows(old, *args)
    return new, old


@pytest.mark.parametrize("kind,a,b", KINDS, ids=[f"{k}-{a}-{b}" for k, a, b in KINDS])
@pytest.mark.parametrize("dim", DIMS)
def test_fill_rows_is_bit_identical_to_reference(kind, a, b, dim):
    n = 4000 if dim <= 17 else 1500
    for seed in SEEDS:
        keys = _keys(n, seed % 1000)
        rows = np.arange(n, dtype=np.int64)
        new, old = _fill_both(kind, a, b, seed, dim, keys, (), rows, n)
        np.testing.assert_array_equal(new.view(np.uint32), old.view(np.uint32))
        assert np.isfinite(new).all()


@pytest.mark.parametrize("kind,a,b", KINDS[::2], ids=[f"{k}-{a}-{b}" for k, a, b in KINDS[::2]])
@pytest.mark.parametrize("dim", [1, 16, 17])
@pytest.mark.parametrize("slots", [(0.1,), (0.0, -2.5), (1.0, 2.0, 3.0)])
def test_fill_rows_with_slots_and_scattered_int32_rows_is_bit_identical(kind, a, b, dim, slots):
    n, capacity = 3000, 7000
    rng = np.random.default_rng(dim)
    rows = rng.permutation(capacity)[:n].astype(np.int32)
    keys = _keys(n, 7)
    new, old = _fill_both(kind, a, b, 99, dim, keys, slots, rows, capacity)
    np.testing.assert_array_equal(new.view(np.uint32), old.view(np.uint32))
    untouched = np.setdiff1d(np.arange(capacity), rows)
    np.testing.assert_array_equal(new[untouched], 9.0)


@pytest.mark.parametrize("kind", [KIND_NORMAL, KIND_TRUNCATED_NORMAL])
def test_tails_and_region_boundaries_are_exercised(kind):
    # The inverse CDF has three regions; make sure the sample above hits all of them, and that
    # the kernel agrees with the reference there as well (dim 16, many keys).
    n, dim = 20000, 16
    keys = _keys(n, 3)
    new, old = _fill_both(kind, 0.0, 1.0, 5, dim, keys, (), np.arange(n), n)
    np.testing.assert_array_equal(new.view(np.uint32), old.view(np.uint32))
    z = new.ravel()
    # Acklam's tail starts at Phi^-1(0.02425) = -1.973; both kinds reach past it on each side.
    assert (z < -1.98).sum() > 100 and (z > 1.98).sum() > 100
    if kind == KIND_TRUNCATED_NORMAL:
        assert np.abs(z).max() <= 2.0


@pytest.mark.parametrize("kind", [KIND_NORMAL, KIND_TRUNCATED_NORMAL, KIND_UNIFORM])
@pytest.mark.parametrize("dim", [0, 1023, 1024, 1025, 2049])
def test_wide_rows_and_zero_dim_are_bit_identical(kind, dim):
    # Rows as wide as (or wider than) the kernel's working block, and the degenerate dim 0.
    n = 37
    keys = _keys(n, 11)[::-1].copy()  # the fixed keys (0, -1, ...) at the end this time
    new, old = _fill_both(kind, -0.5, 2.0, 8, dim, keys, (3.0,), np.arange(n)[::-1].copy(), n)
    np.testing.assert_array_equal(new.view(np.uint32), old.view(np.uint32))


def test_duplicate_rows_keep_the_last_key():
    # Two keys mapped to one row (not something callers do, but the result must not change).
    n = 3000
    rows = np.arange(n, dtype=np.int64) % 700
    keys = _keys(n, 13)
    for kind in (KIND_NORMAL, KIND_TRUNCATED_NORMAL, KIND_UNIFORM, KIND_CONSTANT):
        new, old = _fill_both(kind, 0.0, 1.0, 21, 16, keys, (0.5,), rows, 700)
        np.testing.assert_array_equal(new.view(np.uint32), old.view(np.uint32))


def test_repeated_keys_and_empty_batch():
    keys = np.array([5, 5, -5, 5, 0, 0], np.int64)
    new, old = _fill_both(KIND_TRUNCATED_NORMAL, 0.0, 1.0, 1, 16, keys, (0.5,),
                          np.arange(6), 6)
    np.testing.assert_array_equal(new.view(np.uint32), old.view(np.uint32))
    np.testing.assert_array_equal(new[0], new[1])
    new, old = _fill_both(KIND_NORMAL, 0.0, 1.0, 1, 16, keys[:0], (0.5,),
                          np.zeros(0, np.int64), 3)
    np.testing.assert_array_equal(new, 9.0)
