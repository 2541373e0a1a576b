"""``sparseflow.keras.SparseEmbedding``: a Keras 3 layer over a sparseflow table, trained by
``model.fit`` with lazy sparse updates, saved and reloaded with the model."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from sparseflow import tf2
from sparseflow.keras import SparseEmbedding
from tests.pipeline_utils import batched, item_user_ids

B = 64


def _functional_model():
    items = keras.Input(shape=(3,), dtype="int64", name="items")
    users = keras.Input(shape=(), dtype="int64", name="users")
    e_items = SparseEmbedding(300, 8, optimizer=tf2.Adam(0.1), combiner="sum",
                              name="item_table")(items)
    e_users = SparseEmbedding(100, 4, optimizer=tf2.Adagrad(0.5), name="user_table")(users)
    hidden = keras.layers.Dense(16, activation="relu")(
        keras.layers.Concatenate()([e_items, e_users]))
    out = keras.layers.Dense(1, activation="sigmoid")(hidden)
    model = keras.Model([items, users], out)
    model.compile(optimizer=keras.optimizers.Adam(0.03), loss="binary_crossentropy",
                  metrics=[keras.metrics.AUC(name="auc")])
    return model


def test_model_fit_trains_and_the_model_saves_and_reloads(tmp_path):
    features, label = item_user_ids()
    model = _functional_model()
    history = model.fit(batched(features, label, B), epochs=4, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0] - 0.1
    assert history.history["auc"][-1] > 0.8
    table = model.get_layer("item_table").table
    assert table.stats()["keys_held"] == 300
    assert float(model.get_layer("item_table").anchor.numpy()) == 0.0
    predicted = model.predict(batched(features, label, B), verbose=0)

    model.save(tmp_path / "model.keras")
    reloaded = keras.models.load_model(tmp_path / "model.keras")
    np.testing.assert_array_equal(reloaded.predict(batched(features, label, B), verbose=0),
                                  predicted)
    keys, values = table.export()
    got = reloaded.get_layer("item_table").table.export()
    np.testing.assert_array_equal(got[0], keys)
    np.testing.assert_array_equal(got[1], values)
    # And it keeps training from there (optimizer slots and steps came back).
    reloaded.fit(batched(features, label, B), epochs=1, verbose=0)

    fresh = _functional_model()
    model.save_weights(tmp_path / "w.weights.h5")
    fresh.load_weights(tmp_path / "w.weights.h5")
    np.testing.assert_array_equal(fresh.predict(batched(features, label, B), verbose=0),
                                  predicted)


def test_prediction_and_evaluation_read_only():
    features, label = item_user_ids()
    model = _functional_model()
    model.fit(batched(features, label, B).take(2), epochs=1, verbose=0)
    table = model.get_layer("item_table").table
    before = table.export()
    unseen = {"items": features["items"] + 1000, "users": features["users"]}
    out = model.predict(batched(unseen, label, B).take(1), verbose=0)
    model.evaluate(batched(features, label, B), verbose=0)
    after = table.export()
    np.testing.assert_array_equal(after[0], before[0])      # nothing admitted
    np.testing.assert_array_equal(after[1], before[1])      # nothing updated
    assert out.shape == (B, 1)


def test_fit_applies_the_sparse_update_as_the_tf2_api_does():
    """A layer trained by model.fit (SGD on the rows, a frozen dense head, MSE) ends with the
    same table as sparseflow.tf2.Embedding trained by hand on the same batches: the custom
    gradient delivers the activation gradient, once per step, to the right rows."""
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 50, (256, 2)).astype(np.int64)
    target = rng.normal(size=(256, 1)).astype(np.float32)
    kernel = rng.normal(0, 0.5, (4, 1)).astype(np.float32)
    init = keras.initializers.RandomNormal(stddev=0.1, seed=4)

    inputs = keras.Input(shape=(2,), dtype="int64")
    layer = SparseEmbedding(50, 4, initializer=init, optimizer=tf2.SGD(0.5), name="tbl")
    head = keras.layers.Dense(1, use_bias=False, trainable=False)
    model = keras.Model(inputs, head(layer(inputs)))
    head.set_weights([kernel])
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    model.fit(tf.data.Dataset.from_tensor_slices((ids, target)).batch(32), epochs=2,
              verbose=0)

    table = tf2.TableConfig(50, 4, init, name="tbl")
    embedding = tf2.Embedding({"ids": tf2.FeatureConfig(table)}, tf2.SGD(0.5))
    for _ in range(2):
        for start in range(0, 256, 32):
            embedding.enqueue({"ids": ids[start:start + 32]})
            with tf.GradientTape() as tape:
                act = embedding.dequeue()
                tape.watch(act)
                loss = tf.reduce_mean(tf.square(tf.matmul(act["ids"], kernel)
                                                - target[start:start + 32]))
            embedding.apply_gradients(tape.gradient(loss, act))
    expected = embedding.tables[table].export()
    got = layer.table.export()
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_allclose(got[1], expected[1], rtol=1e-5, atol=1e-6)
    untrained = tf2.Embedding({"ids": tf2.FeatureConfig(table)})
    untrained.enqueue({"ids": ids})
    untrained.dequeue()
    initial = untrained.tables[table].export()
    np.testing.assert_array_equal(initial[0], got[0])
    assert np.abs(got[1] - initial[1]).max(axis=1).min() > 1e-5   # every row moved


class SubclassedModel(keras.Model):
    def __init__(self):
        super().__init__()
        self.items = SparseEmbedding(300, 8, optimizer=tf2.SGD(0.2), combiner="mean")
        self.out = keras.layers.Dense(1, activation="sigmoid")

    def call(self, inputs, training=False):
        return self.out(self.items(inputs["items"], training=training))


def test_a_subclassed_model_trains_with_fit():
    features, label = item_user_ids(2)
    model = SubclassedModel()
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy")
    history = model.fit(batched(features, label, B), epochs=5, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert model.items.table.stats()["keys_held"] == 300


def test_bad_arguments_name_them():
    with pytest.raises(TypeError, match=r"Argument `optimizer` must be one of "
                                        r"sparseflow.tf2"):
        SparseEmbedding(10, 2, optimizer=keras.optimizers.SGD())
    with pytest.raises(ValueError, match=r"Argument `combiner`"):
        SparseEmbedding(10, 2, combiner="max")


def test_sparse_updates_are_lazy():
    """Adam with momentum: a dense Adam would keep moving rows after their last batch; the
    layer's lazy Adam leaves rows untouched by a step exactly as they were."""
    inputs = keras.Input(shape=(2,), dtype="int64")
    layer = SparseEmbedding(40, 4, optimizer=tf2.Adam(0.1), name="lazy")
    model = keras.Model(inputs, keras.layers.Dense(1)(layer(inputs)))
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    first = np.arange(20).reshape(10, 2)
    second = first + 20
    model.fit(first, np.ones((10, 1)), batch_size=10, epochs=1, verbose=0)
    keys, after_first = layer.table.export()
    model.fit(second, np.ones((10, 1)), batch_size=10, epochs=3, verbose=0)
    keys2, after_second = layer.table.export()
    assert keys.tolist() == list(range(20)) and keys2.tolist() == list(range(40))
    np.testing.assert_array_equal(after_second[:20], after_first)   # untouched rows
    assert layer.table.rows.optimizer.steps("lazy") == 4


def test_weights_of_another_optimizer_are_refused_and_names_are_cleaned(tmp_path):
    inputs = keras.Input(shape=(2,), dtype="int64")

    def model_with(optimizer):
        layer = SparseEmbedding(40, 2, optimizer=optimizer, name="my-table")
        model = keras.Model(inputs, keras.layers.Dense(1)(layer(inputs)))
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
        return model, layer

    model, layer = model_with(tf2.Adam(0.1))
    assert layer.table.table_name == "my_table"
    model.fit(np.arange(8).reshape(4, 2), np.ones((4, 1)), verbose=0)
    model.save_weights(tmp_path / "adam.weights.h5")
    other, _ = model_with(tf2.FTRL(0.1))
    with pytest.raises(ValueError, match=r"optimizer slots \['momentum', 'velocity'\] but "
                                         r"the table has .* \['accum', 'linear'\]"):
        other.load_weights(tmp_path / "adam.weights.h5")
    with pytest.raises(ValueError, match=r"Argument `eviction_threshold` must be None"):
        SparseEmbedding(10, 2, eviction_threshold=5)
