"""Chains of stateful ops in a tf.function (sparseflow.distributed.op_chains): program order
within a chain, none between chains."""

import threading

import numpy as np
import tensorflow as tf

from sparseflow.distributed import op_chains


def _identity(x):
    return x


def _traced(chains: bool):
    """A function with two groups of two stateful numpy functions, then one more, each
    group in a chain of its own when ``chains``."""
    @tf.function(input_signature=[tf.TensorSpec([], tf.float32)])
    def step(x):
        outs = []
        for name in ("a", "b"):
            with op_chains.chain(name) if chains else _no_chain():
                outs.append(tf.numpy_function(_identity, [x], tf.float32, name=f"{name}1"))
                outs.append(tf.numpy_function(_identity, [x], tf.float32, name=f"{name}2"))
        outs.append(tf.numpy_function(_identity, [x], tf.float32, name="free"))
        return outs

    graph = step.get_concrete_function().graph
    return {op.name: sorted(c.name for c in op.control_inputs)
            for op in graph.get_operations() if op.type == "PyFunc"}


class _no_chain:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_a_chain_keeps_program_order_within_itself_and_none_with_other_ops():
    assert _traced(chains=False) == {"a1": [], "a2": ["a1"], "b1": ["a2"], "b2": ["b1"],
                                     "free": ["b2"]}
    assert _traced(chains=True) == {"a1": [], "a2": ["a1"], "b1": [], "b2": ["b1"],
                                    "free": []}


def test_a_cond_or_a_loop_is_ordered_with_every_chain_and_other_ops_keep_their_order():
    """Ops that run function bodies (a cond, a loop) are barriers between a graph's chains:
    the chains' ops inside them are not ordered with those outside. Stateful ops outside
    any chain keep their program order among themselves."""
    @tf.function(input_signature=[tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.bool)])
    def step(x, flag):
        with op_chains.chain("a"):
            a1 = tf.numpy_function(_identity, [x], tf.float32, name="a1")
        free1 = tf.numpy_function(_identity, [x], tf.float32, name="free1")

        def in_chain():
            with op_chains.chain("a"):
                return tf.ensure_shape(
                    tf.numpy_function(_identity, [x], tf.float32, name="inner"), [])

        branch = tf.cond(flag, in_chain, lambda: x, name="branch")
        looped = tf.while_loop(lambda i, y: i < 2, lambda i, y: (i + 1, in_chain()),
                               [tf.constant(0), x], name="loop")[1]
        with op_chains.chain("a"):
            a2 = tf.numpy_function(_identity, [x], tf.float32, name="a2")
        with op_chains.chain("b"):
            b1 = tf.numpy_function(_identity, [x], tf.float32, name="b1")
        free2 = tf.numpy_function(_identity, [x], tf.float32, name="free2")
        return a1, free1, branch, looped, a2, b1, free2

    graph = step.get_concrete_function().graph
    ops = {op.name: op for op in graph.get_operations()}
    inputs = {name: {c.name for c in op.control_inputs} for name, op in ops.items()}
    cond = next(name for name, op in ops.items() if op.type in ("If", "StatelessIf"))
    loop = next(name for name, op in ops.items() if op.type in ("While", "StatelessWhile"))
    assert "a1" in inputs[cond] and "free1" in inputs[cond]   # after chain a and the rest
    assert cond in inputs[loop]
    assert loop in inputs["a2"] and loop in inputs["b1"] and loop in inputs["free2"]
    assert inputs["free1"] == set() and "a1" not in inputs["free1"]
    assert "a2" not in inputs["b1"]                             # two chains: no order


def test_two_chains_run_at_the_same_time():
    """Chain a's first op waits for chain b's to run: in program order it never would (it
    gives up after 20 s and reports it)."""
    ran = threading.Event()

    def wait_for_b(x):
        return np.float32(ran.wait(20.0))

    def b_runs(x):
        ran.set()
        return x

    @tf.function(input_signature=[tf.TensorSpec([], tf.float32)])
    def step(x):
        with op_chains.chain("waits"):
            waited = tf.numpy_function(wait_for_b, [x], tf.float32)
        with op_chains.chain("sets"):
            done = tf.numpy_function(b_runs, [x], tf.float32)
        return waited, done

    waited, _ = step(tf.constant(1.0))
    assert float(waited) == 1.0


def test_outside_a_function_a_chain_changes_nothing():
    with tf.Graph().as_default() as graph:
        with op_chains.chain("a"):
            out = tf.numpy_function(_identity, [tf.constant(1.0)], tf.float32)
        assert op_chains.chain_of(out.op) is None
        assert not [op for op in graph.get_operations() if "op_chain" in op.name]
    with op_chains.chain("a"):   # eagerly
        assert float(tf.numpy_function(_identity, [tf.constant(2.0)], tf.float32)) == 2.0


def test_chain_names_are_told_apart_in_the_order_they_are_asked_for():
    base = f"embedding_{id(object())}"
    assert [op_chains.unique_name(base) for _ in range(3)] == [base, f"{base}#1",
                                                              f"{base}#2"]
