"""Independent chains of stateful ops in a ``tf.function``.

A ``tf.function`` runs its stateful ops in program order (its automatic control
dependencies): each stateful op that touches no resource waits for the one built before it.
Every numpy function and collective of sparseflow is such an op, so the exchanges of 26
Keras ``SparseEmbedding`` layers ran one after another, each waiting out its loopback
round trips before the next began (a 2-rank step spent ~77 ms where the same exchanges side
by side take ~25).

The stateful ops built under :func:`chain` keep program order among themselves only: the
resolver below tells TensorFlow's automatic control dependencies that each of them writes
one resource, a token of the chain, as a variable's ops are ordered by the variable they
write. Two chains' ops may then run at once. In a graph that has chains:

- the other stateful ops that touch no resource write one more token, the graph's general
  one, so they keep the program order they had among themselves;
- a stateful op that runs a function body (a ``tf.cond``, a loop, a nested function call)
  writes every token of the graph: a barrier, since the chains' ops inside it are not
  ordered with the chains outside.

A chain must therefore hold everything its ops need ordered among themselves: its key
processing, its collectives, its reads and its updates (one ``tf2.Embedding``'s, for
instance).
"""

from __future__ import annotations

import contextlib
import threading

import tensorflow as tf
from tensorflow.python.framework import auto_control_deps

from sparseflow.pipeline.graph_cache import graph_cache

_OPS = "op_chain_ops"          # per graph: op name -> the token of its chain
_TOKENS = "op_chain_tokens"    # per graph: chain name -> its token (and _GENERAL)
_NUMBERS = "op_chain_numbers"  # per graph: chain name -> its number, in order first opened
_GENERAL = object()            # the key of the graph's general token in _TOKENS

# Ops that run function bodies: barriers between a graph's chains.
_BODY_OPS = frozenset(("If", "StatelessIf", "While", "StatelessWhile", "Case",
                       "StatelessCase", "PartitionedCall", "StatefulPartitionedCall"))

class _Open(threading.local):
    """The chains this thread is building, innermost last: ``(graph, number)``."""

    def __init__(self):
        self.stack = []


_OPEN = _Open()


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
    numbers = graph_cache(graph, _NUMBERS)
    number = numbers.setdefault(name, len(numbers))
    stack = _OPEN.stack
    stack.append((graph, number))
    before = len(graph.get_operations())
    try:
        yield
    finally:
        stack.pop()
        tokens = graph_cache(graph, _TOKENS)
        made = graph.get_operations()[before:]
        if _GENERAL not in tokens:
            tokens[_GENERAL] = _token(graph, "general")
        if name not in tokens:
            tokens[name] = _token(graph, name)
        members = graph_cache(graph, _OPS)
        for op in made:
            # An inner chain's ops stay in it (tagged when it closed).
            if op._is_stateful:   # noqa: SLF001 -- what automatic control deps reads too
                members.setdefault(op.name, tokens[name])


def current_number() -> int | None:
    """The number of the chain being built in the default graph (chains are numbered in
    the order first opened in their graph, the same on every rank that traces the same
    function), or None outside a chain."""
    stack = _OPEN.stack
    if not stack:
        return None
    graph, number = stack[-1]
    return number if graph is tf.compat.v1.get_default_graph() else None


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
    """In a graph with chains, the tokens ``op`` writes (see the module docstring); True
    when it added any."""
    tokens = graph_cache(op.graph, _TOKENS, create=False)
    if not tokens:
        return False   # no chain in this graph: TensorFlow's own order
    token = chain_of(op)
    if token is not None:
        wanted = [token]
    elif not auto_control_deps.op_is_stateful(op):
        return False
    elif op.type in _BODY_OPS:
        wanted = list(tokens.values())
    elif resource_reads or resource_writes:
        return False   # ordered by its resources, as without chains
    else:
        wanted = [tokens[_GENERAL]]
    added = False
    for t in wanted:
        if t not in resource_writes:
            resource_writes.add(t)
            added = True
    return added


_NAMES: dict = {}


def unique_name(name: str) -> str:
    """``name``, or ``name#k`` for the k-th later chain this process named so.

    Args:
      name: the owner's name (an Embedding's, for instance).

    Returns:
      A chain name no earlier call returned.
    """
    count = _NAMES.get(name, 0)
    _NAMES[name] = count + 1
    return name if count == 0 else f"{name}#{count}"
