"""A training job for checkpoint tests, run in its own process.

    python tests/checkpoint_job.py save    DIR OUT   # train 15 steps, save, train 20 more
    python tests/checkpoint_job.py restore DIR OUT   # fresh process: restore, train those 20
    python tests/checkpoint_job.py big     DIR OUT   # save step 1, then a large step 2 (to kill)

OUT (.npz) receives the losses of the 20 steps after the checkpoint and the table state at
the checkpoint.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import sparseflow as sf  # noqa: E402
from sparseflow.optimizers import lazy_adam  # noqa: E402
from tests.pipeline_utils import sorted_state  # noqa: E402

B, SAVE_AT, AFTER = 16, 15, 20


def data():
    rng = np.random.default_rng(0)
    n = B * (SAVE_AT + AFTER)
    keys = rng.integers(0, 400, (n, 3)).astype(np.int64)
    return {"f": keys, "ts": np.repeat(np.arange(SAVE_AT + AFTER, dtype=np.int64), B),
            "label": ((keys[:, 0] % 3) == 0).astype(np.float32)}


def build(skip, capacity=1000):
    tf.compat.v1.disable_eager_execution()
    sf.init()
    specs = [sf.FeatureSpec("f", table_name="t", access_threshold=2, eviction_threshold=1000),
             sf.FeatureSpec("ts", is_timestamp=True)]
    table = sf.create_table(tf.int64, 8, "t",
                            tf.compat.v1.truncated_normal_initializer(stddev=0.1, seed=1),
                            device_vocabulary_size=capacity)
    ds = tf.data.Dataset.from_tensor_slices(data()).batch(B).skip(skip)
    ds = ds.map(sf.get_asc_insert_func(tgt_key_specs=specs))
    # Exact resumption needs the key state of exactly the batches trained on: no read-ahead
    # (a prefetching pipeline counts batches the model has not trained on yet).
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    ds = ds.with_options(options)
    batch = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
    emb = tf.reduce_sum(sf.sparse_lookup(table, specs[0], batch=batch), 1)
    w = tf.compat.v1.get_variable("w", initializer=tf.ones([8, 1]) * 0.1)
    logit = tf.squeeze(tf.matmul(emb, w), 1)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=batch["label"],
                                                                  logits=logit))
    dense, sparse = sf.get_dense_and_sparse_variable()
    grads = tf.gradients(loss, dense + sparse)
    train = tf.group(
        tf.compat.v1.train.AdamOptimizer(0.01).apply_gradients(zip(grads[:1], dense)),
        lazy_adam.create_hash_optimizer(0.05).apply_gradients(zip(grads[1:], sparse)))
    saver = sf.Saver(max_to_keep=2)
    sf.start_asc_pipeline()
    return table, loss, train, saver


def state_arrays(table):
    """The state the tests compare, under the names they use (m, v: Adam's slots)."""
    state = sorted_state(table)
    state["m"], state["v"] = state.pop("momentum"), state.pop("velocity")
    return state


def main(mode, directory, out):
    prefix = os.path.join(directory, "model")
    if mode == "save":
        table, loss, train, saver = build(skip=0)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(SAVE_AT):
                sess.run(train)
            saver.save(sess, prefix, global_step=SAVE_AT)
            at_save = state_arrays(table)
            losses = [sess.run([train, loss])[1] for _ in range(AFTER)]
    elif mode == "restore":
        table, loss, train, saver = build(skip=SAVE_AT)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            saver.restore(sess, sf.latest_checkpoint(directory))
            at_save = state_arrays(table)
            losses = [sess.run([train, loss])[1] for _ in range(AFTER)]
    else:  # big: a small checkpoint, then a large one to be killed while it is written
        table, loss, train, saver = build(skip=0, capacity=3_000_000)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train)
            saver.save(sess, prefix, global_step=1)
            at_save = state_arrays(table)
            np.savez(out, losses=np.zeros(0), **at_save)
            keys = np.arange(10, 2_500_010, dtype=np.int64)
            for _ in range(2):  # count twice: threshold 2
                result = table.processor.process(keys, np.array([keys.shape[0]]),
                                                 np.array([1], np.int32), True, 5)
                # Read, as a lookup would: a save leaves out batches still in flight.
                table.release_batch(result.seq, drain=True)
            print("saving-big", flush=True)
            saver.save(sess, prefix, global_step=2)
        return
    np.savez(out, losses=np.array(losses), **at_save)
    sf.terminate_config_initializer()


if __name__ == "__main__":
    main(*sys.argv[1:4])
