"""A Rec SDK Session script whose tiered table's fast tier (device rows over host rows) is
too small for a batch, for tests/test_pipeline_teardown.py (its batches hold 1010-1019
distinct keys, the first 1011, the second 1014): a step's gather raises CacheFullError in its
numpy function while a parallel map and a prefetch buffer hold further batches; the script
ends the usual way (``finally: terminate_config_initializer()``) and must exit promptly with
the error.

    python -m tests.workers.full_fast_tier SLOTS
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import sparseflow as sf  # noqa: E402
from sparseflow.optimizers import lazy_adam  # noqa: E402


def main(slots: int) -> None:
    tf.compat.v1.disable_eager_execution()
    sf.init()
    try:
        spec = sf.FeatureSpec("f", table_name="t")
        table = sf.create_table(tf.int64, 4, "t", tf.compat.v1.zeros_initializer(),
                                device_vocabulary_size=slots, host_vocabulary_size=100_000,
                                rows_on="device")
        keys = np.random.default_rng(0).integers(0, 50_000, (64 * 256, 4))
        ds = tf.data.Dataset.from_tensor_slices({"f": keys}).batch(256, drop_remainder=True)
        ds = ds.map(sf.get_asc_insert_func(tgt_key_specs=[spec], is_training=True),
                    num_parallel_calls=4).prefetch(4)
        it = tf.compat.v1.data.make_initializable_iterator(ds)
        emb = sf.sparse_lookup(table, spec, batch=it.get_next())
        train = lazy_adam.create_hash_optimizer(0.01).apply_gradients(
            [(tf.gradients(tf.reduce_sum(emb * emb), table)[0], table)])
        sf.start_asc_pipeline()
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), it.initializer])
            for step in range(64):
                sess.run(train)
                print(f"step {step + 1}", flush=True)
    finally:
        sf.terminate_config_initializer()


if __name__ == "__main__":
    main(int(sys.argv[1]))
