"""Training invariants in a tf.compat.v1 Session: equivalence, laziness, determinism."""

import numpy as np
import pytest
import tensorflow as tf

import sparseflow as sf
from sparseflow.embed.initializers import init_rows
from sparseflow.optimizers import lazy_adam
from sparseflow.pipeline.insert_func import batch_rows
from tests.pipeline_utils import (int_keys, linear_tower, make_batch_iterator,
                                  reference_lazy_adam, run_all, two_table_data)

B, STEPS = 32, 50
V1, V2 = 300, 60
D1, D2 = 8, 4
LR_SPARSE, LR_DENSE = 0.05, 0.1


def _data(seed=0):
    return two_table_data(seed, B * STEPS, V1, V2)


def _sparseflow_losses(data, initializer, num_parallel_calls=None):
    """Trains through sparseflow; returns (losses, exported tables, init specs)."""
    sf.init()
    specs = [sf.FeatureSpec("f1", table_name="t1"), sf.FeatureSpec("f2", table_name="t1"),
             sf.FeatureSpec("f3", table_name="t2")]
    t1 = sf.create_table(tf.int64, D1, "t1", initializer, device_vocabulary_size=2 * V1)
    t2 = sf.create_table(tf.int64, D2, "t2", initializer, device_vocabulary_size=2 * V2)
    it = make_batch_iterator(data, B, specs, num_parallel_calls=num_parallel_calls)
    batch = it.get_next()
    tables = {"t1": t1, "t2": t2}
    pooled = [tf.reduce_sum(sf.sparse_lookup(tables[s.table_name], s, batch=batch), 1)
              for s in specs]
    loss = linear_tower(pooled, batch["label"])
    dense, sparse = sf.get_dense_and_sparse_variable()
    grads = tf.gradients(loss, dense + sparse)
    train = tf.group(
        tf.compat.v1.train.GradientDescentOptimizer(LR_DENSE).apply_gradients(
            zip(grads[:len(dense)], dense)),
        lazy_adam.create_hash_optimizer(learning_rate=LR_SPARSE).apply_gradients(
            zip(grads[len(dense):], sparse)))
    sf.start_asc_pipeline()
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        losses = [l for _, l in run_all(sess, [train, loss], it)]
    exported = {name: t.export() for name, t in tables.items()}
    init_specs = {name: t.rows.init_spec for name, t in tables.items()}
    sf.terminate_config_initializer()
    return np.array(losses), exported, init_specs


def _reference_losses(data, init_specs):
    """The same model on dense tf.Variables, tf.nn.embedding_lookup and plain-TF lazy Adam."""
    ds = tf.data.Dataset.from_tensor_slices(data).batch(B, drop_remainder=True)
    it = tf.compat.v1.data.make_initializable_iterator(ds)
    batch = it.get_next()
    variables = {}
    for name, vocab, dim in (("t1", V1, D1), ("t2", V2, D2)):
        # Row k starts where sparseflow starts key k: init values are a function of the key.
        init = np.zeros((vocab, dim), np.float32)
        init_rows(init, np.arange(vocab, dtype=np.int32), np.arange(vocab, dtype=np.int64),
                  init_specs[name], dim)
        variables[name] = (tf.Variable(init, name=name),
                           tf.Variable(tf.zeros([vocab, dim]), name=name + "_m"),
                           tf.Variable(tf.zeros([vocab, dim]), name=name + "_v"),
                           tf.Variable(0, dtype=tf.int64, name=name + "_step"))
    lookups = (("f1", "t1"), ("f2", "t1"), ("f3", "t2"))
    pooled = [tf.reduce_sum(tf.nn.embedding_lookup(variables[t][0], batch[f]), 1)
              for f, t in lookups]
    loss = linear_tower(pooled, batch["label"])
    dense = [v for v in tf.compat.v1.trainable_variables() if v.name.startswith("w")]
    tables = [variables["t1"][0], variables["t2"][0]]
    grads = tf.gradients(loss, dense + tables)
    updates = [tf.compat.v1.train.GradientDescentOptimizer(LR_DENSE).apply_gradients(
        zip(grads[:len(dense)], dense))]
    for grad, name in zip(grads[len(dense):], ("t1", "t2")):
        var, m, v, step = variables[name]
        updates.append(reference_lazy_adam(var, m, v, step, grad, LR_SPARSE))
    train = tf.group(*updates)
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        losses = [l for _, l in run_all(sess, [train, loss], it)]
        final = {name: sess.run(variables[name][0]) for name in ("t1", "t2")}
    return np.array(losses), final


def test_equivalence_with_dense_variable_and_plain_tf_lazy_adam():
    data = _data()
    with tf.Graph().as_default() as graph:
        ours, exported, init_specs = _sparseflow_losses(
            data, tf.compat.v1.truncated_normal_initializer(stddev=0.1, seed=3))
    # The embeddings are gathered, and their gradient summed, by compiled ops (one of each
    # per width: two here), not numpy functions.
    ops = graph.get_operations()
    sums = [op for op in ops if op.type == "SparseflowSumTables"]
    assert len(sums) == 2 and all("sparseflow_gather_grad" in op.name for op in sums)
    gathers = [op for op in ops if op.type == "SparseflowGatherTables"]
    assert len(gathers) == 2 and all("sparseflow_gather" in op.name for op in gathers)
    assert not [op for op in ops if op.type == "PyFunc" and "sparseflow_gather" in op.name]
    with tf.Graph().as_default():
        ref, final = _reference_losses(data, init_specs)
    assert len(ours) == len(ref) == STEPS
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)
    assert ours[-10:].mean() < ours[:10].mean() - 0.01  # it actually trained
    for name in ("t1", "t2"):
        keys, emb = exported[name]
        np.testing.assert_allclose(emb, final[name][keys], rtol=1e-4, atol=1e-5)


def test_training_is_deterministic():
    data = _data(seed=1)
    init = tf.compat.v1.random_normal_initializer(stddev=0.05)
    with tf.Graph().as_default():
        first, exp1, _ = _sparseflow_losses(data, init)
    with tf.Graph().as_default():
        second, exp2, _ = _sparseflow_losses(data, init)
    np.testing.assert_array_equal(first, second)
    for name in exp1:
        np.testing.assert_array_equal(exp1[name][0], exp2[name][0])
        np.testing.assert_array_equal(exp1[name][1], exp2[name][1])


def test_parallel_map_without_admission_is_reproducible():
    data = _data(seed=4)
    init = tf.compat.v1.truncated_normal_initializer(stddev=0.05)
    runs = []
    for _ in range(2):
        with tf.Graph().as_default():
            runs.append(_sparseflow_losses(data, init, num_parallel_calls=4))
    with tf.Graph().as_default():
        sequential = _sparseflow_losses(data, init)
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    np.testing.assert_array_equal(runs[0][0], sequential[0])
    for name in runs[0][1]:  # exported (sorted by key) tables match too
        np.testing.assert_array_equal(runs[0][1][name][1], runs[1][1][name][1])
        np.testing.assert_array_equal(runs[0][1][name][1], sequential[1][name][1])


def test_untouched_rows_and_slots_do_not_change(sf_init):
    rng = np.random.default_rng(2)
    data = {"f": int_keys(rng, 1000, (8 * B, 3)), "label": np.ones(8 * B, np.float32)}
    spec = sf.FeatureSpec("f", table_name="t")
    table = sf.create_table(tf.int64, 4, "t", tf.compat.v1.random_uniform_initializer(-1, 1),
                            device_vocabulary_size=2000)
    it = make_batch_iterator(data, B, [spec])
    batch = it.get_next()
    emb = sf.sparse_lookup(table, spec, batch=batch)
    loss = tf.reduce_sum(tf.square(emb))
    _, sparse = sf.get_dense_and_sparse_variable()
    opt = lazy_adam.create_hash_optimizer(learning_rate=0.1)
    train = opt.apply_gradients(zip(tf.gradients(loss, sparse), sparse))
    sf.start_asc_pipeline()
    with tf.compat.v1.Session() as sess:
        sess.run(it.initializer)
        sess.run(train)  # step 1: slots of touched rows become non-zero
        for _ in range(5):
            # Under the key processor's lock: the input pipeline allocates and initialises
            # the next batches' rows meanwhile, and a row it allocated between the copy and
            # the count would count as old with its initial values missing from the copy.
            with table.processor.lock:
                before = table.rows.storage.copy()
                allocated = table.processor.size  # rows allocated before this step
            _, rows = sess.run([train, batch_rows(batch, "t")])
            after = table.rows.storage
            touched = np.zeros(table.capacity(), bool)
            touched[rows[rows >= 0]] = True
            old = np.zeros(table.capacity(), bool)
            old[:allocated] = True
            untouched = old & ~touched
            assert untouched.any() and touched.any()
            np.testing.assert_array_equal(after[untouched], before[untouched])
            assert not np.array_equal(after[touched & old], before[touched & old])


@pytest.mark.parametrize("module,kwargs", [
    ("gradient_descent", dict(learning_rate=1.0)),
    ("adagrad", dict(learning_rate=0.3, initial_accumulator_value=0.5)),
    ("ftrl", dict(learning_rate=0.1, l1_regularization_strength=0.001)),
])
def test_every_optimizer_trains_through_the_session(sf_init, module, kwargs):
    import importlib
    create = importlib.import_module(f"sparseflow.optimizers.{module}").create_hash_optimizer
    rng = np.random.default_rng(3)
    data = {"f": int_keys(rng, 50, (20 * B, 2))}
    spec = sf.FeatureSpec("f", table_name="t")
    table = sf.create_table(tf.int64, 4, "t", tf.compat.v1.constant_initializer(0.5),
                            device_vocabulary_size=100)
    it = make_batch_iterator(data, B, [spec])
    emb = sf.sparse_lookup(table, spec, batch=it.get_next())
    loss = tf.reduce_sum(tf.square(emb)) / B  # minimum at zero embeddings
    _, sparse = sf.get_dense_and_sparse_variable()
    train = create(**kwargs).apply_gradients(zip(tf.gradients(loss, sparse), sparse))
    sf.start_asc_pipeline()
    with tf.compat.v1.Session() as sess:
        losses = [l for _, l in run_all(sess, [train, loss], it)]
    assert losses[-1] < 0.5 * losses[0]
