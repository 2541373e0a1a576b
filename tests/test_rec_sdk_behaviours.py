"""Behaviours Rec SDK example programs rely on (issue 18, part 2).

- ``create_table(..., optimizer_list=[...])`` binds the optimizer; the sparse optimizer's
  ``apply_gradients`` may be built after ``start_asc_pipeline()`` (little_demo's order) as long
  as the table holds no row yet;
- ``sparse_lookup``: ``dim``, ``access_and_evict_config`` in FeatureSpec mode, ``is_grad``,
  ``serving_default_value``;
- dynamic expansion: ``ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS`` holds the addresses, so both
  ``APPLY_GRADIENTS_STRATEGY`` values train;
- automatic graph modification keeps a one-shot iterator one-shot (no initializer to run), and
  pads to ``send_count`` under ``init(use_dynamic=False)``;
- a tiered table's fast tier needs room for the batches one step gathers, not for every batch
  the pipeline reads ahead; the process ends promptly when the session closes while the
  pipeline reads ahead, or when a step fails with the session left alive;
- ``SparseOptimizer.compute_gradients``.

Numbers are checked against plain numpy (lazy Adam, SGD) or against the same training with
every row in host memory (the tiers only move rows).
"""

import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import sparseflow as sf
from sparseflow.optimizers import gradient_descent, lazy_adam, lazy_adam_by_addr
from tests.pipeline_utils import linear_tower, make_batch_iterator, run_all, two_table_data

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOCAL_EMB = "ASCEND_SPARSE_LOOKUP_LOCAL_EMB"
ID_OFFSET = "ASCEND_SPARSE_LOOKUP_ID_OFFSET"
UNIQUE_KEYS = "ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS"
HANG_GUARD_SECONDS = 120


def _numpy_lazy_adam(batches, init, dim, lr, beta1=0.9, beta2=0.999, eps=1e-8):
    """Rows by key after lazy Adam on ``sum(emb^2)`` over ``batches`` (arrays of keys), every
    row starting at ``init``: the gradient of a key's row is ``2 * w * count``."""
    w, m, v = {}, {}, {}
    for step, keys in enumerate(batches, start=1):
        uniq, counts = np.unique(keys, return_counts=True)
        lr_t = lr * np.sqrt(1 - beta2 ** step) / (1 - beta1 ** step)
        for key, count in zip(uniq.tolist(), counts):
            row = w.setdefault(key, np.full(dim, init, np.float64))
            g = 2.0 * row * count
            m[key] = beta1 * m.get(key, 0.0) + (1 - beta1) * g
            v[key] = beta2 * v.get(key, 0.0) + (1 - beta2) * g * g
            w[key] = row - lr_t * m[key] / (np.sqrt(v[key]) + eps)
    return w


def _assert_rows(table, expected, sess=None, rtol=1e-5):
    keys, values = table.export(sess)
    assert sorted(keys.tolist()) == sorted(expected)
    for key, row in zip(keys.tolist(), values):
        np.testing.assert_allclose(row, expected[key], rtol=rtol, atol=1e-6)


KEYS = np.array([[[1, 2, 2]], [[2, 3, 5]], [[5, 5, 1]], [[7, 1, 3]]], np.int64)


# -- 1. optimizer_list, and apply_gradients built after start_asc_pipeline ------------------

@pytest.mark.parametrize("kind", ["host", "device", "host_over_disk"])
def test_apply_gradients_built_after_start_asc_pipeline_trains(sf_init, kind, tmp_path):
    """little_demo's order: the pipeline starts in main, RunMode builds apply_gradients after."""
    spec = sf.FeatureSpec("f", table_name="t")
    sizes = {"host": dict(device_vocabulary_size=50),
             "device": dict(device_vocabulary_size=50, rows_on="device"),
             "host_over_disk": dict(device_vocabulary_size=4, host_vocabulary_size=4,
                                    ssd_vocabulary_size=42, ssd_data_path=str(tmp_path))}
    table = sf.create_table(tf.int64, 4, "t", tf.compat.v1.constant_initializer(0.5),
                            **sizes[kind])
    optimizer = lazy_adam.create_hash_optimizer(learning_rate=0.1)
    it = make_batch_iterator({"f": KEYS.reshape(4, 3)}, 1, [spec])
    emb = sf.sparse_lookup(table, spec, batch=it.get_next())
    loss = tf.reduce_sum(emb * emb)
    sf.start_asc_pipeline()
    train = optimizer.apply_gradients([(tf.gradients(loss, table)[0], table)])
    with tf.compat.v1.Session() as sess:
        sess.run([tf.compat.v1.global_variables_initializer(), it.initializer])
        run_all(sess, train)
        _assert_rows(table, _numpy_lazy_adam(KEYS.reshape(4, 3), 0.5, 4, 0.1), sess)


@pytest.mark.parametrize("as_list", [True, False], ids=["list", "instance"])
def test_create_table_binds_the_optimizer_list(sf_init, as_list):
    optimizer = lazy_adam.create_hash_optimizer(learning_rate=0.1)
    table = sf.create_table(tf.int64, 4, "t", tf.compat.v1.constant_initializer(0.5),
                            device_vocabulary_size=50,
                            optimizer_list=[optimizer] if as_list else optimizer)
    assert table.rows.optimizer is optimizer
    assert table.rows.slot_names == ("momentum", "velocity")
    spec = sf.FeatureSpec("f", table_name="t")
    it = make_batch_iterator({"f": KEYS.reshape(4, 3)}, 1, [spec])
    emb = sf.sparse_lookup(table, spec, batch=it.get_next())
    train = optimizer.apply_gradients([(tf.gradients(tf.reduce_sum(emb * emb), table)[0],
                                        table)])
    with pytest.raises(ValueError, match=r"already updated by optimizer `LazyAdam`"):
        gradient_descent.create_hash_optimizer(0.1).apply_gradients(
            [(tf.gradients(tf.reduce_sum(emb), table)[0], table)])
    sf.start_asc_pipeline()
    with tf.compat.v1.Session() as sess:
        sess.run(it.initializer)
        run_all(sess, train)
    _assert_rows(table, _numpy_lazy_adam(KEYS.reshape(4, 3), 0.5, 4, 0.1))


def test_create_table_checks_the_optimizer_list(sf_init):
    init = tf.compat.v1.zeros_initializer()
    adam, sgd = lazy_adam.create_hash_optimizer(0.1), gradient_descent.create_hash_optimizer(0.1)
    with pytest.raises(TypeError, match=r"Argument `optimizer_list` must be .*sparse "
                                        r"optimizers.*Received: .*'str'"):
        sf.create_table(tf.int64, 4, "a", init, optimizer_list=["adam"])
    with pytest.raises(ValueError, match=r"Argument `optimizer_list`.* one sparse optimizer "
                                         r"per table.*Received: \['LazyAdam', "
                                         r"'GradientDescent'\]"):
        sf.create_table(tf.int64, 4, "b", init, optimizer_list=[adam, sgd])
    table = sf.create_table(tf.int64, 4, "c", init, optimizer_list=[])
    assert table.rows.optimizer is None


def test_a_device_table_over_a_host_tier_binds_before_the_pipeline_starts(sf_init):
    spec = sf.FeatureSpec("f", table_name="t")
    table = sf.create_table(tf.int64, 4, "t", tf.compat.v1.zeros_initializer(),
                            device_vocabulary_size=4, host_vocabulary_size=46, rows_on="device")
    it = make_batch_iterator({"f": KEYS.reshape(4, 3)}, 1, [spec])
    emb = sf.sparse_lookup(table, spec, batch=it.get_next())
    sf.start_asc_pipeline()
    with pytest.raises(ValueError, match=r"Table `t` keeps device rows over a host tier.*"
                                         r"create_table\(optimizer_list=\[...\]\)"):
        lazy_adam.create_hash_optimizer(0.1).apply_gradients(
            [(tf.gradients(tf.reduce_sum(emb), table)[0], table)])


def test_a_table_holding_rows_without_slots_still_refuses_an_optimizer(sf_init):
    spec = sf.FeatureSpec("f", table_name="t")
    table = sf.create_table(tf.int64, 4, "t", tf.compat.v1.constant_initializer(0.5),
                            device_vocabulary_size=50)
    it = make_batch_iterator({"f": KEYS.reshape(4, 3)}, 1, [spec])
    emb = sf.sparse_lookup(table, spec, batch=it.get_next())
    sf.start_asc_pipeline()
    with tf.compat.v1.Session() as sess:
        sess.run(it.initializer)
        sess.run(emb)                      # keys got rows, without optimizer slots
    with pytest.raises(ValueError, match=r"Table `t` already holds rows without optimizer "
                                         r"slots"):
        lazy_adam.create_hash_optimizer(0.1).apply_gradients(
            [(tf.gradients(tf.reduce_sum(emb), table)[0], table)])


# -- 2. sparse_lookup's arguments -------------------------------------------------------------

def _lookup_table_and_batch(spec_kwargs=None):
    spec = sf.FeatureSpec("f", table_name="t", **(spec_kwargs or {}))
    table = sf.create_table(tf.int64, 4, "t", tf.compat.v1.zeros_initializer(),
                            device_vocabulary_size=50)
    it = make_batch_iterator({"f": KEYS.reshape(4, 3)}, 2, [spec])
    return table, spec, it.get_next()


def test_sparse_lookup_dim_none_or_the_tables(sf_init):
    table, spec, batch = _lookup_table_and_batch()
    for dim in (None, 4, tf.TensorShape([4])):
        assert sf.sparse_lookup(table, spec, dim=dim, batch=batch).shape.as_list() == [2, 3, 4]
    with pytest.raises(ValueError, match=r"Argument `dim` must be None or the dim of table "
                                         r"`t` \(4\)\. Received: 8"):
        sf.sparse_lookup(table, spec, dim=8, batch=batch)


def test_access_and_evict_config_in_feature_spec_mode(sf_init):
    table, spec, batch = _lookup_table_and_batch(
        dict(access_threshold=2, eviction_threshold=5, faae_coefficient=4))
    same = dict(access_threshold=2, eviction_threshold=5, faae_coefficient=4)
    assert sf.sparse_lookup(table, spec, access_and_evict_config=same,
                            batch=batch).shape.as_list() == [2, 3, 4]
    sf.sparse_lookup(table, spec, access_and_evict_config={"access_threshold": 2}, batch=batch)
    with pytest.raises(ValueError, match=r"`access_and_evict_config` sets access_threshold=3, "
                                         r"but FeatureSpec `f` has access_threshold=2"):
        sf.sparse_lookup(table, spec, access_and_evict_config=dict(same, access_threshold=3),
                         batch=batch)
    with pytest.raises(ValueError, match=r"sets faae_coefficient=1, but FeatureSpec `f` has "
                                         r"faae_coefficient=4"):
        sf.sparse_lookup(table, spec, access_and_evict_config=dict(same, faae_coefficient=1),
                         batch=batch)
    with pytest.raises(ValueError, match=r"Argument `access_and_evict_config` .*keys "
                                         r"access_threshold, eviction_threshold, "
                                         r"faae_coefficient.*Received: .*'threshold'"):
        sf.sparse_lookup(table, spec, access_and_evict_config={"threshold": 2}, batch=batch)
    with pytest.raises(TypeError, match=r"Argument `access_and_evict_config`"):
        sf.sparse_lookup(table, spec, access_and_evict_config=[2, 5], batch=batch)


def test_access_and_evict_config_thresholds_off_in_the_spec(sf_init):
    table, spec, batch = _lookup_table_and_batch()
    sf.sparse_lookup(table, spec, access_and_evict_config=dict(access_threshold=None),
                     batch=batch)
    with pytest.raises(ValueError, match=r"sets eviction_threshold=2, but FeatureSpec `f` has "
                                         r"eviction_threshold=None"):
        sf.sparse_lookup(table, spec, batch=batch,
                         access_and_evict_config=dict(access_threshold=None,
                                                      eviction_threshold=2))


@pytest.mark.parametrize("default", [None, 0.0], ids=["shared_gather", "per_table"])
def test_is_grad_false_lookups_add_no_gradient(sf_init, default):
    """Two lookups of one table on one batch: only the is_grad=True one trains the rows."""
    f, g = sf.FeatureSpec("f", table_name="t"), sf.FeatureSpec("g", table_name="t")
    table = sf.create_table(tf.int64, 2, "t", tf.compat.v1.constant_initializer(0.5),
                            device_vocabulary_size=50)
    data = {"f": np.array([[1, 2, 2]], np.int64), "g": np.array([[2, 3, 3]], np.int64)}
    it = make_batch_iterator(data, 1, [f, g])
    batch = it.get_next()
    kw = {} if default is None else {"serving_default_value": tf.fill([2], default)}
    ef = sf.sparse_lookup(table, f, batch=batch, **kw)
    eg = sf.sparse_lookup(table, g, batch=batch, is_grad=False, **kw)
    loss = tf.reduce_sum(ef * ef) + tf.reduce_sum(eg * eg)
    train = gradient_descent.create_hash_optimizer(0.1).apply_gradients(
        [(tf.gradients(loss, table)[0], table)])
    sf.start_asc_pipeline()
    with tf.compat.v1.Session() as sess:
        sess.run(it.initializer)
        sess.run(train)
    # SGD on sum(emb_f^2) only: w -= 0.1 * 2 * w * count_in_f
    _assert_rows(table, {1: np.full(2, 0.5 * (1 - 0.2 * 1)), 2: np.full(2, 0.5 * (1 - 0.2 * 2)),
                         3: np.full(2, 0.5)})


def test_serving_default_value_reads_for_keys_without_a_row(sf_init):
    spec = sf.FeatureSpec("f", table_name="t", access_threshold=2)
    eval_spec = sf.FeatureSpec("f", table_name="t")
    table = sf.create_table(tf.int64, 3, "t", tf.compat.v1.constant_initializer(0.5),
                            device_vocabulary_size=50)
    data = {"f": np.array([[1, 1, 2]], np.int64)}
    train_it = make_batch_iterator(data, 1, [spec])
    eval_it = make_batch_iterator({"f": np.array([[1, 9, 2]], np.int64)}, 1, [eval_spec],
                                  is_training=False)
    default = tf.constant([7.0, 8.0, 9.0])
    train_emb = sf.sparse_lookup(table, spec, batch=train_it.get_next(),
                                 serving_default_value=default)
    eval_emb = sf.sparse_lookup(table, eval_spec, batch=eval_it.get_next(), is_train=False,
                                serving_default_value=default)
    with pytest.raises(ValueError, match=r"Argument `serving_default_value` must broadcast to "
                                         r"the table's \[dim\] = \[3\]\. Received: shape "
                                         r"\(2,\)"):
        sf.sparse_lookup(table, spec, batch=train_it.get_next(),
                         serving_default_value=tf.ones([2]))
    sf.start_asc_pipeline()
    with tf.compat.v1.Session() as sess:
        sess.run(train_it.initializer)
        got = sess.run(train_emb)[0]
        sess.run(eval_it.initializer)      # after the training batch: key 1 has its row
        evaluated = sess.run(eval_emb)[0]
    # key 1 is admitted (count 2), key 2 is not: it reads the default, as unknown key 9 does
    np.testing.assert_array_equal(got, [[0.5] * 3, [0.5] * 3, [7, 8, 9]])
    np.testing.assert_array_equal(evaluated, [[0.5] * 3, [7, 8, 9], [7, 8, 9]])


# -- 3. dynamic expansion: UNIQUE_KEYS -------------------------------------------------------

def _expansion_training(collection):
    """The two-table task under expansion, the by-address optimizer given the addresses from
    ``collection``; returns (losses, exports)."""
    data = two_table_data(0, 32 * 12, 300, 60)
    with tf.Graph().as_default():
        sf.init(use_dynamic_expansion=True)
        init = tf.compat.v1.truncated_normal_initializer(stddev=0.1, seed=3)
        specs = [sf.FeatureSpec("f1", table_name="t1"), sf.FeatureSpec("f2", table_name="t1"),
                 sf.FeatureSpec("f3", table_name="t2")]
        tables = {"t1": sf.create_table(tf.int64, 8, "t1", init, expansion_block_rows=64),
                  "t2": sf.create_table(tf.int64, 4, "t2", init, expansion_block_rows=64)}
        it = make_batch_iterator(data, 32, specs)
        batch = it.get_next()
        pooled = [tf.reduce_sum(sf.sparse_lookup(tables[s.table_name], s, batch=batch), 1)
                  for s in specs]
        loss = linear_tower(pooled, batch["label"])
        local_embs = tf.compat.v1.get_collection(LOCAL_EMB)
        addresses = tf.compat.v1.get_collection(collection)
        assert tf.compat.v1.get_collection(UNIQUE_KEYS) == tf.compat.v1.get_collection(ID_OFFSET)
        dense = tf.compat.v1.trainable_variables()
        grads = tf.gradients(loss, dense + local_embs)
        train = tf.group(
            tf.compat.v1.train.GradientDescentOptimizer(0.1).apply_gradients(
                zip(grads[:len(dense)], dense)),
            lazy_adam_by_addr.create_hash_optimizer_by_address(0.05).apply_gradients(
                list(zip(grads[len(dense):], addresses))))
        sf.start_asc_pipeline()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            losses = [l for _, l in run_all(sess, [train, loss], it)]
        exports = {name: t.export() for name, t in tables.items()}
        sf.terminate_config_initializer()
    return losses, exports


def test_both_apply_gradients_strategies_train_identically():
    """run_mode.py reads UNIQUE_KEYS under sum_same_id_gradients_and_apply, ID_OFFSET under
    direct_apply; the local embeddings are unique rows already, so both train the same."""
    direct, summed = _expansion_training(ID_OFFSET), _expansion_training(UNIQUE_KEYS)
    assert len(summed[0]) == 12 and summed[0][-1] < summed[0][0]
    np.testing.assert_array_equal(summed[0], direct[0])
    for name, (keys, values) in direct[1].items():
        np.testing.assert_array_equal(summed[1][name][0], keys)
        np.testing.assert_array_equal(summed[1][name][1], values)


# -- 4. automatic graph modification with one-shot iterators ---------------------------------

def test_modify_graph_keeps_one_shot_iterators_one_shot(sf_init):
    """little_demo with USE_ONE_SHOT=1 and USE_MODIFY_GRAPH=1 runs no initializer at all."""
    table = sf.create_table(tf.int64, 4, "t", tf.compat.v1.constant_initializer(0.5),
                            device_vocabulary_size=50)

    def one_shot(keys):
        ds = tf.compat.v1.data.Dataset.from_tensor_slices({"u": keys}).batch(1).prefetch(4)
        return ds.make_one_shot_iterator().get_next()["u"]

    emb = sf.sparse_lookup(table, one_shot(KEYS.reshape(4, 3)), 10, modify_graph=True)
    eval_emb = sf.sparse_lookup(table, one_shot(np.array([[1, 9, 3]], np.int64)), 10,
                                modify_graph=True, is_train=False)
    train = lazy_adam.create_hash_optimizer(0.1).apply_gradients(
        [(tf.gradients(tf.reduce_sum(emb * emb), table)[0], table)])
    sf.modify_graph_and_start_emb_cache()
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for _ in range(4):
            sess.run(train)
        with pytest.raises(tf.errors.OutOfRangeError):
            sess.run(train)
        evaluated = sess.run(eval_emb)[0]
        sess.run([sf.get_initializer(True), sf.get_initializer(False)])  # no-ops, runnable
    expected = _numpy_lazy_adam(KEYS.reshape(4, 3), 0.5, 4, 0.1)
    _assert_rows(table, expected)
    np.testing.assert_allclose(evaluated, [expected[1], np.zeros(4), expected[3]], rtol=1e-5)


def test_modify_graph_lookups_pad_to_their_send_count(graph):
    """little_demo's default (USE_DYNAMIC=0) in modify-graph mode: init(use_dynamic=False)."""
    sf.init(use_dynamic=False)
    table = sf.create_table(tf.int64, 4, "t", tf.compat.v1.constant_initializer(0.5),
                            device_vocabulary_size=50)
    it = tf.compat.v1.data.make_initializable_iterator(
        tf.data.Dataset.from_tensor_slices({"u": KEYS.reshape(4, 3)}).batch(1))
    ids = it.get_next()["u"]
    with pytest.raises(ValueError, match=r"Argument `send_count` must be an int in "
                                         r"\[1, 2147483647\] when init\(use_dynamic=False\)"):
        sf.sparse_lookup(table, ids, modify_graph=True)
    emb = sf.sparse_lookup(table, ids, 4, modify_graph=True)
    train = lazy_adam.create_hash_optimizer(0.1).apply_gradients(
        [(tf.gradients(tf.reduce_sum(emb * emb), table)[0], table)])
    sf.modify_graph_and_start_emb_cache()
    with tf.compat.v1.Session() as sess:
        sess.run(sf.get_initializer(True))
        for _ in range(4):
            sess.run(train)
    _assert_rows(table, _numpy_lazy_adam(KEYS.reshape(4, 3), 0.5, 4, 0.1))


# -- 5. the fast tier of tiered tables and the batches read ahead ----------------------------

def _tier_training(tier: dict, evaluate_every=0, use_dynamic=True):
    """One table (dim 4) trained with lazy Adam on sum(emb^2) over 24 batches of 64x2 keys
    from 3000, read ahead by prefetch(100) as little_demo does; with ``evaluate_every``, an
    evaluation pipeline (also prefetch(100)) is re-initialized every that many steps and two
    of its batches read. Returns (losses, export, eval results)."""
    keys = np.random.default_rng(1).integers(0, 3000, (64 * 24, 2)).astype(np.int64)
    with tf.Graph().as_default():
        sf.init(use_dynamic=use_dynamic)
        try:
            return _train_tiered_table(tier, keys, evaluate_every)
        finally:
            sf.terminate_config_initializer()


def _train_tiered_table(tier: dict, keys: np.ndarray, evaluate_every: int):
    spec, eval_spec = sf.FeatureSpec("f", table_name="t"), sf.FeatureSpec("f", table_name="t")
    table = sf.create_table(tf.int64, 4, "t", tf.compat.v1.constant_initializer(0.5), **tier)

    def pipeline(spec_, data, training):
        ds = tf.compat.v1.data.Dataset.from_tensor_slices({"f": data}).batch(64)
        ds = ds.map(sf.get_asc_insert_func(tgt_key_specs=[spec_], is_training=training))
        return ds.prefetch(100).make_initializable_iterator()

    it = pipeline(spec, keys, True)
    eval_it = pipeline(eval_spec, keys[::-1].copy(), False)
    # send_count pads the unique keys under init(use_dynamic=False) (little_demo's default).
    emb = sf.sparse_lookup(table, spec, 128, batch=it.get_next())
    eval_emb = sf.sparse_lookup(table, eval_spec, 128, batch=eval_it.get_next(),
                                is_train=False)
    loss = tf.reduce_sum(emb * emb)
    train = lazy_adam.create_hash_optimizer(0.05).apply_gradients(
        [(tf.gradients(loss, table)[0], table)])
    sf.start_asc_pipeline()
    losses, evaluated = [], []
    with tf.compat.v1.Session() as sess:
        sess.run([tf.compat.v1.global_variables_initializer(), it.initializer])
        for step in range(1, 25):
            losses.append(sess.run([train, loss])[1])
            if evaluate_every and step % evaluate_every == 0:
                sess.run(eval_it.initializer)   # the last evaluation's read-ahead is dropped
                evaluated.append([sess.run(eval_emb) for _ in range(2)])
        exported = table.export()
    return np.array(losses), exported, evaluated


@pytest.mark.parametrize("kind, use_dynamic", [("host_over_disk", True),
                                               ("host_over_disk", False),
                                               ("device_over_host", True)])
def test_read_ahead_past_the_fast_tier_trains_as_all_rows_in_memory(tmp_path, kind,
                                                                    use_dynamic):
    """little_demo's SSD (host rows over a disk tier) and, on a GPU, DDR (device rows over a
    host tier) modes: 330 fast rows hold two batches' keys (~250), not the hundred batches
    prefetch(100) reads ahead; evaluation pipelines re-initialized with batches still read
    ahead leave nothing behind in the fast tier."""
    tier = {"host_over_disk": dict(device_vocabulary_size=200, host_vocabulary_size=130,
                                   ssd_vocabulary_size=2700, ssd_data_path=str(tmp_path)),
            "device_over_host": dict(device_vocabulary_size=330, host_vocabulary_size=2700,
                                     rows_on="device")}[kind]
    run = _tier_training(tier, evaluate_every=4, use_dynamic=use_dynamic)
    reference = _tier_training(dict(device_vocabulary_size=3030), evaluate_every=4)
    np.testing.assert_allclose(run[0], reference[0], rtol=1e-5)
    np.testing.assert_array_equal(run[1][0], reference[1][0])
    np.testing.assert_allclose(run[1][1], reference[1][1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.array(run[2]), np.array(reference[2]), rtol=1e-5, atol=1e-6)


def test_a_fast_tier_smaller_than_a_step_still_raises(tmp_path):
    tier = dict(device_vocabulary_size=60, host_vocabulary_size=40, ssd_vocabulary_size=2900,
                ssd_data_path=str(tmp_path))
    with pytest.raises(tf.errors.OpError, match=r"CacheFullError: Table `t`: a batch has "
                                                r"\d+ distinct rows \(\d+ of them not in the "
                                                r"fast tier\), more than its 100 slots "
                                                r"\(device_vocabulary_size "
                                                r"\+ host_vocabulary_size = 100, "
                                                r"ssd_vocabulary_size=2900\)"):
        _tier_training(tier)


def _run_worker(module: str, *args) -> tuple[int, str, str]:
    """Runs ``python -m module args`` in its own process group; fails the test (killing the
    group) if it has not exited within the hang guard (a hang guard only, not a timing
    assertion)."""
    proc = subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                                     CUDA_VISIBLE_DEVICES=""))
    try:
        out, err = proc.communicate(timeout=HANG_GUARD_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"still running after {HANG_GUARD_SECONDS} s (hang guard):\n"
                    f"{(out + err)[-3000:]}")
    return proc.returncode, out, err


def test_the_process_ends_promptly_when_the_session_closes_while_reading_ahead(tmp_path):
    """A Session script whose pipeline reads ahead past its fast tier (prefetch(100), a
    parallel map) closes the session mid-run and ends without terminate_config_initializer():
    it must exit at once with its output."""
    code, out, err = _run_worker("tests.workers.read_ahead_tier", str(tmp_path))
    assert code == 0, (out + err)[-3000:]
    assert "trained 6 steps, session closed" in out


def test_the_process_ends_promptly_when_a_step_fails_with_the_session_left_alive(tmp_path):
    """little_demo's style: the session is never closed, and the first step fails
    (CacheFullError) while the pipeline reads large batches ahead. Deleted only during
    interpreter finalization, the session would wait forever for the pipeline's thread;
    sparseflow deletes live sessions at exit, before finalization."""
    code, out, err = _run_worker("tests.workers.failed_step_session", str(tmp_path))
    assert code == 1, (out + err)[-3000:]
    assert re.search(r"CacheFullError: Table `t`: a batch has \d+ distinct rows \(\d+ of them "
                     r"not in the fast tier\), more than its 2000 slots", err), err[-3000:]


# -- 6. compute_gradients ---------------------------------------------------------------------

def test_compute_gradients_pairs_gradients_with_tables(sf_init):
    f = sf.FeatureSpec("f", table_name="t")
    table = sf.create_table(tf.int64, 4, "t", tf.compat.v1.constant_initializer(0.5),
                            device_vocabulary_size=50)
    other = sf.create_table(tf.int64, 2, "unused", tf.compat.v1.zeros_initializer())
    it = make_batch_iterator({"f": KEYS.reshape(4, 3)}, 1, [f])
    loss = tf.reduce_sum(tf.square(sf.sparse_lookup(table, f, batch=it.get_next())))
    optimizer = lazy_adam.create_hash_optimizer(0.1)
    pairs = optimizer.compute_gradients(loss, var_list=[table])
    assert len(pairs) == 1 and pairs[0][1] is table
    assert isinstance(pairs[0][0], tf.IndexedSlices)
    every = optimizer.compute_gradients(loss)        # var_list: every table
    assert [v for _, v in every] == [table, other] and every[1][0] is None
    with pytest.raises(TypeError, match=r"Argument `var_list` must be .*sparseflow tables"):
        optimizer.compute_gradients(loss, var_list=[tf.compat.v1.get_variable("w", [1])])
    train = optimizer.apply_gradients(pairs)
    sf.start_asc_pipeline()
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        run_all(sess, train, it)
    _assert_rows(table, _numpy_lazy_adam(KEYS.reshape(4, 3), 0.5, 4, 0.1))


def test_by_address_compute_gradients_pairs_gradients_with_addresses(graph):
    sf.init(use_dynamic_expansion=True)
    f = sf.FeatureSpec("f", table_name="t")
    table = sf.create_table(tf.int64, 4, "t", tf.compat.v1.constant_initializer(0.5))
    it = make_batch_iterator({"f": KEYS.reshape(4, 3)}, 1, [f])
    loss = tf.reduce_sum(tf.square(sf.sparse_lookup(table, f, batch=it.get_next())))
    optimizer = lazy_adam_by_addr.create_hash_optimizer_by_address(0.1)
    local_embs = tf.compat.v1.get_collection(LOCAL_EMB)
    pairs = optimizer.compute_gradients(loss, var_list=local_embs)
    assert [a for _, a in pairs] == tf.compat.v1.get_collection(ID_OFFSET)
    assert optimizer.compute_gradients(loss)[0][1] is pairs[0][1]   # default: LOCAL_EMB
    with pytest.raises(TypeError, match=r"Argument `var_list` must be .*"
                                        r"ASCEND_SPARSE_LOOKUP_LOCAL_EMB"):
        optimizer.compute_gradients(loss, var_list=[table])
    train = optimizer.apply_gradients(pairs)
    sf.start_asc_pipeline()
    with tf.compat.v1.Session() as sess:
        run_all(sess, train, it)
    _assert_rows(table, _numpy_lazy_adam(KEYS.reshape(4, 3), 0.5, 4, 0.1))
