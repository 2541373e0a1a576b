"""Rec SDK ``mx_rec.graph.hooks``: the slicer hooks.

On Ascend they move parts of the lookup subgraph (ops of the listed types, or the key
computations no lookup result depends on) from the NPU graph into the CPU prefetch. The result
does not change. sparseflow's key processing already runs in ``tf.data`` and its lookups share
one gather per table, so there is nothing to slice: the hooks are accepted and say so once in
the log.
"""

import tensorflow as tf

from mx_rec.util.log import log_once
from sparseflow.validation import fail

__all__ = ["LookupSubgraphSlicerHook", "OrphanLookupKeySlicerHook"]


def _check_graph(full_graph) -> None:
    if full_graph is not None and not isinstance(full_graph, tf.Graph):
        fail("full_graph", "a tf.Graph or None", full_graph, TypeError)


def _log_nothing_to_slice(hook: str) -> None:
    log_once(hook, "mx_rec: %s slices nothing: sparseflow's key processing already runs in "
             "tf.data, on the CPU.", hook)


class LookupSubgraphSlicerHook(tf.compat.v1.train.SessionRunHook):
    """Accepted; slices nothing (see the module docstring).

    Args:
      op_types: list of op type names (str), e.g. ``["StringToNumber"]``.
      full_graph: a ``tf.Graph`` or None (the default graph).

    Raises:
      TypeError: ``op_types`` is not a list of str, or ``full_graph`` is not a graph.
    """

    def __init__(self, op_types, full_graph=None):
        if not isinstance(op_types, list) or not all(isinstance(t, str) for t in op_types):
            fail("op_types", "a list of op type names (str)", op_types, TypeError)
        _check_graph(full_graph)
        self.op_types = list(op_types)
        self.full_graph = full_graph

    def begin(self):
        _log_nothing_to_slice("LookupSubgraphSlicerHook")


class OrphanLookupKeySlicerHook(tf.compat.v1.train.SessionRunHook):
    """Accepted; slices nothing (see the module docstring).

    Args:
      full_graph: a ``tf.Graph`` or None (the default graph).

    Raises:
      TypeError: ``full_graph`` is not a graph.
    """

    def __init__(self, full_graph=None):
        _check_graph(full_graph)
        self.full_graph = full_graph

    def begin(self):
        _log_nothing_to_slice("OrphanLookupKeySlicerHook")
