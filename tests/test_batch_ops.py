"""The compiled batch ops (``ops/batch_ops.py``, kernels registered through TensorFlow's C API,
``ops/tf_capi.py``) against numpy references, eagerly, in ``tf.function`` and in a Session."""

import numpy as np
import pytest
import tensorflow as tf

from sparseflow.ops import batch_ops
from tests.test_batch_kernels import random_batch

TABLES = [(50, 1), (80, 3), (7, 2), (60, 1)]


def _reference_sum(parts, members, grads, dim):
    """Per table (in member order), each unique row's summed gradient, by np.add.at."""
    out = []
    for t in dict.fromkeys(t for t, _, _ in members):
        rows_part = next(w for tt, w, _ in members if tt == t)
        summed = np.zeros((parts[rows_part].shape[0], dim), np.float64)
        for (tt, _, r), grad in zip(members, grads):
            if tt == t:
                np.add.at(summed, parts[r], grad)
        out.append(summed)
    return np.concatenate(out)


def _case(seed, dim=4):
    rng = np.random.default_rng(seed)
    parts, flat, sizes, members, layout = random_batch(rng, TABLES, dim)
    grads = [rng.normal(size=(parts[r].shape[0], dim)).astype(np.float32)
             for _, _, r in members]
    return parts, flat, sizes, members, layout, grads


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sum_tables_op_vs_numpy_eager_and_function(seed):
    parts, flat, sizes, members, layout, grads = _case(seed)
    # part_sizes longer than n_parts, as a batch's sizes carry more entries after the parts
    sizes = np.concatenate([sizes, [7, 9]]).astype(np.int32)
    reference = _reference_sum(parts, members, grads, 4)
    eager = batch_ops.sum_tables(flat, sizes, layout[1], layout[2], len(parts), grads)
    np.testing.assert_allclose(eager.numpy(), reference, rtol=1e-5, atol=1e-6)

    @tf.function
    def traced(*g):
        return batch_ops.sum_tables(flat, sizes, layout[1], layout[2], len(parts), list(g))
    np.testing.assert_allclose(traced(*grads).numpy(), reference, rtol=1e-5, atol=1e-6)


def test_sum_tables_op_in_a_session_with_fed_gradients():
    parts, flat, sizes, members, layout, grads = _case(3, dim=5)
    reference = _reference_sum(parts, members, grads, 5)
    graph = tf.Graph()
    with graph.as_default():
        flat_in = tf.compat.v1.placeholder(tf.int32, [None])
        grad_in = [tf.compat.v1.placeholder(tf.float32, [None, 5]) for _ in grads]
        summed = batch_ops.sum_tables(flat_in, tf.constant(sizes, tf.int32), layout[1],
                                      layout[2], len(parts), grad_in, name="summed")
        assert summed.op.type == batch_ops.SUM_TABLES and summed.op.name == "summed"
        with tf.compat.v1.Session(graph=graph) as session:
            for _ in range(2):   # the kernel keeps nothing between runs
                out = session.run(summed, {flat_in: flat, **dict(zip(grad_in, grads))})
                np.testing.assert_allclose(out, reference, rtol=1e-5, atol=1e-6)


def test_sum_tables_op_empty_batch():
    sizes = np.zeros(2, np.int32)
    out = batch_ops.sum_tables(np.zeros(0, np.int32), sizes, np.array([0]), np.array([1]), 2,
                               [np.zeros((0, 3), np.float32)])
    assert out.shape == (0, 3)


def test_sum_tables_op_refuses_a_gradient_that_does_not_match_its_keys():
    parts, flat, sizes, members, layout, grads = _case(0)
    m = next(i for i, g in enumerate(grads) if g.shape[0] > 1)
    short = list(grads)
    short[m] = grads[m][:-1]
    with pytest.raises(tf.errors.InvalidArgumentError, match="one row per key"):
        batch_ops.sum_tables(flat, sizes, layout[1], layout[2], len(parts), short)
    wide = list(grads)
    wide[m] = np.zeros((grads[m].shape[0], 5), np.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="every member of one width"):
        batch_ops.sum_tables(flat, sizes, layout[1], layout[2], len(parts), wide)


def test_sum_tables_op_refuses_a_layout_outside_the_batch():
    parts, flat, sizes, members, layout, grads = _case(1)
    bad_restore = layout[2].copy()
    bad_restore[0] = len(parts)
    with pytest.raises(tf.errors.InvalidArgumentError, match="naming parts below n_parts"):
        batch_ops.sum_tables(flat, sizes, layout[1], bad_restore, len(parts), grads)
    with pytest.raises(tf.errors.InvalidArgumentError, match="inside flat"):
        batch_ops.sum_tables(flat[:-1], sizes, layout[1], layout[2], len(parts), grads)
    with pytest.raises(tf.errors.InvalidArgumentError, match="naming parts below n_parts"):
        batch_ops.sum_tables(flat, sizes, layout[1], layout[2][:-1], len(parts), grads)


def test_sum_tables_op_has_no_gradient_and_registers_once():
    parts, flat, sizes, members, layout, grads = _case(2)
    batch_ops._register()   # again: a no-op, not TensorFlow's "already registered"
    variables = [tf.Variable(g) for g in grads]
    with tf.GradientTape() as tape:
        out = batch_ops.sum_tables(flat, sizes, layout[1], layout[2], len(parts), variables)
    assert all(g is None for g in tape.gradient(out, variables))


def test_sum_tables_op_refuses_inputs_of_the_wrong_rank():
    parts, flat, sizes, members, layout, grads = _case(2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="flat and part_sizes must be 1-D"):
        batch_ops.sum_tables(flat[None], sizes, layout[1], layout[2], len(parts), grads)
    with pytest.raises(tf.errors.InvalidArgumentError, match="one row per key"):
        batch_ops.sum_tables(flat, sizes, layout[1], layout[2], len(parts),
                             [g.reshape(-1) for g in grads])


def test_sum_tables_op_refuses_a_restore_index_past_its_tables_rows():
    parts = [np.arange(3, dtype=np.int32), np.array([0, 3], np.int32)]   # row 3 of 3 rows
    sizes = np.array([3, 2], np.int32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="indexes past its table"):
        batch_ops.sum_tables(np.concatenate(parts), sizes, np.array([0]), np.array([1]), 2,
                             [np.ones((2, 4), np.float32)])
    with pytest.raises(tf.errors.InvalidArgumentError, match="naming parts below n_parts"):
        batch_ops.sum_tables(np.concatenate(parts), np.array([3, -1], np.int32),
                             np.array([0]), np.array([1]), 2, [np.ones((2, 4), np.float32)])


def test_sum_tables_op_refuses_layouts_that_would_misplace_rows():
    parts, flat, sizes, members, layout, grads = _case(0)
    # A negative part count, once printed by numba and returned with no output set.
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"n_parts a scalar in"):
        batch_ops.sum_tables(flat, sizes, layout[1], layout[2], -1, grads)
    # A table's members apart: its rows would be summed into two blocks of the output.
    rows, restore = np.array([0, 1, 0]), np.array([2, 3, 4])
    flat3 = np.concatenate([np.arange(2), np.arange(2), [0, 1], [1], [0]]).astype(np.int32)
    sizes3 = np.array([2, 2, 2, 1, 1])
    three = [np.ones((n, 4), np.float32) for n in (2, 1, 1)]
    with pytest.raises(tf.errors.InvalidArgumentError, match="members consecutive"):
        batch_ops.sum_tables(flat3, sizes3, rows, restore, 5, three)
    ok = batch_ops.sum_tables(flat3, sizes3, np.array([0, 0, 1]), restore, 5, three)
    assert ok.shape == (4, 4)


def test_sum_tables_op_refuses_an_output_too_large_instead_of_aborting():
    # TensorFlow aborts the process on a shape whose size overflows; the op checks first.
    with pytest.raises(tf.errors.InvalidArgumentError, match="exceed 2\\^62 bytes"):
        batch_ops.sum_tables(np.array([0, 1], np.int32), np.array([2, 0]), np.array([0]),
                             np.array([1]), 2, [tf.zeros([0, 2 ** 62])])


def test_sum_tables_op_of_zero_width_and_int64_batch_sizes():
    parts, flat, sizes, members, layout, grads = _case(1, dim=0)
    out = batch_ops.sum_tables(flat, sizes.astype(np.int64), layout[1], layout[2], len(parts),
                               grads)
    assert out.shape == (_reference_sum(parts, members, grads, 0).shape[0], 0)


def test_the_session_gradient_sum_runs_after_the_gather(sf_init):
    """A loss linear in the embeddings gives a gradient that does not read them: the sum
    (and the update after it) must still wait for the gather, through a data edge."""
    import sparseflow as sf
    from tests.pipeline_utils import make_batch_iterator, two_table_data

    data = two_table_data(0, 64, 50, 20)
    specs = [sf.FeatureSpec("f1", table_name="t1"), sf.FeatureSpec("f3", table_name="t2")]
    tables = {name: sf.create_table(tf.int64, 4, name, tf.zeros_initializer(),
                                    device_vocabulary_size=100) for name in ("t1", "t2")}
    batch = make_batch_iterator(data, 32, specs).get_next()
    loss = tf.add_n([tf.reduce_sum(sf.sparse_lookup(tables[s.table_name], s, batch=batch))
                     for s in specs])
    tf.gradients(loss, list(tables.values()))
    graph = tf.compat.v1.get_default_graph()
    # The tables may be split over several ops (ops/op_shards.py): every sum waits for
    # every gather.
    gathers = [op for op in graph.get_operations() if op.type == batch_ops.GATHER_TABLES]
    sums = [op for op in graph.get_operations() if op.type == batch_ops.SUM_TABLES]
    assert gathers and len(sums) == len(gathers)
    for summed in sums:
        seen, stack = set(), [summed]
        while stack:
            op = stack.pop()
            for upstream in [t.op for t in op.inputs] + list(op.control_inputs):
                if upstream.name not in seen:
                    seen.add(upstream.name)
                    stack.append(upstream)
        for gather in gathers:
            assert gather.name in seen
            # The path runs through the op's own batch input, not a constant Grappler may
            # fold.
            assert gather in summed.inputs[0].op.control_inputs
