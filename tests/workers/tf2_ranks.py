"""A TF2 program (sparseflow.tf2.Embedding in a custom training loop under
tf.distribute.MultiWorkerMirroredStrategy), run as 1 process or as N ranks (``sparseflow
launch``) by tests/test_tf2_ranks.py, on the same global batches either way.

    python -m tests.workers.tf2_ranks OUT_DIR STEPS [--keras | --keras-group]
                                                    [--save-at K --save-to PREFIX]
                                                    [--restore PATH --start K]

Two tables (one read by two features), admission on one, timestamps; a linear head whose
gradient is all-reduced with "sum" by the replica context; the loss the local batch's sum
over the global batch size. ``--keras``: table "b" is a sparseflow.keras.SparseEmbedding
layer (its own sparse optimizer, applied in the backward pass) instead of an Embedding
feature; ``--keras-group``: every feature is read through one
sparseflow.keras.DistributedEmbedding layer (no Embedding; the layer sees no timestamps).
``--save-at K``: after global step K, every rank saves a tf.train.Checkpoint of the
Embedding and the head to ``PREFIX-rank{r}`` (with ``--keras``, the layer's saved variables to
``PREFIX-rank{r}-layer.weights.h5``, in the group where ``model.save_weights`` puts them);
``--restore PATH --start K``: restore one (the layer's first; ``{rank}`` in PATH: this rank's)
and train steps K+1..STEPS.
``--die-at K``: the last rank exits (status 7) before global step K. Each rank writes
``OUT_DIR/rank{r}.npz``: the step losses, its shard of each table, sorted by key, and its
thread count after the second step and after the last.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from sparseflow import tf2  # noqa: E402
from sparseflow.distributed.ranks import detect  # noqa: E402
from tests.pipeline_utils import sorted_state, two_table_data  # noqa: E402

GLOBAL_BATCH = 32
LAYER_GROUPS = {"layer": "layers/b/vars", "group": "layers/distributed_embedding/vars"}


def main(out_dir: str, steps: int, keras_layer: str, save_at: int = 0, save_to: str = "",
         restore: str = "", start: int = 0, die_at: int = 0) -> None:
    ranks = detect()
    strategy = (tf.distribute.MultiWorkerMirroredStrategy() if ranks.size > 1
                else tf.distribute.get_strategy())
    data = two_table_data(seed=3, n_rows=GLOBAL_BATCH * steps, v1=300, v2=60, drift=7)
    ts = np.arange(GLOBAL_BATCH * steps, dtype=np.int64) // GLOBAL_BATCH
    init = tf.compat.v1.truncated_normal_initializer(stddev=0.2, seed=7)
    a = tf2.TableConfig(4000, 8, initializer=init, combiner="sum", name="a",
                        access_threshold=2)
    b = tf2.TableConfig(200, 4, initializer=init, combiner="sum", name="b")
    features = {"f1": tf2.FeatureConfig(a, name="f1"), "f2": tf2.FeatureConfig(a, name="f2")}
    if keras_layer != "layer":
        features["f3"] = tf2.FeatureConfig(b, name="f3")
    with strategy.scope():
        embedding = layer = None
        if keras_layer == "group":
            from sparseflow.keras import DistributedEmbedding
            layer = DistributedEmbedding(features, tf2.Adam(0.05), name="ab")
        else:
            embedding = tf2.Embedding(features, tf2.Adam(0.05))
        if keras_layer == "layer":
            from sparseflow.keras import SparseEmbedding
            layer = SparseEmbedding(200, 4, initializer=init, optimizer=tf2.Adam(0.05),
                                    combiner="sum", name="b")
    # The head: a plain variable on every rank, kept equal by all-reduced gradients.
    w0 = np.random.default_rng(5).normal(0, 0.3, (20, 1)).astype(np.float32)
    w = tf.Variable(w0)

    ds = tf.data.Dataset.from_tensor_slices(dict(data, ts=ts)).shard(ranks.size, ranks.rank)
    ds = ds.batch(GLOBAL_BATCH // ranks.size, drop_remainder=True).skip(start)
    if embedding is None:   # the layer processes its ids in the step
        ds = ds.map(lambda x: ({k: x[k] for k in features}, x["f3"], x["label"]))
    else:
        ds = ds.map(lambda x: (embedding.preprocess({k: x[k] for k in features},
                                                    training=True, timestamp=x["ts"]),
                               x["f3"], x["label"]))

    def replica_step(batch, f3, label):
        if embedding is not None:
            embedding.enqueue(batch, training=True)
        with tf.GradientTape() as tape:
            if embedding is None:
                acts = layer(batch, training=True)
            else:
                acts = embedding.dequeue()
                tape.watch(acts)
            third = layer(f3, training=True) if keras_layer == "layer" else acts["f3"]
            x = tf.concat([acts["f1"], acts["f2"], third], 1)
            logit = tf.squeeze(tf.matmul(x, w), 1)
            loss = tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(
                labels=label, logits=logit)) / GLOBAL_BATCH
        if embedding is None:   # the anchor's gradient applies the layer's tables
            grad_w, _ = tape.gradient(loss, [w, layer.anchor])
        else:
            grads, grad_w = tape.gradient(loss, [acts, w])
            embedding.apply_gradients(grads)
        replica = tf.distribute.get_replica_context()
        grad_w, total = replica.all_reduce("sum", [grad_w, loss])
        w.assign_sub(0.1 * grad_w)
        return total

    @tf.function
    def step(batch, f3, label):
        return strategy.run(replica_step, args=(batch, f3, label))

    checkpoint = (tf.train.Checkpoint(w=w) if embedding is None
                  else tf.train.Checkpoint(embedding=embedding, w=w))
    restore = restore.replace("{rank}", str(ranks.rank))   # each rank its own file
    if restore:
        if layer is not None:
            layer.build((None, 3))
            with h5py.File(f"{restore}-layer.weights.h5", "r") as f:
                layer.load_own_variables(f[LAYER_GROUPS[keras_layer]])
        checkpoint.read(restore).assert_consumed()
    losses = []
    threads = []   # the process's threads after the second step and after the last
    for index, element in enumerate(ds, start=start + 1):
        if index == die_at and ranks.rank == ranks.size - 1:
            os._exit(7)
        losses.append(float(step(*element)))
        if len(losses) == 2:
            threads.append(len(os.listdir("/proc/self/task")))
        if index == save_at:
            checkpoint.write(f"{save_to}-rank{ranks.rank}")
            if layer is not None:   # where model.save_weights puts the layer's variables
                with h5py.File(f"{save_to}-rank{ranks.rank}-layer.weights.h5", "w") as f:
                    layer.save_own_variables(f.create_group(LAYER_GROUPS[keras_layer]))
    threads.append(len(os.listdir("/proc/self/task")))
    out = {"losses": np.asarray(losses), "w": w.numpy(), "threads": np.asarray(threads)}
    from sparseflow.distributed import collective_watchdog
    watchdog = collective_watchdog._WATCHDOG   # noqa: SLF001 -- the test reads its count
    # Collectives the watchdog still counts as waiting once every step has returned.
    out["pending"] = -1 if watchdog is None else watchdog.pending
    tables = ((list(embedding.tables.values()) if embedding is not None else [])
              + ([layer.table] if keras_layer == "layer" else [])
              + (list(layer.tables.values()) if keras_layer == "group" else []))
    for table in tables:
        for name, value in sorted_state(table).items():
            out[f"{table.table_name}/{name}"] = value
    np.savez(os.path.join(out_dir, f"rank{ranks.rank}.npz"), size=ranks.size, **out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("steps", type=int)
    parser.add_argument("--keras", dest="keras", action="store_const", const="layer",
                        default="")
    parser.add_argument("--keras-group", dest="keras", action="store_const", const="group")
    parser.add_argument("--save-at", type=int, default=0)
    parser.add_argument("--save-to", default="")
    parser.add_argument("--restore", default="")
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--die-at", type=int, default=0)
    a = parser.parse_args()
    main(a.out_dir, a.steps, a.keras, a.save_at, a.save_to, a.restore, a.start, a.die_at)
