"""The TF2 faces' routing of a batch's keys to their owners as a compiled op
(``ops/tf_capi.py``): ``KeyRouter.route``'s kernel (``shard_kernels.route_keys``) without
entering Python.

The Keras layers route their ids in the training step, one layer (one table) at a time: as
``tf.numpy_function`` nodes, 26 layers on 2 ranks made 26 turns of the GIL a step on a rank's
one core, each costing more than its kernel. This op runs the same kernel on TensorFlow's
thread.
"""

from __future__ import annotations

import numba
import numpy as np
import tensorflow as tf
from numba import types

from sparseflow.distributed.sharding import PAD_KEY
from sparseflow.ops import tf_capi as capi
from sparseflow.ops.key_kernels import scratch_slots, table_bounds
from sparseflow.ops.shard_kernels import route_keys

ROUTE_KEYS = "SparseflowRouteKeys"

_BAD_CONFIG = capi.message_bytes(
    "SparseflowRouteKeys: config must be int64 [4 + 3F + T]: world >= 1, mixed 0 or 1, "
    "T >= 1 tables, F features (one keys input each), each feature's index in table "
    "order (a permutation), its coefficient, the tables' feature ends (non-decreasing, "
    "the last F) and each segment's table in [0, T)")
_TOO_LARGE = capi.message_bytes(
    "SparseflowRouteKeys: a batch of 2^31 keys or more (the gather vector is int32)")
_KERNEL_ERROR = capi.message_bytes(
    "SparseflowRouteKeys: the kernel raised (an allocation failed?)")
_HEAD = 4   # world, mixed, n_tables, n_features


@numba.njit(nogil=True, cache=True)
def _config_valid(config, n_inputs):
    """Whether ``config`` (see :data:`_BAD_CONFIG`) describes ``n_inputs`` feature
    inputs: every index the kernel writes through stays in its array."""
    if config.shape[0] < _HEAD:
        return False
    world, mixed, n_tables, n_features = config[0], config[1], config[2], config[3]
    if (world < 1 or world > 2 ** 31 - 1 or (mixed != 0 and mixed != 1) or n_tables < 1
            or n_features != n_inputs or config.shape[0] != _HEAD + 3 * n_features + n_tables):
        return False
    order = config[_HEAD:_HEAD + n_features]
    segs = config[_HEAD + 2 * n_features:_HEAD + 2 * n_features + n_tables]
    tables = config[_HEAD + 2 * n_features + n_tables:]
    seen = np.zeros(n_features, np.bool_)
    for j in range(n_features):
        f = order[j]
        if f < 0 or f >= n_features or seen[f] or tables[j] < 0 or tables[j] >= n_tables:
            return False
        seen[f] = True
    previous = 0
    for t in range(n_tables):
        if segs[t] < previous or segs[t] > n_features:
            return False
        previous = segs[t]
    if previous != n_features:   # before the walk below, which relies on it to stop
        return False
    # Each segment's table must be the one whose feature range holds it.
    t = 0
    for j in range(n_features):
        while segs[t] <= j:
            t += 1
        if tables[j] != t:
            return False
    return True


@numba.njit(nogil=True, cache=True)
def _elements(handle):
    n = np.int64(1)
    for d in range(capi.tensor_rank(handle)):
        n *= capi.tensor_dim(handle, d)
    return n


@numba.njit(nogil=True, cache=True)
def _route_body(context, status, scratch, config):
    n_features = capi.num_inputs(context) - 1
    if not _config_valid(config, n_features):
        capi.fail(context, status, _BAD_CONFIG)
        return
    world, mixed, n_tables = config[0], config[1] == 1, config[2]
    order = config[_HEAD:_HEAD + n_features]
    coefs = config[_HEAD + n_features:_HEAD + 2 * n_features].astype(np.int32)
    table_segs = config[_HEAD + 2 * n_features:_HEAD + 2 * n_features + n_tables]
    segment_tables = config[_HEAD + 2 * n_features + n_tables:]
    handles = np.zeros(n_features, np.uint64)
    key_ends = np.empty(n_features, np.int64)
    total = np.int64(0)
    for j in range(n_features):   # segment j is feature order[j]'s keys
        handles[j] = capi.input_handle(context, 1 + order[j], scratch, status)
        if handles[j] == 0:
            capi.kernel_failure(context, status)
            capi.delete_handles(handles)
            return
        total += _elements(handles[j])
        key_ends[j] = total
    if total >= 2 ** 31:
        capi.delete_handles(handles)
        capi.fail(context, status, _TOO_LARGE)
        return
    keys = np.empty(0, np.int64)
    allocated = True
    try:   # the inputs' handles are open: an allocation that raises must still free them
        keys = np.empty(total, np.int64)
    except Exception:  # noqa: BLE001
        allocated = False
    if not allocated:
        capi.delete_handles(handles)
        capi.fail(context, status, _KERNEL_ERROR)
        return
    start = 0
    for j in range(n_features):
        n = key_ends[j] - start
        keys[start:key_ends[j]] = numba.carray(
            capi.int64_pointer(capi.tensor_data(handles[j])), n)
        start = key_ends[j]
    capi.delete_handles(handles)
    size = scratch_slots(table_bounds(key_ends, table_segs)[2])
    send, counts, place, gather, sizes, _ = route_keys(
        keys, key_ends, coefs, table_segs, order, segment_tables, world, mixed, -1, PAD_KEY,
        np.zeros(size, np.int64), np.zeros(size, np.int64), 1)
    shape = np.empty(3, np.int64)
    shape[0], shape[1], shape[2] = world, send.shape[0] // world, 2
    if (_emit(context, status, 0, capi.TF_INT64, shape, send.ctypes.data, send.size * 8)
            and _emit(context, status, 1, capi.TF_INT32, _shape_of(counts),
                      counts.ctypes.data, counts.size * 4)
            and _emit(context, status, 2, capi.TF_INT32, _shape_of(place), place.ctypes.data,
                      place.size * 4)
            and _emit(context, status, 3, capi.TF_INT32, _shape_of(gather),
                      gather.ctypes.data, gather.size * 4)):
        _emit(context, status, 4, capi.TF_INT64, _shape_of(sizes), sizes.ctypes.data,
              sizes.size * 8)


@numba.njit(nogil=True, cache=True)
def _shape_of(array):
    shape = np.empty(array.ndim, np.int64)
    for d in range(array.ndim):
        shape[d] = array.shape[d]
    return shape


@numba.njit(nogil=True, cache=True)
def _emit(context, status, index, dtype, shape, source, n_bytes):
    """Output ``index`` of ``shape`` (int64 array), its ``n_bytes`` copied from address
    ``source``; False (the op failed) if TF refused the allocation."""
    handle = capi.allocate_output(context, index, dtype, shape.ctypes.data, shape.shape[0],
                                  n_bytes, status)
    if capi.status_code(status) != capi.TF_OK:
        capi.kernel_failure(context, status)
        return False
    out = numba.carray(capi.uint8_pointer(capi.tensor_data(handle)), n_bytes)
    out[:] = numba.carray(capi.uint8_pointer(source), n_bytes)
    capi.delete_tensor(handle)
    return True


_CONFIG_RANK = np.array([1], np.int32)


@numba.cfunc(types.void(types.uint64, types.uint64), nopython=True, cache=True)
def _route_keys_kernel(kernel, context):
    # Inputs: config int64 [4 + 3F + T], then F int64 key tensors (any shape).
    status = capi.new_status()
    scratch = np.zeros(1, np.uint64)
    handles, ok = capi.open_inputs(context, _CONFIG_RANK, _BAD_CONFIG, scratch, status)
    if ok:
        # An exception must still fail the op and free the handles (written out per
        # kernel: numba will not cache a cfunc that takes its body as an argument).
        try:
            _route_body(context, status, scratch, capi.int64_vector(handles[0]))
        except Exception:  # noqa: BLE001
            capi.fail(context, status, _KERNEL_ERROR)
    capi.close_inputs(handles, status)


def route_config(world: int, mixed: bool, n_tables: int, features: np.ndarray,
                 coefs: np.ndarray, table_segs: np.ndarray,
                 segment_tables: np.ndarray) -> np.ndarray:
    """The op's int64 config: the owner rule and a router's layout (``KeyRouter``: each
    table's features in table order, their coefficients, the tables' feature ends, each
    segment's table)."""
    return np.concatenate([[world, int(mixed), n_tables, len(features)], features, coefs,
                           table_segs, segment_tables]).astype(np.int64)


def route_keys_op(config: np.ndarray, keys: list, name: str | None = None) -> list:
    """A batch's keys laid out by owner, as ``KeyRouter.route`` with ``send_count`` None
    returns them (without its ``commit_ahead``), by one compiled op.

    Args:
      config: :func:`route_config` of the router.
      keys: per feature (batch order), its int64 keys, any shape (flattened).
      name: the node's name in a graph.

    Returns:
      ``[send int64 [N, width, 2], counts int32 [N, T], place int32 [U, 2], gather int32
      [K], sizes int64 [T + F]]``. Running it raises ``tf.errors.InvalidArgumentError`` for
      a config that does not describe ``keys``.
    """
    capi.register_op(ROUTE_KEYS, inputs=["config: int64", "keys: N * int64"],
                     outputs=["send: int64", "counts: int32", "place: int32",
                              "gather: int32", "sizes: int64"],
                     attrs=["N: int >= 1"], compute=_route_keys_kernel)
    world, n_tables, n_features = int(config[0]), int(config[2]), int(config[3])
    out = capi.apply_op(ROUTE_KEYS, [tf.constant(config, tf.int64),
                                     *(tf.cast(k, tf.int64) for k in keys)],
                        5, attrs={"N": len(keys)}, op_name=name)
    if not tf.executing_eagerly():
        for tensor, shape in zip(out, ([world, None, 2], [world, n_tables], [None, 2],
                                       [None], [n_tables + n_features])):
            tensor.set_shape(shape)
    return out
