"""Checkpoint save and restore: time and bytes for 10^7 keys x dim 16 with Adam slots.

Floor: ``np.save`` / ``np.load`` of the same arrays (keys, counts, last-seen, weights, both
slots) — the least any format must write and read. Also: an incremental save after 1 % of the
rows changed, against a full save.

    python benchmarks/bench_checkpoint.py [--keys 10000000] [--write]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from report import machine_line, replace_section  # noqa: E402

import sparseflow as sf  # noqa: E402
from sparseflow.checkpoint.saver import sparse_path  # noqa: E402
from sparseflow.checkpoint.table_state import capture  # noqa: E402
from sparseflow.optimizers import lazy_adam  # noqa: E402

DIM = 16
CHUNK = 1_000_000


def dir_bytes(path: str) -> int:
    """Bytes of every file under ``path``."""
    return sum(os.path.getsize(os.path.join(root, f))
               for root, _, files in os.walk(path) for f in files)


def build(n_keys: int):
    """A table of ``n_keys`` admitted keys with non-zero Adam slots, and a session."""
    sf.init()
    table = sf.create_table(tf.int64, DIM, "t",
                            tf.compat.v1.truncated_normal_initializer(stddev=0.05),
                            device_vocabulary_size=n_keys)
    spec = sf.FeatureSpec("f", table_name="t")
    ds = tf.data.Dataset.from_tensors({"f": tf.zeros([1], tf.int64)})
    batch = tf.compat.v1.data.make_one_shot_iterator(
        ds.map(sf.get_asc_insert_func(tgt_key_specs=[spec]))).get_next()
    emb = sf.sparse_lookup(table, spec, batch=batch)
    lazy_adam.create_hash_optimizer().apply_gradients(
        [(tf.gradients(tf.reduce_sum(emb), table)[0], table)])  # binds the Adam slots
    tf.compat.v1.get_variable("dense", initializer=tf.ones([4]))
    sf.start_asc_pipeline()
    keys = np.arange(n_keys, dtype=np.int64) * 7919 + 13
    for start in range(0, n_keys, CHUNK):  # admit every key (threshold off): rows + init
        part = keys[start:start + CHUNK]
        result = table.processor.process(part, np.array([part.shape[0]]),
                                         np.array([1], np.int32), True, 100)
        table.release_batch(result.seq, drain=True)  # read: a save leaves out batches in flight
    storage = table.rows.storage
    storage[:n_keys, DIM:] = np.random.default_rng(0).random((n_keys, 2 * DIM),
                                                             dtype=np.float32)
    return table, keys


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=10_000_000)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="sf-ckpt-bench-")
    try:
        with tf.Graph().as_default():
            table, keys = build(args.keys)
            saver = sf.Saver(max_to_keep=0)
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                prefix = os.path.join(work, "model")
                save_s = timed(lambda: saver.save(sess, prefix, global_step=1))
                save_bytes = dir_bytes(sparse_path(f"{prefix}-1"))
                restore_s = timed(lambda: saver.restore(sess, f"{prefix}-1"))
                # 1 % of the rows change (a training batch touches them), then save a delta.
                touched = np.random.default_rng(1).choice(keys, args.keys // 100, replace=False)
                result = table.processor.process(touched, np.array([touched.shape[0]]),
                                                 np.array([1], np.int32), True, 200)
                table.release_batch(result.seq, drain=True)
                incr_s = timed(lambda: saver.save(sess, prefix, global_step=2, incremental=True))
                incr_bytes = dir_bytes(sparse_path(f"{prefix}-2"))
                full2_s = timed(lambda: saver.save(sess, prefix, global_step=3))
            state = capture(table)
            arrays = {"keys": state.keys, "counts": state.counts, "last_seen": state.last_seen,
                      "weights": state.weights, **state.slots}
            floor_dir = os.path.join(work, "floor")
            os.makedirs(floor_dir)
            floor_save_s = timed(lambda: [np.save(os.path.join(floor_dir, k), v)
                                          for k, v in arrays.items()])
            floor_bytes = dir_bytes(floor_dir)
            floor_load_s = timed(lambda: [np.load(os.path.join(floor_dir, f"{k}.npy"))
                                          for k in arrays])
            sf.terminate_config_initializer()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    full_s = min(save_s, full2_s)
    lines = [
        "## Checkpoint save and restore", "",
        f"Command: `.venv/bin/python benchmarks/bench_checkpoint.py --write` ({args.keys:,} "
        f"keys x dim {DIM} with lazy Adam slots; sparse part only; the floor is np.save / "
        f"np.load of the same arrays, measured in the same run).", "",
        f"Machine: {machine_line(TF=tf.__version__)}.", "",
        "| | sparseflow | np.save floor | ratio (target <= 2x) |", "|---|---:|---:|---:|",
        f"| save | {full_s:.2f} s | {floor_save_s:.2f} s | {full_s / floor_save_s:.2f}x |",
        f"| restore (verify CRC32, parse, rebuild the index) | {restore_s:.2f} s | "
        f"{floor_load_s:.2f} s | {restore_s / floor_load_s:.2f}x |",
        f"| bytes on disk | {save_bytes / 2**20:,.0f} MiB | {floor_bytes / 2**20:,.0f} MiB | "
        f"{save_bytes / floor_bytes:.2f}x |", "",
        f"Incremental save after 1 % of the rows changed: {incr_s:.2f} s and "
        f"{incr_bytes / 2**20:,.1f} MiB, **{full_s / incr_s:.1f}x faster** than a full save "
        f"(target >= 20x).",
    ]
    print("\n".join(lines))
    if args.write:
        replace_section("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
