"""Automatic graph modification: same training as FeatureSpec mode, eval channel, errors."""

import numpy as np
import pytest
import tensorflow as tf

import sparseflow as sf
from sparseflow.optimizers import lazy_adam
from sparseflow.pipeline.graph_modifier import update_input
from tests.modify_graph_job import DATA, modify_graph_training, tables

# DATA, the two tables and the training loop are shared with test_device_tables.py.
_tables = tables
_train = modify_graph_training


def test_graph_modification_trains_exactly_like_feature_spec_mode():
    spec_losses, spec_table = _train("spec")
    mod_losses, mod_table = _train("modify")
    np.testing.assert_array_equal(spec_losses, mod_losses)
    np.testing.assert_array_equal(spec_table[0], mod_table[0])
    np.testing.assert_array_equal(spec_table[1], mod_table[1])
    assert mod_losses[-5:].mean() < mod_losses[:5].mean()


def test_eval_through_get_initializer_false_reads_without_admitting(sf_init):
    tu, ti = _tables()
    train_it = tf.compat.v1.data.make_initializable_iterator(
        tf.data.Dataset.from_tensor_slices({"u": DATA["u"][:64]}).batch(16))
    eval_it = tf.compat.v1.data.make_initializable_iterator(
        tf.data.Dataset.from_tensor_slices({"u": DATA["u"][64:128] + 1000}).batch(16))
    train_emb = sf.sparse_lookup(tu, train_it.get_next()["u"], 64, modify_graph=True)
    eval_batch = eval_it.get_next()
    eval_emb = sf.sparse_lookup(tu, eval_batch["u"], 64, is_train=False, modify_graph=True)
    sf.modify_graph_and_start_emb_cache()
    with tf.compat.v1.Session() as sess:
        sess.run([sf.get_initializer(True), sf.get_initializer(False)])
        for _ in range(4):
            sess.run(train_emb)
        size = tu.size()
        values = sess.run(eval_emb)  # keys shifted by 1000: all unknown
    assert size > 0 and tu.size() == size  # eval admitted nothing
    np.testing.assert_array_equal(values, np.zeros_like(values))


def test_graph_modification_errors(sf_init):
    tu, _ = _tables()
    with pytest.raises(ValueError, match=r"found no lookup"):
        sf.modify_graph_and_start_emb_cache()
    with pytest.raises(ValueError, match=r"`ids` must be an output of iterator.get_next\(\)"):
        sf.sparse_lookup(tu, tf.constant([1, 2], tf.int64), modify_graph=True)
    with pytest.raises(ValueError, match=r"`modify_graph` must be True when `ids` is a tensor"):
        sf.sparse_lookup(tu, tf.constant([1, 2], tf.int64))
    with pytest.raises(RuntimeError, match=r"No rewritten training iterator"):
        sf.get_initializer(True)


def test_one_shot_iterators_are_rewritten_too(sf_init):
    tu, _ = _tables()
    one_shot = tf.compat.v1.data.make_one_shot_iterator(
        tf.data.Dataset.from_tensor_slices({"u": DATA["u"][:8]}).batch(4))
    emb = sf.sparse_lookup(tu, one_shot.get_next()["u"], 16, modify_graph=True)
    sf.modify_graph_and_start_emb_cache()
    with tf.compat.v1.Session() as sess:
        sess.run(sf.get_initializer(True))
        first, second = sess.run(emb), sess.run(emb)
        with pytest.raises(tf.errors.OutOfRangeError):
            sess.run(emb)
    assert first.shape == second.shape == (4, 4, 8)
    keys, values = tu.export()
    by_key = dict(zip(keys.tolist(), values))
    for (i, j), k in np.ndenumerate(DATA["u"][4:8]):
        np.testing.assert_array_equal(second[i, j], by_key[int(k)])


def test_update_input_wrapper_rewires_an_op(graph):
    a, b = tf.constant(1.0), tf.constant(5.0)
    out = tf.identity(a)
    update_input(out.op, 0, b)
    with tf.compat.v1.Session() as sess:
        assert sess.run(out) == 5.0


def test_timestamp_collection_drives_eviction_in_graph_modification_mode(sf_init):
    tu, _ = _tables()
    data = {"u": np.array([[1], [2], [3], [4]], np.int64), "ts": np.array([0, 10, 20, 30])}
    it = tf.compat.v1.data.make_initializable_iterator(
        tf.data.Dataset.from_tensor_slices(data).batch(1))
    batch = it.get_next()
    tf.compat.v1.add_to_collection("ASCEND_TIMESTAMP", batch["ts"])
    emb = sf.sparse_lookup(tu, batch["u"], 1, modify_graph=True,
                           access_and_evict_config={"access_threshold": 0,
                                                    "eviction_threshold": 15})
    sf.modify_graph_and_start_emb_cache()
    with tf.compat.v1.Session() as sess:
        sess.run(sf.get_initializer(True))
        for _ in range(4):
            sess.run(emb)
    assert tu.stats()["clock"] == 30
    assert sf.evict("u")["u"].keys_removed == 2  # keys 1 and 2: 30 and 20 time units old
    assert tf.compat.v1.get_collection("ASCEND_GLOBAL_HASHTABLE_COLLECTION")[0] is tu


def test_several_lookups_of_one_table_share_its_rows_and_dump_graph(sf_init, tmp_path,
                                                                   monkeypatch):
    monkeypatch.chdir(tmp_path)
    tu, _ = _tables()
    data = {"a": np.array([[1, 2], [3, 4]], np.int64), "b": np.array([[2], [5]], np.int64)}
    it = tf.compat.v1.data.make_initializable_iterator(
        tf.data.Dataset.from_tensor_slices(data).batch(2))
    batch = it.get_next()
    ea = sf.sparse_lookup(tu, batch["a"], 4, modify_graph=True)
    eb = sf.sparse_lookup(tu, batch["b"], 2, modify_graph=True)
    sf.modify_graph_and_start_emb_cache(dump_graph=True)
    with tf.compat.v1.Session() as sess:
        sess.run(sf.get_initializer(True))
        a, b = sess.run([ea, eb])
    assert a.shape == (2, 2, 8) and b.shape == (2, 1, 8)
    np.testing.assert_array_equal(a[0, 1], b[0, 0])  # key 2 in both lookups: one row
    assert tu.size() == 5
    assert len(list((tmp_path / "sparseflow_dump").glob("*.pbtxt"))) >= 2  # before + after


def test_monitored_session_trains_then_evaluates_with_graph_modifier_hook(sf_init):
    from mx_rec.graph.modifier import GraphModifierHook
    tu, _ = _tables()
    train_it = tf.compat.v1.data.make_initializable_iterator(
        tf.data.Dataset.from_tensor_slices({"u": DATA["u"][:64]}).batch(16))
    eval_it = tf.compat.v1.data.make_initializable_iterator(
        tf.data.Dataset.from_tensor_slices({"u": DATA["u"][:32]}).batch(16))
    train_emb = sf.sparse_lookup(tu, train_it.get_next()["u"], 64, modify_graph=True)
    eval_emb = sf.sparse_lookup(tu, eval_it.get_next()["u"], 64, is_train=False,
                                modify_graph=True)
    loss = tf.reduce_sum(tf.square(train_emb))
    step = tf.compat.v1.train.get_or_create_global_step()
    train = lazy_adam.create_hash_optimizer(0.1).apply_gradients(
        [(tf.gradients(loss, tu)[0], tu)], global_step=step)
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[GraphModifierHook()]) as sess:
        for _ in range(4):
            sess.run(train)
        size = tu.size()
        sess.run(sf.get_initializer(False))  # evaluate: the eval iterator was rewritten too
        evaluated = sess.run(eval_emb)
    assert tu.size() == size  # evaluation admitted nothing
    keys, values = tu.export()
    by_key = dict(zip(keys.tolist(), values))
    for (i, j), k in np.ndenumerate(DATA["u"][:16]):
        np.testing.assert_array_equal(evaluated[i, j], by_key[int(k)])  # the trained rows


def test_train_and_eval_lookups_on_one_iterator_are_rejected(sf_init):
    tu, _ = _tables()
    it = tf.compat.v1.data.make_initializable_iterator(
        tf.data.Dataset.from_tensor_slices({"u": DATA["u"][:8]}).batch(4))
    batch = it.get_next()
    sf.sparse_lookup(tu, batch["u"], 16, modify_graph=True)
    sf.sparse_lookup(tu, batch["u"], 16, is_train=False, modify_graph=True)
    with pytest.raises(ValueError, match=r"is_train=True and is_train=False read the same "
                                         r"iterator"):
        sf.modify_graph_and_start_emb_cache()
