"""With ``mx_rec`` imported, a TF optimizer's ``compute_gradients`` takes the sparse tables in
its ``var_list``, as Rec SDK's dlrm and mmoe examples pass them (Rec SDK's tables are
``tf.Variable``s): ``dense_optimizer.compute_gradients(loss, var_list=dense + sparse)``, the
dense pairs to the dense optimizer, the table's gradient to the sparse optimizer."""

import numpy as np
import tensorflow as tf

import mx_rec  # noqa: F401  (installs the facade's TF changes)
import sparseflow as sf
from sparseflow.optimizers import gradient_descent
from tests.pipeline_utils import make_batch_iterator


def _model():
    table = sf.create_table(tf.int64, 4, "t", tf.compat.v1.truncated_normal_initializer(seed=1),
                            device_vocabulary_size=100)
    spec = sf.FeatureSpec("ids", table_name="t")
    data = {"ids": np.arange(24).reshape(12, 2) % 7, "y": np.linspace(0, 1, 12, dtype=np.float32)}
    it = make_batch_iterator(data, 4, [spec], read_ahead=False)
    batch = it.get_next()
    emb = tf.reduce_sum(sf.sparse_lookup(table, spec, batch=batch), axis=1)
    w = tf.compat.v1.get_variable("w", initializer=tf.ones([4, 1]) * 0.5)
    b = tf.compat.v1.get_variable("b", initializer=tf.zeros([1]))
    loss = tf.reduce_mean((tf.reshape(tf.matmul(emb, w) + b, [-1]) - batch["y"]) ** 2)
    return table, it, loss, [w, b]


def test_tf_optimizer_compute_gradients_accepts_tables_in_var_list(sf_init):
    table, it, loss, dense = _model()
    dense_optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    grads = dense_optimizer.compute_gradients(loss, var_list=dense + [table])
    assert [v for _, v in grads] == dense + [table]
    assert isinstance(grads[-1][0], tf.IndexedSlices)
    # Independent reference: plain tf.gradients of the same loss.
    reference = tf.gradients(loss, dense + [table])
    train = tf.group(dense_optimizer.apply_gradients(grads[:-1]),
                     gradient_descent.create_hash_optimizer(0.1).apply_gradients(
                         [(grads[-1][0], table)]))
    sf.start_asc_pipeline()
    with tf.compat.v1.Session() as sess:
        sess.run([it.initializer, tf.compat.v1.global_variables_initializer()])
        got, want = sess.run([[g for g, _ in grads], reference])
        for g, r in zip(got[:-1], want[:-1]):
            np.testing.assert_allclose(g, r, rtol=1e-6)
        np.testing.assert_array_equal(got[-1].indices, want[-1].indices)
        np.testing.assert_allclose(got[-1].values, want[-1].values, rtol=1e-6)
        losses = [sess.run([train, loss])[1] for _ in range(2)]
    assert losses[1] < losses[0]


def test_tf_optimizer_compute_gradients_without_tables_is_tfs(sf_init):
    _, _, loss, dense = _model()
    optimizer = tf.compat.v1.train.AdamOptimizer(0.1)
    assert [v for _, v in optimizer.compute_gradients(loss, var_list=dense)] == dense
    assert [v for _, v in optimizer.compute_gradients(loss)] == tf.compat.v1.trainable_variables()
