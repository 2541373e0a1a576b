"""Fused, lazy sparse-optimizer updates on interleaved row storage.

A table's storage is one C-contiguous ``float32`` array of shape
``[capacity, dim * (1 + n_slots)]``; row ``r`` is ``[weights | slot1 | slot2]``, so updating
one row touches one contiguous span of memory instead of ``1 + n_slots`` scattered ones:

==========  =======  ==============================
optimizer   n_slots  row layout
==========  =======  ==============================
SGD         0        ``[w]``
Adagrad     1        ``[w | accumulator]``
lazy Adam   2        ``[w | m | v]``
FTRL        2        ``[w | accum | linear]``
==========  =======  ==============================

Every ``apply_*`` function is *lazy*: only the rows listed in ``rows`` change (weights and
slots); every other row is left bit-for-bit untouched. Negative entries in ``rows`` mean
"no row" and are skipped. Duplicate rows have their gradients summed first (see
:func:`coalesce_rows`) and then get exactly one update, which makes the result independent of
how a batch happened to repeat an id (Adam and FTRL are nonlinear in ``g``). Checking for
duplicates is one O(n) pass with O(n) scratch; when there are none (the usual case) the inputs
go to the kernel uncopied, and ``assume_unique=True`` skips even that pass.

The numba kernels release the GIL, so a training step may run them in a Python thread beside
TensorFlow; calls on different storages may run concurrently, calls that update the same
rows of one storage must not. They run on one thread each and compute in ``float32``
element by element with ``fastmath`` off, so they agree with TensorFlow's own CPU kernels to
within a few ulps.

The kernels are compiled on first use (about 3 s for all of them per row dtype, int32 or int64)
and cached on disk in ``__pycache__`` next to this file (numba ``cache=True``; a cached start
takes ~0.2 s); set ``NUMBA_CACHE_DIR`` where that directory is read-only.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from sparseflow.ops.batch_kernels import as_tuple
from sparseflow.ops.prefetch import prefetch_for_write as _prefetch_for_write
from sparseflow.validation import INT32_MAX, check_bool, check_float, check_int, fail

__all__ = [
    "apply_lazy_adam",
    "apply_lazy_adam_tables",
    "apply_sgd",
    "apply_adagrad",
    "apply_ftrl",
    "coalesce_rows",
]

# error_model='numpy': division by zero gives inf/nan as in TF instead of raising, and the
# kernels skip the per-division checks. fastmath off: no reassociation or approximate
# reciprocals, so results stay within ulps of TensorFlow's kernels.
_JIT = dict(nogil=True, error_model="numpy", boundscheck=False, cache=True, fastmath=False)

_ROW_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))

# Fibonacci hashing: multiplying by 2**64 / golden ratio spreads consecutive or strided ids
# (the common case for embedding ids) evenly over the table's top bits.
_HASH_MULT = np.uint64(0x9E3779B97F4A7C15)


# --------------------------------------------------------------------------------------------
# Software prefetch.
#
# Rows are random in a table far larger than cache, so the update loops are bound by memory
# latency, not arithmetic: each kernel prefetches the row it will update `ahead` iterations
# later, which keeps many misses in flight and made lazy Adam 2.5-7x faster
# (BENCHMARKS.md). `ahead` is set so that about _PREFETCH_LINES cache lines
# are in flight: fewer leaves the memory system idle, more evicts rows before their turn
# (measured best at 96-192 lines for dim 8 to 128). Inner loops index 1-D row slices so LLVM
# can prove the indices non-negative and vectorise them. The look-ahead test sits in each
# kernel: moving it (and `rows`) into the inlined helper measured 2.5x slower.
# --------------------------------------------------------------------------------------------

_PREFETCH_LINES = 128
_SCAN_AHEAD = 16
_CACHE_LINE_FLOATS = 16


@numba.njit(**_JIT)
def _prefetch_distance(width):
    """Rows to look ahead for storage rows of `width` float32s (+1 line: rows straddle lines)."""
    lines = (width * 4 + 63) // 64 + 1
    return max(2, min(64, _PREFETCH_LINES // lines))


@numba.njit(inline="always", **_JIT)
def _prefetch_row(storage, r, width):
    """Prefetches storage row r (all `width` floats) for writing; skips r < 0."""
    if r >= 0:
        for c in range(0, width, _CACHE_LINE_FLOATS):
            _prefetch_for_write(storage, (r, c))
        # numpy aligns large arrays to 16 bytes, not 64, so a row usually straddles one more
        # cache line than width/16; its last element's line is the one the loop can miss.
        _prefetch_for_write(storage, (r, width - 1))


# --------------------------------------------------------------------------------------------
# Coalescing duplicate rows.
# --------------------------------------------------------------------------------------------


@numba.njit(**_JIT)
def _scan_rows(rows):
    """One pass over ``rows``: first-occurrence unique index of every entry.

    Returns (slot_of, first, n_unique, max_row):
      slot_of[i]: index into the unique list of rows[i], or -1 where rows[i] < 0.
      first[u]: position in ``rows`` of the first occurrence of unique row u (u < n_unique).
      max_row: largest row seen, -1 if none.
    """
    n = rows.shape[0]
    # Open addressing with linear probing at load factor <= 1/2: expected probes stay ~1.5,
    # and the table is O(n) (never O(capacity)). Slots hold unique indices, keys are read back
    # through `first`, which keeps the scratch at 4 bytes a slot.
    bits = 1
    while (1 << bits) < 2 * n:
        bits += 1
    mask = (1 << bits) - 1
    shift = np.uint64(64 - bits)
    table = np.full(1 << bits, -1, dtype=np.int32)
    slot_of = np.empty(n, dtype=np.int32)
    first = np.empty(n, dtype=np.int32)
    n_unique = 0
    max_row = -1
    for i in range(n):
        # The scratch table outgrows L2 from ~100k rows; prefetching the slot a later row will
        # probe overlaps those misses (measured 5% faster at 100k rows, 15% at 1M).
        if i + _SCAN_AHEAD < n:
            ahead = rows[i + _SCAN_AHEAD]
            if ahead >= 0:
                _prefetch_for_write(table, np.int64((np.uint64(ahead) * _HASH_MULT) >> shift))
        r = rows[i]
        if r < 0:
            slot_of[i] = -1
            continue
        if r > max_row:
            max_row = r
        h = np.int64((np.uint64(r) * _HASH_MULT) >> shift)
        while True:
            u = table[h]
            if u < 0:
                table[h] = n_unique
                first[n_unique] = i
                slot_of[i] = n_unique
                n_unique += 1
                break
            if rows[first[u]] == r:
                slot_of[i] = u
                break
            h = (h + 1) & mask
    return slot_of, first, n_unique, max_row


@numba.njit(**_JIT)
def _gather_sum(rows, grads, slot_of, first, n_unique):
    """Unique rows in first-occurrence order and their summed gradients (float32, in order)."""
    dim = grads.shape[1]
    out_rows = np.empty(n_unique, dtype=rows.dtype)
    for u in range(n_unique):
        out_rows[u] = rows[first[u]]
    out_grads = np.zeros((n_unique, dim), dtype=np.float32)
    for i in range(rows.shape[0]):
        u = slot_of[i]
        if u < 0:
            continue
        for j in range(dim):
            out_grads[u, j] += grads[i, j]
    return out_rows, out_grads


@numba.njit(**_JIT)
def _no_duplicates(rows, capacity):
    """True iff the non-negative entries of ``rows`` are distinct and all below ``capacity``.

    The hot path of every ``apply_*``: rows usually come from unique keys, so this check
    passes, and it is cheaper than :func:`_scan_rows` (one load per probe, not three chained;
    stops at the first duplicate). Scratch stays O(n): a bitmap over ``[0, capacity)`` when
    that is no larger than the hash table it replaces (capacity <= 32 slots per row of the
    table; at 100k rows of a 1M-row table it is 8x smaller, fits L2, and measured 0.17 ms
    against 0.48 ms for the hash), else an int32-keyed hash, exact because the caller only
    passes capacity <= 2**31 - 1 and a row at or above capacity returns False at once.
    """
    n = rows.shape[0]
    bits = 1
    while (1 << bits) < 2 * n:
        bits += 1
    if capacity <= 32 * (1 << bits):
        words = np.zeros((capacity + 63) >> 6, dtype=np.uint64)
        one = np.uint64(1)
        for i in range(n):
            r = rows[i]
            if r < 0:
                continue
            if r >= capacity:
                return False
            bit = one << np.uint64(r & 63)
            word = words[r >> 6]
            if word & bit:
                return False
            words[r >> 6] = word | bit
        return True
    mask = (1 << bits) - 1
    shift = np.uint64(64 - bits)
    table = np.full(1 << bits, -1, dtype=np.int32)
    for i in range(n):
        if i + _SCAN_AHEAD < n:
            ahead = rows[i + _SCAN_AHEAD]
            if ahead >= 0:
                _prefetch_for_write(table, np.int64((np.uint64(ahead) * _HASH_MULT) >> shift))
        r = rows[i]
        if r < 0:
            continue
        if r >= capacity:
            return False
        key = np.int32(r)
        h = np.int64((np.uint64(r) * _HASH_MULT) >> shift)
        while True:
            t = table[h]
            if t < 0:
                table[h] = key
                break
            if t == key:
                return False
            h = (h + 1) & mask
    return True


@numba.njit(**_JIT)
def _max_row(rows):
    m = -1
    for i in range(rows.shape[0]):
        if rows[i] > m:
            m = rows[i]
    return m


def _coalesce_checked(rows, grads):
    """Coalesces already-validated inputs. Returns (rows, grads, max_row); max_row -1 if empty."""
    if rows.shape[0] == 0:
        return rows, grads, -1
    slot_of, first, n_unique, max_row = _scan_rows(rows)
    if n_unique == rows.shape[0]:
        # No duplicates and no negatives: the inputs already are the answer, so skip the copy.
        return rows, grads, int(max_row)
    out_rows, out_grads = _gather_sum(rows, grads, slot_of, first, n_unique)
    return out_rows, out_grads, int(max_row)


def coalesce_rows(rows: np.ndarray, grads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drops negative rows and sums the gradients of duplicate rows.

    Runs in O(n) time with O(n) scratch (an open-addressing hash table of about 2n slots); it
    never allocates anything proportional to the table's capacity.

    Args:
      rows: 1-D ``int32`` or ``int64`` array of length n. Negative entries mean "no row" and
        are dropped; duplicates are merged.
      grads: C-contiguous ``float32`` array of shape ``[n, dim]``; ``grads[i]`` belongs to
        ``rows[i]``.

    Returns:
      ``(unique_rows, summed_grads)``: ``unique_rows`` has the dtype of ``rows`` and lists each
      non-negative row once, in order of first occurrence; ``summed_grads`` is ``float32`` of
      shape ``[len(unique_rows), dim]``, the sum (in occurrence order, in float32) of the
      gradients of that row. When ``rows`` has no duplicates and no negative entries the inputs
      themselves are returned (not copies), so treat the results as read-only views.

    Raises:
      ValueError: ``rows`` or ``grads`` has the wrong dtype, rank or layout, or their lengths
        differ.
    """
    rows, grads = _check_rows_grads(rows, grads)
    out_rows, out_grads, _ = _coalesce_checked(rows, grads)
    return out_rows, out_grads


# --------------------------------------------------------------------------------------------
# Update kernels. Each takes unique rows, in range; negative rows are skipped (the no-duplicate
# fast path hands them over uncopied). Scalars arrive as np.float32 so every expression stays
# in float32, as in TF's kernels.
# --------------------------------------------------------------------------------------------

@numba.njit(**_JIT)
def _sgd_kernel(storage, rows, grads, ahead, lr, wd):
    dim = grads.shape[1]
    n = rows.shape[0]
    width = storage.shape[1]
    for k in range(n):
        if k + ahead < n:
            _prefetch_row(storage, rows[k + ahead], width)
        r = rows[k]
        if r < 0:
            continue
        w = storage[r, :dim]
        g = grads[k]
        for j in range(dim):
            w[j] -= lr * (g[j] + wd * w[j])


@numba.njit(**_JIT)
def _adagrad_kernel(storage, rows, grads, ahead, lr):
    dim = grads.shape[1]
    n = rows.shape[0]
    width = storage.shape[1]
    for k in range(n):
        if k + ahead < n:
            _prefetch_row(storage, rows[k + ahead], width)
        r = rows[k]
        if r < 0:
            continue
        row = storage[r]
        w = row[:dim]
        acc = row[dim:2 * dim]
        g = grads[k]
        for j in range(dim):
            a = acc[j] + g[j] * g[j]
            acc[j] = a
            w[j] -= lr * g[j] / np.sqrt(a)


@numba.njit(**_JIT)
def _adam_kernel(storage, rows, grads, ahead, lr_t, b1, omb1, b2, omb2, eps):
    dim = grads.shape[1]
    n = rows.shape[0]
    width = storage.shape[1]
    for k in range(n):
        if k + ahead < n:
            _prefetch_row(storage, rows[k + ahead], width)
        r = rows[k]
        if r < 0:
            continue
        row = storage[r]
        w = row[:dim]
        m = row[dim:2 * dim]
        v = row[2 * dim:3 * dim]
        g = grads[k]
        for j in range(dim):
            gj = g[j]
            mj = b1 * m[j] + omb1 * gj
            vj = b2 * v[j] + omb2 * (gj * gj)
            m[j] = mj
            v[j] = vj
            w[j] -= lr_t * mj / (np.sqrt(vj) + eps)


@numba.njit(**_JIT)
def _adam_tables(storages, rows, grads, lr_t, b1, omb1, b2, omb2, eps):
    """:func:`_adam_kernel` on every table: ``storages``, ``rows``, ``grads`` are tuples
    (one entry per table), ``lr_t`` float32 per table. Returns the first table with a row at
    or past its capacity, checked before anything is updated, else -1."""
    for t in range(len(storages)):
        r = rows[t]
        capacity = storages[t].shape[0]
        for k in range(r.shape[0]):
            if r[k] >= capacity:
                return t
    for t in range(len(storages)):
        adam_update(storages[t], rows[t], grads[t], lr_t[t], b1, omb1, b2, omb2, eps)
    return -1


@numba.njit(**_JIT)
def adam_update(storage, rows, grads, lr_t, b1, omb1, b2, omb2, eps):
    """The lazy Adam kernel on one storage, prefetching as its row width allows: rows
    distinct (negative: skipped) and inside the storage (the caller checks), the
    hyper-parameters float32 as :func:`apply_lazy_adam` derives them
    (:func:`adam_step_rate` for ``lr_t``)."""
    _adam_kernel(storage, rows, grads, _prefetch_distance(storage.shape[1]), lr_t, b1, omb1,
                 b2, omb2, eps)


@numba.njit(**_JIT)
def adam_step_rate(learning_rate, b1, b2, step):
    """Adam's step size with bias correction, ``learning_rate * sqrt(1 - b2^step) /
    (1 - b1^step)``, float32. Like TF, the correction uses the betas as rounded to float32
    (``b1``, ``b2``), so it stays consistent with the float32 (1 - beta) in the moments (at
    step 1 the update is then lr * sign(g)); the powers are taken in float64 and rounded
    once, so a large ``step`` loses nothing."""
    b1d = np.float64(b1)
    b2d = np.float64(b2)
    t = np.float64(step)
    return np.float32(learning_rate * math.sqrt(1.0 - math.pow(b2d, t))
                      / (1.0 - math.pow(b1d, t)))


@numba.njit(**_JIT)
def _ftrl_kernel(storage, rows, grads, ahead, lr, neg_power, l1, l2x2, zero, use_sqrt):
    # use_sqrt: lr_power == -0.5 (the usual setting). TF then switches to sqrt, which is
    # correctly rounded where powf(x, 0.5) may be an ulp off, and is much cheaper.
    dim = grads.shape[1]
    n = rows.shape[0]
    width = storage.shape[1]
    for k in range(n):
        if k + ahead < n:
            _prefetch_row(storage, rows[k + ahead], width)
        r = rows[k]
        if r < 0:
            continue
        row = storage[r]
        w = row[:dim]
        accum = row[dim:2 * dim]
        linear = row[2 * dim:3 * dim]
        g = grads[k]
        for j in range(dim):
            gj = g[j]
            acc = accum[j]
            new_acc = acc + gj * gj
            if use_sqrt:
                p_new = np.sqrt(new_acc)
                p_old = np.sqrt(acc)
            else:
                p_new = new_acc ** neg_power
                p_old = acc ** neg_power
            # Same expression order as TF's SparseApplyFtrl functor, so results agree to ulps.
            lin = linear[j] + (gj - (p_new - p_old) / lr * w[j])
            linear[j] = lin
            accum[j] = new_acc
            # TF writes clip(lin, -l1, l1) - lin, which is exactly these three cases.
            if lin > l1:
                w[j] = (l1 - lin) / (p_new / lr + l2x2)
            elif lin < -l1:
                w[j] = (-l1 - lin) / (p_new / lr + l2x2)
            else:
                w[j] = zero


# --------------------------------------------------------------------------------------------
# Validation.
# --------------------------------------------------------------------------------------------


def _describe(a):
    if not isinstance(a, np.ndarray):
        return type(a).__name__
    flags = "C-contiguous" if a.flags.c_contiguous else "not C-contiguous"
    if not a.flags.writeable:
        flags += ", read-only"
    return f"array(shape={a.shape}, dtype={a.dtype}, {flags})"


def _check_rows_grads(rows, grads):
    """Checks rows/grads; returns rows made contiguous (a no-op in the usual case)."""
    if not isinstance(rows, np.ndarray) or rows.dtype not in _ROW_DTYPES or rows.ndim != 1:
        fail("rows", "a 1-D numpy array of int32 or int64", _Raw(_describe(rows)))
    if (not isinstance(grads, np.ndarray) or grads.dtype != np.float32 or grads.ndim != 2
            or not grads.flags.c_contiguous):
        fail("grads", "a C-contiguous 2-D numpy array of float32 [n, dim]",
             _Raw(_describe(grads)))
    if rows.shape[0] != grads.shape[0]:
        fail("rows", f"as long as `grads` ({grads.shape[0]} rows)",
             _Raw(f"length {rows.shape[0]}"))
    if grads.shape[1] == 0:
        fail("grads", "an array with dim >= 1 columns", _Raw(_describe(grads)))
    return np.ascontiguousarray(rows), grads


def _check_storage(storage, dim, n_slots, optimizer):
    if (not isinstance(storage, np.ndarray) or storage.dtype != np.float32 or storage.ndim != 2
            or not storage.flags.c_contiguous or not storage.flags.writeable):
        fail("storage", "a writeable C-contiguous 2-D numpy array of float32",
             _Raw(_describe(storage)))
    width = dim * (1 + n_slots)
    if storage.shape[1] != width:
        fail("storage",
             f"{width} columns wide for {optimizer} with dim={dim} "
             f"(dim * (1 + {n_slots} slots), dim taken from `grads`)",
             _Raw(f"shape {storage.shape}"))


class _Raw:
    """Shows a description verbatim in `fail`'s "Received: ..." (its repr is the text)."""

    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return self.text


def _prepare(storage, rows, grads, n_slots, optimizer, assume_unique):
    """Validates, then coalesces only if needed.

    Returns:
      (rows, grads, ahead) ready for a kernel (rows unique; negative rows may remain, kernels
      skip them), or None when there is nothing to update.
    """
    rows, grads = _check_rows_grads(rows, grads)
    _check_storage(storage, grads.shape[1], n_slots, optimizer)
    assume_unique = check_bool("assume_unique", assume_unique)
    capacity = storage.shape[0]
    if rows.shape[0] == 0:
        return None
    if assume_unique:
        max_row = int(_max_row(rows))
    elif capacity <= INT32_MAX and _no_duplicates(rows, capacity):
        # Unique and in range: the kernels take the inputs as they are, negatives included.
        max_row = -1
    else:
        rows, grads, max_row = _coalesce_checked(rows, grads)
    if max_row >= capacity:
        raise IndexError(
            f"Argument `rows` contains row {max_row}, but `storage` has capacity {capacity} "
            f"(valid rows are 0 to {capacity - 1}, negative means skip)."
        )
    if rows.shape[0] == 0:
        return None
    return rows, grads, _prefetch_distance(storage.shape[1])


_f32 = np.float32


# --------------------------------------------------------------------------------------------
# Public API.
# --------------------------------------------------------------------------------------------


def apply_lazy_adam(storage: np.ndarray, rows: np.ndarray, grads: np.ndarray, *,
                    learning_rate: float, beta1: float, beta2: float, epsilon: float,
                    step: int, assume_unique: bool = False) -> None:
    """Applies one lazy Adam update, in place, to the listed rows of ``[w | m | v]`` storage.

    Matches TF's ``LazyAdamOptimizer``: with ``lr_t = learning_rate * sqrt(1 - beta2**step) /
    (1 - beta1**step)``, each touched row does ``m = beta1*m + (1-beta1)*g;
    v = beta2*v + (1-beta2)*g*g; w -= lr_t * m / (sqrt(v) + epsilon)``, in float32.
    Rows not listed keep their weights and moments unchanged.

    Args:
      storage: writeable C-contiguous ``float32`` array ``[capacity, 3*dim]``, rows laid out
        ``[w | m | v]``. Updated in place.
      rows: 1-D ``int32``/``int64`` row ids, length n; negative means skip; duplicates have
        their gradients summed before the (single) update.
      grads: C-contiguous ``float32`` ``[n, dim]``.
      learning_rate: finite float.
      beta1, beta2: floats in [0, 1).
      epsilon: float >= 0.
      step: 1-based count of updates this optimizer has applied, this one included.
      assume_unique: the caller guarantees no row appears twice (e.g. rows of unique keys), so
        the duplicate scan is skipped; negative rows are still skipped and rows are still
        range-checked. Duplicates passed anyway get one update per occurrence, in order.

    Returns:
      None.

    Raises:
      ValueError: an array has the wrong dtype, rank, layout or width, the lengths of ``rows``
        and ``grads`` differ, or a hyperparameter is out of range.
      TypeError: a hyperparameter is not a number (``step`` not an int), or
        ``assume_unique`` is not a bool.
      IndexError: a row is >= ``storage.shape[0]``; nothing is updated then.
    """
    learning_rate = check_float("learning_rate", learning_rate)
    beta1 = check_float("beta1", beta1, 0.0, 1.0, high_open=True)
    beta2 = check_float("beta2", beta2, 0.0, 1.0, high_open=True)
    epsilon = check_float("epsilon", epsilon, 0.0)
    step = check_int("step", step, 1)
    prepared = _prepare(storage, rows, grads, 2, "lazy Adam", assume_unique)
    if prepared is None:
        return
    rows, grads, ahead = prepared
    b1, b2 = _f32(beta1), _f32(beta2)
    one = _f32(1.0)
    # numba hands a float32 result back to Python as a float: rounded, but the kernel would
    # be compiled for a float64 lr_t without _f32.
    lr_t = _f32(adam_step_rate(learning_rate, b1, b2, step))
    _adam_kernel(storage, rows, grads, ahead, lr_t, b1, one - b1, b2, one - b2, _f32(epsilon))


def apply_lazy_adam_tables(storages: tuple, rows: tuple, grads: tuple, steps: list, *,
                           learning_rate: float, beta1: float, beta2: float,
                           epsilon: float) -> None:
    """:func:`apply_lazy_adam` with ``assume_unique=True`` on several tables in one kernel
    call: one update of ``storages[t]`` at ``rows[t]`` by ``grads[t]`` at step ``steps[t]``.
    With 26 tables per batch, the checks and dispatch of 26 calls cost more than the updates.

    Args:
      storages: tuple of writeable C-contiguous float32 ``[capacity, 3*dim]`` arrays.
      rows: tuple of int32 arrays, each distinct (negative: skip), one per storage.
      grads: tuple of C-contiguous float32 ``[n, dim]`` arrays, ``n`` as its ``rows``.
      steps: each table's 1-based update count, this one included.
      learning_rate, beta1, beta2, epsilon: as :func:`apply_lazy_adam`.

    Returns:
      None.

    Raises:
      ValueError: the tuples differ in length, or an array's dtype, layout, width or length
        does not fit (as :func:`apply_lazy_adam`).
      IndexError: a row is past its storage's capacity; nothing is updated then.
    """
    if not len(storages) == len(rows) == len(grads) == len(steps):
        fail("rows", f"one entry per storage ({len(storages)})",
             _Raw(f"{len(rows)} rows, {len(grads)} grads, {len(steps)} steps"))
    if not storages:
        return
    for t, (storage, r, g) in enumerate(zip(storages, rows, grads)):
        _check_rows_grads(r, g)
        _check_storage(storage, g.shape[1], 2, "lazy Adam")
        if r.dtype != np.int32 and r.shape[0] and int(r.max()) >= storage.shape[0]:
            # Checked before the rows become int32, which would wrap them.
            _raise_past_capacity(t, int(r.max()), storage.shape[0])
    rows = as_tuple(np.asarray(r, np.int32) for r in rows)
    grads = as_tuple(grads)
    b1, b2 = _f32(beta1), _f32(beta2)
    one = _f32(1.0)
    lr_t = np.array([adam_step_rate(learning_rate, b1, b2, step) for step in steps],
                    np.float32)
    bad = _adam_tables(storages, rows, grads, lr_t, b1, one - b1, b2, one - b2,
                       _f32(epsilon))
    if bad >= 0:
        _raise_past_capacity(bad, int(rows[bad].max()), storages[bad].shape[0])


def _raise_past_capacity(table: int, row: int, capacity: int):
    raise IndexError(
        f"Argument `rows` of table {table} contains row {row}, but its storage has capacity "
        f"{capacity} (valid rows are 0 to {capacity - 1}, negative means skip).")


def apply_sgd(storage: np.ndarray, rows: np.ndarray, grads: np.ndarray, *,
              learning_rate: float, weight_decay: float = 0.0,
              assume_unique: bool = False) -> None:
    """Applies one SGD step, in place, to the listed rows of ``[w]`` storage.

    Each touched row does ``w -= learning_rate * (g + weight_decay * w)`` in float32, where
    ``g`` is the summed gradient of that row. Other rows are unchanged.

    Args:
      storage: writeable C-contiguous ``float32`` array ``[capacity, dim]``. Updated in place.
      rows: 1-D ``int32``/``int64`` row ids, length n; negative means skip; duplicates summed.
      grads: C-contiguous ``float32`` ``[n, dim]``.
      learning_rate: finite float.
      weight_decay: finite float >= 0, decoupled L2 applied only to touched rows.
      assume_unique: the caller guarantees no row appears twice (e.g. rows of unique keys), so
        the duplicate scan is skipped; negative rows are still skipped and rows are still
        range-checked. Duplicates passed anyway get one update per occurrence, in order.

    Returns:
      None.

    Raises:
      ValueError: bad array dtype/rank/layout/width, mismatched lengths, or a hyperparameter
        out of range.
      TypeError: a hyperparameter is not a number, or ``assume_unique`` is not a bool.
      IndexError: a row is >= ``storage.shape[0]``; nothing is updated then.
    """
    learning_rate = check_float("learning_rate", learning_rate)
    weight_decay = check_float("weight_decay", weight_decay, 0.0)
    prepared = _prepare(storage, rows, grads, 0, "SGD", assume_unique)
    if prepared is None:
        return
    rows, grads, ahead = prepared
    _sgd_kernel(storage, rows, grads, ahead, _f32(learning_rate), _f32(weight_decay))


def apply_adagrad(storage: np.ndarray, rows: np.ndarray, grads: np.ndarray, *,
                  learning_rate: float, assume_unique: bool = False) -> None:
    """Applies one Adagrad step, in place, to the listed rows of ``[w | accumulator]`` storage.

    TF ``ApplyAdagrad`` semantics: ``acc += g*g; w -= learning_rate * g / sqrt(acc)`` in
    float32, with ``g`` the summed gradient of the row. Other rows are unchanged. Initialise
    the accumulator to a positive value (TF's default is 0.1) or a zero gradient on a fresh
    row divides 0 by 0.

    Args:
      storage: writeable C-contiguous ``float32`` array ``[capacity, 2*dim]``, rows laid out
        ``[w | accumulator]``. Updated in place.
      rows: 1-D ``int32``/``int64`` row ids, length n; negative means skip; duplicates summed.
      grads: C-contiguous ``float32`` ``[n, dim]``.
      learning_rate: finite float.
      assume_unique: the caller guarantees no row appears twice (e.g. rows of unique keys), so
        the duplicate scan is skipped; negative rows are still skipped and rows are still
        range-checked. Duplicates passed anyway get one update per occurrence, in order.

    Returns:
      None.

    Raises:
      ValueError: bad array dtype/rank/layout/width, mismatched lengths, or a hyperparameter
        out of range.
      TypeError: a hyperparameter is not a number, or ``assume_unique`` is not a bool.
      IndexError: a row is >= ``storage.shape[0]``; nothing is updated then.
    """
    learning_rate = check_float("learning_rate", learning_rate)
    prepared = _prepare(storage, rows, grads, 1, "Adagrad", assume_unique)
    if prepared is None:
        return
    rows, grads, ahead = prepared
    _adagrad_kernel(storage, rows, grads, ahead, _f32(learning_rate))


def apply_ftrl(storage: np.ndarray, rows: np.ndarray, grads: np.ndarray, *,
               learning_rate: float, learning_rate_power: float, l1: float, l2: float,
               assume_unique: bool = False) -> None:
    """Applies one FTRL-Proximal step, in place, to the listed rows of ``[w | accum | linear]``.

    TF ``ResourceSparseApplyFtrl`` semantics (``l2_shrinkage=0``, ``multiply_linear_by_lr``
    false), in float32, with ``g`` the summed gradient of the row and ``p = -lr_power``::

        accum_new = accum + g*g
        linear += g - (accum_new**p - accum**p) / learning_rate * w
        quadratic = accum_new**p / learning_rate + 2*l2
        w = (sign(linear)*l1 - linear) / quadratic if |linear| > l1 else 0
        accum = accum_new

    Other rows are unchanged.

    Args:
      storage: writeable C-contiguous ``float32`` array ``[capacity, 3*dim]``, rows laid out
        ``[w | accum | linear]``. Updated in place.
      rows: 1-D ``int32``/``int64`` row ids, length n; negative means skip; duplicates summed.
      grads: C-contiguous ``float32`` ``[n, dim]``.
      learning_rate: float > 0.
      learning_rate_power: float <= 0 (usually -0.5, which uses sqrt as TF does).
      l1, l2: floats >= 0.
      assume_unique: the caller guarantees no row appears twice (e.g. rows of unique keys), so
        the duplicate scan is skipped; negative rows are still skipped and rows are still
        range-checked. Duplicates passed anyway get one update per occurrence, in order.

    Returns:
      None.

    Raises:
      ValueError: bad array dtype/rank/layout/width, mismatched lengths, or a hyperparameter
        out of range.
      TypeError: a hyperparameter is not a number, or ``assume_unique`` is not a bool.
      IndexError: a row is >= ``storage.shape[0]``; nothing is updated then.
    """
    learning_rate = check_float("learning_rate", learning_rate, 0.0, low_open=True)
    learning_rate_power = check_float("learning_rate_power", learning_rate_power, high=0.0)
    l1 = check_float("l1", l1, 0.0)
    l2 = check_float("l2", l2, 0.0)
    prepared = _prepare(storage, rows, grads, 2, "FTRL", assume_unique)
    if prepared is None:
        return
    rows, grads, ahead = prepared
    lr, f_l1, l2x2, zero = _f32(learning_rate), _f32(l1), _f32(2.0) * _f32(l2), _f32(0.0)
    power = _f32(learning_rate_power)
    _ftrl_kernel(storage, rows, grads, ahead, lr, -power, f_l1, l2x2, zero,
                 bool(power == _f32(-0.5)))
