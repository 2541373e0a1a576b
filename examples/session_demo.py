"""Rec SDK "little demo" on sparseflow: FeatureSpec + tf.compat.v1 Session, train and eval.

A user table (dim 32, 8 ids per sample) and an item table (dim 8, 16 ids per sample), batch
4096, two labels, lazy Adam on the tables and Adam on the dense tower; training and evaluation
alternate. The data is generated (``sparseflow.synthetic``): labels depend on hidden per-key
effects, so the AUC shows whether the embeddings learn.

    python examples/session_demo.py [--steps 120] [--eval-every 40] [--access-threshold 2]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import sparseflow as sf  # noqa: E402
from sparseflow.optimizers import lazy_adam  # noqa: E402
from sparseflow.metrics import auc  # noqa: E402
from sparseflow.synthetic import ctr_dataset  # noqa: E402

BATCH = 4096
FEATURES = {  # name -> (ids per sample, cardinality, zipf exponent)
    "user_ids": (8, 200_000, 1.05),
    "item_ids": (16, 50_000, 1.1),  # capacity below: 2x cardinality
}
TABLES = {"user_ids": ("user_table", 32), "item_ids": ("item_table", 8)}


def make_dataset(data: dict, batches: int, specs, is_training: bool):
    """A dict dataset of ``batches`` batches, mapped through the insert function."""
    n = batches * BATCH
    dataset = tf.data.Dataset.from_tensor_slices({k: v[:n] for k, v in data.items()})
    dataset = dataset.batch(BATCH, drop_remainder=True)
    # Sequential map: admission is on, and a parallel map would let the batch on which a key
    # is admitted vary from run to run (README, "Parallel map").
    dataset = dataset.map(sf.get_asc_insert_func(tgt_key_specs=specs, is_training=is_training))
    return dataset.prefetch(2)


def model_forward(batch, tables, specs, is_train):
    """Embeddings pooled per feature, a small MLP, one logit per label."""
    pooled = []
    for spec in specs:
        emb = sf.sparse_lookup(tables[spec.table_name], spec, is_train=is_train, batch=batch,
                               name=f"{spec.table_name}_lookup")
        pooled.append(tf.reduce_sum(emb, axis=1))
    x = tf.concat(pooled, axis=1)
    with tf.compat.v1.variable_scope("tower", reuse=tf.compat.v1.AUTO_REUSE):
        for i, width in enumerate((64, 32)):
            w = tf.compat.v1.get_variable(f"w{i}", [x.shape[1], width],
                                          initializer=tf.compat.v1.glorot_uniform_initializer(seed=i))
            b = tf.compat.v1.get_variable(f"b{i}", [width], initializer=tf.zeros_initializer())
            x = tf.nn.relu(tf.matmul(x, w) + b)
        w = tf.compat.v1.get_variable("out_w", [x.shape[1], 2],
                                      initializer=tf.compat.v1.glorot_uniform_initializer(seed=9))
        b = tf.compat.v1.get_variable("out_b", [2], initializer=tf.zeros_initializer())
        logits = tf.matmul(x, w) + b
    labels = tf.stack([batch["label_0"], batch["label_1"]], axis=1)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    return loss, tf.sigmoid(logits), labels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--eval-every", type=int, default=40)
    parser.add_argument("--eval-batches", type=int, default=4)
    parser.add_argument("--access-threshold", type=int, default=2)
    args = parser.parse_args()

    rng = np.random.default_rng(2026)
    train_data = ctr_dataset(rng, args.steps * BATCH, FEATURES)
    eval_data = ctr_dataset(np.random.default_rng(7), args.eval_batches * BATCH, FEATURES)

    tf.compat.v1.disable_eager_execution()
    tf.compat.v1.set_random_seed(0)
    sf.init(max_steps=args.steps, train_steps=args.eval_every, eval_steps=args.eval_batches)

    def specs(channel):
        return [sf.FeatureSpec(name, table_name=TABLES[name][0],
                               access_threshold=args.access_threshold) for name in FEATURES]

    train_specs, eval_specs = specs("train"), specs("eval")
    tables = {table: sf.create_table(tf.int64, tf.TensorShape([dim]), table,
                                     tf.compat.v1.truncated_normal_initializer(stddev=0.05),
                                     device_vocabulary_size=2 * card)
              for name, (table, dim) in TABLES.items()
              for card in [FEATURES[name][1]]}

    train_iter = tf.compat.v1.data.make_initializable_iterator(
        make_dataset(train_data, args.steps, train_specs, True))
    eval_iter = tf.compat.v1.data.make_initializable_iterator(
        make_dataset(eval_data, args.eval_batches, eval_specs, False))
    train_batch, eval_batch = train_iter.get_next(), eval_iter.get_next()

    loss, _, _ = model_forward(train_batch, tables, train_specs, is_train=True)
    eval_loss, eval_pred, eval_labels = model_forward(eval_batch, tables, eval_specs, False)

    dense_vars, sparse_vars = sf.get_dense_and_sparse_variable()
    dense_opt = tf.compat.v1.train.AdamOptimizer(learning_rate=0.002)
    sparse_opt = lazy_adam.create_hash_optimizer(learning_rate=0.01)
    grads = tf.gradients(loss, dense_vars + sparse_vars)
    train_op = tf.group(
        dense_opt.apply_gradients(zip(grads[:len(dense_vars)], dense_vars)),
        sparse_opt.apply_gradients(zip(grads[len(dense_vars):], sparse_vars)))

    sf.start_asc_pipeline()

    def evaluate(sess):
        sess.run(eval_iter.initializer)
        preds, labels, losses = [], [], []
        while True:
            try:
                l, p, y = sess.run([eval_loss, eval_pred, eval_labels])
            except tf.errors.OutOfRangeError:
                break
            losses.append(l)
            preds.append(p)
            labels.append(y)
        p, y = np.concatenate(preds), np.concatenate(labels)
        return float(np.mean(losses)), auc(y[:, 0], p[:, 0]), auc(y[:, 1], p[:, 1])

    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(train_iter.initializer)
        sess.run(train_op)  # warm-up: numba compile caches, first allocations
        train_time, steps, window = 0.0, 1, []
        while True:
            start = time.perf_counter()
            try:
                _, value = sess.run([train_op, loss])
            except tf.errors.OutOfRangeError:
                break
            train_time += time.perf_counter() - start
            steps += 1
            window.append(value)
            if steps % args.eval_every == 0:
                ev = evaluate(sess)
                print(f"step {steps:4d}  train loss {np.mean(window):.4f}  eval loss {ev[0]:.4f}"
                      f"  AUC label_0 {ev[1]:.4f}  label_1 {ev[2]:.4f}", flush=True)
                window = []
        final = evaluate(sess)

    timed = steps - 1
    print("\n== sparseflow session demo ==")
    print(f"trained {steps} steps of batch {BATCH} ({steps * BATCH:,} samples)")
    for table in tables.values():
        print(f"  {table.table_name:<11} dim {table.dim:>2}: {table.size():>7,} keys admitted "
              f"(access_threshold={args.access_threshold}) of capacity {table.capacity():,}")
    print(f"final eval: loss {final[0]:.4f}, AUC label_0 {final[1]:.4f}, label_1 {final[2]:.4f}")
    if timed:
        print(f"throughput: {timed * BATCH / train_time:,.0f} samples/s "
              f"({timed / train_time:.1f} steps/s) over {timed} timed steps")
    sf.terminate_config_initializer()


if __name__ == "__main__":
    main()
