"""Independent chains of stateful ops in a ``tf.function``.

A ``tf.function`` runs its stateful ops in program order (its automatic control
dependencies): each stateful op that touches no resource waits for the one built before it.
Every numpy function and collective of sparseflow is such an op, so the exchanges of 26
Keras ``SparseEmbedding`` layers ran one after another, each waiting out its loopback
round trips before the next began (a 2-rank step spent ~75 ms where the same exchanges side
by side take ~25).

The stateful ops built under :func:`chain` keep program order among themselves only: the
resolver below tells TensorFlow's automatic control dependencies that each of them writes
one resource, a token of the chain, as a variable's ops are ordered by the variable they
write. Two chains' ops, and a chain's and the function's other stateful ops, may then run
at once. A chain must therefore hold everything its ops need ordered: its key processing,
its collectives, its reads and its updates (one ``tf2.Embedding``'s, for instance).
"""

from __future__ import annotations

import contextlib

import tensorflow as tf
from tensorflow.python.framework import auto_control_deps

from sparseflow.pipeline.graph_cache import graph_cache

_OPS = "op_chain_ops"        # per graph: op name -> the token of its chain
_TOKENS = "op_chain_tokens"  # per graph: chain name -> its token


@contextlib.contextmanager
def chain(name: str):
    """Builds the stateful ops made inside as one chain, ``name``, of the function being
    traced (program order among themselves, none with the function's other ops). Eagerly,
    and in a ``tf.compat.v1`` graph (a Session runs ops as their data allows), it changes
    nothing.

    Args:
      name: the chain; ops built under one name in one graph form one chain, wherever they
        are built.
    """
    graph = tf.compat.v1.get_default_graph()
    if tf.executing_eagerly() or not getattr(graph, "building_function", False):
        yield
        return
    before = len(graph.get_operations())
    try:
        yield
    finally:
        tokens = graph_cache(graph, _TOKENS)
        made = graph.get_operations()[before:]
        if name not in tokens:
            tokens[name] = _token(graph, name)
        members = graph_cache(graph, _OPS)
        for op in made:
            # An inner chain's ops stay in it (tagged when it closed).
            if op._is_stateful:   # noqa: SLF001 -- what automatic control deps reads too
                members.setdefault(op.name, tokens[name])


def _token(graph, name: str) -> tf.Tensor:
    """A tensor that stands for the chain in automatic control dependencies (never run)."""
    with graph.control_dependencies(None), graph.name_scope(None):
        return tf.constant(0, name=f"sparseflow_op_chain_{_safe(name)}")


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._" else "_" for c in name) or "chain"


def chain_of(op) -> tf.Tensor | None:
    """The token of the chain ``op`` belongs to, or None."""
    # Not created here: the resolver sees every op of every function traced.
    members = graph_cache(op.graph, _OPS, create=False)
    return None if members is None else members.get(op.name)


@auto_control_deps.register_acd_resource_resolver
def _chain_resolver(op, resource_reads, resource_writes) -> bool:
    """Gives a chain's op its chain's token as a resource it writes (True when added)."""
    token = chain_of(op)
    if token is None or token in resource_writes:
        return False
    resource_writes.add(token)
    return True


_NAMES: dict = {}


def unique_name(name: str) -> str:
    """``name``, or ``name#k`` for the k-th later chain this process named so: the same
    names on every rank that builds the same objects in the same order.

    Args:
      name: the owner's name (an Embedding's, for instance).

    Returns:
      A chain name no earlier call returned.
    """
    count = _NAMES.get(name, 0)
    _NAMES[name] = count + 1
    return name if count == 0 else f"{name}#{count}"
