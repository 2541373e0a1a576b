"""tensor_buffers: numpy_function outputs that TensorFlow can adopt without a copy."""

import numpy as np
import pytest
import tensorflow as tf

from sparseflow import tensor_buffers


@pytest.mark.parametrize("shape", [0, 1, 7, (3, 5), (4097, 16), (2, 3, 4)])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.uint8])
def test_empty_is_aligned_contiguous_and_of_the_asked_shape(shape, dtype):
    for _ in range(5):   # different allocations land at different offsets
        out = tensor_buffers.empty(shape, dtype)
        assert out.size == 0 or out.ctypes.data % tensor_buffers.ALIGNMENT == 0
        assert out.shape == np.empty(shape, dtype).shape
        assert out.dtype == np.dtype(dtype)
        assert out.flags.c_contiguous and out.flags.writeable


def test_zeros_are_zero():
    out = tensor_buffers.zeros((1000, 3), np.float32)
    np.testing.assert_array_equal(out, np.zeros((1000, 3), np.float32))


def test_concatenate_matches_numpy_and_casts():
    rng = np.random.default_rng(0)
    parts = [rng.integers(-5, 5, n).astype(np.int32) for n in (0, 3, 100, 1)]
    out = tensor_buffers.concatenate(parts, np.int32)
    np.testing.assert_array_equal(out, np.concatenate(parts))
    assert out.ctypes.data % tensor_buffers.ALIGNMENT == 0
    wide = tensor_buffers.concatenate([np.arange(3, dtype=np.int32)], np.int64)
    assert wide.dtype == np.int64 and wide.tolist() == [0, 1, 2]


def test_aligned_output_of_a_numpy_function_reads_back_unchanged():
    values = np.arange(4096 * 16, dtype=np.float32).reshape(4096, 16)

    def make():
        out = tensor_buffers.empty(values.shape, np.float32)
        out[...] = values
        return out

    got = tf.numpy_function(make, [], tf.float32)
    np.testing.assert_array_equal(got.numpy(), values)
