"""``sparseflow.keras.DistributedEmbedding``: every table of a model in one Keras layer,
trained by ``model.fit`` with one lazy sparse update per step, saved and reloaded."""

import h5py
import keras
import numpy as np
import pytest
import tensorflow as tf

from sparseflow import tf2
from sparseflow.keras import DistributedEmbedding
from tests.pipeline_utils import batched, item_user_ids

N, B = 1024, 64


def _configs():
    items = tf2.TableConfig(300, 8, combiner="sum", name="item_table",
                            optimizer=tf2.Adam(0.1))
    users = tf2.TableConfig(100, 4, name="user_table", access_threshold=2)
    return {"items": tf2.FeatureConfig(items), "users": tf2.FeatureConfig(users)}


def _functional_model():
    inputs = {"items": keras.Input(shape=(3,), dtype="int64", name="items"),
              "users": keras.Input(shape=(), dtype="int64", name="users")}
    acts = DistributedEmbedding(_configs(), optimizer=tf2.Adagrad(0.5), name="emb")(inputs)
    assert acts["items"].shape == (None, 8) and acts["users"].shape == (None, 4)
    hidden = keras.layers.Dense(16, activation="relu")(
        keras.layers.Concatenate()([acts["items"], acts["users"]]))
    model = keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(hidden))
    model.compile(optimizer=keras.optimizers.Adam(0.03), loss="binary_crossentropy",
                  metrics=[keras.metrics.AUC(name="auc")])
    return model


def _exports(layer) -> dict:
    return {name: table.export() for name, table in layer.tables.items()}


def test_model_fit_trains_every_table_and_the_model_saves_and_reloads(tmp_path):
    features, label = item_user_ids(n=N)
    model = _functional_model()
    history = model.fit(batched(features, label, B), epochs=4, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0] - 0.1
    assert history.history["auc"][-1] > 0.8
    layer = model.get_layer("emb")
    assert layer.tables["item_table"].stats()["keys_held"] == 300
    assert layer.tables["user_table"].stats()["keys_held"] == 100   # admitted on 2 sightings
    # One update per step for every table: Adam on one, Adagrad (the layer's) on the other.
    steps = 4 * N // B
    assert layer.tables["item_table"].rows.optimizer.steps("item_table") == steps
    assert layer.tables["user_table"].rows.slot_names == ("accumulator",)
    assert float(layer.anchor.numpy()) == 0.0
    predicted = model.predict(batched(features, label, B), verbose=0)
    saved = _exports(layer)

    model.save(tmp_path / "model.keras")
    reloaded = keras.models.load_model(tmp_path / "model.keras")
    np.testing.assert_array_equal(reloaded.predict(batched(features, label, B), verbose=0),
                                  predicted)
    for name, (keys, values) in _exports(reloaded.get_layer("emb")).items():
        np.testing.assert_array_equal(keys, saved[name][0])
        np.testing.assert_array_equal(values, saved[name][1])
    # And it keeps training from there (slots, steps and counts came back).
    reloaded.fit(batched(features, label, B), epochs=1, verbose=0)
    assert (reloaded.get_layer("emb").tables["item_table"].rows.optimizer
            .steps("item_table") == steps + N // B)

    fresh = _functional_model()
    model.save_weights(tmp_path / "w.weights.h5")
    with h5py.File(tmp_path / "w.weights.h5", "r") as f:   # one group per table, by name
        group = f["layers/distributed_embedding/vars"]
        assert set(group.keys()) == {"0", "table_names", "tables"}
        assert set(group["tables"].keys()) == {"item_table", "user_table"}
    fresh.load_weights(tmp_path / "w.weights.h5")
    np.testing.assert_array_equal(fresh.predict(batched(features, label, B), verbose=0),
                                  predicted)


def test_prediction_and_evaluation_read_only():
    features, label = item_user_ids()
    model = _functional_model()
    model.fit(batched(features, label, B).take(2), epochs=1, verbose=0)
    layer = model.get_layer("emb")
    before = _exports(layer)
    counted = layer.tables["user_table"].stats()["keys_counted_not_admitted"]
    unseen = {"items": features["items"] + 1000, "users": features["users"] + 1000}
    out = model.predict(batched(unseen, label, B).take(1), verbose=0)
    model.evaluate(batched(features, label, B), verbose=0)
    for name, (keys, values) in _exports(layer).items():
        np.testing.assert_array_equal(keys, before[name][0])      # nothing admitted
        np.testing.assert_array_equal(values, before[name][1])    # nothing updated
    assert layer.tables["user_table"].stats()["keys_counted_not_admitted"] == counted
    assert out.shape == (B, 1)


def test_fit_trains_as_plain_tensorflow_on_dense_tables():
    """SGD on the rows and a frozen linear head under MSE, against the same model on dense
    tf.Variable tables (tf.nn.embedding_lookup, autodiff, plain SGD), started from the rows
    the tables drew for each key: two features sharing one table (their gradients summed
    into one update), a multi-hot "sum" feature and a multi-hot "mean" one."""
    rng = np.random.default_rng(1)
    f1 = rng.integers(0, 50, (256, 2)).astype(np.int64)
    f2 = rng.integers(0, 50, 256).astype(np.int64)
    f3 = rng.integers(0, 30, (256, 3)).astype(np.int64)
    target = rng.normal(size=(256, 1)).astype(np.float32)
    kernel = rng.normal(0, 0.5, (4 + 4 + 3, 1)).astype(np.float32)
    shared = tf2.TableConfig(50, 4, keras.initializers.RandomNormal(stddev=0.1, seed=4),
                             combiner="sum", name="shared")
    other = tf2.TableConfig(30, 3, keras.initializers.RandomUniform(-0.2, 0.2, seed=9),
                            combiner="mean", name="other")
    configs = {"f1": tf2.FeatureConfig(shared), "f2": tf2.FeatureConfig(shared),
               "f3": tf2.FeatureConfig(other)}

    # The rows each key starts from: a table admits every key of an epoch on its first step.
    initial = tf2.Embedding({k: tf2.FeatureConfig(c.table, name=k) for k, c in configs.items()})
    initial.enqueue({"f1": np.arange(100).reshape(50, 2) % 50, "f2": np.arange(50),
                     "f3": np.arange(90).reshape(30, 3) % 30})
    initial.dequeue()
    start = {}
    for config, table in initial.tables.items():
        keys, values = table.export()
        start[config.name] = values[np.argsort(keys)]

    inputs = {"f1": keras.Input((2,), dtype="int64", name="f1"),
              "f2": keras.Input((), dtype="int64", name="f2"),
              "f3": keras.Input((3,), dtype="int64", name="f3")}
    layer = DistributedEmbedding(configs, optimizer=tf2.SGD(0.5), name="tables")
    acts = layer(inputs)
    head = keras.layers.Dense(1, use_bias=False, trainable=False)
    model = keras.Model(inputs, head(keras.layers.Concatenate()(
        [acts["f1"], acts["f2"], acts["f3"]])))
    head.set_weights([kernel])
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    data = {"f1": f1, "f2": f2, "f3": f3}
    model.fit(tf.data.Dataset.from_tensor_slices((data, target)).batch(32), epochs=2,
              verbose=0)

    w_shared = tf.Variable(start["shared"])
    w_other = tf.Variable(start["other"])
    for _ in range(2):
        for s in range(0, 256, 32):
            with tf.GradientTape() as tape:
                x = tf.concat([
                    tf.reduce_sum(tf.nn.embedding_lookup(w_shared, f1[s:s + 32]), 1),
                    tf.nn.embedding_lookup(w_shared, f2[s:s + 32]),
                    tf.reduce_mean(tf.nn.embedding_lookup(w_other, f3[s:s + 32]), 1)], 1)
                loss = tf.reduce_mean(tf.square(tf.matmul(x, kernel) - target[s:s + 32]))
            for var, grad in zip((w_shared, w_other), tape.gradient(loss, [w_shared,
                                                                              w_other])):
                var.assign_sub(0.5 * tf.convert_to_tensor(grad))
    for name, expected in (("shared", w_shared), ("other", w_other)):
        keys, values = layer.tables[name].export()
        order = np.argsort(keys)
        np.testing.assert_array_equal(keys[order], np.arange(len(keys)))
        np.testing.assert_allclose(values[order], expected.numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=name)
        assert np.abs(values[order] - start[name]).max(axis=1).min() > 1e-5   # all trained


def test_outputs_follow_the_features_whatever_order_the_dict_is_written_in():
    """tf.nest orders a dict by its keys: the layer must still hand each feature its own
    table's rows (equal widths, so a mix-up would not fail a shape check)."""
    configs = {
        "zeta": tf2.FeatureConfig(tf2.TableConfig(10, 3, keras.initializers.Constant(1.0),
                                                  name="ones")),
        "alpha": tf2.FeatureConfig(tf2.TableConfig(10, 3, keras.initializers.Constant(2.0),
                                                   name="twos")),
        "mid": tf2.FeatureConfig(tf2.TableConfig(10, 3, keras.initializers.Constant(3.0),
                                                 name="threes"), max_sequence_length=2)}
    layer = DistributedEmbedding(configs, optimizer=tf2.SGD(0.1))
    ids = {"zeta": tf.constant([1, 2], tf.int64), "alpha": tf.constant([3, 4], tf.int64),
           "mid": tf.constant([[5, 6], [7, 8]], tf.int64)}
    for training in (True, False):
        out = layer(ids, training=training)
        assert list(out) == ["zeta", "alpha", "mid"]
        np.testing.assert_array_equal(out["zeta"], np.full((2, 3), 1.0))
        np.testing.assert_array_equal(out["alpha"], np.full((2, 3), 2.0))
        np.testing.assert_array_equal(out["mid"], np.full((2, 2, 3), 3.0))


def test_sparse_updates_are_lazy_in_every_table():
    inputs = {"a": keras.Input((2,), dtype="int64", name="a"),
              "b": keras.Input((), dtype="int64", name="b")}
    layer = DistributedEmbedding({"a": tf2.FeatureConfig(tf2.TableConfig(40, 4, name="ta")),
                                  "b": tf2.FeatureConfig(tf2.TableConfig(20, 2, name="tb"))},
                                 optimizer=tf2.Adam(0.1), name="lazy")
    acts = layer(inputs)
    model = keras.Model(inputs, keras.layers.Dense(1)(
        keras.layers.Concatenate()([acts["a"], acts["b"]])))
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    first = {"a": np.arange(20).reshape(10, 2), "b": np.arange(10)}
    second = {"a": first["a"] + 20, "b": first["b"] + 10}
    model.fit(first, np.ones((10, 1)), batch_size=10, epochs=1, verbose=0)
    after_first = _exports(layer)
    model.fit(second, np.ones((10, 1)), batch_size=10, epochs=3, verbose=0)
    for name, n in (("ta", 20), ("tb", 10)):
        keys, values = layer.tables[name].export()
        order = np.argsort(keys)
        assert keys[order].tolist() == list(range(2 * n))
        first_keys, first_values = after_first[name]
        np.testing.assert_array_equal(values[order][:n],
                                      first_values[np.argsort(first_keys)])
        assert layer.tables[name].rows.optimizer.steps(name) == 4


def test_bad_arguments_name_them():
    table = tf2.TableConfig(10, 2, name="t")
    with pytest.raises(TypeError, match=r"Argument `feature_configs` must be a non-empty dict"):
        DistributedEmbedding([tf2.FeatureConfig(table)])
    with pytest.raises(TypeError, match=r"Argument `feature_configs` must be a non-empty dict"):
        DistributedEmbedding({})
    with pytest.raises(TypeError, match=r"Argument `optimizer` must be one of sparseflow.tf2"):
        DistributedEmbedding({"f": tf2.FeatureConfig(table)}, optimizer=keras.optimizers.SGD())
    with pytest.raises(ValueError, match=r"Argument `feature_configs` must be tables named "
                                         r"other than '.' and '..' .* Received: TableConfig"):
        DistributedEmbedding({"f": tf2.FeatureConfig(tf2.TableConfig(10, 2))})
    with pytest.raises(ValueError, match=r"Argument `feature_configs` must be tables named"):
        DistributedEmbedding({"f": tf2.FeatureConfig(tf2.TableConfig(10, 2, name=".."))})
    with pytest.raises(ValueError, match=r"Argument `feature_configs` must be a str of 1 to "
                                         r"100 characters .* Received: 'user-id'"):
        DistributedEmbedding({"user-id": tf2.FeatureConfig(table)})
    with pytest.raises(ValueError, match=r"Argument `eviction_threshold` must be None for "
                                         r"table `e`"):
        DistributedEmbedding({"f": tf2.FeatureConfig(
            tf2.TableConfig(10, 2, name="e", eviction_threshold=5))})
    # A TensorFlow initializer without a Keras equivalent cannot go into a saved config.
    odd = tf2.TableConfig(10, 2, name="odd",
                          initializer=tf.compat.v1.uniform_unit_scaling_initializer())
    with pytest.raises(TypeError, match=r"Argument `initializer` must be a Keras initializer "
                                        r".* for table `odd`"):
        DistributedEmbedding({"f": tf2.FeatureConfig(odd)})
    layer = DistributedEmbedding({"f": tf2.FeatureConfig(table)})
    with pytest.raises(TypeError, match=r"Argument `inputs` must be a dict with exactly the "
                                        r"keys \['f'\]. Received: \['g'\]"):
        layer({"g": tf.constant([1, 2], tf.int64)})


def test_a_tensorflow_initializer_is_saved_as_the_keras_one_drawing_the_same_rows(tmp_path):
    """TableConfig's default (tf.compat.v1 truncated normal) and a seeded TF2 one round-trip
    through get_config with every key's initial row unchanged."""
    configs = {"a": tf2.FeatureConfig(tf2.TableConfig(64, 4, name="default_init")),
               "b": tf2.FeatureConfig(tf2.TableConfig(
                   64, 3, tf.random_normal_initializer(0.5, 0.3, seed=11), name="seeded")),
               "c": tf2.FeatureConfig(tf2.TableConfig(
                   64, 5, tf.compat.v1.glorot_uniform_initializer(seed=3), name="glorot"))}
    layer = DistributedEmbedding(configs, name="init")
    clone = DistributedEmbedding.from_config(layer.get_config())
    ids = {k: tf.range(64, dtype=tf.int64) for k in configs}
    for one in (layer, clone):
        one(ids, training=True)
    for name in ("default_init", "seeded", "glorot"):
        keys, values = layer.tables[name].export()
        keys2, values2 = clone.tables[name].export()
        np.testing.assert_array_equal(values[np.argsort(keys)], values2[np.argsort(keys2)])


def test_weights_of_other_tables_or_optimizers_are_refused_and_nothing_changes(tmp_path):
    inputs = {"f": keras.Input((2,), dtype="int64", name="f")}

    def model_with(table_name, optimizer):
        layer = DistributedEmbedding(
            {"f": tf2.FeatureConfig(tf2.TableConfig(40, 2, name=table_name))},
            optimizer=optimizer, name="emb")
        model = keras.Model(inputs, keras.layers.Dense(1)(layer(inputs)["f"]))
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
        model.fit({"f": np.arange(8).reshape(4, 2)}, np.ones((4, 1)), verbose=0)
        return model, layer

    model, _ = model_with("t", tf2.Adam(0.1))
    model.save_weights(tmp_path / "adam.weights.h5")
    other, layer = model_with("t", tf2.FTRL(0.1))
    before = layer.tables["t"].export()
    with pytest.raises(ValueError, match=r"optimizer slots \['momentum', 'velocity'\] but "
                                         r"the table has .* \['accum', 'linear'\]"):
        other.load_weights(tmp_path / "adam.weights.h5")
    renamed, renamed_layer = model_with("u", tf2.Adam(0.1))
    with pytest.raises(ValueError, match=r"The saved layer `emb` holds the tables \['t'\]; "
                                         r"this layer has \['u'\]"):
        renamed.load_weights(tmp_path / "adam.weights.h5")
    after = other.get_layer("emb").tables["t"].export()
    np.testing.assert_array_equal(after[1], before[1])

    # A file with a table the layer lacks is refused too: that table would be lost.
    inputs2 = {"f": inputs["f"], "g": keras.Input((), dtype="int64", name="g")}
    two = DistributedEmbedding(
        {"f": tf2.FeatureConfig(tf2.TableConfig(40, 2, name="t")),
         "g": tf2.FeatureConfig(tf2.TableConfig(40, 2, name="v"))}, tf2.Adam(0.1), name="emb")
    acts = two(inputs2)
    both = keras.Model(inputs2, keras.layers.Dense(1)(
        keras.layers.Concatenate()([acts["f"], acts["g"]])))
    both.save_weights(tmp_path / "two.weights.h5")
    kept = renamed_layer.tables["u"].export()
    with pytest.raises(ValueError, match=r"holds the tables \['t', 'v'\]; this layer has "
                                         r"\['u'\]"):
        renamed.load_weights(tmp_path / "two.weights.h5")
    np.testing.assert_array_equal(renamed_layer.tables["u"].export()[1], kept[1])
