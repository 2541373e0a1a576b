"""``custom_gradient``: ``tf.custom_gradient`` whose gradient lives as long as its graph.

In a graph (a ``tf.compat.v1`` graph, or a ``tf.function``'s), ``tf.custom_gradient``
registers each call's gradient function under a fresh name in TensorFlow's process-wide
gradient registry, which is never emptied. The function closes over the call's tensors, hence
over their graph and all it holds: for a sparseflow lookup, the numpy functions of the input
pipeline and through them the tables (each table's key processor: its index, last-seen times
and marks; ~150 MB for the e2e benchmark's 26 tables). Every Session graph built and dropped
in one process kept its tables: an Estimator's train/evaluate cycles, a sweep, a notebook.

After each call in a graph, :func:`custom_gradient` moves the registered function onto the
graph (a memo table that dies with it) and leaves in the registry a proxy that reaches it
through a weak reference: the registry keeps only the proxy, as small as TensorFlow's own
entry. The gradient is computed by the same function, so it is unchanged. Eagerly,
``tf.custom_gradient`` registers nothing, and this is that function unchanged. Where
TensorFlow's registry is not what this expects, nothing is moved.

The TF2 faces meet a second such keeper: ``tf.numpy_function`` keeps its function on the
outermost graph, in TF2 the thread's global graph, for the life of the process. Their numpy
functions therefore reach the tables through a weak reference to their owner
(:func:`sparseflow.weak_owner.weak`).
"""

from __future__ import annotations

import functools
import weakref

import tensorflow as tf

from sparseflow.pipeline.graph_cache import graph_cache

try:   # TensorFlow-internal: where graph-mode custom gradients are registered
    from tensorflow.python.framework import ops as _tf_ops
    from tensorflow.python.framework import registry as _tf_registry
    _REGISTRY = getattr(_tf_ops, "_gradient_registry", None)
    _TYPE_TAG = getattr(_tf_registry, "_TYPE_TAG", None)
except ImportError:   # a TensorFlow without them: custom gradients stay registered, as in TF
    _REGISTRY = _TYPE_TAG = None

_GRADIENT_OP_TYPE = "_gradient_op_type"


def custom_gradient(f):
    """Decorates ``f`` as ``tf.custom_gradient`` does (``f`` returns ``(outputs, grad_fn)``),
    without TensorFlow's registry keeping the graph of a graph-mode call alive.

    Args:
      f: the function, as for ``tf.custom_gradient``.

    Returns:
      The decorated function: outputs and gradients as ``tf.custom_gradient(f)`` gives them.
    """
    decorated = tf.custom_gradient(f)

    @functools.wraps(f)
    def call(*args, **kwargs):
        outputs = decorated(*args, **kwargs)
        if not tf.executing_eagerly():
            _unpin_gradient(outputs)
        return outputs

    return call


def _unpin_gradient(outputs) -> None:
    """Moves the gradient function registered for ``outputs`` (their IdentityN op's
    ``_gradient_op_type``) from TensorFlow's registry onto their graph, leaving a weak proxy.
    Does nothing where there is no such entry (a TensorFlow that registers differently)."""
    entries = getattr(_REGISTRY, "_registry", None)
    if not isinstance(entries, dict) or _TYPE_TAG is None:
        return
    op = next((t.op for t in tf.nest.flatten(outputs)
               if isinstance(t, tf.Tensor) and hasattr(t, "op")), None)
    if op is None or op.type != "IdentityN":
        return
    try:
        name = op.get_attr(_GRADIENT_OP_TYPE).decode()
    except ValueError:   # no such attribute: not a custom gradient's op
        return
    entry = entries.get(name)
    if not isinstance(entry, dict) or _TYPE_TAG not in entry:
        return
    graph_cache(op.graph, "custom_gradients")[name] = entry[_TYPE_TAG]
    entry[_TYPE_TAG] = _weak_gradient(name, weakref.ref(op.graph))


def _weak_gradient(name: str, graph_ref):
    """The registry's proxy for ``name``: calls the function kept on the graph. An op of that
    graph holds it, so the graph is alive whenever one of its ops is differentiated. A copy
    of the op in another graph (``import_graph_def``, ``import_meta_graph``, a pruned
    function) names the same gradient and finds it only while the original graph lives;
    sparseflow's gradients use the original graph's tensors, so they could not serve a copy
    anyway."""
    def gradient(op, *grads):
        graph = graph_ref()
        functions = None if graph is None else graph_cache(graph, "custom_gradients",
                                                           create=False)
        if not functions or name not in functions:
            raise LookupError(f"The custom gradient {name!r} of op `{op.name}` belongs to a "
                              f"graph that no longer exists: a copy of a graph "
                              f"(import_graph_def, import_meta_graph, a pruned function) was "
                              f"differentiated after its original was dropped.")
        return functions[name](op, *grads)

    return gradient
