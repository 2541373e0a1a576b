"""A Session-API program in Rec SDK's shape, run as 1 rank or as N (``sparseflow launch``)
by tests/test_session_ranks.py: the same global batches either way.

    python -m tests.workers.session_ranks OUT_DIR STEPS [--save-at K --save-to PREFIX]
                                                        [--restore PREFIX --start K]
                                                        [--modify-graph] [--die-at K]
                                                        [--shared-prefix]
                                                        [--rows host|disk|expanding|device|device-tier]
                                                        [--frozen a|all]

``--save-at K``: save after global step K to ``PREFIX-{rank}-K`` (per-rank prefixes, as Rec
SDK's programs name them). ``--restore PREFIX --start K``: restore that checkpoint (saved by
any number of ranks) and train global steps K+1..STEPS. ``--modify-graph``: the same model
through automatic graph modification (lookups of raw ids, thresholds per lookup).
``--die-at K``: the last rank exits (status 7) before global step K. ``--shared-prefix``:
every rank saves to ``PREFIX-K`` itself (refused over several ranks). ``--rows disk``:
table a keeps 120 of its 4000 rows in memory over a disk tier; ``--rows expanding``: both
tables grow (``init(use_dynamic_expansion=True)``); ``--rows device``: both tables keep
their rows in TF variables (``rows_on="device"``); ``--rows device-tier``: table a keeps 120
device slots over host homes for its 4000 rows. ``--frozen a``: table a is looked up with
``is_grad=False`` and no update trains it (only b and the dense layer train); ``--frozen
all``: both tables are, though created with a sparse optimizer (``optimizer_list``, Rec
SDK's style), and only the dense layer trains.

Two tables (one shared by two feature specs), admission, timestamps, lazy Adam on the
tables and Adam on a dense layer whose gradients are all-reduced with "sum"; the loss is
the local batch's sum divided by the global batch size. Each rank writes
``OUT_DIR/rank{r}.npz``: the step losses (over the global batch) and its shard of each
table (sorted by key).
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import sparseflow as sf  # noqa: E402
from sparseflow.distributed import collectives  # noqa: E402
from sparseflow.optimizers import lazy_adam, lazy_adam_by_addr  # noqa: E402
from tests.pipeline_utils import sorted_state, two_table_data  # noqa: E402

GLOBAL_BATCH = 32


def main(out_dir: str, steps: int, save_at: int, save_to: str, restore: str,
         start: int, modify_graph: bool, die_at: int = 0, shared_prefix: bool = False,
         rows: str = "host", frozen: str = "") -> None:
    tf.compat.v1.disable_eager_execution()
    sf.init(use_dynamic_expansion=rows == "expanding")
    rank, size = collectives.rank_and_size()
    data = two_table_data(seed=3, n_rows=GLOBAL_BATCH * steps, v1=300, v2=60, drift=7)
    data["ts"] = np.arange(GLOBAL_BATCH * steps, dtype=np.int64) // GLOBAL_BATCH
    specs = [sf.FeatureSpec("f1", table_name="a", access_threshold=2, faae_coefficient=1),
             sf.FeatureSpec("f2", table_name="a", access_threshold=2, faae_coefficient=2),
             sf.FeatureSpec("f3", table_name="b"),
             sf.FeatureSpec("ts", is_timestamp=True)]
    init = tf.compat.v1.truncated_normal_initializer(stddev=0.2, seed=7)
    # Table a's 4000 rows: 120 in memory over a disk tier (rows move in and out every step).
    a_rows = {"device_vocabulary_size": 4000}
    if rows == "disk":
        a_rows = {"device_vocabulary_size": 100, "host_vocabulary_size": 20,
                  "ssd_vocabulary_size": 3880, "ssd_data_path": [os.path.join(out_dir, "ssd")]}
    elif rows == "device-tier":   # 120 device slots over 4000 host homes
        a_rows = {"device_vocabulary_size": 120, "host_vocabulary_size": 3880}
    placed = {"rows_on": "device"} if rows in ("device", "device-tier") else {}
    if frozen == "all":   # bound to an optimizer that no update applies
        placed["optimizer_list"] = [lazy_adam.create_hash_optimizer(0.05)]
    tables = [sf.create_table(tf.int64, 8, "a", init, **a_rows, **placed),
              sf.create_table(tf.int64, 4, "b", init, device_vocabulary_size=200, **placed)]
    # Rank r reads examples r, r + N, ...: its part of every global batch (Rec SDK's
    # dataset.shard by rank before batching).
    ds = tf.data.Dataset.from_tensor_slices(data).shard(size, rank)
    ds = ds.batch(GLOBAL_BATCH // size, drop_remainder=True).skip(start)
    if modify_graph:
        iterator = tf.compat.v1.data.make_initializable_iterator(ds)
        batch = iterator.get_next()
        tf.compat.v1.add_to_collection("ASCEND_TIMESTAMP", batch["ts"])
        pooled = [tf.reduce_sum(sf.sparse_lookup(
            tables[0 if s.table_name == "a" else 1], batch[s.name], modify_graph=True,
            is_grad=not _frozen(frozen, s.table_name),
            access_and_evict_config=None if s.table_name == "b" else {
                "access_threshold": 2, "faae_coefficient": s.faae_coefficient}), 1)
            for s in specs[:3]]
    else:
        ds = ds.map(sf.get_asc_insert_func(tgt_key_specs=specs))
        batch = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
        pooled = [tf.reduce_sum(sf.sparse_lookup(
            tables[0 if s.table_name == "a" else 1], s, batch=batch,
            is_grad=not _frozen(frozen, s.table_name)), 1) for s in specs[:3]]
    x = tf.concat(pooled, axis=1)
    w0 = np.random.default_rng(5).normal(0, 0.3, (int(x.shape[1]), 1)).astype(np.float32)
    w = tf.compat.v1.get_variable("w", initializer=w0)
    logit = tf.squeeze(tf.matmul(x, w), 1)
    local = tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(labels=batch["label"],
                                                                  logits=logit))
    loss = local / GLOBAL_BATCH
    dense, sparse = sf.get_dense_and_sparse_variable()
    sparse = [table for table in sparse if not _frozen(frozen, table.table_name)]
    if rows == "expanding":   # expanding tables train through their local embeddings
        sparse = tf.compat.v1.get_collection("ASCEND_SPARSE_LOOKUP_LOCAL_EMB")
        addresses = tf.compat.v1.get_collection("ASCEND_SPARSE_LOOKUP_ID_OFFSET")
    grads = tf.gradients(loss, dense + sparse)
    dense_grads = [collectives.all_reduce(g, "sum") for g in grads[:len(dense)]]
    sparse_grads, sparse_steps = grads[len(dense):], []
    if rows == "expanding":
        sparse_steps.append(lazy_adam_by_addr.create_hash_optimizer_by_address(
            0.05).apply_gradients(zip(sparse_grads, addresses)))
    elif sparse:   # none with --frozen all: only the dense layer trains
        sparse_steps.append(lazy_adam.create_hash_optimizer(0.05).apply_gradients(
            zip(sparse_grads, sparse)))
    train = tf.group(
        tf.compat.v1.train.AdamOptimizer(0.02).apply_gradients(zip(dense_grads, dense)),
        *sparse_steps)
    global_loss = collectives.all_reduce(loss, "sum")
    saver = sf.Saver()
    if modify_graph:
        sf.modify_graph_and_start_emb_cache()
    else:
        sf.start_asc_pipeline()
    losses = []
    threads = []   # the process's threads after the second step and after the last
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        if modify_graph:
            sess.run(sf.get_initializer(True))
        if restore:
            saver.restore(sess, restore)
        for step in range(start + 1, steps + 1):
            if step == die_at and rank == size - 1:
                os._exit(7)
            losses.append(sess.run([global_loss, train])[0])
            if step == start + 2:
                threads.append(len(os.listdir("/proc/self/task")))
            if step == save_at:
                saver.save(sess, save_to if shared_prefix else f"{save_to}-{rank}",
                           global_step=step)
        threads.append(len(os.listdir("/proc/self/task")))
        out = {"losses": np.asarray(losses), "w": sess.run(w), "threads": np.asarray(threads)}
        for table in tables:   # device rows are read through the session
            for name, value in sorted_state(table, sess).items():
                out[f"{table.table_name}/{name}"] = value
            out[f"{table.table_name}/rows_on"] = np.array(table.rows_on)
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"), size=size, **out)
    sf.terminate_config_initializer()


def _frozen(frozen: str, table_name: str) -> bool:
    """Whether ``--frozen`` leaves table ``table_name`` untrained."""
    return frozen == "all" or (frozen == "a" and table_name == "a")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("steps", type=int)
    parser.add_argument("--save-at", type=int, default=0)
    parser.add_argument("--save-to", default="")
    parser.add_argument("--restore", default="")
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--modify-graph", action="store_true")
    parser.add_argument("--die-at", type=int, default=0)
    parser.add_argument("--shared-prefix", action="store_true")
    parser.add_argument("--rows", choices=["host", "disk", "expanding", "device",
                                           "device-tier"], default="host")
    parser.add_argument("--frozen", choices=["a", "all"], default="")
    a = parser.parse_args()
    main(a.out_dir, a.steps, a.save_at, a.save_to, a.restore, a.start, a.modify_graph,
         a.die_at, a.shared_prefix, a.rows, a.frozen)
