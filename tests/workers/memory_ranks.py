"""Runs built, trained and dropped one after another in one process, as one of N ranks
(``sparseflow launch``), for tests/test_memory_release.py: how many key processors (a
table's index, last-seen times and marks) each run leaves alive.

    python -m tests.workers.memory_ranks OUT_DIR FACE RUNS

FACE: ``embedding`` (a sparseflow.tf2.Embedding, keys routed in the dataset's map) or
``keras`` (a sparseflow.keras.SparseEmbedding, keys routed in the step), trained for a few
steps in a custom loop under tf.distribute.MultiWorkerMirroredStrategy. Each rank writes
``OUT_DIR/rank{r}.json``: the live key processors before the first run and after each.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from sparseflow import tf2  # noqa: E402
from sparseflow.distributed.ranks import detect  # noqa: E402
from sparseflow.pipeline.exit_sessions import live_objects  # noqa: E402
from sparseflow.pipeline.key_processor import KeyProcessor  # noqa: E402

GLOBAL_BATCH, STEPS = 16, 3


def live_key_processors() -> int:
    return len(live_objects(KeyProcessor))


def one_run(strategy, ranks, face: str, seed: int) -> float:
    """Builds, trains and drops one model; returns its last loss (nothing of it lives on)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 200, (GLOBAL_BATCH * STEPS,)).astype(np.int64)
    labels = (rng.random(GLOBAL_BATCH * STEPS) < 0.3).astype(np.float32)
    init = tf.compat.v1.truncated_normal_initializer(stddev=0.2, seed=7)
    with strategy.scope():
        if face == "keras":
            from sparseflow.keras import SparseEmbedding
            layer = SparseEmbedding(500, 4, initializer=init, optimizer=tf2.Adam(0.05),
                                    combiner="sum", name="t")
        else:
            table = tf2.TableConfig(500, 4, initializer=init, combiner="sum", name="t")
            embedding = tf2.Embedding({"f": tf2.FeatureConfig(table, name="f")},
                                      tf2.Adam(0.05))
    w = tf.Variable(np.full((4, 1), 0.1, np.float32))
    ds = tf.data.Dataset.from_tensor_slices((ids, labels)).shard(ranks.size, ranks.rank)
    ds = ds.batch(GLOBAL_BATCH // ranks.size, drop_remainder=True)
    if face != "keras":
        ds = ds.map(lambda k, y: (embedding.preprocess({"f": k}, training=True), y))

    def replica_step(batch, label):
        with tf.GradientTape() as tape:
            if face == "keras":
                x = layer(batch, training=True)
            else:
                embedding.enqueue(batch, training=True)
                acts = embedding.dequeue()
                tape.watch(acts)
                x = acts["f"]
            loss = tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(
                labels=label, logits=tf.squeeze(tf.matmul(x, w), 1))) / GLOBAL_BATCH
        if face == "keras":   # the anchor's gradient applies the layer's table
            grad_w, _ = tape.gradient(loss, [w, layer.anchor])
        else:
            grads, grad_w = tape.gradient(loss, [acts, w])
            embedding.apply_gradients(grads)
        grad_w, total = tf.distribute.get_replica_context().all_reduce("sum", [grad_w, loss])
        w.assign_sub(0.1 * grad_w)
        return total

    @tf.function
    def step(batch, label):
        return strategy.run(replica_step, args=(batch, label))

    losses = [float(step(batch, label)) for batch, label in ds]
    assert len(losses) == STEPS and np.isfinite(losses).all(), losses
    return losses[-1]


def main(out_dir: str, face: str, runs: int) -> None:
    ranks = detect()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    counts = [live_key_processors()]
    for run in range(runs):
        one_run(strategy, ranks, face, seed=run)
        counts.append(live_key_processors())
    with open(os.path.join(out_dir, f"rank{ranks.rank}.json"), "w") as f:
        json.dump({"rank": ranks.rank, "size": ranks.size, "live": counts}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
