"""TensorFlow ops over every table of a batch, with compiled kernels (``ops/tf_capi.py``).

``sum_tables``: the gradient of a batch's gather (``lookup.py``): each key's gradient row
summed into its table's unique row, the same sum as ``batch_kernels.sum_tables``, run as a
TensorFlow op instead of a ``tf.numpy_function``: the backward pass no longer enters Python
or waits for the GIL before the sparse update (``benchmarks/bench_op_boundary.py``).
"""

from __future__ import annotations

import numba
import numpy as np
import tensorflow as tf
from numba import types

from sparseflow.ops import tf_capi as capi
from sparseflow.ops.batch_kernels import add_member_gradient, member_offsets

SUM_TABLES = "SparseflowSumTables"

_BAD_GRADIENT = capi.message_bytes(
    "SparseflowSumTables: a member's gradient must be float32 [its keys, dim], one row per "
    "key of its restore vector, every member of one width")
_BAD_RESTORE = capi.message_bytes(
    "SparseflowSumTables: a restore vector indexes past its table's unique rows")
_BAD_LAYOUT = capi.message_bytes(
    "SparseflowSumTables: flat and part_sizes must be 1-D, n_parts a scalar in "
    "[0, len(part_sizes)], part sizes >= 0 with the parts inside flat, member_rows and "
    "member_restore int64 [N] naming parts below n_parts, a table's members consecutive")
_TOO_LARGE = capi.message_bytes(
    "SparseflowSumTables: the summed output would exceed 2^62 bytes")
_KERNEL_ERROR = capi.message_bytes(
    "SparseflowSumTables: the kernel raised (an allocation failed?)")
_MAX_OUTPUT_FLOATS = 2 ** 60   # TF aborts the process on a shape whose size overflows


@numba.njit(nogil=True, cache=True)
def _input(context, index, slot, status):
    """The handle of input ``index`` (to be deleted with ``delete_tensor``), 0 if TF
    refused."""
    slot[0] = 0
    capi.get_input(context, index, slot.ctypes.data, status)
    if capi.status_code(status) != capi.TF_OK:
        return np.uint64(0)
    return slot[0]


@numba.njit(nogil=True, cache=True)
def _restore_in_range(restore, n_rows):
    # An index past its table's unique rows would write outside the op's output.
    for i in range(restore.shape[0]):
        if restore[i] < 0 or restore[i] >= n_rows:
            return False
    return True


@numba.njit(nogil=True, cache=True)
def _members_valid(member_rows, member_restore, n_parts):
    """Whether every member names parts below ``n_parts`` and a table's members are
    consecutive (a part that comes back after another would be summed into a second block
    of the output)."""
    done = np.zeros(n_parts, np.bool_)
    current = -1
    for m in range(member_rows.shape[0]):
        w = member_rows[m]
        if not (0 <= w < n_parts and 0 <= member_restore[m] < n_parts):
            return False
        if w != current:
            if done[w]:
                return False
            done[w] = True
            current = w
    return True


@numba.njit(nogil=True, cache=True)
def _fail(context, status, message):
    capi.set_status(status, capi.TF_INVALID_ARGUMENT, message.ctypes.data)
    capi.kernel_failure(context, status)


@numba.njit(nogil=True, cache=True)
def _sum_members(context, status, slot, flat, sizes, member_rows, member_restore, n_parts,
                 n_members):
    if (capi.num_inputs(context) != 5 + n_members or n_members < 1 or n_parts < 0
            or n_parts > sizes.shape[0] or member_restore.shape[0] != n_members):
        _fail(context, status, _BAD_LAYOUT)
        return
    starts = np.empty(n_parts, np.int64)
    ends = np.empty(n_parts, np.int64)
    at = 0
    for p in range(n_parts):
        if sizes[p] < 0 or sizes[p] > flat.shape[0]:
            _fail(context, status, _BAD_LAYOUT)
            return
        starts[p] = at
        at += sizes[p]
        ends[p] = at
    if at > flat.shape[0] or not _members_valid(member_rows, member_restore, n_parts):
        _fail(context, status, _BAD_LAYOUT)
        return
    offsets, n_unique = member_offsets(member_rows, starts, ends)
    first = _input(context, 5, slot, status)
    if first == 0:
        capi.kernel_failure(context, status)
        return
    dim = capi.tensor_dim(first, 1) if capi.tensor_rank(first) == 2 else -1
    capi.delete_tensor(first)
    if dim < 0:
        _fail(context, status, _BAD_GRADIENT)
        return
    if dim > 0 and n_unique > _MAX_OUTPUT_FLOATS // dim:
        _fail(context, status, _TOO_LARGE)
        return
    dims = np.empty(2, np.int64)
    dims[0] = n_unique
    dims[1] = dim
    result = capi.allocate_output(context, 0, capi.TF_FLOAT, dims.ctypes.data, 2,
                                  n_unique * dim * 4, status)
    if capi.status_code(status) != capi.TF_OK:
        capi.kernel_failure(context, status)
        return
    out = numba.carray(capi.float32_pointer(capi.tensor_data(result)), (n_unique, dim))
    out[:] = 0.0
    for m in range(n_members):
        r = member_restore[m]
        handle = _input(context, 5 + m, slot, status)
        if handle == 0:
            capi.kernel_failure(context, status)
            break
        n_keys = ends[r] - starts[r]
        if (capi.tensor_rank(handle) != 2 or capi.tensor_dim(handle, 0) != n_keys
                or capi.tensor_dim(handle, 1) != dim):
            capi.delete_tensor(handle)
            _fail(context, status, _BAD_GRADIENT)
            break
        if not _restore_in_range(flat[starts[r]:ends[r]],
                                 ends[member_rows[m]] - starts[member_rows[m]]):
            capi.delete_tensor(handle)
            _fail(context, status, _BAD_RESTORE)
            break
        grad = numba.carray(capi.float32_pointer(capi.tensor_data(handle)), (n_keys, dim))
        add_member_gradient(grad, flat[starts[r]:ends[r]], offsets[m], out)
        capi.delete_tensor(handle)
    capi.delete_tensor(result)


@numba.cfunc(types.void(types.uint64, types.uint64), nopython=True, cache=True)
def _sum_tables_kernel(kernel, context):
    # Inputs: flat int32 [F], part_sizes int64 [>= n_parts], member_rows int64 [N],
    # member_restore int64 [N], n_parts int64 [], grads N x float32 [keys, dim].
    status = capi.new_status()
    slot = np.zeros(1, np.uint64)
    handles = np.zeros(5, np.uint64)
    got = True
    for k in range(5):
        handles[k] = _input(context, k, slot, status)
        got = got and handles[k] != 0
    if not got:
        capi.kernel_failure(context, status)
    elif (capi.tensor_rank(handles[0]) != 1 or capi.tensor_rank(handles[1]) != 1
          or capi.tensor_rank(handles[2]) != 1 or capi.tensor_rank(handles[3]) != 1
          or capi.tensor_rank(handles[4]) != 0):
        _fail(context, status, _BAD_LAYOUT)
    else:
        flat = numba.carray(capi.int32_pointer(capi.tensor_data(handles[0])),
                            capi.tensor_dim(handles[0], 0))
        sizes = numba.carray(capi.int64_pointer(capi.tensor_data(handles[1])),
                             capi.tensor_dim(handles[1], 0))
        n_members = capi.tensor_dim(handles[2], 0)
        member_rows = numba.carray(capi.int64_pointer(capi.tensor_data(handles[2])),
                                   n_members)
        member_restore = numba.carray(capi.int64_pointer(capi.tensor_data(handles[3])),
                                      capi.tensor_dim(handles[3], 0))
        n_parts = numba.carray(capi.int64_pointer(capi.tensor_data(handles[4])), 1)[0]
        # An exception must still fail the op and free the handles below: numba would
        # print it and return with no output set.
        try:
            _sum_members(context, status, slot, flat, sizes, member_rows, member_restore,
                         n_parts, n_members)
        except Exception:  # noqa: BLE001
            _fail(context, status, _KERNEL_ERROR)
    for k in range(5):
        if handles[k] != 0:
            capi.delete_tensor(handles[k])
    capi.delete_status(status)


def _register() -> None:
    capi.register_op(
        SUM_TABLES,
        inputs=["flat: int32", "part_sizes: int64", "member_rows: int64",
                "member_restore: int64", "n_parts: int64", "grads: N * float"],
        outputs=["summed: float"], attrs=["N: int >= 1"], compute=_sum_tables_kernel)


def sum_tables(flat, part_sizes, member_rows, member_restore, n_parts: int, grads: list,
               name: str | None = None) -> tf.Tensor:
    """Each key's gradient row summed into its table's unique row, as one TensorFlow op.

    Args:
      flat: int32 tensor, the batch's parts (``pipeline/insert_func.py``).
      part_sizes: int64 tensor, each part's size (at least ``n_parts`` of them; a batch's
        sizes, which carry more after the parts).
      member_rows, member_restore: int64 ``[N]`` (arrays or tensors): per member, the part
        holding its table's unique rows and the part holding its restore vector; a table's
        members consecutive (``batch_kernels.sum_tables``).
      n_parts: how many parts ``flat`` holds.
      grads: N float32 tensors, member m's ``[its keys, dim]``.
      name: the node's name in a graph.

    Returns:
      float32 ``[sum of the members' tables' unique rows, dim]``, the tables in member order.
      Running it raises ``tf.errors.InvalidArgumentError`` if a gradient's shape does not
      match its restore vector, a restore index is outside its table's unique rows, or the
      layout is not one :func:`batch_kernels.sum_tables` takes.
    """
    _register()
    grads = [tf.cast(g, tf.float32) for g in grads]
    summed = capi.apply_op(
        SUM_TABLES,
        [tf.cast(flat, tf.int32), tf.cast(part_sizes, tf.int64),
         tf.cast(member_rows, tf.int64), tf.cast(member_restore, tf.int64),
         tf.constant(n_parts, tf.int64), *grads],
        1, attrs={"N": len(grads)}, op_name=name)[0]
    if not tf.executing_eagerly():
        summed.set_shape([None, grads[0].shape[-1] if grads[0].shape.rank else None])
    return summed
