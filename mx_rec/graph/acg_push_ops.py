"""Rec SDK ``mx_rec.graph.acg_push_ops``: ``ACGPushOpsToDatasetHook``.

On Ascend the hook moves string ops (``StringSplit``, ``StringToNumber``...) that the model
graph runs on the batch into the dataset, where the host CPU runs them instead of the NPU. The
result does not change. On CPU every op already runs on the host, so there are no ops to push:
the hook is accepted and says so once in the log.
"""

import tensorflow as tf

from mx_rec.util.log import log_once
from sparseflow.validation import check_bool

__all__ = ["ACGPushOpsToDatasetHook"]


class ACGPushOpsToDatasetHook(tf.compat.v1.train.SessionRunHook):
    """Accepted; pushes nothing (see the module docstring).

    Args:
      dump_graph: bool, Rec SDK's "write the graph before and after"; nothing is rewritten.

    Raises:
      TypeError: ``dump_graph`` is not a bool.
    """

    def __init__(self, dump_graph=False):
        self.dump_graph = check_bool("dump_graph", dump_graph)

    def begin(self):
        log_once("ACGPushOpsToDatasetHook", "mx_rec: ACGPushOpsToDatasetHook pushes no ops: "
                 "on CPU every op already runs on the host, beside the dataset.")
