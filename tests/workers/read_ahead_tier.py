"""A Session script whose tiered table (host rows over a disk tier) has a fast tier that holds
two batches' keys while its pipeline reads far more ahead (a parallel map and prefetch(100), as
little_demo does), for tests/test_rec_sdk_behaviours.py: it trains a few steps, closes the
session while the pipeline is still reading ahead, and ends without
terminate_config_initializer() (the session object lives until interpreter exit, as
little_demo's does). It must exit promptly with status 0.

    python -m tests.workers.read_ahead_tier SSD_DIR
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import sparseflow as sf  # noqa: E402
from sparseflow.optimizers import lazy_adam  # noqa: E402

STEPS = 6
SESSIONS = []   # keeps the closed session alive until interpreter exit


def main(ssd_dir: str) -> None:
    tf.compat.v1.disable_eager_execution()
    sf.init()
    spec = sf.FeatureSpec("f", table_name="t")
    table = sf.create_table(tf.int64, 4, "t", tf.compat.v1.zeros_initializer(),
                            device_vocabulary_size=300, host_vocabulary_size=300,
                            ssd_vocabulary_size=49_400, ssd_data_path=ssd_dir)
    keys = np.random.default_rng(0).integers(0, 50_000, (64 * 256, 1))
    ds = tf.data.Dataset.from_tensor_slices({"f": keys}).batch(256, drop_remainder=True)
    ds = ds.map(sf.get_asc_insert_func(tgt_key_specs=[spec], is_training=True),
                num_parallel_calls=4).prefetch(100)
    it = tf.compat.v1.data.make_initializable_iterator(ds)
    emb = sf.sparse_lookup(table, spec, batch=it.get_next())
    train = lazy_adam.create_hash_optimizer(0.01).apply_gradients(
        [(tf.gradients(tf.reduce_sum(emb * emb), table)[0], table)])
    sf.start_asc_pipeline()
    with tf.compat.v1.Session() as sess:
        SESSIONS.append(sess)
        sess.run(it.initializer)
        for _ in range(STEPS):
            sess.run(train)
    print(f"trained {STEPS} steps, session closed", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
