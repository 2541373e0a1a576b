"""The TF2 API (``sparseflow.tf2``): TableConfig / FeatureConfig / Embedding.

The reference is the Session path (Rec SDK API) on the same data and seeds, itself tested
against plain TF: the same tables (host rows, same numba kernels), so the losses and trained
rows must agree (1e-5). Combiners are checked against a plain TF computation.
"""

import numpy as np
import pytest
import tensorflow as tf

import sparseflow as sf
from sparseflow import tf2
from sparseflow.optimizers import adagrad, ftrl, gradient_descent, lazy_adam
from tests.pipeline_utils import (assert_same_training, linear_tower, make_batch_iterator,
                                  run_all, sgd_and_sparse_train_op, two_table_data)

B, STEPS, V1, V2 = 32, 25, 120, 40
D1, D2 = 8, 4
LR_DENSE = 0.1
INIT = dict(stddev=0.1, seed=3)

OPTIMIZERS = {   # (Session-path sparse optimizer, the TF2 one with the same hyper-parameters)
    "adam": (lambda: lazy_adam.create_hash_optimizer(0.05), lambda: tf2.Adam(0.05, epsilon=1e-8)),
    "sgd": (lambda: gradient_descent.create_hash_optimizer(0.3), lambda: tf2.SGD(0.3)),
    "adagrad": (lambda: adagrad.create_hash_optimizer(0.1, 0.1), lambda: tf2.Adagrad(0.1, 0.1)),
    "ftrl": (lambda: ftrl.create_hash_optimizer(0.1, l1=1e-3, initial_accumulator_value=0.1),
             lambda: tf2.FTRL(0.1, l1_regularization_strength=1e-3)),
}


def _w0():
    return np.random.default_rng(5).normal(0, 0.3, (D1 + D1 + D2, 1)).astype(np.float32)


def _session_losses(data, optimizer, threshold):
    """f1 (4 ids) and f2 (2 ids) on t1, f3 (3 ids) on t2, each summed over its ids; a linear
    tower trained by SGD."""
    with tf.Graph().as_default():
        sf.init()
        specs = [sf.FeatureSpec(f, table_name=t, access_threshold=threshold)
                 for f, t in (("f1", "t1"), ("f2", "t1"), ("f3", "t2"))]
        tables = {name: sf.create_table(
            tf.int64, dim, name, tf.compat.v1.truncated_normal_initializer(**INIT),
            device_vocabulary_size=vocab) for name, dim, vocab in (("t1", D1, V1), ("t2", D2, V2))}
        it = make_batch_iterator(data, B, specs, read_ahead=False)
        batch = it.get_next()
        pooled = [tf.reduce_sum(sf.sparse_lookup(tables[s.table_name], s, batch=batch), 1)
                  for s in specs]
        loss = linear_tower(pooled, batch["label"])   # its weights are _w0()
        train = sgd_and_sparse_train_op(loss, OPTIMIZERS[optimizer][0](), LR_DENSE)
        sf.start_asc_pipeline()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            losses = [l for _, l in run_all(sess, [train, loss], it)]
            exported = {name: t.export() for name, t in tables.items()}
        sf.terminate_config_initializer()
    return np.array(losses), exported


def _tf2_embedding(optimizer, threshold, combiner="sum"):
    t1 = tf2.TableConfig(V1, D1, tf.compat.v1.truncated_normal_initializer(**INIT),
                         combiner=combiner, name="t1", access_threshold=threshold)
    t2 = tf2.TableConfig(V2, D2, tf.compat.v1.truncated_normal_initializer(**INIT),
                         combiner=combiner, name="t2", access_threshold=threshold)
    features = {"f1": tf2.FeatureConfig(t1), "f2": tf2.FeatureConfig(t1),
                "f3": tf2.FeatureConfig(t2)}
    return tf2.Embedding(features, OPTIMIZERS[optimizer][1]()), (t1, t2)


def _train_step(embedding, w):
    """One training step of the three features' embeddings and the linear tower ``w``, as a
    ``tf.function``: the sparse update through the Embedding, plain SGD on ``w``."""
    @tf.function(reduce_retracing=True)   # batches differ in unique rows: one trace
    def step(features, label):
        embedding.enqueue(features, training=True)
        with tf.GradientTape() as tape:
            activations = embedding.dequeue()
            tape.watch(activations)
            x = tf.concat([activations[k] for k in ("f1", "f2", "f3")], 1)
            logit = tf.squeeze(tf.matmul(x, w), 1)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label,
                                                                          logits=logit))
        g_act, g_w = tape.gradient(loss, [activations, w])
        embedding.apply_gradients(g_act)
        w.assign_sub(LR_DENSE * g_w)
        return loss

    return step


def _tf2_losses(data, optimizer, threshold, in_dataset):
    embedding, (t1, t2) = _tf2_embedding(optimizer, threshold)
    w = tf.Variable(_w0())
    ds = tf.data.Dataset.from_tensor_slices(data).batch(B, drop_remainder=True)
    if in_dataset:   # key processing in the tf.data pipeline
        ds = ds.map(lambda x: (embedding.preprocess(
            {k: x[k] for k in ("f1", "f2", "f3")}), x["label"]))
    else:
        ds = ds.map(lambda x: ({k: x[k] for k in ("f1", "f2", "f3")}, x["label"]))

    step = _train_step(embedding, w)
    losses = [float(step(f, l)) for f, l in ds]
    exported = {"t1": embedding.tables[t1].export(), "t2": embedding.tables[t2].export()}
    return np.array(losses), exported


def _assert_same(run, reference):
    assert_same_training(run, reference, STEPS)


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_the_tf2_path_trains_as_the_session_path(optimizer):
    data = two_table_data(0, B * STEPS, V1, V2)
    reference = _session_losses(data, optimizer, threshold=2)
    _assert_same(_tf2_losses(data, optimizer, 2, in_dataset=True), reference)
    assert reference[0][-5:].mean() < reference[0][:5].mean()   # it trained


@pytest.mark.parametrize("optimizer, update", [("adam", "SparseflowLazyAdamTables"),
                                               ("sgd", "PyFunc")])
def test_the_tf2_step_gathers_sums_and_updates_in_compiled_ops(optimizer, update):
    """The TF2 face runs the Session path's compiled ops: the gather and the gradient's sum
    always, the update where the optimizer has one (lazy Adam; SGD's kernel runs in a numpy
    function)."""
    embedding, _ = _tf2_embedding(optimizer, 1)
    w = tf.Variable(_w0())
    data = two_table_data(1, B, V1, V2)
    features = {k: tf.constant(data[k]) for k in ("f1", "f2", "f3")}
    step = _train_step(embedding, w)
    label = tf.constant(data["label"])
    ops = step.get_concrete_function(features, label).graph.get_operations()
    by_type = {}
    for op in ops:
        by_type.setdefault(op.type, []).append(op.name)
    assert len(by_type["SparseflowGatherTables"]) == 2       # two widths
    assert len(by_type["SparseflowSumTables"]) == 2
    assert any("update" in n for n in by_type.get(update, []))
    assert not any("gather" in n for n in by_type.get("PyFunc", []))
    first, second = float(step(features, label)), float(step(features, label))
    assert second < first   # the compiled path trains


def test_raw_ids_enqueued_train_as_ids_processed_in_the_dataset():
    data = two_table_data(1, B * STEPS, V1, V2)
    _assert_same(_tf2_losses(data, "adam", 1, in_dataset=False),
                 _tf2_losses(data, "adam", 1, in_dataset=True))


# -- TPUEmbedding's documentation example, adapted only in names -----------------------------

def test_the_tpu_embedding_documentation_example_runs(tmp_path):
    """tf.tpu.experimental.embedding.TPUEmbedding's example (shared table across two
    features; training and evaluation steps in tf.function over tf.range; checkpoint; CPU
    serving through embedding_tables), with tf.tpu.experimental.embedding -> sparseflow.tf2,
    TPUEmbedding -> Embedding, TPUStrategy -> the default strategy. The dataset yields raw
    ids, as the example's does. Filled in where the example leaves it to the user: the data,
    the model and its optimizer (the tape is made persistent to give the model's gradient
    too), and the losses returned."""
    rng = np.random.default_rng(0)
    n = 64 * 8
    raw = {"feature_one": rng.integers(0, 100, (n, 2)), "feature_two": rng.integers(0, 100, n),
           "feature_three": rng.integers(0, 30, (n, 3))}
    labels = (raw["feature_two"] % 2).astype(np.float32)

    table_config_one = tf2.TableConfig(vocabulary_size=100, dim=8)
    table_config_two = tf2.TableConfig(vocabulary_size=30, dim=4)
    feature_config = {
        'feature_one': tf2.FeatureConfig(table=table_config_one),
        'feature_two': tf2.FeatureConfig(table=table_config_one),
        'feature_three': tf2.FeatureConfig(table=table_config_two)}

    strategy = tf.distribute.get_strategy()
    with strategy.scope():
        embedding = tf2.Embedding(feature_config=feature_config, optimizer=tf2.SGD(0.1))

    def dataset_fn(_):
        return tf.data.Dataset.from_tensor_slices((raw, labels)).repeat().batch(64)

    distributed_dataset = (
        strategy.distribute_datasets_from_function(
            dataset_fn=dataset_fn,
            options=tf.distribute.InputOptions(
                experimental_fetch_to_device=False)))
    dataset_iterator = iter(distributed_dataset)

    model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
    model.build([None, 8 + 8 + 4])
    dense_optimizer = tf.keras.optimizers.SGD(0.1)
    losses = []

    def model_fn(activations):
        x = tf.concat([activations[k] for k in sorted(activations)], 1)
        return tf.squeeze(model(x), 1)

    @tf.function
    def training_step(dataset_iterator, num_steps):
      def tpu_step(tpu_features):
        with tf.GradientTape(persistent=True) as tape:   # persistent: for the model's too
          activations = embedding.dequeue()
          tape.watch(activations)
          model_output = model_fn(activations)
          loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
              labels=tpu_features, logits=model_output))

        embedding_gradients = tape.gradient(loss, activations)
        embedding.apply_gradients(embedding_gradients)
        # Insert your model gradient and optimizer application here
        dense_optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                            model.trainable_variables))
        return loss

      loss = tf.constant(0.0)
      for _ in tf.range(num_steps):
        embedding_features, tpu_features = next(dataset_iterator)
        embedding.enqueue(embedding_features, training=True)
        loss = strategy.run(tpu_step, args=(tpu_features, ))
      return loss

    @tf.function
    def evalution_step(dataset_iterator, num_steps):
      def tpu_step(tpu_features):
        activations = embedding.dequeue()
        model_output = model_fn(activations)
        # Insert your evaluation code here.
        return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
            labels=tpu_features, logits=model_output))

      loss = tf.constant(0.0)
      for _ in tf.range(num_steps):
        embedding_features, tpu_features = next(dataset_iterator)
        embedding.enqueue(embedding_features, training=False)
        loss = strategy.run(tpu_step, args=(tpu_features, ))
      return loss

    for _ in range(6):
        losses.append(float(training_step(dataset_iterator, tf.constant(8))))
    eval_loss = float(evalution_step(dataset_iterator, tf.constant(2)))
    assert losses[-1] < losses[0] and abs(eval_loss - losses[-1]) < 0.2
    held = embedding.tables[table_config_one].stats()["keys_held"]
    assert held == 100          # every id of both features shares table one

    checkpoint = tf.train.Checkpoint(model=model, embedding=embedding)
    path = checkpoint.save(str(tmp_path / "ckpt"))

    # On the CPU: a fresh model and Embedding restored, tables served by embedding_lookup.
    model_2 = tf.keras.Sequential([tf.keras.layers.Dense(1)])
    model_2.build([None, 8 + 8 + 4])
    embedding_2 = tf2.Embedding(
        feature_config=feature_config,
        optimizer=tf2.SGD(0.1))
    checkpoint = tf.train.Checkpoint(model=model_2, embedding=embedding_2)
    checkpoint.restore(path).assert_consumed()

    tables = embedding_2.embedding_tables
    ids = {k: tf.constant(v[:64]) for k, v in raw.items()}
    served = {name: tf.nn.embedding_lookup(tables[config.table], ids[name])
              for name, config in feature_config.items()}
    served = {k: tf.reduce_mean(v, 1) if v.shape.rank == 3 else v for k, v in served.items()}
    embedding.enqueue(ids, training=False)
    trained = embedding.dequeue()
    for name in feature_config:
        np.testing.assert_allclose(served[name].numpy(), trained[name].numpy(), rtol=1e-6,
                                   atol=1e-7)
    np.testing.assert_array_equal(model_2.get_weights()[0], model.get_weights()[0])


# -- input kinds and combiners, against plain TF -------------------------------------------

def _reference_rows(embedding, config, ids):
    """Each id's embedding as the table holds it (the export), for a plain-TF reference."""
    keys, values = embedding.tables[config].export()
    lookup = dict(zip(keys.tolist(), values))
    return np.stack([lookup[int(i)] for i in ids])


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_dense_sparse_and_ragged_ids_are_combined_as_plain_tf(combiner):
    table = tf2.TableConfig(50, 3, combiner=combiner, name="t")
    seq_table = tf2.TableConfig(50, 2, name="s")
    features = {"dense": tf2.FeatureConfig(table, padding_key=-1),
                "sparse": tf2.FeatureConfig(table),
                "ragged": tf2.FeatureConfig(table),
                "seq": tf2.FeatureConfig(seq_table, max_sequence_length=2),
                "shaped": tf2.FeatureConfig(table, output_shape=[4, 1])}
    embedding = tf2.Embedding(features, tf2.SGD(0.1))
    dense = np.array([[1, 2, -1], [3, -1, -1], [4, 4, 5], [-1, -1, -1]])  # -1: its padding
    ragged = tf.ragged.constant([[7], [8, 9, 10], [], [7, 7]], tf.int64)
    sparse = tf.sparse.from_dense(tf.constant([[11, 0], [0, 12], [13, 14], [0, 0]], tf.int64))
    seq = tf.ragged.constant([[20, 21, 22], [23], [], [24, 25]], tf.int64)
    embedding.enqueue({"dense": tf.constant(dense), "sparse": sparse, "ragged": ragged,
                       "seq": seq, "shaped": tf.constant([1, 2, 3, 4])})
    out = embedding.dequeue()

    def pooled(rows_of_ids):
        result = np.zeros((len(rows_of_ids), 3), np.float32)
        for b, ids in enumerate(rows_of_ids):
            if ids:
                vectors = _reference_rows(embedding, table, ids)
                total = vectors.sum(0)
                result[b] = {"sum": total, "mean": total / len(ids),
                             "sqrtn": total / np.sqrt(len(ids))}[combiner]
        return result

    np.testing.assert_allclose(out["dense"], pooled([[1, 2], [3], [4, 4, 5], []]), rtol=1e-6)
    np.testing.assert_allclose(out["ragged"], pooled([[7], [8, 9, 10], [], [7, 7]]), rtol=1e-6)
    np.testing.assert_allclose(out["sparse"], pooled([[11], [12], [13, 14], []]), rtol=1e-6)
    assert out["seq"].shape == (4, 2, 2)
    expected = np.zeros((4, 2, 2), np.float32)
    for b, ids in enumerate([[20, 21], [23], [], [24, 25]]):   # truncated to 2 positions
        for p, key in enumerate(ids):
            expected[b, p] = _reference_rows(embedding, seq_table, [key])[0]
    np.testing.assert_allclose(out["seq"], expected, rtol=1e-6)
    assert out["shaped"].shape == (4, 1, 3)
    np.testing.assert_allclose(out["shaped"][:, 0], pooled([[1], [2], [3], [4]]), rtol=1e-6)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_gradients_reach_each_id_scaled_by_the_combiner(combiner):
    """With SGD (lr 1) and loss = sum(activation * c), each row moves by -c times its
    share in each example it appears in (summed over examples and features)."""
    table = tf2.TableConfig(20, 2, initializer=tf.compat.v1.zeros_initializer(),
                            combiner=combiner, name="t")
    embedding = tf2.Embedding({"a": tf2.FeatureConfig(table), "b": tf2.FeatureConfig(table)},
                              tf2.SGD(1.0))
    a = tf.ragged.constant([[1, 2, 2], [3]], tf.int64)
    b = tf.constant([[2], [3]], tf.int64)
    embedding.enqueue({"a": a, "b": b})
    c = tf.constant([[1.0, 2.0], [3.0, 4.0]])
    with tf.GradientTape() as tape:
        out = embedding.dequeue()
        tape.watch(out)
        loss = tf.reduce_sum(out["a"] * c) + tf.reduce_sum(out["b"] * c)
    embedding.apply_gradients(tape.gradient(loss, out))
    share = {"sum": lambda n: 1.0, "mean": lambda n: 1.0 / n,
             "sqrtn": lambda n: 1.0 / np.sqrt(n)}[combiner]
    expected = {1: -share(3) * c[0].numpy(), 2: -2 * share(3) * c[0].numpy() - c[0].numpy(),
                3: -c[1].numpy() - c[1].numpy()}
    for key, value in expected.items():
        np.testing.assert_allclose(_reference_rows(embedding, table, [key])[0], value,
                                   rtol=1e-6)


# -- checkpoints ----------------------------------------------------------------------------

def test_checkpoint_manager_saves_and_restores_tables_with_the_model(tmp_path):
    data = two_table_data(2, B * 6, V1, V2)

    def train(embedding, w, batches):
        for features, label in batches:
            embedding.enqueue(features)
            with tf.GradientTape() as tape:
                act = embedding.dequeue()
                tape.watch(act)
                x = tf.concat([act[k] for k in ("f1", "f2", "f3")], 1)
                loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
                    labels=label, logits=tf.squeeze(tf.matmul(x, w), 1)))
            g_act, g_w = tape.gradient(loss, [act, w])
            embedding.apply_gradients(g_act)
            w.assign_sub(LR_DENSE * g_w)
            yield float(loss)

    batches = [({k: v[i:i + B] for k, v in data.items() if k != "label"},
                data["label"][i:i + B]) for i in range(0, B * 6, B)]
    embedding, (t1, _) = _tf2_embedding("adam", threshold=2)
    w = tf.Variable(_w0())
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(embedding=embedding, w=w),
                                         str(tmp_path), max_to_keep=2)
    list(train(embedding, w, batches[:3]))
    manager.save()
    expected = list(train(embedding, w, batches[3:]))
    saved_keys = embedding.tables[t1].export()[0]

    fresh, (f1, _) = _tf2_embedding("adam", threshold=2)
    w2 = tf.Variable(tf.zeros_like(w))
    tf.train.Checkpoint(embedding=fresh, w=w2).restore(manager.latest_checkpoint
                                                       ).assert_consumed()
    assert fresh.tables[f1].stats()["keys_held"] > 20
    resumed = list(train(fresh, w2, batches[3:]))
    np.testing.assert_allclose(resumed, expected, rtol=1e-5)   # Adam steps, counts restored
    np.testing.assert_array_equal(fresh.tables[f1].export()[0], saved_keys)


def test_restoring_into_another_optimizer_names_both_slot_layouts(tmp_path):
    embedding, _ = _tf2_embedding("adam", threshold=1)
    embedding.enqueue({k: tf.constant([[1, 2]]) for k in ("f1", "f2", "f3")})
    embedding.dequeue()
    path = tf.train.Checkpoint(embedding=embedding).save(str(tmp_path / "c"))
    other, _ = _tf2_embedding("adagrad", threshold=1)
    with pytest.raises(ValueError, match=r"Cannot restore table `t1` .* optimizer slots "
                                         r"\['momentum', 'velocity'\] but the table has .* "
                                         r"\['accumulator'\]"):
        tf.train.Checkpoint(embedding=other).restore(path)


# -- eviction and errors ---------------------------------------------------------------------

def test_keys_unseen_for_the_eviction_window_are_evicted():
    table = tf2.TableConfig(10, 2, name="t", eviction_threshold=100)
    embedding = tf2.Embedding({"f": tf2.FeatureConfig(table)}, tf2.SGD(0.1))
    ds = tf.data.Dataset.from_tensor_slices(({"f": [[1], [2], [3]]}, [0, 50, 200])).map(
        lambda f, ts: embedding.preprocess(f, timestamp=ts))
    for batch in ds:
        embedding.enqueue(batch)
        embedding.dequeue()
    result = embedding.evict()["t"]
    assert result.keys_removed == 2      # keys 1 and 2: last seen 200 and 150 ago
    keys, _ = embedding.tables[table].export()
    assert keys.tolist() == [3]


def test_misuse_gets_clear_errors():
    table = tf2.TableConfig(10, 2, name="t")
    embedding = tf2.Embedding({"f": tf2.FeatureConfig(table)})
    with pytest.raises(RuntimeError, match=r"dequeue\(\) needs a batch: call enqueue"):
        embedding.dequeue()
    with pytest.raises(RuntimeError, match=r"apply_gradients\(\) needs the activations"):
        embedding.apply_gradients({"f": tf.zeros([1, 2])})
    with pytest.raises(ValueError, match=r"`features` must have the structure of "
                                         r"feature_config"):
        embedding.enqueue({"g": tf.constant([1])})
    embedding.enqueue({"f": tf.constant([1])}, training=False)
    out = embedding.dequeue()
    with pytest.raises(RuntimeError, match=r"on an evaluation batch"):
        embedding.apply_gradients(out)
    embedding.enqueue({"f": tf.constant([1])})
    out = embedding.dequeue()
    with pytest.raises(ValueError, match=r"Argument `optimizer` must be an optimizer for "
                                         r"table `t`"):
        embedding.apply_gradients(out)
    with pytest.raises(ValueError, match=r"Argument `combiner` must be one of"):
        tf2.TableConfig(10, 2, combiner="max")
    with pytest.raises(ValueError, match=r"Argument `vocabulary_size`"):
        tf2.TableConfig(0, 2)
    with pytest.raises(TypeError, match=r"Argument `optimizer` must be None or one of "
                                        r"sparseflow.tf2"):
        tf2.TableConfig(10, 2, optimizer=tf.keras.optimizers.SGD())
    with pytest.raises(ValueError, match=r"Argument `lazy_adam` must be True"):
        tf2.Adam(lazy_adam=False)
    with pytest.raises(ValueError, match=r"tables with distinct names"):
        tf2.Embedding({"a": tf2.FeatureConfig(tf2.TableConfig(5, 2, name="x")),
                       "b": tf2.FeatureConfig(tf2.TableConfig(5, 2, name="x"))})


def test_a_full_table_raises_table_full_error():
    embedding = tf2.Embedding({"f": tf2.FeatureConfig(tf2.TableConfig(3, 2, name="t"))},
                              tf2.SGD(0.1))
    # Eagerly the key processor's own error comes through; inside tf.function an OpError.
    with pytest.raises((sf.TableFullError, tf.errors.OpError),
                       match=r"Table `t` is full.*Set `vocabulary_size` to at least 4"):
        embedding.enqueue({"f": tf.constant([1, 2, 3, 4])})


def test_any_int64_is_a_key_unless_it_is_the_padding_key():
    table = tf2.TableConfig(10, 2, name="t", combiner="sum")
    embedding = tf2.Embedding({"f": tf2.FeatureConfig(table)}, tf2.SGD(0.1))
    keys = tf.constant([[-5, 2**62], [-1, 7]], tf.int64)
    embedding.enqueue({"f": keys})
    out = embedding.dequeue()["f"].numpy()
    assert sorted(embedding.tables[table].export()[0].tolist()) == [-5, -1, 7, 2**62]
    np.testing.assert_allclose(out[1], _reference_rows(embedding, table, [-1, 7]).sum(0),
                               rtol=1e-6)
    padded = tf2.Embedding({"f": tf2.FeatureConfig(table, padding_key=-1)})
    padded.enqueue({"f": keys}, training=True)
    padded.dequeue()
    assert sorted(padded.tables[table].export()[0].tolist()) == [-5, 7, 2**62]


# -- misuse found in review ---------------------------------------------------------------

def test_a_gradient_of_the_wrong_size_is_refused_not_applied():
    table = tf2.TableConfig(10, 2, name="t", initializer=tf.compat.v1.zeros_initializer())
    embedding = tf2.Embedding({"f": tf2.FeatureConfig(table)}, tf2.SGD(1.0))
    embedding.enqueue({"f": tf.constant([1, 2, 3, 4])})
    embedding.dequeue()
    with pytest.raises((ValueError, tf.errors.OpError),
                       match=r"`gradients` for feature `feature_0` must match its "
                             r"activations: 4 embedding rows .* got a gradient giving 1"):
        embedding.apply_gradients({"f": tf.ones([1, 2])})
    np.testing.assert_array_equal(embedding.tables[table].export()[1], 0)   # untouched


def test_feature_names_must_differ_and_tables_be_well_named():
    table = tf2.TableConfig(10, 2, name="t")
    with pytest.raises(ValueError, match=r"features with distinct names"):
        tf2.Embedding({"a": tf2.FeatureConfig(table, name="x"),
                       "b": tf2.FeatureConfig(table, name="x")})
    with pytest.raises(ValueError, match=r"Argument `name` must be a str of 1 to 100 "
                                         r"characters from A-Z"):
        tf2.TableConfig(10, 2, name="a/b")
    assert tf2.FeatureConfig(table, output_shape=[np.int64(4), 1]).output_shape == [4, 1]
    with pytest.raises(ValueError, match=r"`output_shape`"):
        tf2.FeatureConfig(table, output_shape=[0])


def test_a_batch_is_enqueued_on_the_channel_it_was_preprocessed_for():
    table = tf2.TableConfig(10, 2, name="t")
    embedding = tf2.Embedding({"f": tf2.FeatureConfig(table)}, tf2.SGD(1.0))
    evaluation = embedding.preprocess({"f": tf.constant([1])}, training=False)
    with pytest.raises(ValueError, match=r"Argument `training` must be False, the channel "
                                         r"the batch was preprocessed for"):
        embedding.enqueue(evaluation)                      # training=True by default
    embedding.enqueue(evaluation, training=False)
    out = embedding.dequeue()
    with pytest.raises(RuntimeError, match=r"on an evaluation batch"):
        embedding.apply_gradients(out)
    with pytest.raises(TypeError, match=r"Argument `training` must be a Python bool"):
        embedding.preprocess({"f": tf.constant([1])}, training=tf.constant(True))


def test_several_replicas_in_one_process_are_refused(monkeypatch):
    class TwoReplicas:
        num_replicas_in_sync = 2

    embedding = tf2.Embedding({"f": tf2.FeatureConfig(tf2.TableConfig(10, 2, name="t"))})
    monkeypatch.setattr(tf.distribute, "get_replica_context", lambda: TwoReplicas())
    with pytest.raises(RuntimeError, match=r"runs one replica per rank \(1 here\); this "
                                           r"strategy has 2 replicas"):
        embedding.enqueue({"f": tf.constant([1])})


def test_nested_ragged_and_high_rank_sparse_inputs():
    table = tf2.TableConfig(20, 2, name="t", combiner="sum")
    embedding = tf2.Embedding({"f": tf2.FeatureConfig(table)}, tf2.SGD(0.1))
    nested = tf.ragged.constant([[[1, 2], [3]], [[4]]], tf.int64)
    embedding.enqueue({"f": nested})
    out = embedding.dequeue()["f"].numpy()
    np.testing.assert_allclose(out[0], _reference_rows(embedding, table, [1, 2, 3]).sum(0),
                               rtol=1e-6)
    sequence = tf2.Embedding({"f": tf2.FeatureConfig(table, max_sequence_length=2)})
    with pytest.raises(ValueError, match=r"ragged rank 1\) for a sequence feature"):
        sequence.enqueue({"f": nested})
    rank3 = tf.sparse.from_dense(tf.constant([[[1, 2], [3, 4]]], tf.int64))
    with pytest.raises(ValueError, match=r"a SparseTensor of rank 1 or 2"):
        embedding.enqueue({"f": rank3})
