"""Restoring a checkpoint into a table with another optimizer slot layout (issue 17, item 5).

A layout mismatch is refused with an error naming the table, the checkpoint's slots and the
table's, and nothing is restored; only a table with no optimizer at all (serving) takes the
weights alone. SGD has no slots but is an optimizer: it is not a serving table. Each path
is tested: ``tf.train.Checkpoint`` (TF2), Keras ``load_weights``, the Session ``Saver``.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import sparseflow as sf
from sparseflow import tf2
from sparseflow.keras import SparseEmbedding
from sparseflow.optimizers import gradient_descent, lazy_adam
from tests.pipeline_utils import make_batch_iterator

ADAM_SLOTS = r"\['momentum', 'velocity'\]"


def _refusal(table, saved, has):
    return (rf"Cannot restore table `{table}` .* optimizer slots {saved} but the table has "
            rf".* {has}")


# -- TF2: tf.train.Checkpoint ---------------------------------------------------------------

def _tf2_embedding(t1_optimizer, t2_optimizer):
    t1 = tf2.TableConfig(50, 4, tf.compat.v1.truncated_normal_initializer(seed=1), name="t1",
                         optimizer=t1_optimizer)
    t2 = tf2.TableConfig(50, 4, tf.compat.v1.truncated_normal_initializer(seed=2), name="t2",
                         optimizer=t2_optimizer)
    features = {"f1": tf2.FeatureConfig(t1), "f2": tf2.FeatureConfig(t2)}
    return tf2.Embedding(features), (t1, t2)


def _tf2_checkpoint(tmp_path, t1_optimizer, t2_optimizer):
    embedding, (t1, t2) = _tf2_embedding(t1_optimizer, t2_optimizer)
    ids = {"f1": tf.constant([[1, 2], [3, 4]], tf.int64), "f2": tf.constant([[5], [6]], tf.int64)}
    embedding.enqueue(ids, training=True)
    embedding.apply_gradients({k: tf.ones_like(v) for k, v in embedding.dequeue().items()})
    path = tf.train.Checkpoint(embedding=embedding).save(str(tmp_path / "c"))
    return path, embedding.tables[t1].export()


@pytest.mark.parametrize("saved, restored, saved_slots, table_slots", [
    ("adam", "sgd", ADAM_SLOTS, r"\[\]"),
    ("adagrad", "sgd", r"\['accumulator'\]", r"\[\]"),
    ("sgd", "adam", r"\[\]", ADAM_SLOTS),
])
def test_tf2_refuses_another_slot_layout_and_restores_no_table(tmp_path, saved, restored,
                                                                saved_slots, table_slots):
    make = {"adam": lambda: tf2.Adam(0.1), "adagrad": lambda: tf2.Adagrad(0.1),
            "sgd": lambda: tf2.SGD(0.1)}
    path, _ = _tf2_checkpoint(tmp_path, make[saved](), make[saved]())
    # t1 matches the checkpoint; t2 does not: t1 must not be restored either.
    fresh, (t1, t2) = _tf2_embedding(make[saved](), make[restored]())
    with pytest.raises(ValueError, match=_refusal("t2", saved_slots, table_slots)):
        tf.train.Checkpoint(embedding=fresh).restore(path)
    assert fresh.tables[t1].stats()["keys_held"] == 0
    assert fresh.tables[t2].stats()["keys_held"] == 0


def test_tf2_serving_embedding_takes_the_weights_only(tmp_path):
    path, (keys, weights) = _tf2_checkpoint(tmp_path, tf2.Adam(0.1), tf2.Adam(0.1))
    serving, (t1, _) = _tf2_embedding(None, None)
    tf.train.Checkpoint(embedding=serving).restore(path)
    got_keys, got = serving.tables[t1].export()
    np.testing.assert_array_equal(got_keys, keys)
    np.testing.assert_array_equal(got, weights)


# -- Keras: load_weights --------------------------------------------------------------------

def _keras_model(optimizer):
    inputs = keras.Input(shape=(2,), dtype="int64")
    layer = SparseEmbedding(40, 2, optimizer=optimizer, name="table")
    model = keras.Model(inputs, keras.layers.Dense(1)(layer(inputs)))
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    return model, layer


@pytest.mark.parametrize("saved, restored, saved_slots, table_slots", [
    ("adam", "sgd", ADAM_SLOTS, r"\[\]"),
    ("sgd", "adagrad", r"\[\]", r"\['accumulator'\]"),
])
def test_keras_load_weights_refuses_another_slot_layout(tmp_path, saved, restored,
                                                        saved_slots, table_slots):
    make = {"adam": lambda: tf2.Adam(0.1), "adagrad": lambda: tf2.Adagrad(0.1),
            "sgd": lambda: tf2.SGD(0.1)}
    model, _ = _keras_model(make[saved]())
    model.fit(np.arange(8).reshape(4, 2), np.ones((4, 1)), verbose=0)
    model.save_weights(tmp_path / "w.weights.h5")
    other, layer = _keras_model(make[restored]())
    with pytest.raises(ValueError, match=_refusal("table", saved_slots, table_slots)):
        other.load_weights(tmp_path / "w.weights.h5")
    assert layer.table.stats()["keys_held"] == 0


# -- Session: sparseflow.Saver --------------------------------------------------------------

def _session_table(optimizer):
    """Table `t` (and a dense variable) in a fresh init; ``optimizer``: "adam", "sgd" or None
    (an evaluation graph: no sparse optimizer). Returns (table, train op or None, saver,
    iterator, dense variable)."""
    sf.init()
    spec = sf.FeatureSpec("f", table_name="t")
    table = sf.create_table(tf.int64, 4, "t", tf.compat.v1.random_normal_initializer(seed=2),
                            device_vocabulary_size=100)
    rng = np.random.default_rng(3)
    it = make_batch_iterator({"f": rng.integers(0, 30, (32, 2)).astype(np.int64)}, 8, [spec],
                             is_training=optimizer is not None, read_ahead=False)
    emb = sf.sparse_lookup(table, spec, batch=it.get_next(), is_train=optimizer is not None)
    train = None
    if optimizer is not None:
        make = {"adam": lazy_adam.create_hash_optimizer,
                "sgd": gradient_descent.create_hash_optimizer}[optimizer]
        train = make(0.1).apply_gradients(
            [(tf.gradients(tf.reduce_sum(emb * emb), table)[0], table)])
    dense = tf.compat.v1.get_variable("dense", initializer=tf.zeros([2]))
    saver = sf.Saver()
    sf.start_asc_pipeline()
    return table, train, saver, it, dense


def _session_checkpoint(tmp_path, optimizer):
    with tf.Graph().as_default():
        table, train, saver, it, dense = _session_table(optimizer)
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), it.initializer])
            for _ in range(3):
                sess.run(train)
            sess.run(dense.assign([1.0, 2.0]))
            prefix = saver.save(sess, str(tmp_path / "model"), global_step=3)
        exported = table.export()
        sf.terminate_config_initializer()
    return prefix, exported


@pytest.mark.parametrize("saved, restored, saved_slots, table_slots", [
    ("adam", "sgd", ADAM_SLOTS, r"\[\]"),
    ("sgd", "adam", r"\[\]", ADAM_SLOTS),
])
def test_saver_refuses_another_slot_layout_and_restores_nothing(graph, tmp_path, saved,
                                                                restored, saved_slots,
                                                                table_slots):
    prefix, _ = _session_checkpoint(tmp_path, saved)
    table, _, saver, _, dense = _session_table(restored)
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        with pytest.raises(ValueError, match=_refusal("t", saved_slots, table_slots)):
            saver.restore(sess, prefix)
        np.testing.assert_array_equal(sess.run(dense), [0.0, 0.0])   # dense part untouched
    assert table.size() == 0


def test_saver_restores_the_weights_into_an_evaluation_graph(graph, tmp_path):
    prefix, (keys, weights) = _session_checkpoint(tmp_path, "adam")
    table, _, saver, _, dense = _session_table(None)
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        saver.restore(sess, prefix)
        np.testing.assert_array_equal(sess.run(dense), [1.0, 2.0])
    got_keys, got = table.export()
    np.testing.assert_array_equal(got_keys, keys)
    np.testing.assert_array_equal(got, weights)
