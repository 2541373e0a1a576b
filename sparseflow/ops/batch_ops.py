"""TensorFlow ops over every table of a batch, with compiled kernels (``ops/tf_capi.py``).

``gather_tables``: a batch's embeddings, every table's unique rows read once and expanded by
each feature's restore vector (the same expand as ``batch_kernels.expand_tables``), from the
tables' storages as the registry (``ops/table_registry.py``) holds them; each table's batch
is then released through the registry's event queue.

``sum_tables``: the gather's gradient: each key's gradient row summed into its table's
unique row, the same sum as ``batch_kernels.sum_tables``.

Both replaced ``tf.numpy_function`` nodes: the step no longer enters Python or waits for the
GIL for them (``benchmarks/bench_op_boundary.py``, BENCHMARKS.md end-to-end).
"""

from __future__ import annotations

import numba
import numpy as np
import tensorflow as tf
from numba import types

from sparseflow.ops import table_registry as registry
from sparseflow.ops import tf_capi as capi
from sparseflow.ops.batch_kernels import (add_member_gradient, expand_member, gather_rows,
                                          member_offsets, most_unique_rows)

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

GATHER_TABLES = "SparseflowGatherTables"

_BAD_GATHER_LAYOUT = capi.message_bytes(
    "SparseflowGatherTables: flat and part_sizes must be 1-D, n_parts and dim scalars with "
    "n_parts in [0, len(part_sizes)] and dim >= 1, part sizes >= 0 with the parts inside "
    "flat, member_tables, member_rows and member_restore int64 [N >= 1] with rows and "
    "restore naming parts below n_parts, one table per rows part, and each "
    "table's batch seq at part_sizes[n_parts + its rows' part]")
_UNKNOWN_TABLE = capi.message_bytes(
    "SparseflowGatherTables: a member's table token names no table alive in this process "
    "(the table was released by terminate_config_initializer(), or the graph was built in "
    "another process)")
_NO_STORAGE = capi.message_bytes(
    "SparseflowGatherTables: a member's table has no rows allocated yet "
    "(start_asc_pipeline() allocates them)")
_NARROW_TABLE = capi.message_bytes(
    "SparseflowGatherTables: a member's table rows are narrower than dim")
_BAD_ROW = capi.message_bytes(
    "SparseflowGatherTables: a row index is outside its table (-1, a key without a row, is "
    "the only negative index allowed)")
_BAD_GATHER_RESTORE = capi.message_bytes(
    "SparseflowGatherTables: a restore vector indexes past its table's unique rows")
_GATHER_TOO_LARGE = capi.message_bytes(
    "SparseflowGatherTables: the output would exceed 2^62 bytes")
_GATHER_KERNEL_ERROR = capi.message_bytes(
    "SparseflowGatherTables: the kernel raised (an allocation failed?)")


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
def _part_bounds(flat, sizes, n_parts):
    """int64 (starts, ends) of the first ``n_parts`` parts in ``flat``; empty arrays when a
    size is negative or the parts run past ``flat``."""
    starts = np.empty(n_parts, np.int64)
    ends = np.empty(n_parts, np.int64)
    at = 0
    for p in range(n_parts):
        if sizes[p] < 0 or sizes[p] > flat.shape[0]:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        starts[p] = at
        at += sizes[p]
        ends[p] = at
    if at > flat.shape[0]:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return starts, ends


@numba.njit(nogil=True, cache=True)
def _sum_members(context, status, scratch, flat, sizes, member_rows, member_restore, n_parts,
                 n_members):
    if (capi.num_inputs(context) != 5 + n_members or n_members < 1 or n_parts < 0
            or n_parts > sizes.shape[0] or member_restore.shape[0] != n_members):
        capi.fail(context, status, _BAD_LAYOUT)
        return
    starts, ends = _part_bounds(flat, sizes, n_parts)
    if starts.shape[0] != n_parts or not _members_valid(member_rows, member_restore, n_parts):
        capi.fail(context, status, _BAD_LAYOUT)
        return
    offsets, n_unique = member_offsets(member_rows, starts, ends)
    first = capi.input_handle(context, 5, scratch, status)
    if first == 0:
        capi.kernel_failure(context, status)
        return
    dim = capi.tensor_dim(first, 1) if capi.tensor_rank(first) == 2 else -1
    capi.delete_tensor(first)
    if dim < 0:
        capi.fail(context, status, _BAD_GRADIENT)
        return
    if dim > 0 and n_unique > _MAX_OUTPUT_FLOATS // dim:
        capi.fail(context, status, _TOO_LARGE)
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
        handle = capi.input_handle(context, 5 + m, scratch, status)
        if handle == 0:
            capi.kernel_failure(context, status)
            break
        n_keys = ends[r] - starts[r]
        if (capi.tensor_rank(handle) != 2 or capi.tensor_dim(handle, 0) != n_keys
                or capi.tensor_dim(handle, 1) != dim):
            capi.delete_tensor(handle)
            capi.fail(context, status, _BAD_GRADIENT)
            break
        if not _restore_in_range(flat[starts[r]:ends[r]],
                                 ends[member_rows[m]] - starts[member_rows[m]]):
            capi.delete_tensor(handle)
            capi.fail(context, status, _BAD_RESTORE)
            break
        grad = numba.carray(capi.float32_pointer(capi.tensor_data(handle)), (n_keys, dim))
        add_member_gradient(grad, flat[starts[r]:ends[r]], offsets[m], out)
        capi.delete_tensor(handle)
    capi.delete_tensor(result)


_SUM_RANKS = np.array([1, 1, 1, 1, 0], np.int32)


@numba.njit(nogil=True, cache=True)
def _sum_body(context, status, scratch, handles):
    _sum_members(context, status, scratch, capi.int32_vector(handles[0]),
                 capi.int64_vector(handles[1]), capi.int64_vector(handles[2]),
                 capi.int64_vector(handles[3]), capi.int64_scalar(handles[4]),
                 capi.tensor_dim(handles[2], 0))


@numba.cfunc(types.void(types.uint64, types.uint64), nopython=True, cache=True)
def _sum_tables_kernel(kernel, context):
    # Inputs: flat int32 [F], part_sizes int64 [>= n_parts], member_rows int64 [N],
    # member_restore int64 [N], n_parts int64 [], grads N x float32 [keys, dim].
    status = capi.new_status()
    scratch = np.zeros(1, np.uint64)
    handles, ok = capi.open_inputs(context, _SUM_RANKS, _BAD_LAYOUT, scratch, status)
    if ok:
        # An exception must still fail the op and free the handles: numba would print it
        # and return with no output set. (Written out per kernel: passing the body as a
        # function argument made numba refuse to cache the cfunc.)
        try:
            _sum_body(context, status, scratch, handles)
        except Exception:  # noqa: BLE001
            capi.fail(context, status, _KERNEL_ERROR)
    capi.close_inputs(handles, status)


# -- the gather ------------------------------------------------------------------------------

@numba.njit(nogil=True, cache=True)
def rows_in_range(rows, n_rows):
    """Whether every row is -1 (a key without a row) or in ``[0, n_rows)``: anything else
    would read or write outside a table's storage."""
    for i in range(rows.shape[0]):
        if rows[i] < -1 or rows[i] >= n_rows:
            return False
    return True


@numba.njit(nogil=True, cache=True)
def _gather_members(context, status, flat, sizes, tables, member_rows, member_restore,
                    n_parts, dim):
    n_members = member_rows.shape[0]
    if (n_members < 1 or tables.shape[0] != n_members or member_restore.shape[0] != n_members
            or n_parts < 0 or n_parts > sizes.shape[0] or dim < 1):
        capi.fail(context, status, _BAD_GATHER_LAYOUT)
        return
    starts, ends = _part_bounds(flat, sizes, n_parts)
    if starts.shape[0] != n_parts:
        capi.fail(context, status, _BAD_GATHER_LAYOUT)
        return
    # Per rows part, its table: one table per part, and the part's batch seq present.
    part_table = np.zeros(n_parts, np.int64)
    is_rows = np.zeros(n_parts, np.bool_)
    for m in range(n_members):
        w = member_rows[m]
        if not (0 <= w < n_parts and 0 <= member_restore[m] < n_parts
                and n_parts + w < sizes.shape[0]
                and (not is_rows[w] or part_table[w] == tables[m])):
            capi.fail(context, status, _BAD_GATHER_LAYOUT)
            return
        part_table[w] = tables[m]
        is_rows[w] = True
    # Allocated before the tables are held: an allocation that raises then holds nothing.
    unique = np.empty((most_unique_rows(member_rows, starts, ends), dim), np.float32)
    part_slot = np.full(n_parts, -1, np.int64)
    code = 0
    for w in range(n_parts):
        if is_rows[w]:
            slot = registry.acquire(part_table[w])
            if slot < 0:
                code = slot
                break
            part_slot[w] = slot
    if code == registry.UNKNOWN:
        capi.fail_with(context, status, capi.TF_FAILED_PRECONDITION, _UNKNOWN_TABLE)
    elif code == registry.NO_STORAGE:
        capi.fail_with(context, status, capi.TF_FAILED_PRECONDITION, _NO_STORAGE)
    else:
        _gather_held(context, status, flat, sizes, part_slot, member_rows, member_restore,
                     n_parts, dim, starts, ends, unique)
    for w in range(n_parts):
        if part_slot[w] >= 0:
            registry.release(part_slot[w])


@numba.njit(nogil=True, cache=True)
def _gather_held(context, status, flat, sizes, part_slot, member_rows, member_restore,
                 n_parts, dim, starts, ends, unique):
    """The gather once every rows part's table is held (:func:`registry.acquire`,
    ``part_slot``): its storage, rows and width stay as read here until released."""
    reg = registry.registry()
    n_members = member_rows.shape[0]
    n_keys = 0
    for w in range(n_parts):
        if part_slot[w] < 0:
            continue
        if reg[part_slot[w], registry.WIDTH] < dim:
            capi.fail(context, status, _NARROW_TABLE)
            return
        if not rows_in_range(flat[starts[w]:ends[w]], reg[part_slot[w], registry.ROWS]):
            capi.fail(context, status, _BAD_ROW)
            return
    for m in range(n_members):
        w = member_rows[m]
        r = member_restore[m]
        if not _restore_in_range(flat[starts[r]:ends[r]], ends[w] - starts[w]):
            capi.fail(context, status, _BAD_GATHER_RESTORE)
            return
        n_keys += ends[r] - starts[r]
    if n_keys > _MAX_OUTPUT_FLOATS // dim:
        capi.fail(context, status, _GATHER_TOO_LARGE)
        return
    dims = np.empty(2, np.int64)
    dims[0] = n_keys
    dims[1] = dim
    result = capi.allocate_output(context, 0, capi.TF_FLOAT, dims.ctypes.data, 2,
                                  n_keys * dim * 4, status)
    if capi.status_code(status) != capi.TF_OK:
        capi.kernel_failure(context, status)
        return
    out = numba.carray(capi.float32_pointer(capi.tensor_data(result)), (n_keys, dim))
    at = 0
    for m in range(n_members):
        w = member_rows[m]
        # A table's members are usually consecutive: its unique rows are read once then.
        if m == 0 or member_rows[m - 1] != w:
            storage = numba.carray(capi.float32_pointer(reg[part_slot[w], registry.STORAGE]),
                                   (reg[part_slot[w], registry.ROWS],
                                    reg[part_slot[w], registry.WIDTH]))
            gather_rows(storage, flat[starts[w]:ends[w]], dim, unique[:ends[w] - starts[w]])
        r = member_restore[m]
        at = expand_member(unique, flat[starts[r]:ends[r]], out, at)
    capi.delete_tensor(result)
    # Every row is read: the batches are released (KeyProcessor.release, taken under its
    # lock from the registry's queue).
    for w in range(n_parts):
        if part_slot[w] >= 0 and sizes[n_parts + w] >= 0:
            registry.push_released(part_slot[w], sizes[n_parts + w])


_GATHER_RANKS = np.array([1, 1, 1, 1, 1, 0, 0], np.int32)


@numba.njit(nogil=True, cache=True)
def _gather_body(context, status, scratch, handles):
    _gather_members(context, status, capi.int32_vector(handles[0]),
                    capi.int64_vector(handles[1]), capi.int64_vector(handles[2]),
                    capi.int64_vector(handles[3]), capi.int64_vector(handles[4]),
                    capi.int64_scalar(handles[5]), capi.int64_scalar(handles[6]))


@numba.cfunc(types.void(types.uint64, types.uint64), nopython=True, cache=True)
def _gather_tables_kernel(kernel, context):
    # Inputs: flat int32 [F], part_sizes int64 [>= n_parts + tables], member_tables int64
    # [N], member_rows int64 [N], member_restore int64 [N], n_parts int64 [], dim int64 [].
    status = capi.new_status()
    scratch = np.zeros(1, np.uint64)
    handles, ok = capi.open_inputs(context, _GATHER_RANKS, _BAD_GATHER_LAYOUT, scratch, status)
    if ok:
        # An exception must still fail the op and free the handles: numba would print it
        # and return with no output set. (Written out per kernel: passing the body as a
        # function argument made numba refuse to cache the cfunc.)
        try:
            _gather_body(context, status, scratch, handles)
        except Exception:  # noqa: BLE001
            capi.fail(context, status, _GATHER_KERNEL_ERROR)
    capi.close_inputs(handles, status)


def _register() -> None:
    capi.register_op(
        SUM_TABLES,
        inputs=["flat: int32", "part_sizes: int64", "member_rows: int64",
                "member_restore: int64", "n_parts: int64", "grads: N * float"],
        outputs=["summed: float"], attrs=["N: int >= 1"], compute=_sum_tables_kernel)
    capi.register_op(
        GATHER_TABLES,
        inputs=["flat: int32", "part_sizes: int64", "member_tables: int64",
                "member_rows: int64", "member_restore: int64", "n_parts: int64",
                "dim: int64"],
        outputs=["embeddings: float"], compute=_gather_tables_kernel, stateful=True)


def gather_tables(flat, part_sizes, member_tables, member_rows, member_restore, n_parts: int,
                  dim: int, name: str | None = None) -> tf.Tensor:
    """Every member's embeddings, read from its table's rows, as one TensorFlow op; each
    table's batch is then released (``KeyProcessor.release``, through the registry).

    Args:
      flat: int32 tensor, the batch's parts (``pipeline/insert_func.py``): a table's unique
        rows (-1: a key without a row, read as zeros) and each feature's restore vector.
      part_sizes: int64 tensor: the parts' sizes, then at ``n_parts + w`` the batch's
        sequence number for the table whose rows are part ``w`` (-1: not tracked).
      member_tables: int64 ``[N]``, per member its table's registry token
        (``TableEntry.token``).
      member_rows, member_restore: int64 ``[N]``, per member the part holding its table's
        unique rows and the part holding its restore vector (a table's members consecutive
        read its rows once; apart, once per run).
      n_parts: how many parts ``flat`` holds.
      dim: the embedding width (each table's rows are at least this wide: weights first).
      name: the node's name in a graph.

    Returns:
      float32 ``[sum of the members' keys, dim]``, the members in order. Running it raises
      ``tf.errors.FailedPreconditionError`` when a token names no table alive in this process
      and ``tf.errors.InvalidArgumentError`` for a row outside its table, a restore index
      outside its table's unique rows, or a layout :func:`batch_kernels.expand_tables` does
      not take.
    """
    _register()
    embeddings = capi.apply_op(
        GATHER_TABLES,
        [tf.cast(flat, tf.int32), tf.cast(part_sizes, tf.int64),
         tf.constant(member_tables, tf.int64), tf.cast(member_rows, tf.int64),
         tf.cast(member_restore, tf.int64), tf.constant(n_parts, tf.int64),
         tf.constant(dim, tf.int64)],
        1, op_name=name)[0]
    if not tf.executing_eagerly():
        embeddings.set_shape([None, dim])
    return embeddings


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
