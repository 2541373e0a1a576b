"""Sparse optimizer updates as TensorFlow ops with compiled kernels (``ops/tf_capi.py``).

``lazy_adam_tables``: one lazy Adam update of every table of a batch at its unique rows, the
kernel of ``optimizer_kernels.apply_lazy_adam_tables``, run as a TensorFlow op instead of a
``tf.numpy_function``: the step's update no longer enters Python or waits for the GIL. The
tables are named by registry tokens (``ops/table_registry.py``); per table, the op counts
the update's step in the registry, marks the rows for the next incremental checkpoint and
queues a DRAIN for the key processor (evicted rows its batches held may be reused), as
``SparseOptimizer.apply_at_tables`` does through ``SparseTable.after_update``.
"""

from __future__ import annotations

import numba
import numpy as np
import tensorflow as tf
from numba import types

from sparseflow.ops import table_registry as registry
from sparseflow.ops import tf_capi as capi
from sparseflow.ops.batch_ops import rows_in_range
from sparseflow.ops.key_kernels import mark_rows
from sparseflow.ops.optimizer_kernels import adam_step_rate, adam_update

LAZY_ADAM_TABLES = "SparseflowLazyAdamTables"

_BAD_LAYOUT = capi.message_bytes(
    "SparseflowLazyAdamTables: tables must be int64 [N], hparams float64 [4] (learning_rate, "
    "beta1, beta2, epsilon), each table's rows int32 [U] and grads float32 [U, dim] with "
    "its rows [w | m | v] 3 * dim wide")
_UNKNOWN_TABLE = capi.message_bytes(
    "SparseflowLazyAdamTables: a table token names no table alive in this process (the "
    "table was released by terminate_config_initializer(), or the graph was built in "
    "another process)")
_NO_STORAGE = capi.message_bytes(
    "SparseflowLazyAdamTables: a table has no rows allocated yet (start_asc_pipeline() "
    "allocates them)")
_BAD_ROW = capi.message_bytes(
    "SparseflowLazyAdamTables: a row index is outside its table (-1, a key without a row, "
    "is the only negative index allowed); nothing was updated")
_KERNEL_ERROR = capi.message_bytes(
    "SparseflowLazyAdamTables: the kernel raised (an allocation failed?)")


@numba.njit(nogil=True, cache=True)
def _float64_vector(handle):
    return numba.carray(capi.float64_pointer(capi.tensor_data(handle)),
                        capi.tensor_dim(handle, 0))


@numba.njit(nogil=True, cache=True)
def _update_tables(context, status, scratch, tokens, hparams, n_tables):
    if (capi.num_inputs(context) != 2 + 2 * n_tables or n_tables < 1
            or tokens.shape[0] != n_tables or hparams.shape[0] != 4):
        capi.fail(context, status, _BAD_LAYOUT)
        return
    handles = np.zeros(2 * n_tables, np.uint64)
    slots = np.full(n_tables, -1, np.int64)
    dims = np.empty(0, np.int64)
    # The output first: once a table is updated, nothing may fail the op.
    result = capi.allocate_output(context, 0, capi.TF_INT64, dims.ctypes.data, 0, 8, status)
    if capi.status_code(status) != capi.TF_OK:
        capi.kernel_failure(context, status)
        return
    code = 0
    for t in range(n_tables):
        handles[2 * t] = capi.input_handle(context, 2 + t, scratch, status)
        handles[2 * t + 1] = capi.input_handle(context, 2 + n_tables + t, scratch, status)
        if handles[2 * t] == 0 or handles[2 * t + 1] == 0:
            code = 1
            break
        slots[t] = registry.acquire(tokens[t])
        if slots[t] < 0:
            code = slots[t]
            break
    if code == 1:
        capi.kernel_failure(context, status)
    elif code == registry.UNKNOWN:
        capi.fail_with(context, status, capi.TF_FAILED_PRECONDITION, _UNKNOWN_TABLE)
    elif code == registry.NO_STORAGE:
        capi.fail_with(context, status, capi.TF_FAILED_PRECONDITION, _NO_STORAGE)
    elif _valid(context, status, handles, slots):
        _update_held(handles, slots, hparams)
        numba.carray(capi.int64_pointer(capi.tensor_data(result)), 1)[0] = n_tables
    for t in range(n_tables):
        if slots[t] >= 0:
            registry.release(slots[t])
    capi.delete_tensor(result)
    capi.delete_handles(handles)


@numba.njit(nogil=True, cache=True)
def _valid(context, status, handles, slots):
    """Whether every held table's rows and gradients fit it; fails the op if not. Every
    table is checked before any is updated: a refused op changes nothing."""
    reg = registry.registry()
    for t in range(slots.shape[0]):
        rows_handle, grads_handle = handles[2 * t], handles[2 * t + 1]
        if (capi.tensor_rank(rows_handle) != 1 or capi.tensor_rank(grads_handle) != 2
                or capi.tensor_dim(grads_handle, 0) != capi.tensor_dim(rows_handle, 0)
                or 3 * capi.tensor_dim(grads_handle, 1) != reg[slots[t], registry.WIDTH]):
            capi.fail(context, status, _BAD_LAYOUT)
            return False
        if not rows_in_range(capi.int32_vector(rows_handle), reg[slots[t], registry.ROWS]):
            capi.fail(context, status, _BAD_ROW)
            return False
    return True


@numba.njit(nogil=True, cache=True)
def _update_held(handles, slots, hparams):
    """Per held table: Adam's step counted, the update, its rows marked for the next
    incremental checkpoint, a DRAIN queued (``KeyProcessor.updated``)."""
    reg = registry.registry()
    learning_rate = hparams[0]
    b1 = np.float32(hparams[1])
    b2 = np.float32(hparams[2])
    eps = np.float32(hparams[3])
    one = np.float32(1.0)
    for t in range(slots.shape[0]):
        rows = capi.int32_vector(handles[2 * t])
        dim = capi.tensor_dim(handles[2 * t + 1], 1)
        grads = numba.carray(capi.float32_pointer(capi.tensor_data(handles[2 * t + 1])),
                             (rows.shape[0], dim))
        storage = numba.carray(capi.float32_pointer(reg[slots[t], registry.STORAGE]),
                               (reg[slots[t], registry.ROWS], reg[slots[t], registry.WIDTH]))
        step = registry.count_step(slots[t])
        adam_update(storage, rows, grads, adam_step_rate(learning_rate, b1, b2, step), b1,
                    one - b1, b2, one - b2, eps)
        marks = registry.marks(slots[t])
        if rows_in_range(rows, marks.shape[0]):   # the marks cover every row
            mark_rows(marks, rows)
        registry.push_drain(slots[t])


@numba.njit(nogil=True, cache=True)
def _update_body(context, status, scratch, handles):
    _update_tables(context, status, scratch, capi.int64_vector(handles[0]),
                   _float64_vector(handles[1]), capi.tensor_dim(handles[0], 0))


_RANKS = np.array([1, 1], np.int32)


@numba.cfunc(types.void(types.uint64, types.uint64), nopython=True, cache=True)
def _lazy_adam_tables_kernel(kernel, context):
    # Inputs: tables int64 [N], hparams float64 [4], rows N x int32 [U], grads N x float32
    # [U, dim].
    status = capi.new_status()
    scratch = np.zeros(1, np.uint64)
    handles, ok = capi.open_inputs(context, _RANKS, _BAD_LAYOUT, scratch, status)
    if ok:
        # An exception must still fail the op and free the handles: numba would print it
        # and return with no output set. (Written out per kernel: passing the body as a
        # function argument made numba refuse to cache the cfunc.)
        try:
            _update_body(context, status, scratch, handles)
        except Exception:  # noqa: BLE001
            capi.fail(context, status, _KERNEL_ERROR)
    capi.close_inputs(handles, status)


def _register() -> None:
    capi.register_op(
        LAZY_ADAM_TABLES,
        inputs=["tables: int64", "hparams: float64", "rows: N * int32", "grads: N * float"],
        outputs=["updated: int64"], attrs=["N: int >= 1"], compute=_lazy_adam_tables_kernel,
        stateful=True)


def lazy_adam_tables(tokens, rows: list, grads: list, *, learning_rate: float, beta1: float,
                     beta2: float, epsilon: float, name: str | None = None) -> tf.Tensor:
    """One lazy Adam update of every table at its rows, as one TensorFlow op.

    Args:
      tokens: int64 ``[N]``, each table's registry token (``TableEntry.token``); its rows
        ``[w | m | v]``, ``3 * dim`` wide.
      rows: N int32 tensors ``[U]``: each table's rows, distinct (a batch's unique rows: the
        op does not check; a repeated row gets one update per occurrence), -1 skipped.
      grads: N float32 tensors ``[U, dim]``, each row's summed gradient.
      learning_rate, beta1, beta2, epsilon: as ``optimizer_kernels.apply_lazy_adam``.
      name: the node's name in a graph.

    Returns:
      int64 scalar, the number of tables updated. Running it raises
      ``tf.errors.FailedPreconditionError`` when a token names no table alive in this
      process and ``tf.errors.InvalidArgumentError`` for a row outside its table or shapes
      that do not fit; nothing is updated then.
    """
    _register()
    hparams = np.array([learning_rate, np.float32(beta1), np.float32(beta2),
                        np.float32(epsilon)], np.float64)
    return capi.apply_op(
        LAZY_ADAM_TABLES,
        [tf.constant(np.asarray(tokens, np.int64)), tf.constant(hparams),
         *[tf.cast(r, tf.int32) for r in rows], *[tf.cast(g, tf.float32) for g in grads]],
        1, attrs={"N": len(rows)}, op_name=name)[0]
