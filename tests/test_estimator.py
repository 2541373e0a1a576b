"""sparseflow.estimator against references that do not use it: a hand-written
tf.compat.v1.Session loop on the same batches, numpy metrics from the predictions, and the
exported SavedModel loaded by plain TensorFlow in a process without sparseflow."""

import json
import logging
import os
import subprocess
import sys
import types

import numpy as np
import pytest
import tensorflow as tf

import sparseflow as sf
from sparseflow import estimator as est
from sparseflow import runtime
from sparseflow.checkpoint.saver import read_sparse_states
from sparseflow.optimizers import lazy_adam

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B, F, DIM, VOCAB = 32, 4, 8, 200
STEPS = 16


def make_data(n_batches=STEPS, seed=0, unseen=False):
    """Keys [N, F] (Zipf-like over VOCAB; ``unseen``: a quarter of them from keys training
    never saw), dense [N, 3] and labels [N, 1] that depend on hidden key weights."""
    rng = np.random.default_rng(seed)
    n = n_batches * B
    ids = (rng.zipf(1.3, (n, F)) % VOCAB).astype(np.int64)
    if unseen:
        mask = rng.random((n, F)) < 0.25
        ids[mask] = 10_000 + rng.integers(0, 50, mask.sum())
    weight = np.random.default_rng(99).normal(size=VOCAB)
    dense = rng.normal(size=(n, 3)).astype(np.float32)
    score = weight[np.minimum(ids, VOCAB - 1)].sum(1) + dense[:, 0]
    labels = (score > 0).astype(np.float32)[:, None]
    return {"ids": ids, "dense": dense, "labels": labels}


class Model:
    """A model_fn and input_fns over one table "t" (dim 8, lazy Adam) and a linear head
    (Adam), in FeatureSpec mode; ``threshold`` is the table's access threshold."""

    def __init__(self, threshold=None, is_train_in_eval=False):
        self.threshold = threshold
        self.is_train_in_eval = is_train_in_eval
        self.spec = None

    def input_fn(self, data, skip=0):
        def input_fn(mode):
            training = mode == est.ModeKeys.TRAIN
            self.spec = sf.FeatureSpec("ids", table_name="t",
                                       access_threshold=self.threshold if training else None)
            insert = sf.get_asc_insert_func(tgt_key_specs=[self.spec],
                                            is_training=training or self.is_train_in_eval)
            ds = tf.compat.v1.data.Dataset.from_tensor_slices(
                ({"ids": data["ids"], "dense": data["dense"]}, data["labels"]))
            return ds.batch(B, drop_remainder=True).skip(skip).map(
                lambda f, l: (insert(f), l))
        return input_fn

    def model_fn(self, features, labels, mode):
        table = sf.create_table(tf.int64, DIM, "t",
                                tf.compat.v1.truncated_normal_initializer(stddev=0.1, seed=1),
                                device_vocabulary_size=1000)
        is_train = mode == est.ModeKeys.TRAIN or self.is_train_in_eval
        emb = sf.sparse_lookup(table, self.spec, batch=features, is_train=is_train)
        x = tf.concat([tf.reduce_sum(emb, 1), features["dense"]], 1)
        w = tf.compat.v1.get_variable("w", [DIM + 3, 1],
                                      initializer=tf.compat.v1.glorot_uniform_initializer(seed=2))
        b = tf.compat.v1.get_variable("b", [1], initializer=tf.compat.v1.zeros_initializer())
        logits = tf.matmul(x, w) + b
        prob = tf.sigmoid(logits)
        if mode == est.ModeKeys.PREDICT:
            return est.EstimatorSpec(mode, predictions={"prob": prob, "logits": logits})
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels,
                                                                      logits=logits))
        tf.compat.v1.add_to_collection("test_loss", loss)
        if mode == est.ModeKeys.EVAL:
            return est.EstimatorSpec(mode, loss=loss, eval_metric_ops={
                "mse": tf.compat.v1.metrics.mean_squared_error(labels, prob),
                "accuracy": tf.compat.v1.metrics.accuracy(labels, tf.cast(prob > 0.5,
                                                                          tf.float32))})
        return est.EstimatorSpec(mode, loss=loss, train_op=self.train_op(loss))

    @staticmethod
    def train_op(loss):
        dense, tables = sf.get_dense_and_sparse_variable()
        grads = tf.gradients(loss, dense + tables)
        updates = [tf.compat.v1.train.AdamOptimizer(0.05).apply_gradients(
                       zip(grads[:len(dense)], dense)),
                   lazy_adam.create_hash_optimizer(learning_rate=0.05).apply_gradients(
                       zip(grads[len(dense):], tables))]
        # After the updates, as optimizer.minimize(global_step=...) does: a run that finds
        # the data at its end then counts no step.
        with tf.control_dependencies(updates):
            return tf.compat.v1.assign_add(tf.compat.v1.train.get_global_step(), 1).op


class LossHook(tf.compat.v1.train.SessionRunHook):
    """Records the loss of every step (the model_fn's "test_loss" collection)."""

    def __init__(self):
        self.losses = []

    def begin(self):
        self._loss = tf.compat.v1.get_collection("test_loss")[0]

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self._loss)

    def after_run(self, run_context, run_values):
        self.losses.append(float(run_values.results))


class TableSizeHook(tf.compat.v1.train.SessionRunHook):
    """The size of table "t" of the call's own runtime when its session ends."""

    size = None

    def begin(self):
        self._table = runtime.active().tables["t"]

    def end(self, session):
        TableSizeHook.size = self._table.size()


def estimator(tmp_path, model, **config):
    config = dict(dict(tf_random_seed=7, save_checkpoints_steps=8, log_step_count_steps=4),
                  **config)
    return est.Estimator(model.model_fn, model_dir=str(tmp_path / "model"),
                         config=est.RunConfig(**config))


def checkpoint_values(prefix):
    """Dense variables and table t (keys sorted: keys, weights, slots, counts) of a
    checkpoint."""
    dense = {name: tf.train.load_variable(prefix, name)
             for name, _ in tf.train.list_variables(prefix)}
    state = read_sparse_states(prefix)["t"]
    order = np.argsort(state.keys)
    table = {"keys": state.keys[order], "values": state.values[order],
             "counts": state.counts[order], "steps": state.optimizer_steps}
    return dense, table


# -- training equals a hand-written Session loop ------------------------------------------

def hand_written_training(data, model, steps):
    """The same model_fn, graph seed and batches in a tf.compat.v1.Session loop written by
    hand; returns (losses, dense variables by name, table t as checkpoint_values does)."""
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(7)
        sf.init()
        try:
            global_step = tf.compat.v1.train.get_or_create_global_step()
            dataset = model.input_fn(data)(est.ModeKeys.TRAIN)
            iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
            features, labels = iterator.get_next()
            spec = model.model_fn(features, labels, est.ModeKeys.TRAIN)
            sf.start_asc_pipeline()
            losses = []
            with tf.compat.v1.Session() as sess:
                sess.run([tf.compat.v1.global_variables_initializer(),
                          tf.compat.v1.local_variables_initializer(), iterator.initializer])
                for _ in range(steps):
                    _, loss = sess.run([spec.train_op, spec.loss])
                    losses.append(float(loss))
                dense = {v.op.name: sess.run(v) for v in tf.compat.v1.global_variables()}
                assert int(sess.run(global_step)) == steps
            table = sf.get_dense_and_sparse_variable()[1][0]
            keys, values = table.export()
            order = np.argsort(keys)
            return losses, dense, {"keys": keys[order], "weights": values[order]}
        finally:
            sf.terminate_config_initializer()


def test_train_equals_a_hand_written_session_loop(tmp_path):
    data = make_data()
    model = Model(threshold=2)
    hook = LossHook()
    e = estimator(tmp_path, model)
    e.train(model.input_fn(data), hooks=[hook], max_steps=STEPS)

    losses, dense, table = hand_written_training(data, Model(threshold=2), STEPS)
    np.testing.assert_allclose(hook.losses, losses, rtol=1e-5, atol=1e-6)
    assert losses[-4:] != losses[:4]
    ours_dense, ours_table = checkpoint_values(e.latest_checkpoint())
    assert e.latest_checkpoint().endswith(f"model.ckpt-{STEPS}")
    for name, value in dense.items():
        np.testing.assert_allclose(ours_dense[name], value, rtol=1e-5, atol=1e-6,
                                   err_msg=name)
    np.testing.assert_array_equal(ours_table["keys"], table["keys"])
    np.testing.assert_allclose(ours_table["values"][:, :DIM], table["weights"], rtol=1e-5,
                               atol=1e-6)


def test_a_run_stopped_at_max_steps_and_resumed_equals_an_uninterrupted_run(tmp_path):
    data = make_data()
    whole_model = Model(threshold=3)
    whole = est.Estimator(whole_model.model_fn, model_dir=str(tmp_path / "whole"),
                          config=est.RunConfig(tf_random_seed=7, save_checkpoints_steps=5))
    whole.train(whole_model.input_fn(data), max_steps=STEPS)

    model = Model(threshold=3)
    parts = est.Estimator(model.model_fn, model_dir=str(tmp_path / "parts"),
                          config=est.RunConfig(tf_random_seed=7, save_checkpoints_steps=5))
    parts.train(model.input_fn(data), max_steps=STEPS // 2)
    assert parts.latest_checkpoint().endswith(f"model.ckpt-{STEPS // 2}")
    # The data restarts with input_fn (as in tf.estimator): skip the batches trained on.
    parts.train(model.input_fn(data, skip=STEPS // 2), max_steps=STEPS)
    # Already at max_steps: trains nothing, reads no data.
    parts.train(lambda: (_ for _ in ()).throw(AssertionError("input_fn called")),
                max_steps=STEPS)

    a_dense, a_table = checkpoint_values(whole.latest_checkpoint())
    b_dense, b_table = checkpoint_values(parts.latest_checkpoint())
    assert a_dense["global_step"] == b_dense["global_step"] == STEPS
    for name in a_dense:
        np.testing.assert_allclose(b_dense[name], a_dense[name], rtol=1e-5, atol=1e-6,
                                   err_msg=name)
    np.testing.assert_array_equal(b_table["keys"], a_table["keys"])
    np.testing.assert_array_equal(b_table["counts"], a_table["counts"])
    np.testing.assert_allclose(b_table["values"], a_table["values"], rtol=1e-5, atol=1e-6)
    assert b_table["steps"] == a_table["steps"]


# -- evaluate and predict -------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trained")
    model = Model(threshold=2)
    e = estimator(tmp, model)
    e.train(model.input_fn(make_data()), max_steps=STEPS)
    return e, model


def test_evaluate_metrics_equal_numpy_from_predict(trained):
    e, model = trained
    data = make_data(n_batches=6, seed=3, unseen=True)
    results = e.evaluate(model.input_fn(data))
    assert results["global_step"] == STEPS
    assert set(results) == {"loss", "mse", "accuracy", "global_step"}
    predictions = list(e.predict(model.input_fn(data)))
    assert len(predictions) == 6 * B
    prob = np.array([p["prob"][0] for p in predictions], np.float64)
    logits = np.array([p["logits"][0] for p in predictions], np.float64)
    y = data["labels"][:, 0].astype(np.float64)
    # The loss metric is the mean of the batches' mean losses (equal batches: the mean).
    logloss = np.maximum(logits, 0) - logits * y + np.log1p(np.exp(-np.abs(logits)))
    np.testing.assert_allclose(results["loss"], logloss.mean(), rtol=1e-5)
    np.testing.assert_allclose(results["mse"], ((prob - y) ** 2).mean(), rtol=1e-5)
    np.testing.assert_allclose(results["accuracy"], ((prob > 0.5) == y).mean(), rtol=1e-6)
    batches = list(e.predict(model.input_fn(data), predict_keys=["prob"],
                             yield_single_examples=False))
    assert len(batches) == 6 and set(batches[0]) == {"prob"}
    np.testing.assert_allclose(np.concatenate([b["prob"] for b in batches])[:, 0], prob,
                               rtol=1e-6)


def test_evaluation_reads_unknown_keys_as_zeros_and_adds_no_key(trained, tmp_path):
    e, model = trained
    held = read_sparse_states(e.latest_checkpoint())["t"].keys.shape[0]
    data = make_data(n_batches=3, seed=5, unseen=True)
    # Even an insert function and a lookup that say is_training / is_train=True in EVAL add
    # nothing: the runtime is read-only.
    careless = Model(is_train_in_eval=True)
    e2 = est.Estimator(careless.model_fn, model_dir=e.model_dir, config=e.config)
    TableSizeHook.size = None
    first = e2.evaluate(careless.input_fn(data), hooks=[TableSizeHook()])
    assert TableSizeHook.size == held
    assert e2.evaluate(careless.input_fn(data)) == first   # nothing was counted either
    TableSizeHook.size = None
    list(e.predict(model.input_fn(data), hooks=[TableSizeHook()]))
    assert TableSizeHook.size == held


def test_the_exported_saved_model_predicts_what_predict_does_in_plain_tf(trained, tmp_path):
    e, model = trained
    data = make_data(n_batches=2, seed=4, unseen=True)
    expected = np.concatenate([b["prob"] for b in e.predict(
        model.input_fn(data), yield_single_examples=False)])

    def serving_input_receiver_fn():
        inputs = {"ids": tf.compat.v1.placeholder(tf.int64, [None, F], name="ids"),
                  "dense": tf.compat.v1.placeholder(tf.float32, [None, 3], name="dense")}
        return est.export.ServingInputReceiver(inputs, inputs)

    path = e.export_saved_model(str(tmp_path / "export"), serving_input_receiver_fn)
    assert isinstance(path, bytes) and os.path.isfile(os.path.join(path.decode(),
                                                                   "saved_model.pb"))
    np.save(tmp_path / "ids.npy", data["ids"])
    np.save(tmp_path / "dense.npy", data["dense"])
    script = (
        "import sys, json, numpy as np, tensorflow as tf\n"
        f"m = tf.saved_model.load({path.decode()!r})\n"
        "f = m.signatures['serving_default']\n"
        f"ids = np.load({str(tmp_path / 'ids.npy')!r}); dense = np.load({str(tmp_path / 'dense.npy')!r})\n"
        "out = f(ids=tf.constant(ids), dense=tf.constant(dense))['prob'].numpy()\n"
        "print(json.dumps({'prob': out[:, 0].tolist(), 'sparseflow': 'sparseflow' in sys.modules}))\n")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("PYTHONPATH", None)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, cwd=str(tmp_path), timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    served = json.loads(done.stdout.strip().splitlines()[-1])
    assert served["sparseflow"] is False
    np.testing.assert_allclose(served["prob"], expected[:, 0], rtol=1e-5, atol=1e-6)


def test_variable_names_values_and_summaries(trained):
    e, _ = trained
    names = e.get_variable_names()
    assert {"w", "b", "global_step"} <= set(names)
    assert e.get_variable_value("global_step") == STEPS
    np.testing.assert_array_equal(e.get_variable_value("w"),
                                  tf.train.load_variable(e.latest_checkpoint(), "w"))
    with pytest.raises(ValueError, match="`name`"):
        e.get_variable_value("no_such_variable")
    tags = set()
    for name in os.listdir(e.model_dir):
        if name.startswith("events.out"):
            for event in tf.compat.v1.train.summary_iterator(os.path.join(e.model_dir, name)):
                tags.update(v.tag for v in event.summary.value)
    assert {"loss", "global_step/sec"} <= tags


def test_a_log_line_every_log_step_count_steps(tmp_path, caplog):
    model = Model()
    e = estimator(tmp_path, model, log_step_count_steps=5)
    with caplog.at_level(logging.INFO, logger="sparseflow.estimator"):
        e.train(model.input_fn(make_data(n_batches=10)), max_steps=10)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("loss = ")]
    assert [line.split("step = ")[1].split()[0] for line in lines] == ["1", "5", "10"]
    assert "global steps/s" in lines[-1]


def test_train_and_evaluate_evaluates_each_checkpoint(tmp_path):
    model = Model(threshold=2)
    e = estimator(tmp_path, model, save_checkpoints_steps=5)
    data = make_data()
    evaluated = []

    class Steps(tf.compat.v1.train.SessionRunHook):
        def after_create_session(self, session, coord):
            evaluated.append(int(session.run(tf.compat.v1.train.get_global_step())))

    result, exports = est.train_and_evaluate(
        e, est.TrainSpec(model.input_fn(data), max_steps=12),
        est.EvalSpec(model.input_fn(make_data(n_batches=2, seed=8)), steps=2, hooks=[Steps()],
                     throttle_secs=0))
    assert evaluated == [5, 10, 12]
    assert result["global_step"] == 12 and exports == []
    assert np.isfinite(result["loss"])
    assert os.listdir(os.path.join(e.model_dir, "eval"))


# -- bad input ------------------------------------------------------------------------------

def test_bad_input_names_the_argument(tmp_path, trained):
    model = Model()
    e = estimator(tmp_path, model)
    data = make_data(n_batches=2)
    for kwargs, argument in (({"steps": 0}, "steps"), ({"max_steps": -3}, "max_steps"),
                             ({"steps": 2.5}, "steps"), ({"steps": 1, "max_steps": 2}, "steps")):
        with pytest.raises(ValueError, match=f"`{argument}`"):
            e.train(model.input_fn(data), **kwargs)
    with pytest.raises(ValueError, match="Could not find a trained model"):
        e.evaluate(model.input_fn(data))

    def no_loss(features, labels, mode):
        return est.EstimatorSpec(mode, train_op=tf.no_op())
    with pytest.raises(ValueError, match="Argument `loss` must be a scalar float tensor in "
                                         "mode='train'.*Received: None"):
        est.Estimator(no_loss, model_dir=str(tmp_path / "x")).train(model.input_fn(data),
                                                                    steps=1)

    def three(mode):
        return (tf.zeros([2]), tf.zeros([2]), tf.zeros([2]))
    with pytest.raises(ValueError, match="Argument `input_fn` must be .*Received: 'a 3-tuple'"):
        e.train(three, steps=1)
    with pytest.raises(TypeError, match="Argument `input_fn`"):
        e.train(lambda: "not a dataset", steps=1)

    trained_estimator, trained_model = trained
    with pytest.raises(ValueError, match=r"Argument `predict_keys` must be keys of the "
                                         r"predictions, among \['logits', 'prob'\]"):
        next(trained_estimator.predict(trained_model.input_fn(data), predict_keys=["probs"]))
    with pytest.raises(ValueError, match="`steps`"):
        trained_estimator.evaluate(trained_model.input_fn(data), steps=0)
    with pytest.raises(ValueError, match="`mode`"):
        est.EstimatorSpec("training", loss=tf.constant(0.0))
    with pytest.raises(ValueError, match="save_checkpoints_steps.*save_checkpoints_secs"):
        est.RunConfig(save_checkpoints_steps=5, save_checkpoints_secs=5)


def test_another_models_checkpoint_is_refused_before_anything_changes(tmp_path, trained):
    trained_estimator, _ = trained

    def other_model_fn(features, labels, mode):
        table = sf.create_table(tf.int64, 4, "other", tf.compat.v1.zeros_initializer(),
                                device_vocabulary_size=10)
        del table
        v = tf.compat.v1.get_variable("v", [3])
        loss = tf.reduce_sum(v)
        return est.EstimatorSpec(mode, loss=loss, train_op=tf.group(
            tf.compat.v1.assign_add(tf.compat.v1.train.get_global_step(), 1)))

    other = est.Estimator(other_model_fn, model_dir=trained_estimator.model_dir)
    before = sorted(os.listdir(trained_estimator.model_dir))
    with pytest.raises(ValueError, match="Argument `model_dir` must hold a checkpoint of this "
                                         "model.*variable `v` is not in it.*table `t` is in it "
                                         "but not in this model"):
        other.train(lambda: {"x": tf.zeros([1])}, steps=1)
    assert sorted(os.listdir(trained_estimator.model_dir)) == before


def test_a_train_op_that_leaves_the_global_step_fails(tmp_path):
    def model_fn(features, mode):
        v = tf.compat.v1.get_variable("v", [1])
        loss = tf.reduce_sum(v * features["x"])
        return est.EstimatorSpec(mode, loss=loss, train_op=tf.compat.v1.train
                                 .GradientDescentOptimizer(0.1).minimize(loss))
    e = est.Estimator(model_fn, model_dir=str(tmp_path))
    with pytest.raises(RuntimeError, match="did not increase the global step"):
        e.train(lambda: {"x": tf.ones([2, 1])}, steps=3)


def test_tables_created_outside_model_fn_are_refused(tmp_path):
    sf.init()
    try:
        sf.create_table(tf.int64, 4, "early", tf.compat.v1.zeros_initializer(),
                        device_vocabulary_size=10)
        e = est.Estimator(Model().model_fn, model_dir=str(tmp_path))
        with pytest.raises(ValueError, match="call create_table inside model_fn"):
            e.train(Model().input_fn(make_data(n_batches=1)), steps=1)
    finally:
        sf.terminate_config_initializer()


def test_import_mx_rec_gives_tf_estimator_only_where_tf_has_none():
    import mx_rec  # noqa: F401
    from mx_rec import _compat
    assert tf.estimator is est and tf.compat.v1.estimator is est
    real = object()
    fake_tf = types.SimpleNamespace(estimator=real)
    bare = types.SimpleNamespace()
    _compat._install_estimator((fake_tf, bare))
    assert fake_tf.estimator is real and bare.estimator is est


def test_npu_run_config_accepts_npu_options_and_refuses_result_changing_ones(caplog):
    from tf_adapter import DumpConfig, NPUEstimator, NPURunConfig, npu_hooks_append
    with caplog.at_level(logging.INFO, logger="mx_rec"):
        config = NPURunConfig(model_dir="m", save_checkpoints_steps=3, iterations_per_loop=1,
                              precision_mode="allow_mix_precision", op_compiler_cache_mode="x")
    assert config.save_checkpoints_steps == 3 and config.save_checkpoints_secs is None
    assert any("precision_mode" in r.getMessage() for r in caplog.records)
    with pytest.raises(ValueError, match="Argument `horovod_mode`"):
        NPURunConfig(horovod_mode=True)
    hooks = [tf.compat.v1.train.StopAtStepHook(num_steps=1)]
    assert npu_hooks_append(hooks) == hooks and npu_hooks_append(None) == []
    DumpConfig(enable_dump=False)
    assert issubclass(NPUEstimator, est.Estimator)


def test_the_estimator_example_runs(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "estimator_demo.py"),
                           "--model-dir", str(tmp_path)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    trained = next(line for line in lines if line.startswith("trained to step"))
    assert trained.startswith("trained to step 300") and float(trained.split("AUC ")[1]) > 0.8
    served = next(line for line in lines if line.startswith("SavedModel at"))
    assert float(served.split("max difference ")[1].rstrip(")")) < 1e-5
    assert "Evaluation at step 300" in done.stderr


def test_warm_start_from_another_model_dir(trained, tmp_path):
    source, model = trained
    seen = {}

    class Initial(tf.compat.v1.train.SessionRunHook):
        def begin(self):
            self._table = runtime.active().tables["t"]

        def after_create_session(self, session, coord):
            w = next(v for v in tf.compat.v1.global_variables() if v.op.name == "w")
            seen["w"] = session.run(w)
            seen["step"] = int(session.run(tf.compat.v1.train.get_global_step()))
            seen["size"] = self._table.size()

    e = est.Estimator(model.model_fn, model_dir=str(tmp_path / "warm"),
                      warm_start_from=source.model_dir)
    e.train(model.input_fn(make_data(n_batches=2)), hooks=[Initial()], steps=1)
    np.testing.assert_array_equal(seen["w"], source.get_variable_value("w"))
    assert seen["step"] == 0   # as tf.estimator: the global step is not carried over
    assert seen["size"] == read_sparse_states(source.latest_checkpoint())["t"].keys.shape[0]
    # Once model_dir holds a checkpoint, it wins over warm_start_from; max_steps counts
    # this model's steps.
    seen.clear()
    e.train(model.input_fn(make_data(n_batches=4)), hooks=[Initial()], max_steps=3)
    assert seen["step"] == 1 and e.get_variable_value("global_step") == 3


def test_evict_hook_runs_as_a_training_hook(tmp_path):
    """Keys unseen for 5 clock units leave the table at the step EvictHook runs; the batch
    clock is each batch's index, and the second half of the data uses other keys."""
    data = make_data(n_batches=12)
    data["ids"][6 * B:] += 1000
    data["ts"] = np.repeat(np.arange(12, dtype=np.int64), B)

    def run(evict):
        spec = {}

        def input_fn(mode):
            spec["ids"] = sf.FeatureSpec("ids", table_name="t", access_threshold=1,
                                         eviction_threshold=5)
            insert = sf.get_asc_insert_func(
                tgt_key_specs=[spec["ids"], sf.FeatureSpec("ts", is_timestamp=True)],
                is_training=True)
            ds = tf.compat.v1.data.Dataset.from_tensor_slices(
                ({"ids": data["ids"], "dense": data["dense"], "ts": data["ts"]},
                 data["labels"]))
            return ds.batch(B, drop_remainder=True).map(lambda f, l: (insert(f), l))

        model = Model()

        def model_fn(features, labels, mode):
            model.spec = spec["ids"]
            return model.model_fn(features, labels, mode)

        e = est.Estimator(model_fn, model_dir=str(tmp_path / str(evict)))
        hooks = [sf.EvictHook(evict_enable=True, evict_step_interval=12)] if evict else []
        e.train(input_fn, hooks=hooks, max_steps=12)
        return set(read_sparse_states(e.latest_checkpoint())["t"].keys.tolist())

    kept, evicted = run(False), run(True)
    last_seen = {}
    for clock in range(12):
        for key in data["ids"][clock * B:(clock + 1) * B].ravel().tolist():
            last_seen[key] = clock
    assert kept == set(last_seen)
    # At step 12 the clock is 11: keys unseen since clock 6 or before are gone (the whole
    # first half among them).
    assert evicted == {key for key, clock in last_seen.items() if 11 - clock < 5}
    assert not evicted & set(data["ids"][:6 * B].ravel().tolist())


def test_params_may_be_any_object_and_train_may_run_to_the_end_of_the_data(tmp_path):
    """Rec SDK passes its argparse.Namespace as params; train() without steps or max_steps
    runs until input_fn's data ends."""
    import argparse
    model = Model()
    seen = {}

    def model_fn(features, labels, mode, params):
        seen["lr"] = params.learning_rate
        return model.model_fn(features, labels, mode)

    e = est.Estimator(model_fn, model_dir=str(tmp_path),
                      params=argparse.Namespace(learning_rate=0.5))
    e.train(model.input_fn(make_data(n_batches=5)))
    assert seen["lr"] == 0.5 and e.params.learning_rate == 0.5
    assert e.get_variable_value("global_step") == 5


def test_predict_in_modify_graph_mode_can_return_an_input_itself(tmp_path):
    """A prediction that is a raw feature (Rec SDK's estimator demo predicts its label) is read
    from the iterator graph modification put in place, with the lookups of the same batch."""
    data = make_data(n_batches=4)

    def input_fn():
        return tf.compat.v1.data.Dataset.from_tensor_slices(
            {"ids": data["ids"], "label": data["labels"]}).batch(B, drop_remainder=True)

    def model_fn(features, mode):
        table = sf.create_table(tf.int64, DIM, "t", tf.compat.v1.ones_initializer(),
                                device_vocabulary_size=1000)
        emb = sf.sparse_lookup(table, features["ids"], modify_graph=True,
                               is_train=mode == est.ModeKeys.TRAIN)
        logits = tf.reduce_sum(emb, [1, 2])[:, None] * tf.compat.v1.get_variable(
            "scale", [1], initializer=tf.compat.v1.ones_initializer())
        if mode == est.ModeKeys.PREDICT:
            return est.EstimatorSpec(mode, predictions={"logits": logits,
                                                        "label": features["label"],
                                                        "ids": features["ids"]})
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
            labels=features["label"], logits=logits))
        dense, tables = sf.get_dense_and_sparse_variable()
        grads = tf.gradients(loss, dense + tables)
        return est.EstimatorSpec(mode, loss=loss, train_op=tf.group(
            tf.compat.v1.train.GradientDescentOptimizer(0.1).apply_gradients(
                zip(grads[:1], dense)),
            lazy_adam.create_hash_optimizer(0.01).apply_gradients(zip(grads[1:], tables)),
            tf.compat.v1.assign_add(tf.compat.v1.train.get_global_step(), 1)))

    e = est.Estimator(model_fn, model_dir=str(tmp_path))
    e.train(input_fn, hooks=[est.GraphModifierHook()], max_steps=2)
    batches = list(e.predict(input_fn, hooks=[est.GraphModifierHook()],
                             yield_single_examples=False))
    assert len(batches) == 4
    np.testing.assert_array_equal(np.concatenate([b["label"] for b in batches]), data["labels"])
    np.testing.assert_array_equal(np.concatenate([b["ids"] for b in batches]), data["ids"])


def test_keep_checkpoint_max_counts_the_checkpoints_of_earlier_calls(tmp_path):
    model = Model()
    e = estimator(tmp_path, model, keep_checkpoint_max=2)
    for _ in range(4):
        e.train(model.input_fn(make_data(n_batches=2)), steps=1)
    names = os.listdir(e.model_dir)
    assert sorted(n for n in names if n.endswith(".index")) == ["model.ckpt-3.index",
                                                               "model.ckpt-4.index"]
    assert sorted(n for n in names if n.startswith("sparse-")) == ["sparse-model.ckpt-3",
                                                                  "sparse-model.ckpt-4"]


def test_without_a_checkpoint_interval_training_still_saves_at_its_end(tmp_path):
    model = Model()
    e = estimator(tmp_path, model, save_checkpoints_steps=None, save_checkpoints_secs=None)
    e.train(model.input_fn(make_data(n_batches=3)))
    assert e.latest_checkpoint().endswith("model.ckpt-3")
    assert read_sparse_states(e.latest_checkpoint())["t"].keys.shape[0] > 0


def test_a_scaffold_saver_that_would_drop_the_tables_is_refused(tmp_path):
    model = Model()

    def model_fn(features, labels, mode):
        spec = model.model_fn(features, labels, mode)
        return spec._replace(scaffold=tf.compat.v1.train.Scaffold(
            saver=tf.compat.v1.train.Saver()))

    e = est.Estimator(model_fn, model_dir=str(tmp_path))
    with pytest.raises(ValueError, match="Argument `scaffold.saver` must be None when the "
                                         "model has sparse tables"):
        e.train(model.input_fn(make_data(n_batches=2)), steps=1)
    assert not os.path.exists(os.path.join(str(tmp_path), "checkpoint"))


def test_a_serving_graph_may_use_some_of_the_tables(tmp_path):
    """PREDICT builds one tower (table t); the checkpoint also holds table "u"."""
    data = make_data(n_batches=3)
    model = Model()

    def model_fn(features, labels, mode):
        if mode != est.ModeKeys.PREDICT:
            u = sf.create_table(tf.int64, 2, "u", tf.compat.v1.ones_initializer(),
                                device_vocabulary_size=1000)
            spec = model.model_fn(features, labels, mode)
            del u
            return spec
        return model.model_fn(features, labels, mode)

    e = est.Estimator(model_fn, model_dir=str(tmp_path), config=est.RunConfig(tf_random_seed=7))
    e.train(model.input_fn(data), max_steps=3)
    assert set(read_sparse_states(e.latest_checkpoint())) == {"t", "u"}
    served = np.concatenate([b["prob"] for b in e.predict(model.input_fn(data),
                                                          yield_single_examples=False)])
    assert served.shape == (3 * B, 1) and np.all(np.isfinite(served))
    # Training still refuses a checkpoint with a table its graph lacks.
    with pytest.raises(ValueError, match="table `u` is in it but not in this model"):
        est.Estimator(model.model_fn, model_dir=str(tmp_path)).train(model.input_fn(data),
                                                                     steps=1)


def test_ragged_and_sparse_features_pass_and_bad_ones_are_named(tmp_path):
    data = make_data(n_batches=2)
    model = Model()

    def with_ragged(mode):
        dataset = model.input_fn(data)(mode)
        return dataset.map(lambda f, l: (dict(f, tags=tf.RaggedTensor.from_row_lengths(
            tf.range(B, dtype=tf.int64), tf.ones([B], tf.int64))), l))

    e = estimator(tmp_path, model)
    e.train(with_ragged, steps=2)
    assert e.get_variable_value("global_step") == 2
    with pytest.raises(TypeError, match=r"Received: \"features\['ids'\] of type ndarray\""):
        e.train(lambda: ({"ids": data["ids"]}, tf.zeros([1])), steps=1)


def test_eval_metric_ops_may_not_take_the_estimators_names(trained):
    e, model = trained

    def model_fn(features, labels, mode):
        spec = model.model_fn(features, labels, mode)
        return spec._replace(eval_metric_ops={"global_step": tf.compat.v1.metrics.mean(
            spec.loss)})

    other = est.Estimator(model_fn, model_dir=e.model_dir, config=e.config)
    with pytest.raises(ValueError, match=r"Argument `eval_metric_ops` must be a dict without "
                                         r"the keys 'loss' and 'global_step'.*\['global_step'\]"):
        other.evaluate(model.input_fn(make_data(n_batches=1)))


def test_predict_hooks_see_the_predict_runtime_and_the_caller_its_own(trained):
    e, model = trained
    seen = []

    class Watch(tf.compat.v1.train.SessionRunHook):
        def after_run(self, run_context, run_values):
            seen.append(runtime.active())

        def end(self, session):
            seen.append(runtime.active())

    between = []
    for _ in e.predict(model.input_fn(make_data(n_batches=2)), hooks=[Watch()],
                       yield_single_examples=False):
        between.append(runtime.active())
    assert len(seen) == 3 and all(rt is not None and rt.read_only for rt in seen)
    assert between == [None, None]
