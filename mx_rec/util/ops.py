"""Rec SDK ``mx_rec.util.ops``: ``import_host_pipeline_ops()``, the host-pipeline ops scripts
call directly: ``set_threshold``, ``return_timestamp`` and ``clear_channel``.

Rec SDK loads them from a C++ library; here they are TensorFlow ops over sparseflow's own key
pipeline, so there is nothing to load and the library path is accepted as given.
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from mx_rec.constants.constants import EVAL_CHANNEL_ID, TRAIN_CHANNEL_ID
from mx_rec.util.log import log_once
from sparseflow import runtime as _runtime
from sparseflow.pipeline import admission
from sparseflow.validation import INT32_MAX, check_int, fail, is_int

__all__ = ["HostPipelineOps", "import_host_pipeline_ops"]


class HostPipelineOps:
    """What Rec SDK's host-pipeline op library offers scripts, as TensorFlow ops."""

    @staticmethod
    def set_threshold(threshold, emb_name=None, ids_name=None):
        """An op that sets table ``emb_name``'s access threshold when it runs.

        Built in a ``tf.compat.v1`` graph it changes nothing until a session runs it (Rec SDK
        scripts build it mid-training and ``session.run`` it); in eager mode it runs at once.
        The new threshold applies to the batches the key pipeline processes from then on (see
        ``sparseflow.set_threshold``).

        Args:
          threshold: int in [-1, 2^31-1], or an integer scalar tensor holding one.
          emb_name: the table's name.
          ids_name: the lookup's name; accepted and unused (a table has one threshold here).

        Returns:
          An int32 scalar tensor: the threshold set, once run.

        Raises:
          NotInitializedError: ``init`` was not called.
          TypeError, ValueError: ``emb_name`` names no table, ``ids_name`` is not a str, or
            ``threshold`` is neither an int in range nor an integer scalar tensor. A tensor
            value out of range fails when the op runs.
        """
        tables = sorted(_runtime.current("set_threshold").tables)
        if not isinstance(emb_name, str) or emb_name not in tables:
            fail("emb_name", f"the name of the table whose threshold to set, one of {tables}",
                 emb_name)
        if ids_name is not None and not isinstance(ids_name, str):
            fail("ids_name", "a str or None", ids_name, TypeError)
        threshold = _threshold_tensor(threshold)

        def apply(value):
            admission.set_threshold(emb_name, int(value))
            return np.asarray(value, np.int32)

        done = tf.numpy_function(apply, [threshold], tf.int32, stateful=True,
                                 name=f"set_threshold_{emb_name}")
        done.set_shape([])
        return done

    @staticmethod
    def return_timestamp(tensor):
        """The current unix time in whole seconds, as an int64 scalar tensor (Rec SDK's
        ``ReturnTimestamp`` op, used in ``dataset.map`` to stamp each batch).

        Args:
          tensor: an int64 tensor; only its dtype is checked (Rec SDK's op takes one).

        Returns:
          int64 scalar tensor, evaluated each time the op runs.

        Raises:
          TypeError: ``tensor`` is not an int64 tensor.
        """
        if not tf.is_tensor(tensor) or tensor.dtype != tf.int64:
            fail("tensor", "an int64 tensor", tensor, TypeError)
        return tf.cast(tf.timestamp(), tf.int64, name="return_timestamp")

    @staticmethod
    def clear_channel(channel_id):
        """Rec SDK's op that empties a host-to-device data channel before an evaluation.

        sparseflow has no such channel: batches stay in ``tf.data``, and re-initializing the
        evaluation iterator discards those read ahead. The op is a no-op.

        Args:
          channel_id: 0 (training) or 1 (evaluation).

        Returns:
          A ``tf.no_op`` in graph mode (None in eager mode).

        Raises:
          TypeError, ValueError: ``channel_id`` is not 0 or 1.
        """
        allowed = f"{TRAIN_CHANNEL_ID} (training) or {EVAL_CHANNEL_ID} (evaluation)"
        if not is_int(channel_id):
            fail("channel_id", allowed, channel_id, TypeError)
        if channel_id not in (TRAIN_CHANNEL_ID, EVAL_CHANNEL_ID):
            fail("channel_id", allowed, channel_id)
        log_once("clear_channel", "mx_rec: clear_channel is a no-op: sparseflow keeps batches in "
                 "tf.data (no host-to-device channel); re-initializing an iterator discards the "
                 "batches it read ahead.")
        return tf.no_op(name=f"clear_channel_{channel_id}")


def _threshold_tensor(threshold) -> tf.Tensor:
    if is_int(threshold):
        return tf.constant(check_int("threshold", threshold, -1, INT32_MAX), tf.int32)
    if not tf.is_tensor(threshold) or not threshold.dtype.is_integer:
        fail("threshold", "an int in [-1, 2147483647] or an integer scalar tensor", threshold,
             TypeError)
    if threshold.shape.rank not in (None, 0):
        fail("threshold", "a scalar tensor", threshold)
    return threshold


_HOST_PIPELINE_OPS = HostPipelineOps()


def import_host_pipeline_ops(so_path=None) -> HostPipelineOps:
    """Rec SDK's loader of its host-pipeline op library.

    Args:
      so_path: a library name or path (``LIBREC_EOS_OPS_SO``...), or None. Accepted: there is
        nothing to load; logged once at INFO.

    Returns:
      The process's :class:`HostPipelineOps` (the same object every time, also
      ``mx_rec.util.initialize.get_host_pipeline_ops()``).

    Raises:
      TypeError: ``so_path`` is not a str, a path or None.
    """
    if so_path is not None:
        if not isinstance(so_path, (str, os.PathLike)):
            fail("so_path", "a str, a path or None", so_path, TypeError)
        log_once(f"so_path:{os.fspath(so_path)}", "mx_rec: import_host_pipeline_ops(%r): "
                 "nothing to load, sparseflow's host-pipeline ops are TensorFlow ops.",
                 os.fspath(so_path))
    return _HOST_PIPELINE_OPS
