"""Dynamic expansion: growing tables and the by-address optimizers (Rec SDK's pattern).

Numerical correctness against a fixed-size table with the regular optimizers and against plain
TF on dense variables; the collections; growth under a parallel, prefetching pipeline; errors;
checkpoints and eviction under expansion.
"""

import threading

import numpy as np
import pytest
import tensorflow as tf

import sparseflow as sf
from sparseflow.embed.host_rows import HostRows
from sparseflow.embed.initializers import init_rows, init_spec_from_tf
from sparseflow.ops.optimizer_kernels import apply_sgd
from sparseflow.optimizers import (adagrad, adagrad_by_addr, ftrl, gradient_descent,
                                   gradient_descent_by_addr, lazy_adam, lazy_adam_by_addr)
from tests.pipeline_utils import (int_keys, linear_tower, make_batch_iterator,
                                  reference_lazy_adam, run_all, sorted_state, two_table_data)

LOCAL_EMB = "ASCEND_SPARSE_LOOKUP_LOCAL_EMB"
ADDRESS = "ASCEND_SPARSE_LOOKUP_ID_OFFSET"
B, STEPS = 32, 30
V1, V2 = 300, 60
D1, D2 = 8, 4
LR_SPARSE, LR_DENSE = 0.05, 0.1

# (by-address factory, regular factory, shared keyword arguments)
OPTIMIZERS = {
    "lazy_adam": (lazy_adam_by_addr.create_hash_optimizer_by_address,
                  lazy_adam.create_hash_optimizer, dict(learning_rate=LR_SPARSE)),
    "sgd": (gradient_descent_by_addr.create_hash_optimizer_by_addr,
            gradient_descent.create_hash_optimizer,
            dict(learning_rate=0.5, weight_decay=1e-3)),
    "adagrad": (adagrad_by_addr.create_hash_optimizer_by_address,
                adagrad.create_hash_optimizer,
                dict(learning_rate=0.1, initial_accumulator_value=0.5)),
}


def _data(seed=0, drift=0):
    """Two tables' keys and learnable labels; with ``drift``, f1 takes new keys every batch,
    so the tables keep growing while training."""
    return two_table_data(seed, B * STEPS, V1, V2, drift)


def _train(data, optimizer="lazy_adam", expansion=True, block_rows=1, parallel=None):
    """Trains the two-table model; returns (losses, exported tables, capacities of t1 after
    each step, init specs). ``expansion``: growing tables and the by-address optimizer through
    Rec SDK's collections; else fixed tables and the regular optimizer."""
    by_address, regular, kwargs = OPTIMIZERS[optimizer]
    init = tf.compat.v1.truncated_normal_initializer(stddev=0.1, seed=3)
    with tf.Graph().as_default():
        sf.init(use_dynamic_expansion=expansion)
        size = {"expansion_block_rows": block_rows} if expansion else {}
        specs = [sf.FeatureSpec("f1", table_name="t1"), sf.FeatureSpec("f2", table_name="t1"),
                 sf.FeatureSpec("f3", table_name="t2")]
        tables = {"t1": sf.create_table(tf.int64, D1, "t1", init, device_vocabulary_size=4000,
                                        **size),
                  "t2": sf.create_table(tf.int64, D2, "t2", init, device_vocabulary_size=200,
                                        **size)}
        ds = tf.data.Dataset.from_tensor_slices(data).batch(B, drop_remainder=True)
        ds = ds.map(sf.get_asc_insert_func(tgt_key_specs=specs), num_parallel_calls=parallel)
        if parallel:
            ds = ds.prefetch(8)  # the pipeline grows the tables while the model trains
        it = tf.compat.v1.data.make_initializable_iterator(ds)
        batch = it.get_next()
        pooled = [tf.reduce_sum(sf.sparse_lookup(tables[s.table_name], s, batch=batch), 1)
                  for s in specs]
        loss = linear_tower(pooled, batch["label"])
        dense = tf.compat.v1.trainable_variables()
        if expansion:
            local_embs = tf.compat.v1.get_collection(LOCAL_EMB)
            addresses = tf.compat.v1.get_collection(ADDRESS)
            assert len(local_embs) == len(addresses) == 2  # one pair per table and batch
            grads = tf.gradients(loss, dense + local_embs)
            sparse_op = by_address(**kwargs).apply_gradients(
                list(zip(grads[len(dense):], addresses)))
        else:
            _, sparse = sf.get_dense_and_sparse_variable()
            grads = tf.gradients(loss, dense + sparse)
            sparse_op = regular(**kwargs).apply_gradients(zip(grads[len(dense):], sparse))
        train = tf.group(tf.compat.v1.train.GradientDescentOptimizer(LR_DENSE).apply_gradients(
            zip(grads[:len(dense)], dense)), sparse_op)
        sf.start_asc_pipeline()
        losses, capacities = [], []
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), it.initializer])
            while True:
                try:
                    losses.append(sess.run([train, loss])[1])
                except tf.errors.OutOfRangeError:
                    break
                capacities.append(tables["t1"].capacity())
        exported = {name: t.export() for name, t in tables.items()}
        init_specs = {name: t.rows.init_spec for name, t in tables.items()}
        sf.terminate_config_initializer()
    return np.array(losses), exported, capacities, init_specs


def _reference_losses(data, init_specs):
    """The same model on dense tf.Variables, tf.nn.embedding_lookup and plain-TF lazy Adam."""
    with tf.Graph().as_default():
        ds = tf.data.Dataset.from_tensor_slices(data).batch(B, drop_remainder=True)
        it = tf.compat.v1.data.make_initializable_iterator(ds)
        batch = it.get_next()
        variables = {}
        for name, vocab, dim in (("t1", V1, D1), ("t2", V2, D2)):
            init = np.zeros((vocab, dim), np.float32)  # row k starts where key k starts
            init_rows(init, np.arange(vocab, dtype=np.int32), np.arange(vocab, dtype=np.int64),
                      init_specs[name], dim)
            variables[name] = (tf.Variable(init), tf.Variable(tf.zeros([vocab, dim])),
                               tf.Variable(tf.zeros([vocab, dim])),
                               tf.Variable(0, dtype=tf.int64))
        pooled = [tf.reduce_sum(tf.nn.embedding_lookup(variables[t][0], batch[f]), 1)
                  for f, t in (("f1", "t1"), ("f2", "t1"), ("f3", "t2"))]
        loss = linear_tower(pooled, batch["label"])
        dense = [v for v in tf.compat.v1.trainable_variables() if v.name.startswith("w")]
        tables = [variables["t1"][0], variables["t2"][0]]
        grads = tf.gradients(loss, dense + tables)
        updates = [tf.compat.v1.train.GradientDescentOptimizer(LR_DENSE).apply_gradients(
            zip(grads[:len(dense)], dense))]
        for grad, name in zip(grads[len(dense):], ("t1", "t2")):
            updates.append(reference_lazy_adam(*variables[name], grad, LR_SPARSE))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            return np.array([l for _, l in run_all(sess, [tf.group(*updates), loss], it)])


# -- numerical correctness ---------------------------------------------------------------------

@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_growing_table_trains_like_a_fixed_one(optimizer):
    data = _data()
    ours, exported, capacities, init_specs = _train(data, optimizer, expansion=True)
    fixed, fixed_exported, _, _ = _train(data, optimizer, expansion=False)
    assert len(ours) == len(fixed) == STEPS
    np.testing.assert_allclose(ours, fixed, rtol=1e-5, atol=1e-6)
    for name in exported:
        np.testing.assert_array_equal(exported[name][0], fixed_exported[name][0])
        np.testing.assert_allclose(exported[name][1], fixed_exported[name][1], rtol=1e-5,
                                   atol=1e-6)
    # Started at one row; grew by doubling (block of 1 row), never failed on "full".
    assert capacities == sorted(capacities) and capacities[-1] >= exported["t1"][0].shape[0]
    assert 1 < capacities[0] < capacities[-1]
    if optimizer == "lazy_adam":  # and against plain TF on dense variables
        np.testing.assert_allclose(ours, _reference_losses(data, init_specs), rtol=1e-5,
                                   atol=1e-6)
        assert ours[-10:].mean() < ours[:10].mean() - 0.01


def test_capacity_grows_in_whole_blocks_and_stats_report_it(graph):
    sf.init(use_dynamic_expansion=True)
    spec = sf.FeatureSpec("f", table_name="t")
    table = sf.create_table(tf.int64, 2, "t", tf.compat.v1.ones_initializer(),
                            device_vocabulary_size=1, host_vocabulary_size=10,
                            expansion_block_rows=16)
    assert table.config.host_vocabulary_size == 0  # Rec SDK resets the host tier
    assert table.capacity() == 16
    data = {"f": np.arange(100, dtype=np.int64).reshape(10, 10)}
    it = make_batch_iterator(data, 1, [spec], read_ahead=False)
    emb = sf.sparse_lookup(table, spec, batch=it.get_next())
    sf.start_asc_pipeline()
    seen = []
    with tf.compat.v1.Session() as sess:
        sess.run(it.initializer)
        for _ in range(10):
            sess.run(emb)
            seen.append(table.capacity())
    assert seen == [16, 32, 32, 64, 64, 64, 128, 128, 128, 128]
    stats = table.stats()
    assert stats["capacity"] == 128 and stats["keys_held"] == 100 and stats["rows_free"] == 28


def _square_loss_training(create, expansion_rows=1, eval_lookup=False):
    """sum(emb^2)/B (minimum at zero embeddings) through the collections; returns losses."""
    rng = np.random.default_rng(3)
    data = {"f": int_keys(rng, 50, (20 * B, 2)), "g": int_keys(rng, 50, (20 * B, 1))}
    specs = [sf.FeatureSpec("f", table_name="t"), sf.FeatureSpec("g", table_name="t")]
    table = sf.create_table(tf.int64, 4, "t", tf.compat.v1.constant_initializer(0.5),
                            expansion_block_rows=expansion_rows)
    it = make_batch_iterator(data, B, specs)
    batch = it.get_next()
    embs = [sf.sparse_lookup(table, s, batch=batch) for s in specs]  # share one pair
    if eval_lookup:
        eval_spec = sf.FeatureSpec("f", table_name="t")
        eval_it = make_batch_iterator(data, B, [eval_spec], is_training=False)
        sf.sparse_lookup(table, eval_spec, batch=eval_it.get_next(), is_train=False)
    loss = sum(tf.reduce_sum(tf.square(e)) for e in embs) / B
    local_embs, addresses = (tf.compat.v1.get_collection(LOCAL_EMB),
                             tf.compat.v1.get_collection(ADDRESS))
    assert len(local_embs) == len(addresses) == 1
    assert local_embs[0].dtype == tf.float32 and local_embs[0].shape.as_list() == [None, 4]
    assert addresses[0].dtype == tf.int64 and addresses[0].shape.as_list() == [None]
    grads = tf.gradients(loss, local_embs)
    train = create().apply_gradients(list(zip(grads, addresses)))
    sf.start_asc_pipeline()
    with tf.compat.v1.Session() as sess:
        return [l for _, l in run_all(sess, [train, loss], it)]


@pytest.mark.parametrize("create", [
    lambda: lazy_adam_by_addr.create_hash_optimizer_by_address(learning_rate=0.1),
    lambda: gradient_descent_by_addr.create_hash_optimizer_by_addr(1.0),
    lambda: adagrad_by_addr.create_hash_optimizer_by_address(0.3, initial_accumulator_value=0.5),
], ids=["lazy_adam", "sgd", "adagrad"])
def test_rec_sdk_collection_pattern_trains(graph, create):
    sf.init(use_dynamic_expansion=True)
    losses = _square_loss_training(create, eval_lookup=True)
    assert losses[-1] < 0.5 * losses[0]


def test_modify_graph_lookups_fill_the_collections_too(graph):
    sf.init(use_dynamic_expansion=True)
    table = sf.create_table(tf.int64, 4, "t", tf.compat.v1.constant_initializer(0.5),
                            expansion_block_rows=2)
    keys = np.random.default_rng(0).integers(0, 100, (256, 3)).astype(np.int64)
    it = tf.compat.v1.data.make_initializable_iterator(
        tf.data.Dataset.from_tensor_slices({"a": keys}).batch(16))
    ids = it.get_next()["a"]
    embs = [sf.sparse_lookup(table, ids, 1, modify_graph=True) for _ in range(2)]
    loss = sum(tf.reduce_sum(tf.square(e)) for e in embs) / 16
    local_embs, addresses = (tf.compat.v1.get_collection(LOCAL_EMB),
                             tf.compat.v1.get_collection(ADDRESS))
    assert len(local_embs) == len(addresses) == 1  # two lookups of one batch share the pair
    train = lazy_adam_by_addr.create_hash_optimizer_by_address(0.1).apply_gradients(
        list(zip(tf.gradients(loss, local_embs), addresses)))
    sf.modify_graph_and_start_emb_cache()
    with tf.compat.v1.Session() as sess:
        sess.run(sf.get_initializer(True))
        losses = [sess.run([train, loss])[1] for _ in range(16)]
    assert losses[-1] < 0.5 * losses[0]
    assert table.size() == np.unique(keys).shape[0] and table.capacity() >= table.size()


def test_sgd_weight_decay_matches_numpy_for_one_step(graph):
    lr, decay = 0.1, 0.2
    sf.init(use_dynamic_expansion=True)
    spec = sf.FeatureSpec("f", table_name="t")
    table = sf.create_table(tf.int64, 3, "t", tf.compat.v1.random_normal_initializer(seed=7),
                            expansion_block_rows=2)
    keys = np.array([[4, 9, 4, 11, 4, 9]], np.int64)
    it = make_batch_iterator({"f": keys}, 1, [spec])
    emb = sf.sparse_lookup(table, spec, batch=it.get_next())
    loss = tf.reduce_sum(emb * emb)
    grads = tf.gradients(loss, tf.compat.v1.get_collection(LOCAL_EMB))
    opt = gradient_descent_by_addr.create_hash_optimizer_by_addr(lr, weight_decay=decay)
    train = opt.apply_gradients(list(zip(grads, tf.compat.v1.get_collection(ADDRESS))))
    sf.start_asc_pipeline()
    with tf.compat.v1.Session() as sess:
        sess.run(it.initializer)
        before, _ = sess.run([emb, train])  # the gather reads before the update
    got_keys, after = table.export()
    w0 = {int(k): before[0, list(keys[0]).index(k)] for k in got_keys}
    counts = {int(k): int((keys == k).sum()) for k in got_keys}
    f32 = np.float32
    expected = np.stack([w0[k] - f32(lr) * (f32(2 * counts[k]) * w0[k] + f32(decay) * w0[k])
                         for k in map(int, got_keys)])
    np.testing.assert_allclose(after, expected, rtol=1e-6)


# -- growth under concurrency ------------------------------------------------------------------

def test_parallel_prefetching_pipeline_loses_no_update():
    data = _data(seed=4, drift=1000)  # new keys every batch: the table grows while training
    parallel, exp_par, caps, _ = _train(data, block_rows=1, parallel=4)
    sequential, exp_seq, _, _ = _train(data, block_rows=1)
    assert caps[0] < caps[-1]  # it grew while the model trained (after step 1)
    np.testing.assert_array_equal(parallel, sequential)
    for name in exp_seq:
        np.testing.assert_array_equal(exp_par[name][0], exp_seq[name][0])
        np.testing.assert_array_equal(exp_par[name][1], exp_seq[name][1])


def test_growth_waits_for_an_update_on_the_old_rows():
    """An update running while the storage is copied would land in the old array and be
    lost; pinned() makes growth wait for it."""
    spec = init_spec_from_tf(tf.compat.v1.zeros_initializer(), (1, 4), 0, 1.0)
    n_updates = 400
    for _ in range(10):
        host = HostRows("t", 1, 4, spec, expansion_block_rows=1)
        host.allocate()
        grad = np.ones((1, 4), np.float32)

        def update(host=host, grad=grad):
            for _ in range(n_updates):
                with host.pinned() as storage:
                    apply_sgd(storage, np.array([0], np.int32), grad, learning_rate=1.0)

        worker = threading.Thread(target=update)
        worker.start()
        for k in range(1, 19):  # 18 doublings, up to 2^18 rows
            host.ensure_rows(2 ** k)
        worker.join()
        assert host.capacity == 2 ** 18 and host.storage.shape[0] == 2 ** 18
        np.testing.assert_array_equal(host.storage[0], -n_updates)


# -- errors ------------------------------------------------------------------------------------

BY_ADDRESS = [lazy_adam_by_addr.create_hash_optimizer_by_address,
              lambda: gradient_descent_by_addr.create_hash_optimizer_by_addr(0.1),
              adagrad_by_addr.create_hash_optimizer_by_address]


@pytest.mark.parametrize("create", BY_ADDRESS, ids=["lazy_adam", "sgd", "adagrad"])
def test_by_address_optimizers_need_expansion(sf_init, create):
    with pytest.raises(ValueError, match=r"^The dynamic expansion mode is not compatible with "
                                         r"the optimizer .*use_dynamic_expansion=True"):
        create()


@pytest.mark.parametrize("create", [
    lazy_adam.create_hash_optimizer, lambda: gradient_descent.create_hash_optimizer(0.1),
    adagrad.create_hash_optimizer, lambda: ftrl.create_hash_optimizer(0.1)],
    ids=["lazy_adam", "sgd", "adagrad", "ftrl"])
def test_regular_optimizers_refuse_expansion(graph, create):
    sf.init(use_dynamic_expansion=True)
    with pytest.raises(ValueError, match=r"^The dynamic expansion mode is not compatible with "
                                         r"the optimizer"):
        create()


@pytest.mark.parametrize("create,kwargs,argument", [
    (lazy_adam_by_addr.create_hash_optimizer_by_address, dict(learning_rate=11.0),
     "learning_rate"),
    (lazy_adam_by_addr.create_hash_optimizer_by_address, dict(beta1=1.0), "beta1"),
    (lazy_adam_by_addr.create_hash_optimizer_by_address, dict(beta2=1.5), "beta2"),
    (lazy_adam_by_addr.create_hash_optimizer_by_address, dict(epsilon=0.0), "epsilon"),
    (lazy_adam_by_addr.create_hash_optimizer_by_address, dict(name=""), "name"),
    (gradient_descent_by_addr.create_hash_optimizer_by_addr, dict(learning_rate=-0.1),
     "learning_rate"),
    (gradient_descent_by_addr.create_hash_optimizer_by_addr,
     dict(learning_rate=0.1, weight_decay=1.5), "weight_decay"),
    (gradient_descent_by_addr.create_hash_optimizer_by_addr,
     dict(learning_rate=0.1, weight_decay=-1e-4), "weight_decay"),
    (adagrad_by_addr.create_hash_optimizer_by_address, dict(initial_accumulator_value=0.0),
     "initial_accumulator_value"),
    (adagrad_by_addr.create_hash_optimizer_by_address, dict(learning_rate=10.5),
     "learning_rate"),
])
def test_argument_ranges_name_the_argument(graph, create, kwargs, argument):
    sf.init(use_dynamic_expansion=True)
    value = kwargs[argument]
    with pytest.raises(ValueError, match=rf"^Argument `{argument}` must be .* Received: "
                                         rf"{value!r}$"):
        create(**kwargs)


def test_expansion_block_rows_is_checked(graph):
    sf.init()
    with pytest.raises(ValueError, match=r"`expansion_block_rows` must be None without "
                                         r"init\(use_dynamic_expansion=True\).*Received: 8"):
        sf.create_table(tf.int64, 2, "t", tf.compat.v1.ones_initializer(),
                        expansion_block_rows=8)
    sf.terminate_config_initializer()
    sf.init(use_dynamic_expansion=True)
    with pytest.raises(ValueError, match=r"`expansion_block_rows` must be an int in "
                                         r"\[1, 2147483647\]. Received: 0"):
        sf.create_table(tf.int64, 2, "t", tf.compat.v1.ones_initializer(),
                        expansion_block_rows=0)
    with pytest.raises(TypeError, match=r"`expansion_block_rows`.*Received: '4'"):
        sf.create_table(tf.int64, 2, "t", tf.compat.v1.ones_initializer(),
                        expansion_block_rows="4")


def test_unknown_addresses_and_tables_are_refused(graph):
    sf.init(use_dynamic_expansion=True)
    spec = sf.FeatureSpec("f", table_name="t")
    table = sf.create_table(tf.int64, 2, "t", tf.compat.v1.ones_initializer())
    it = make_batch_iterator({"f": np.arange(4, dtype=np.int64).reshape(2, 2)}, 1, [spec])
    emb = sf.sparse_lookup(table, spec, batch=it.get_next())
    grad = tf.gradients(tf.reduce_sum(emb), tf.compat.v1.get_collection(LOCAL_EMB))[0]
    opt = lazy_adam_by_addr.create_hash_optimizer_by_address()
    stray = tf.constant([0, 1], tf.int64, name="stray")
    with pytest.raises(ValueError, match=r"^Argument `grads_and_vars` must be .*address of a "
                                         r"training sparse_lookup.*Received: 'stray:0'"):
        opt.apply_gradients([(grad, stray)])
    with pytest.raises(TypeError, match=r"`grads_and_vars`.*create_hash_optimizer.*"
                                        r"Received: SparseTable\(name='t'"):
        opt.apply_gradients([(grad, table)])
    with pytest.raises(TypeError, match=r"`grads_and_vars` must be pairs"):
        opt.apply_gradients([grad])
    address = tf.compat.v1.get_collection(ADDRESS)[0]
    with pytest.raises(ValueError, match=r"`grads_and_vars` must be gradients of shape \[U, 2\]"):
        opt.apply_gradients([(tf.zeros([3, 5]), address)])
    opt.apply_gradients([(grad, address)])  # the registered address is accepted


# -- checkpoints and eviction ------------------------------------------------------------------

def _checkpoint_graph(data, expansion=True):
    sf.init(use_dynamic_expansion=expansion)
    spec = sf.FeatureSpec("f", table_name="t")
    size = dict(expansion_block_rows=1) if expansion else dict(device_vocabulary_size=2000)
    table = sf.create_table(tf.int64, 4, "t", tf.compat.v1.random_normal_initializer(seed=1),
                            **size)
    it = make_batch_iterator(data, B, [spec], read_ahead=False)
    emb = sf.sparse_lookup(table, spec, batch=it.get_next())
    dense = tf.compat.v1.get_variable("dense", initializer=tf.ones([4]))
    loss = tf.reduce_sum(tf.square(tf.reduce_sum(emb, 1) * dense - 1.0)) / B
    if expansion:
        dense_grad, *grads = tf.gradients(loss, [dense] + tf.compat.v1.get_collection(LOCAL_EMB))
        sparse_op = lazy_adam_by_addr.create_hash_optimizer_by_address(0.05).apply_gradients(
            list(zip(grads, tf.compat.v1.get_collection(ADDRESS))))
    else:
        dense_grad, grad = tf.gradients(loss, [dense, table])
        sparse_op = lazy_adam.create_hash_optimizer(0.05).apply_gradients([(grad, table)])
    train = tf.group(tf.compat.v1.assign_sub(dense, 0.1 * dense_grad), sparse_op)
    saver = sf.Saver(max_to_keep=3)
    sf.start_asc_pipeline()
    return table, it, train, loss, saver


def test_save_and_restore_into_a_fresh_one_row_table(graph, tmp_path):
    rng = np.random.default_rng(6)
    data = {"f": (int_keys(rng, 400, (15 * B, 3)) + (np.arange(15 * B) // B * 30)[:, None])}
    prefix = str(tmp_path / "model")
    table, it, train, loss, saver = _checkpoint_graph(data)
    with tf.compat.v1.Session() as sess:
        sess.run([tf.compat.v1.global_variables_initializer(), it.initializer])
        for step in range(1, 11):
            sess.run(train)
            if step == 5:
                saver.save(sess, prefix, global_step=step)
            if step == 10:  # rows added since the full save: an incremental save holds them
                saver.save(sess, prefix, global_step=step, incremental=True)
        saved = sorted_state(table)
        tail = [sess.run([train, loss])[1] for _ in range(5)]
    sf.terminate_config_initializer()

    rest = {"f": data["f"][10 * B:]}
    with tf.Graph().as_default():
        table, it, train, loss, saver = _checkpoint_graph(rest)
        assert table.capacity() == 1
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), it.initializer])
            saver.restore(sess, sf.latest_checkpoint(str(tmp_path)))
            assert table.capacity() >= saved["keys"].shape[0]  # grown to hold the keys
            restored = sorted_state(table)
            resumed = [sess.run([train, loss])[1] for _ in range(5)]
        sf.terminate_config_initializer()
    for name, value in saved.items():
        np.testing.assert_array_equal(restored[name], value, err_msg=name)
    np.testing.assert_array_equal(resumed, tail)

    with tf.Graph().as_default():  # the same checkpoint into a fixed table, regular lazy Adam
        table, it, train, loss, saver = _checkpoint_graph(rest, expansion=False)
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), it.initializer])
            saver.restore(sess, sf.latest_checkpoint(str(tmp_path)))
            fixed = sorted_state(table)
            resumed = [sess.run([train, loss])[1] for _ in range(5)]
        sf.terminate_config_initializer()
    for name, value in saved.items():
        np.testing.assert_array_equal(fixed[name], value, err_msg=name)
    np.testing.assert_allclose(resumed, tail, rtol=1e-5)


def test_incremental_window_spans_growth(graph):
    """Rows added between taking a save window and capturing it (the pipeline runs on) are
    saved; a window given back after a failed save merges into the grown marks."""
    from sparseflow.checkpoint.table_state import capture, restore_window, take_window
    sf.init(use_dynamic_expansion=True)
    table = sf.create_table(tf.int64, 2, "t", tf.compat.v1.ones_initializer(),
                            expansion_block_rows=1)
    sf.start_asc_pipeline()

    def process(keys):
        keys = np.asarray(keys, np.int64)
        table.processor.process(keys, np.array([keys.shape[0]]), np.ones(1, np.int32), True)

    process([1, 2])
    window = take_window(table)
    process([3, 4, 5, 6, 7])  # grows past the window's marks
    assert table.processor.dirty.shape[0] > window[0].shape[0]
    assert sorted(capture(table, window).keys) == [1, 2, 3, 4, 5, 6, 7]
    restore_window(table, window)
    assert table.processor.dirty[:7].all()


def test_eviction_frees_rows_that_new_keys_reuse(graph):
    sf.init(use_dynamic_expansion=True)
    specs = [sf.FeatureSpec("f", table_name="t", access_threshold=0, eviction_threshold=50),
             sf.FeatureSpec("ts", is_timestamp=True)]
    table = sf.create_table(tf.int64, 2, "t", tf.compat.v1.ones_initializer(),
                            expansion_block_rows=4)
    keys = np.array([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]], np.int64)
    data = {"f": keys, "ts": np.array([0, 100, 110], np.int64)}
    it = make_batch_iterator(data, 1, specs, read_ahead=False)
    batch = it.get_next()
    emb = sf.sparse_lookup(table, specs[0], batch=batch)
    grads = tf.gradients(tf.reduce_sum(emb), tf.compat.v1.get_collection(LOCAL_EMB))
    train = gradient_descent_by_addr.create_hash_optimizer_by_addr(0.1).apply_gradients(
        list(zip(grads, tf.compat.v1.get_collection(ADDRESS))))
    rows = sf.pipeline.insert_func.batch_rows(batch, "t")
    sf.start_asc_pipeline()
    with tf.compat.v1.Session() as sess:
        sess.run(it.initializer)
        old_rows = sess.run([train, rows])[1]
        sess.run(train)
        assert table.capacity() == 8
        result = sf.evict("t")["t"]  # clock 100: keys 1-4 (seen at 0) go
        assert result.keys_removed == 4 and table.stats()["rows_free"] == 4
        e, new_rows, _ = sess.run([emb, rows, train])
    assert sorted(new_rows) == sorted(old_rows)  # the freed rows, reused: no growth
    np.testing.assert_array_equal(e, 1.0)  # with fresh initial values
    stats = table.stats()
    assert stats["capacity"] == 8 and stats["keys_held"] == 8 and stats["keys_evicted"] == 4


def test_size_never_exceeds_capacity_while_the_pipeline_grows_the_table(graph):
    """size() then capacity(), read while another thread admits keys (the pipeline reading
    ahead, as little_demo's per-step log does): the capacity read second is never below the
    size read first. The key count and the grown rows change together, under the key
    processor's lock; reading either without it could catch keys counted before their rows
    were grown."""
    sf.init(use_dynamic_expansion=True)
    table = sf.create_table(tf.int64, 64, "t", tf.compat.v1.ones_initializer(),
                            expansion_block_rows=1)
    sf.start_asc_pipeline()
    done = threading.Event()

    def admit():
        for start in range(0, 400_000, 2_000):
            keys = np.arange(start, start + 2_000, dtype=np.int64)
            table.processor.process(keys, np.array([keys.shape[0]]), np.ones(1, np.int32),
                                    True)
        done.set()

    thread = threading.Thread(target=admit)
    thread.start()
    seen = []
    while not done.is_set():
        size = table.size()
        seen.append((size, table.capacity()))
    thread.join()
    over = [(s, c) for s, c in seen if s > c]
    assert not over, f"{len(over)} of {len(seen)} reads saw size > capacity, e.g. {over[:3]}"
    assert table.size() == 400_000 <= table.capacity()
