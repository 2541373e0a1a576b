"""Rec SDK ``mx_rec.util.tf_version_adapter``: the Ascend TF adapter's ``hccl_ops``,
``npu_ops`` and ``NPUCheckpointSaverHook``, as CPU stand-ins.

- ``hccl_ops``: ``allreduce``, ``allgather``, ``broadcast``; the identity over one rank
  (see ``mx_rec._npu.hccl_ops``).
- ``npu_ops.dropout(x, keep_prob)``: ``tf.nn.dropout(x, rate=1 - keep_prob)``.
- ``NPUCheckpointSaverHook``: TF's ``CheckpointSaverHook`` (Ascend's subclass only adds
  NPU-side bookkeeping).
"""

import tensorflow as tf

from mx_rec._npu import hccl_ops, npu_ops

__all__ = ["NPUCheckpointSaverHook", "hccl_ops", "npu_ops"]


class NPUCheckpointSaverHook(tf.compat.v1.train.CheckpointSaverHook):
    """``tf.compat.v1.train.CheckpointSaverHook``, under the Ascend adapter's name. Pass
    ``saver=tf.compat.v1.train.Saver()`` (with ``mx_rec`` imported, after ``init``) to save
    the sparse tables as well."""
