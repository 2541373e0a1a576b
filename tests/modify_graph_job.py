"""The two-table job of the graph-modification tests, in FeatureSpec mode or by automatic
graph modification, with host or device rows (test_graph_modifier.py, test_device_tables.py)."""

import numpy as np
import tensorflow as tf

import sparseflow as sf
from sparseflow.optimizers import lazy_adam

RNG = np.random.default_rng(0)
DATA = {"u": RNG.integers(0, 300, (320, 4)).astype(np.int64),
        "i": RNG.integers(0, 80, (320, 2)).astype(np.int64)}
DATA["label"] = ((DATA["u"][:, 0] % 3) == 0).astype(np.float32)


def _model(eu, ei, label):
    x = tf.concat([tf.reduce_sum(eu, 1), tf.reduce_sum(ei, 1)], 1)
    w = tf.compat.v1.get_variable("w", initializer=tf.ones([12, 1]) * 0.1)
    logits = tf.squeeze(tf.matmul(x, w), 1)
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logits))


def tables(rows_on="host"):
    """The user table (dim 8, 500 rows) and the item table (dim 4, 200 rows), with rows on
    "host", "device", or "device_over_host" (40% of the rows in device slots over host
    homes)."""
    def placement(rows):
        if rows_on == "device_over_host":
            return dict(device_vocabulary_size=rows * 2 // 5,
                        host_vocabulary_size=rows - rows * 2 // 5, rows_on="device")
        return dict(device_vocabulary_size=rows, rows_on=rows_on)

    tu = sf.create_table(tf.int64, 8, "u",
                         tf.compat.v1.truncated_normal_initializer(stddev=0.1, seed=1),
                         **placement(500))
    ti = sf.create_table(tf.int64, 4, "i",
                         tf.compat.v1.truncated_normal_initializer(stddev=0.1, seed=2),
                         **placement(200))
    return tu, ti


def modify_graph_training(mode, steps=20, rows_on="host"):
    """Trains the two tables in FeatureSpec mode (``mode="spec"``) or by automatic graph
    modification (``"modify"``); returns (losses, the user table's export)."""
    with tf.Graph().as_default():
        sf.init()
        tu, ti = tables(rows_on)
        ds = tf.data.Dataset.from_tensor_slices(DATA).batch(16)
        if mode == "spec":
            specs = [sf.FeatureSpec("u", table_name="u", access_threshold=2),
                     sf.FeatureSpec("i", table_name="i", access_threshold=2)]
            it = tf.compat.v1.data.make_initializable_iterator(
                ds.map(sf.get_asc_insert_func(tgt_key_specs=specs)))
            b = it.get_next()
            eu = sf.sparse_lookup(tu, specs[0], batch=b)
            ei = sf.sparse_lookup(ti, specs[1], batch=b)
        else:
            it = tf.compat.v1.data.make_initializable_iterator(ds)
            b = it.get_next()
            config = {"access_threshold": 2}
            eu = sf.sparse_lookup(tu, b["u"], 64, modify_graph=True,
                                  access_and_evict_config=config)
            ei = sf.sparse_lookup(ti, b["i"], 32, modify_graph=True,
                                  access_and_evict_config=config)
        loss = _model(eu, ei, b["label"])
        dense, sparse = sf.get_dense_and_sparse_variable()
        grads = tf.gradients(loss, dense + sparse)
        train = tf.group(
            tf.compat.v1.train.GradientDescentOptimizer(0.1).apply_gradients(
                zip(grads[:1], dense)),
            lazy_adam.create_hash_optimizer(0.05).apply_gradients(zip(grads[1:], sparse)))
        if mode == "spec":
            sf.start_asc_pipeline()
            init = it.initializer
        else:
            sf.modify_graph_and_start_emb_cache()
            init = sf.get_initializer(True)
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), init])
            losses = [sess.run([train, loss])[1] for _ in range(steps)]
            exported = tu.export(sess=sess)
        sf.terminate_config_initializer()
    return np.array(losses), exported
