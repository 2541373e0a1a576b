"""A finished run's tables are freed: once a program drops its graph, model and tables (and,
in the Session face, calls ``terminate_config_initializer``), no key processor (a table's
index, last-seen times and marks: ~150 MB for the e2e benchmark's 26 tables) stays alive.

TensorFlow registers every ``tf.custom_gradient`` built in a graph (a Session graph, or a
``tf.function``'s) in a process-wide registry that is never emptied; the gradient closures
sparseflow's lookups register there reach the graph, and through its numpy functions the
tables. A program that builds, trains and drops a model several times in one process (an
Estimator's train/evaluate cycles, a sweep, a notebook) kept every run's tables.
"""

import gc
import weakref

import keras
import numpy as np
import pytest
import tensorflow as tf

import sparseflow as sf
from sparseflow import tf2
from sparseflow.custom_gradient import custom_gradient
from sparseflow.keras import SparseEmbedding
from sparseflow.pipeline.exit_sessions import live_objects
from sparseflow.pipeline.key_processor import KeyProcessor
from tests.pipeline_utils import train_pooled_lazy_adam, two_table_data

B, STEPS = 16, 4


def _live_key_processors() -> weakref.WeakSet:
    """The key processors alive now, held weakly: one an earlier test left, freed meanwhile,
    drops out of a set taken before as it does out of one taken after."""
    return weakref.WeakSet(live_objects(KeyProcessor))


def _session_run():
    """A Session-face run (sparse_lookup, lazy Adam from create_hash_optimizer), terminated
    and left: nothing of it is returned."""
    data = two_table_data(0, B * STEPS, 50, 20)
    with tf.Graph().as_default():
        sf.init()
        specs = [sf.FeatureSpec("f1", table_name="t1"), sf.FeatureSpec("f2", table_name="t1"),
                 sf.FeatureSpec("f3", table_name="t2")]
        tables = {name: sf.create_table(tf.int64, dim, name,
                                        tf.compat.v1.truncated_normal_initializer(),
                                        device_vocabulary_size=100)
                  for name, dim in (("t1", 8), ("t2", 4))}
        losses, _ = train_pooled_lazy_adam(data, B, specs,
                                           [tables[s.table_name] for s in specs])
    assert len(losses) == STEPS


def test_a_terminated_session_run_leaves_no_table_alive():
    before = _live_key_processors()
    _session_run()
    _session_run()
    assert _live_key_processors() == before


def _tf2_run(optimizer):
    """A TF2-face run: an Embedding trained in a tf.function, then dropped."""
    table = tf2.TableConfig(50, 4, tf.compat.v1.truncated_normal_initializer(), name="t")
    embedding = tf2.Embedding({"f": tf2.FeatureConfig(table)}, optimizer)
    w = tf.Variable(np.ones((4, 1), np.float32))

    @tf.function
    def step(ids):
        embedding.enqueue({"f": ids}, training=True)
        with tf.GradientTape() as tape:
            activations = embedding.dequeue()
            tape.watch(activations)
            loss = tf.reduce_mean(tf.matmul(activations["f"], w))
        embedding.apply_gradients(tape.gradient(loss, activations))
        return loss

    for s in range(STEPS):
        step(tf.constant(np.arange(s, s + 8, dtype=np.int64)))


# Adam updates in a compiled op; SGD in a numpy function over the tables.
@pytest.mark.parametrize("optimizer", [lambda: tf2.Adam(0.05), lambda: tf2.SGD(0.5)],
                         ids=["adam", "sgd"])
def test_a_dropped_tf2_embedding_leaves_no_table_alive(optimizer):
    before = _live_key_processors()
    _tf2_run(optimizer())
    _tf2_run(optimizer())
    assert _live_key_processors() == before


def _keras_run():
    """A Keras model with a SparseEmbedding layer, fit, then dropped."""
    ids = keras.Input((3,), dtype="int64")
    pooled = SparseEmbedding(50, 4, optimizer=tf2.SGD(0.5), combiner="sum")(ids)
    model = keras.Model(ids, keras.layers.Dense(1)(pooled))
    model.compile(optimizer="sgd", loss="mse")
    x = np.random.default_rng(0).integers(0, 40, (B * STEPS, 3)).astype(np.int64)
    model.fit(x, np.zeros((B * STEPS, 1), np.float32), batch_size=B, verbose=0)


def test_a_dropped_keras_model_leaves_no_table_alive():
    before = _live_key_processors()
    _keras_run()
    _keras_run()
    keras.backend.clear_session()
    assert _live_key_processors() == before


@pytest.mark.parametrize("face", ["embedding", "keras"])
def test_a_dropped_model_on_two_ranks_leaves_no_table_alive(face, tmp_path):
    """On 2 ranks the keys go through the exchange's numpy functions (routing, the owners'
    lookup and update), which TensorFlow keeps for the life of the process in TF2: each
    rank's runs, built, trained and dropped one after another, leave no table alive."""
    import json

    from tests.rank_runs import run_ranks

    run_ranks(["tests.workers.memory_ranks", tmp_path, face, 2], 2, timeout=240)
    for rank in range(2):
        live = json.loads((tmp_path / f"rank{rank}.json").read_text())["live"]
        assert live == [live[0]] * 3, (rank, live)


def test_custom_gradient_in_a_graph_differentiates_as_tf_custom_gradient_and_is_freed():
    """The helper every lookup uses: in a graph, the same gradient as ``tf.custom_gradient``;
    once the graph is dropped, nothing keeps it (or what its gradient closes over)."""
    class Payload:   # stands for the tables a lookup's gradient reaches
        pass

    def build(decorator):
        graph = tf.Graph()
        payload = Payload()
        with graph.as_default():
            @decorator
            def scaled(x):
                held = payload   # the closure holds it, as a lookup's holds its tables

                def grad(dy):
                    assert held is payload
                    return dy * 3.0

                return x * 2.0, grad

            x = tf.constant([1.0, 2.0])
            y = scaled(x)
            dx, = tf.gradients(tf.reduce_sum(y * y), [x])
            with tf.compat.v1.Session() as sess:
                values = sess.run([y, dx])
        return values, graph, payload

    (y_ours, dx_ours), graph, payload = build(custom_gradient)
    (y_tf, dx_tf), _, _ = build(tf.custom_gradient)
    np.testing.assert_array_equal(y_ours, y_tf)
    np.testing.assert_array_equal(dx_ours, dx_tf)   # 2 * y * 3
    np.testing.assert_array_equal(dx_ours, [12.0, 24.0])
    import weakref
    graph_ref, payload_ref = weakref.ref(graph), weakref.ref(payload)
    del graph, payload
    gc.collect()
    assert graph_ref() is None
    assert payload_ref() is None


def test_custom_gradient_in_a_tf_function_under_a_cond_differentiates_as_tf_custom_gradient():
    def build(decorator):
        @decorator
        def scaled(x):
            return x * 2.0, lambda dy: dy * 3.0

        @tf.function
        def grad_of(x, flag):
            # tf.gradients looks the gradient up in the registry (the proxy), in the
            # function's graph and through cond_v2's branch graph.
            y = tf.cond(flag, lambda: scaled(x), lambda: x * 5.0)
            return tf.gradients(tf.reduce_sum(y * y), [x])[0]

        return grad_of

    x = tf.constant([1.0, 2.0])
    for flag in (True, False):
        ours = build(custom_gradient)(x, tf.constant(flag)).numpy()
        np.testing.assert_array_equal(ours, build(tf.custom_gradient)(x, tf.constant(flag)))
    np.testing.assert_array_equal(build(custom_gradient)(x, tf.constant(True)), [12.0, 24.0])
    np.testing.assert_array_equal(build(custom_gradient)(x, tf.constant(False)), [50.0, 100.0])


def test_a_batch_processed_after_its_embedding_was_dropped_is_refused_naming_it():
    table = tf2.TableConfig(50, 4, tf.compat.v1.truncated_normal_initializer(), name="t")
    embedding = tf2.Embedding({"f": tf2.FeatureConfig(table)}, tf2.Adam(0.05))
    ds = tf.data.Dataset.from_tensor_slices(np.arange(16, dtype=np.int64)).batch(4)
    ds = ds.map(lambda ids: embedding.preprocess({"f": ids}))
    assert next(iter(ds))["packed"].shape[0] > 0   # works while the Embedding lives
    del embedding
    gc.collect()
    with pytest.raises(tf.errors.UnknownError,   # a numpy function's RuntimeError
                       match=r"sparseflow.tf2.Embedding was released"):
        next(iter(ds))


def test_custom_gradient_runs_eagerly_as_tf_custom_gradient():
    @custom_gradient
    def scaled(x):
        return x * 2.0, lambda dy: dy * 3.0

    x = tf.constant([1.0, 2.0])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = scaled(x)
    np.testing.assert_array_equal(y.numpy(), [2.0, 4.0])
    np.testing.assert_array_equal(tape.gradient(y, x).numpy(), [3.0, 3.0])
