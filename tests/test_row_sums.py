"""``row_sums.sum_rows_by_index`` against numpy, and its gradient against
``tf.math.unsorted_segment_sum``'s (an independent TensorFlow op)."""

import numpy as np
import pytest
import tensorflow as tf

from sparseflow import row_sums
from sparseflow.row_sums import sum_rows_by_index


@pytest.mark.parametrize("k,n,d", [(200, 17, 16), (5, 40, 3), (0, 6, 4), (9, 1, 1)])
@pytest.mark.parametrize("id_dtype", [np.int32, np.int64])
def test_rows_are_summed_into_their_index(k, n, d, id_dtype):
    rng = np.random.default_rng(k + n)
    values = rng.normal(size=(k, d)).astype(np.float32)
    ids = rng.integers(0, n, k).astype(id_dtype)
    want = np.zeros((n, d), np.float32)
    np.add.at(want, ids, values)
    got = sum_rows_by_index(tf.constant(values), tf.constant(ids), n).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_its_gradient_is_unsorted_segment_sums():
    rng = np.random.default_rng(1)
    values = tf.constant(rng.normal(size=(50, 4)).astype(np.float32))
    ids = tf.constant(rng.integers(0, 12, 50).astype(np.int32))
    weight = tf.constant(rng.normal(size=(12, 4)).astype(np.float32))
    grads = []
    for fn in (sum_rows_by_index, tf.math.unsorted_segment_sum):
        with tf.GradientTape() as tape:
            tape.watch(values)
            loss = tf.reduce_sum(fn(values, ids, 12) * weight)
        grads.append(tape.gradient(loss, values).numpy())
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-6)


def test_in_a_graph_with_a_dynamic_row_count():
    with tf.Graph().as_default():
        values = tf.compat.v1.placeholder(tf.float32, [None, 2])
        ids = tf.compat.v1.placeholder(tf.int32, [None])
        n = tf.compat.v1.placeholder(tf.int32, [])
        out = sum_rows_by_index(values, ids, n)
        with tf.compat.v1.Session() as sess:
            got = sess.run(out, {values: [[1, 2], [3, 4], [5, 6]], ids: [2, 0, 2], n: 4})
    np.testing.assert_array_equal(got, [[3, 4], [0, 0], [6, 8], [0, 0]])


@pytest.mark.parametrize("bad", [-1, 5])
def test_an_index_outside_the_rows_is_an_error(bad):
    assert row_sums._by_matmul()   # noqa: SLF001 -- the CPU test machine takes the matmul
    with pytest.raises(tf.errors.InvalidArgumentError):
        sum_rows_by_index(tf.ones([2, 3]), tf.constant([0, bad]), 5)


def test_op_determinism_is_read_from_tensorflow():
    assert not row_sums._determinism_on()   # noqa: SLF001 -- off unless a program enables it


def test_with_a_gpu_or_op_determinism_it_is_the_segment_sum(monkeypatch):
    """Both fall back to unsorted_segment_sum: its GPU kernel can be deterministic; the
    matmul's cannot (TensorFlow refuses it under op determinism)."""
    values, ids = [[1.0, 2.0], [3.0, 4.0]], [1, 1]
    for gpu, deterministic in ((True, False), (False, True)):
        monkeypatch.setattr(row_sums, "_gpu_visible", lambda gpu=gpu: gpu)
        monkeypatch.setattr(row_sums, "_determinism_on",
                            lambda deterministic=deterministic: deterministic)
        with tf.Graph().as_default():
            out = sum_rows_by_index(values, ids, 3)
            assert out.op.type == "UnsortedSegmentSum"
    monkeypatch.setattr(row_sums, "_gpu_visible", lambda: False)
    monkeypatch.setattr(row_sums, "_determinism_on", lambda: False)
    with tf.Graph().as_default():
        assert sum_rows_by_index(values, ids, 3).op.type == "SparseTensorDenseMatMul"
