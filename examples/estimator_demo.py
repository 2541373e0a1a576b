"""A tf.estimator program on sparseflow: model_fn / input_fn, train_and_evaluate, predict and a
SavedModel that plain TensorFlow serves.

    .venv/bin/python examples/estimator_demo.py [--model-dir DIR] [--modify-graph]

Generated data: 8 ids per example from a skewed vocabulary of 5,000 keys and 4 dense values;
the label depends on hidden per-key weights, so the table has something to learn. One table
(dim 16, admission threshold 2, lazy Adam), a 2-layer MLP (Adam). ``--modify-graph`` looks up
the raw id tensors (Rec SDK's automatic graph modification, started by GraphModifierHook)
instead of FeatureSpecs.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile

import numpy as np
import tensorflow as tf

import sparseflow as sf
from sparseflow import estimator as est
from sparseflow.optimizers import lazy_adam

BATCH, IDS, DENSE, VOCAB, DIM = 256, 8, 4, 5_000, 16


def make_data(batches: int, seed: int) -> dict:
    """Skewed keys, dense values and labels that the keys' hidden weights decide."""
    rng = np.random.default_rng(seed)
    n = batches * BATCH
    ids = (rng.zipf(1.2, (n, IDS)) % VOCAB).astype(np.int64)
    dense = rng.normal(size=(n, DENSE)).astype(np.float32)
    weight = np.random.default_rng(0).normal(size=VOCAB)
    labels = (weight[ids].sum(1) / np.sqrt(IDS) + 0.5 * dense[:, 0] > 0).astype(np.float32)
    return {"ids": ids, "dense": dense, "label": labels[:, None]}


class Demo:
    """model_fn and input_fn; the FeatureSpec made by input_fn is read by model_fn (the same
    graph), as Rec SDK's little_demo_estimator does."""

    def __init__(self, modify_graph: bool):
        self.modify_graph = modify_graph
        self.spec = None

    def input_fn(self, data: dict, epochs: int = 1):
        def input_fn(mode):
            training = mode == est.ModeKeys.TRAIN
            ds = tf.compat.v1.data.Dataset.from_tensor_slices(data).repeat(epochs)
            ds = ds.batch(BATCH, drop_remainder=True)
            if not self.modify_graph:   # FeatureSpec mode: the keys are processed in tf.data
                self.spec = sf.FeatureSpec("ids", table_name="ids_table",
                                           access_threshold=2 if training else None)
                ds = ds.map(sf.get_asc_insert_func(tgt_key_specs=[self.spec],
                                                   is_training=training))
            return ds.map(lambda batch: (batch, batch["label"])).prefetch(2)
        return input_fn

    def model_fn(self, features, labels, mode):
        training = mode == est.ModeKeys.TRAIN
        table = sf.create_table(tf.int64, DIM, "ids_table",
                                tf.compat.v1.truncated_normal_initializer(stddev=0.05),
                                device_vocabulary_size=20_000)
        if self.modify_graph:
            emb = sf.sparse_lookup(table, features["ids"], modify_graph=True, is_train=training,
                                   access_and_evict_config={"access_threshold": 2})
        else:
            emb = sf.sparse_lookup(table, self.spec, batch=features, is_train=training)
        x = tf.concat([tf.reduce_sum(emb, axis=1), features["dense"]], axis=1)
        for i, width in enumerate((32, 1)):
            w = tf.compat.v1.get_variable(f"w{i}", [x.shape[-1], width],
                                          initializer=tf.compat.v1.glorot_uniform_initializer())
            b = tf.compat.v1.get_variable(f"b{i}", [width],
                                          initializer=tf.compat.v1.zeros_initializer())
            x = tf.matmul(x, w) + b
            if width > 1:
                x = tf.nn.relu(x)
        prob = tf.sigmoid(x)
        if mode == est.ModeKeys.PREDICT:
            return est.EstimatorSpec(mode, predictions={"prob": prob})
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=x))
        if mode == est.ModeKeys.EVAL:
            return est.EstimatorSpec(mode, loss=loss, eval_metric_ops={
                "auc": tf.compat.v1.metrics.auc(labels, prob)})
        dense, tables = sf.get_dense_and_sparse_variable()
        grads = tf.gradients(loss, dense + tables)
        train_op = tf.group(
            tf.compat.v1.train.AdamOptimizer(0.005).apply_gradients(
                zip(grads[:len(dense)], dense)),
            lazy_adam.create_hash_optimizer(learning_rate=0.01).apply_gradients(
                zip(grads[len(dense):], tables)),
            tf.compat.v1.assign_add(tf.compat.v1.train.get_global_step(), 1))
        return est.EstimatorSpec(mode, loss=loss, train_op=train_op)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", default=None)
    parser.add_argument("--modify-graph", action="store_true")
    args = parser.parse_args()
    tf.compat.v1.disable_eager_execution()
    tf.get_logger().setLevel("ERROR")   # TF's v1 deprecation notices
    logging.basicConfig(format="%(name)s: %(message)s")
    logging.getLogger("sparseflow.estimator").setLevel(logging.INFO)   # loss, steps/s, evals
    model_dir = args.model_dir or tempfile.mkdtemp(prefix="estimator-demo-")
    demo = Demo(args.modify_graph)
    estimator = est.Estimator(demo.model_fn, model_dir=model_dir, config=est.RunConfig(
        save_checkpoints_steps=100, log_step_count_steps=50, tf_random_seed=1))
    hooks = [est.GraphModifierHook(modify_graph=args.modify_graph)]
    train, evaluation = make_data(100, seed=1), make_data(20, seed=2)
    result, _ = est.train_and_evaluate(
        estimator, est.TrainSpec(demo.input_fn(train, epochs=3), max_steps=300, hooks=hooks),
        est.EvalSpec(demo.input_fn(evaluation), steps=None, hooks=hooks, throttle_secs=0))
    print(f"trained to step {result['global_step']}: eval loss {result['loss']:.4f}, "
          f"AUC {result['auc']:.4f}")
    predictions = list(estimator.predict(demo.input_fn(evaluation), hooks=hooks,
                                         yield_single_examples=False))
    prob = np.concatenate([p["prob"] for p in predictions])[:, 0]
    print(f"predicted {prob.shape[0]} examples, mean probability {prob.mean():.4f}")

    def serving_input_receiver_fn():
        inputs = {"ids": tf.compat.v1.placeholder(tf.int64, [None, IDS], name="ids"),
                  "dense": tf.compat.v1.placeholder(tf.float32, [None, DENSE], name="dense")}
        return est.export.ServingInputReceiver(inputs, inputs)

    export_dir = estimator.export_saved_model(os.path.join(model_dir, "export"),
                                              serving_input_receiver_fn).decode()
    # Plain TensorFlow serves it (a TF1-style load here: this program runs in graph mode).
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        meta = tf.compat.v1.saved_model.load(sess, [tf.saved_model.SERVING], export_dir)
        signature = meta.signature_def["serving_default"]
        out = sess.run(signature.outputs["prob"].name, {
            signature.inputs["ids"].name: evaluation["ids"][:BATCH],
            signature.inputs["dense"].name: evaluation["dense"][:BATCH]})
    print(f"SavedModel at {export_dir}: serves what predict gave "
          f"(max difference {np.abs(out[:, 0] - prob[:BATCH]).max():.2e})")


if __name__ == "__main__":
    main()
