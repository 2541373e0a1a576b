"""The collectives' progress counted by a compiled op (``ops/tf_capi.py``): how many of the
process's collectives started and finished, read by its ``CollectiveWatchdog``.

Each collective of the TF2 faces reports its start and end to the watchdog; as
``tf.numpy_function`` nodes those reports entered Python and took the GIL on the step's
path, two or three per exchange (78 a step for 26 Keras layers on 2 ranks). This op adds
one to a process-wide counter with an atomic instruction instead, and the watchdog's
thread reads the counters.
"""

from __future__ import annotations

import numba
import numpy as np
import tensorflow as tf
from numba import types

from sparseflow.ops import atomics
from sparseflow.ops import tf_capi as capi

STARTED, FINISHED = 0, 1
SYMBOL = "sparseflow_collective_progress"
COUNT_PROGRESS = "SparseflowCountProgress"

# [started, finished]: for the life of the process, never moved (the op reaches it by symbol).
PROCESS_COUNTS = np.zeros(2, np.int64)
atomics.bind(SYMBOL, PROCESS_COUNTS)
_counts_address = atomics.global_address(SYMBOL)

_BAD_INPUT = capi.message_bytes(
    "SparseflowCountProgress: `which` must be an int64 scalar, 0 (started) or 1 (finished)")
_RANKS = np.array([0], np.int32)


@numba.njit(nogil=True, cache=True)
def add(counts, which):
    """Adds one to ``counts[which]`` (an int64 array) atomically: ordered with the op's
    adds and with other threads' calls. Returns the value before."""
    return atomics.atomic("add", counts.ctypes.data + which * 8, 1)


@numba.cfunc(types.void(types.uint64, types.uint64), nopython=True, cache=True)
def _count_progress_kernel(kernel, context):
    status = capi.new_status()
    scratch = np.zeros(1, np.uint64)
    handles, ok = capi.open_inputs(context, _RANKS, _BAD_INPUT, scratch, status)
    if ok:
        which = capi.int64_scalar(handles[0])
        if which == STARTED or which == FINISHED:
            atomics.atomic("add", _counts_address() + which * 8, 1)
        else:
            capi.fail(context, status, _BAD_INPUT)
    capi.close_inputs(handles, status)


def count_progress(which: int, name: str | None = None):
    """An op adding one to ``PROCESS_COUNTS[which]`` each time it runs (a graph or
    ``tf.function``: stateful, so it runs where automatic control dependencies put it even
    though nothing reads it; eagerly it runs now).

    Args:
      which: ``STARTED`` or ``FINISHED``.
      name: the node's name in a graph.

    Returns:
      The ``tf.Operation`` (None eagerly).

    Raises:
      ValueError: ``which`` is neither.
    """
    if which not in (STARTED, FINISHED):
        raise ValueError(f"which must be STARTED ({STARTED}) or FINISHED ({FINISHED}); "
                         f"received {which!r}")
    capi.register_op(COUNT_PROGRESS, inputs=["which: int64"], outputs=[],
                     compute=_count_progress_kernel, stateful=True)
    if tf.executing_eagerly():
        capi.apply_op(COUNT_PROGRESS, [tf.constant(which, tf.int64)], 0, op_name=name)
        return None
    # Outside the caller's control dependencies, so that the op itself carries them.
    with tf.control_dependencies(None):
        which = tf.constant(which, tf.int64)
    return capi.graph_op(COUNT_PROGRESS, [which], op_name=name)
