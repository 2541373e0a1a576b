"""A Session script in little_demo's style, for tests/test_rec_sdk_behaviours.py: it never
closes its session (little_demo keeps it in its RunMode), and its first step fails with
CacheFullError (a fast tier smaller than one batch) while prefetch(100) reads large batches
ahead. The uncaught error leaves the session alive until exit, with the pipeline's thread busy
in its insert function; the process must end promptly with status 1.

    python -m tests.workers.failed_step_session SSD_DIR
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import sparseflow as sf  # noqa: E402
from sparseflow.optimizers import lazy_adam  # noqa: E402


def main(ssd_dir: str) -> None:
    tf.compat.v1.disable_eager_execution()
    sf.init()
    spec = sf.FeatureSpec("f", table_name="t")
    table = sf.create_table(tf.int64, 4, "t", tf.compat.v1.zeros_initializer(),
                            device_vocabulary_size=1000, host_vocabulary_size=1000,
                            ssd_vocabulary_size=1_000_000, ssd_data_path=ssd_dir)
    keys = np.random.default_rng(0).integers(0, 1_000_000, (200 * 64, 1024))
    ds = tf.compat.v1.data.Dataset.from_tensor_slices({"f": keys}).batch(64)
    ds = ds.map(sf.get_asc_insert_func(tgt_key_specs=[spec], is_training=True)).prefetch(100)
    it = ds.make_initializable_iterator()
    emb = sf.sparse_lookup(table, spec, batch=it.get_next())
    train = lazy_adam.create_hash_optimizer(0.01).apply_gradients(
        [(tf.gradients(tf.reduce_sum(emb * emb), table)[0], table)])
    sf.start_asc_pipeline()
    sess = tf.compat.v1.Session()
    sess.run(it.initializer)
    sess.run(train)   # 65k keys for 2000 fast rows: CacheFullError


if __name__ == "__main__":
    main(sys.argv[1])
