"""The compiled lazy Adam update (``SparseflowLazyAdamTables``, ``ops/optimizer_ops.py``)
against a numpy Adam and the numpy kernel, its bookkeeping through the registry (steps,
checkpoint marks, the key processor's drains), and the Session graph that uses it."""

import numpy as np
import pytest
import tensorflow as tf

import sparseflow as sf
from sparseflow.ops import optimizer_kernels, optimizer_ops
from sparseflow.ops import table_registry as registry
from sparseflow.pipeline.key_processor import KeyProcessor
from tests.test_gather_op import push_events

DIM = 4
HP = dict(learning_rate=0.01, beta1=0.9, beta2=0.999, epsilon=1e-8)


def _storage(rng, rows):
    storage = rng.normal(size=(rows, 3 * DIM)).astype(np.float32)
    storage[:, 2 * DIM:] = np.abs(storage[:, 2 * DIM:])   # v >= 0
    return storage


@pytest.fixture
def tables():
    """Two registered tables (30 and 20 rows of [w | m | v]) with marks; closed after."""
    rng = np.random.default_rng(3)
    made = []
    for rows in (30, 20):
        entry = registry.TableEntry(f"t{rows}")
        storage, marks = _storage(rng, rows), np.zeros(rows, np.bool_)
        entry.publish(storage)
        entry.publish_marks(marks)
        made.append((entry, storage, marks))
    yield made
    for entry, _, _ in made:
        entry.close()


def _numpy_adam(storage, rows, grads, step):
    """One lazy Adam step in float64 (TF's LazyAdamOptimizer formulas), rows distinct."""
    out = storage.astype(np.float64)
    b1, b2 = float(np.float32(HP["beta1"])), float(np.float32(HP["beta2"]))
    lr_t = HP["learning_rate"] * np.sqrt(1 - b2 ** step) / (1 - b1 ** step)
    for r, g in zip(rows, grads.astype(np.float64)):
        if r < 0:
            continue
        w, m, v = out[r, :DIM], out[r, DIM:2 * DIM], out[r, 2 * DIM:]
        m[:] = b1 * m + (1 - b1) * g
        v[:] = b2 * v + (1 - b2) * g * g
        w -= lr_t * m / (np.sqrt(v) + HP["epsilon"])
    return out


def test_update_op_vs_numpy_adam_and_the_numpy_kernel_over_steps(tables):
    rng = np.random.default_rng(0)
    (ea, sa, ma), (eb, sb, mb) = tables
    ea.steps = 7   # a restored count: the op's bias correction continues from it
    kernel_a, kernel_b = sa.copy(), sb.copy()
    single_a, single_b = sa.copy(), sb.copy()
    updated_a, updated_b = set(), set()
    for step in range(3):
        ra = rng.choice(30, 6, replace=False).astype(np.int32)
        ra[0] = -1
        rb = rng.choice(20, 3, replace=False).astype(np.int32)
        ga = rng.normal(size=(6, DIM)).astype(np.float32)
        gb = rng.normal(size=(3, DIM)).astype(np.float32)
        expected_a = _numpy_adam(sa, ra, ga, 8 + step)
        expected_b = _numpy_adam(sb, rb, gb, 1 + step)
        n = optimizer_ops.lazy_adam_tables([ea.token, eb.token], [ra, rb], [ga, gb], **HP)
        assert int(n) == 2
        np.testing.assert_allclose(sa, expected_a, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(sb, expected_b, rtol=1e-5, atol=1e-6)
        # The very same float32 arithmetic as the numpy function's kernel.
        optimizer_kernels.apply_lazy_adam_tables((kernel_a, kernel_b), (ra, rb), (ga, gb),
                                                 [8 + step, 1 + step], **HP)
        np.testing.assert_array_equal(sa, kernel_a)
        np.testing.assert_array_equal(sb, kernel_b)
        # And as the single-table kernel (the numpy function's path for rows not known
        # distinct) computes it: one float32 step size for every path.
        optimizer_kernels.apply_lazy_adam(single_a, ra, ga, step=8 + step, **HP)
        optimizer_kernels.apply_lazy_adam(single_b, rb, gb, step=1 + step, **HP)
        np.testing.assert_array_equal(sa, single_a)
        np.testing.assert_array_equal(sb, single_b)
        updated_a.update(ra[ra >= 0].tolist())
        updated_b.update(rb.tolist())
    assert (ea.steps, eb.steps) == (10, 3)
    # Marked for the next incremental checkpoint: exactly the rows updated.
    assert set(np.flatnonzero(ma).tolist()) == updated_a
    assert set(np.flatnonzero(mb).tolist()) == updated_b
    # One DRAIN per table per update, in order.
    for entry in (ea, eb):
        events, overflow, lost = entry.take_events()
        assert events.tolist() == [registry.DRAIN] * 3 and overflow == -1 and not lost


def test_update_op_refuses_and_changes_nothing(tables):
    (ea, sa, ma), (eb, sb, mb) = tables
    before = sa.copy(), sb.copy()
    ok_rows = [np.array([1, 2], np.int32), np.array([3], np.int32)]
    ok_grads = [np.ones((2, DIM), np.float32), np.ones((1, DIM), np.float32)]
    closed = registry.TableEntry("closed")
    closed.publish(np.zeros((5, 3 * DIM), np.float32))
    stale = closed.token
    closed.close()
    with pytest.raises(tf.errors.FailedPreconditionError, match="names no table alive"):
        optimizer_ops.lazy_adam_tables([ea.token, stale], ok_rows, ok_grads, **HP)
    cases = [
        ([np.array([1, 2], np.int32), np.array([20], np.int32)], ok_grads, "outside its table"),
        ([np.array([1, -2], np.int32), ok_rows[1]], ok_grads, "outside its table"),
        (ok_rows, [np.ones((3, DIM), np.float32), ok_grads[1]], "3 \\* dim wide"),
        (ok_rows, [np.ones((2, DIM + 1), np.float32), ok_grads[1]], "3 \\* dim wide"),
    ]
    for rows, grads, match in cases:
        with pytest.raises(tf.errors.InvalidArgumentError, match=match):
            optimizer_ops.lazy_adam_tables([ea.token, eb.token], rows, grads, **HP)
    # The second table's bad row is found before the first table is touched.
    np.testing.assert_array_equal(sa, before[0])
    np.testing.assert_array_equal(sb, before[1])
    assert (ea.steps, eb.steps) == (0, 0) and not ma.any() and not mb.any()
    assert not ea.has_events() and not eb.has_events()


def test_update_op_refuses_inputs_of_the_wrong_shape(tables):
    from sparseflow.ops import tf_capi

    entry = tables[0][0]
    optimizer_ops.lazy_adam_tables([entry.token], [np.zeros(0, np.int32)],
                                   [np.zeros((0, DIM), np.float32)], **HP)   # registers it
    hparams = np.array([0.01, 0.9, 0.999, 1e-8])
    rows, grads = np.zeros(0, np.int32), np.zeros((0, DIM), np.float32)
    for tokens, hp in (([[entry.token]], hparams), ([entry.token], hparams[:3]),
                       ([entry.token], hparams[None])):
        with pytest.raises(tf.errors.InvalidArgumentError, match="SparseflowLazyAdamTables"):
            tf_capi.apply_op(optimizer_ops.LAZY_ADAM_TABLES,
                             [tf.constant(tokens, tf.int64), tf.constant(hp), rows, grads], 1,
                             attrs={"N": 1})


def test_update_op_is_stateful_in_a_graph(tables):
    entry, storage, _ = tables[0]
    graph = tf.Graph()
    with graph.as_default():
        op = optimizer_ops.lazy_adam_tables([entry.token], [np.array([4], np.int32)],
                                            [np.ones((1, DIM), np.float32)], **HP,
                                            name="update")
        assert op.op.type == optimizer_ops.LAZY_ADAM_TABLES and op.op.op_def.is_stateful
        with tf.compat.v1.Session(graph=graph) as session:
            for _ in range(2):   # two runs, two updates: nothing folded or cached
                session.run(op)
    assert entry.steps == 2


def test_a_drain_frees_evicted_rows_only_as_far_as_the_releases_queued_before_it():
    """The key processor applies compiled ops' events in queue order: a DRAIN queued before
    a batch's release must not free rows that batch (still waiting for its update) holds."""
    processor = KeyProcessor("t", 100, 0, lambda rows, keys: None)
    processor.track_in_flight = True
    entry = registry.TableEntry("t")
    try:
        entry.publish(np.zeros((100, 3), np.float32))
        processor.take_kernel_events(entry, lambda: False)   # an optimizer is bound
        one = np.array([1], np.int32)
        first = processor.process(np.array([1, 2], np.int64), np.array([2]), one, True, 0).seq
        second = processor.process(np.array([3], np.int64), np.array([1]), one, True, 0).seq
        processor.evict(0)   # every key goes; both batches are in flight
        assert processor.rows_waiting == 3
        # The first batch's step ran (gather, update); the second was gathered after it.
        push_events(entry.slot, np.array([first, registry.DRAIN, second]))
        assert processor.rows_waiting == 3 and processor.batches_in_flight == 0
        push_events(entry.slot, np.array([registry.DRAIN]))   # the second batch's update ran
        assert processor.rows_waiting == 0 and processor.rows_free == 100
    finally:
        entry.close()


def _train(steps_to_run):
    """A small Session training through sparseflow's lazy Adam; returns (graph, table,
    optimizer, session results)."""
    from sparseflow.optimizers import lazy_adam
    from tests.pipeline_utils import make_batch_iterator, run_all

    data = {"a": (np.arange(8 * steps_to_run * 2, dtype=np.int64).reshape(-1, 2) * 7) % 23}
    spec = sf.FeatureSpec("a", table_name="t")
    table = sf.create_table(tf.int64, DIM, "t", tf.compat.v1.constant_initializer(0.5),
                            device_vocabulary_size=64)
    it = make_batch_iterator(data, 8, [spec])
    emb = sf.sparse_lookup(table, spec, batch=it.get_next())
    optimizer = lazy_adam.create_hash_optimizer(0.1)
    train = optimizer.apply_gradients([(tf.gradients(tf.reduce_sum(emb * emb), table)[0],
                                        table)])
    graph = tf.compat.v1.get_default_graph()
    sf.start_asc_pipeline()
    with tf.compat.v1.Session() as sess:
        outs = run_all(sess, [train], it)
    return graph, table, optimizer, outs


def test_session_training_updates_through_the_op_and_counts_its_steps(sf_init):
    graph, table, optimizer, outs = _train(5)
    ops = graph.get_operations()
    assert [op.name for op in ops if op.type == optimizer_ops.LAZY_ADAM_TABLES] == [
        "LazyAdam/sparseflow_update"]
    assert not [op for op in ops if op.type == "PyFunc" and "sparseflow_update" in op.name]
    assert len(outs) == 5 and optimizer.steps("t") == 5
    optimizer.set_steps("t", 2)   # a restore: the op continues from the restored count
    assert optimizer.steps("t") == 2 and optimizer.next_step("t") == 3
    with table.processor.lock:    # entering applies what the ops queued
        pass
    assert table.processor.batches_in_flight == 0


def test_an_optimizer_carries_its_step_count_to_a_table_created_again(sf_init):
    """A table created again under its name (a new graph's scope) gets a new registry entry:
    the optimizer's count carries over to it, as it did in the numpy function's path."""
    from sparseflow.table import SparseTable

    graph, table, optimizer, outs = _train(3)
    assert optimizer.steps("t") == 3
    rebuilt = SparseTable.__new__(SparseTable)   # stands for the recreated table
    rebuilt.__dict__.update(table.__dict__)
    from sparseflow.embed.host_rows import HostRows
    rows = HostRows("t", 64, DIM, table.rows.init_spec)
    rows.bind_optimizer(optimizer)
    rows.allocate()
    rebuilt.rows = rows
    optimizer._registry_token(rebuilt)
    assert optimizer.steps("t") == 3
    assert rows.registry_entry().steps == 3 and optimizer.next_step("t") == 4
    rows.close()
