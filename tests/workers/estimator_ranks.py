"""An Estimator program run as 1 rank or as N (``sparseflow launch``) by
tests/test_estimator_ranks.py, on the same global batches either way.

    python -m tests.workers.estimator_ranks MODEL_DIR MAX_STEPS [--evaluate] [--save-secs]
                                            [--export DIR]

Trains (or resumes, from MODEL_DIR's latest checkpoint, on the batches after it) to global
step MAX_STEPS, saving every 6 steps: one table (lazy Adam, admission threshold 2) read by
two feature specs, a linear head (Adam) whose gradients are all-reduced with "sum", the
loss the local batch's sum over the global batch size. ``--evaluate``: then evaluate 4 global
batches of other data (loss, AUC, accuracy), each rank its part, and write the results to
``MODEL_DIR/eval-rank{r}.json``. ``--save-secs``: checkpoints every second instead (rank 1's
steps slowed). ``--export DIR``: no training; export MODEL_DIR's latest checkpoint (saved by
any number of ranks) as a SavedModel under DIR, its path written to ``DIR/path.txt``.
"""

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import sparseflow as sf  # noqa: E402
from sparseflow import estimator as est  # noqa: E402
from sparseflow.distributed import collectives  # noqa: E402
from sparseflow.optimizers import lazy_adam  # noqa: E402

GLOBAL_BATCH, STEPS = 32, 12


def data(seed: int = 4, steps: int = STEPS):
    rng = np.random.default_rng(seed)
    n = GLOBAL_BATCH * steps
    ids = (rng.zipf(1.3, (n, 4)) % 500).astype(np.int64)
    more = rng.integers(0, 500, (n, 2)).astype(np.int64)
    labels = ((ids[:, 0] % 3 == 0) | (more[:, 1] % 4 == 0)).astype(np.float32)[:, None]
    return {"ids": ids, "more": more}, labels


class SlowSteps(tf.compat.v1.train.SessionRunHook):
    """Sleeps after every step."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def after_run(self, run_context, run_values):
        time.sleep(self.seconds)


def main(model_dir: str, max_steps: int, evaluate: bool, save_secs: bool = False,
         export_dir: str = "") -> None:
    tf.compat.v1.disable_eager_execution()
    rank, size = collectives.rank_and_size()
    specs = {}

    def input_fn(mode):
        training = mode == est.ModeKeys.TRAIN
        done = 0
        latest = tf.train.latest_checkpoint(model_dir)
        if latest is not None and training:
            done = int(tf.train.load_variable(latest, "global_step"))
        threshold = 2 if training else None
        specs["ids"] = sf.FeatureSpec("ids", table_name="t", access_threshold=threshold)
        specs["more"] = sf.FeatureSpec("more", table_name="t", access_threshold=threshold)
        insert = sf.get_asc_insert_func(tgt_key_specs=[specs["ids"], specs["more"]],
                                        is_training=training)
        features, labels = data() if training else data(seed=9, steps=4)
        ds = tf.compat.v1.data.Dataset.from_tensor_slices((features, labels)).shard(size, rank)
        ds = ds.batch(GLOBAL_BATCH // size, drop_remainder=True).skip(done)
        return ds.map(lambda f, l: (insert(f), l))

    def model_fn(features, labels, mode):
        if mode == est.ModeKeys.PREDICT:   # exported: no input_fn made the specs
            for name in ("ids", "more"):
                specs[name] = sf.FeatureSpec(name, table_name="t")
        table = sf.create_table(tf.int64, 8, "t",
                                tf.compat.v1.truncated_normal_initializer(stddev=0.2, seed=1),
                                device_vocabulary_size=2000)
        x = tf.concat([tf.reduce_sum(sf.sparse_lookup(table, specs[k], batch=features), 1)
                       for k in ("ids", "more")], 1)
        w = tf.compat.v1.get_variable(
            "w", initializer=np.random.default_rng(5).normal(0, 0.3, (16, 1)).astype(np.float32))
        logits = tf.matmul(x, w)
        if mode == est.ModeKeys.PREDICT:
            return est.EstimatorSpec(mode, predictions={"prob": tf.sigmoid(logits)})
        loss = tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(
            labels=labels, logits=logits)) / GLOBAL_BATCH
        if mode == est.ModeKeys.EVAL:
            prob = tf.sigmoid(logits)
            return est.EstimatorSpec(mode, loss=loss, eval_metric_ops={
                "auc": tf.compat.v1.metrics.auc(labels, prob),
                "accuracy": tf.compat.v1.metrics.accuracy(labels, tf.round(prob))})
        dense, sparse = sf.get_dense_and_sparse_variable()
        grads = tf.gradients(loss, dense + sparse)
        dense_grads = [collectives.all_reduce(g, "sum") for g in grads[:len(dense)]]
        step = tf.compat.v1.train.get_global_step()
        train = tf.group(
            tf.compat.v1.train.AdamOptimizer(0.02).apply_gradients(zip(dense_grads, dense),
                                                                   global_step=step),
            lazy_adam.create_hash_optimizer(0.05).apply_gradients(zip(grads[len(dense):],
                                                                      sparse)))
        return est.EstimatorSpec(mode, loss=loss, train_op=train)

    if export_dir:
        def serving_input_receiver_fn():
            inputs = {"ids": tf.compat.v1.placeholder(tf.int64, [None, 4], name="ids"),
                      "more": tf.compat.v1.placeholder(tf.int64, [None, 2], name="more")}
            return est.export.ServingInputReceiver(inputs, inputs)

        path = est.Estimator(model_fn, model_dir=model_dir).export_saved_model(
            export_dir, serving_input_receiver_fn)
        with open(os.path.join(export_dir, "path.txt"), "w") as f:
            f.write(path.decode())
        return
    schedule = ({"save_checkpoints_secs": 1} if save_secs
                else {"save_checkpoints_steps": 6})
    config = est.RunConfig(model_dir=model_dir, log_step_count_steps=None,
                           save_summary_steps=None, **schedule)
    estimator = est.Estimator(model_fn, config=config)
    # With --save-secs, rank 1's steps take 0.25 s longer: its clock says "save" at other
    # steps than rank 0's would.
    slow = [SlowSteps(0.25)] if save_secs and rank == 1 else []
    estimator.train(input_fn, max_steps=max_steps, hooks=slow)
    if evaluate:
        results = estimator.evaluate(input_fn)
        with open(os.path.join(model_dir, f"eval-rank{rank}.json"), "w") as f:
            json.dump({k: float(v) for k, v in results.items()}, f)


if __name__ == "__main__":
    flags = sys.argv[3:]
    main(sys.argv[1], int(sys.argv[2]), "--evaluate" in flags, "--save-secs" in flags,
         flags[flags.index("--export") + 1] if "--export" in flags else "")
