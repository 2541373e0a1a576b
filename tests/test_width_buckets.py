"""Exchange widths rounded up to the rungs of sparseflow.distributed.width_buckets."""

import math

import numpy as np
import tensorflow as tf

from sparseflow.distributed import width_buckets
from sparseflow.validation import INT32_MAX


def test_rungs_climb_from_zero_to_int32_max_by_at_most_an_eighth_of_a_doubling():
    rungs = width_buckets.RUNGS.astype(np.int64)
    assert rungs[0] == 0 and rungs[-1] == INT32_MAX
    assert (np.diff(rungs) > 0).all()
    assert list(rungs[:17]) == list(range(17))   # every small width is its own rung
    # A width just past a rung pads to the next: at most 2^(1/8), rounded up, more.
    for low, high in zip(rungs[1:-2], rungs[2:-1]):
        assert high <= math.ceil((low + 1) * 2 ** (1 / 8)), (low, high)
    assert width_buckets.N_RUNGS == len(rungs) < 256


def test_rounded_width_is_the_smallest_rung_not_below_the_width_in_python_and_in_tf():
    rng = np.random.default_rng(0)
    widths = np.concatenate([np.arange(0, 300), rng.integers(300, INT32_MAX, 200),
                             width_buckets.RUNGS[-3:], [INT32_MAX - 1]]).astype(np.int64)
    expected = [int(width_buckets.RUNGS[width_buckets.RUNGS >= w].min()) for w in widths]
    got = [width_buckets.rounded_width(int(w)) for w in widths]
    assert [rung for rung, _ in got] == expected
    assert all(width_buckets.RUNGS[index] == rung for rung, index in got)

    @tf.function(input_signature=[tf.TensorSpec([], tf.int32)])
    def rounded(width):
        return width_buckets.rounded_width(width)

    for w, (rung, index) in zip(widths, got):
        tf_rung, tf_index = rounded(tf.constant(int(w), tf.int32))
        assert (int(tf_rung), int(tf_index)) == (rung, index), w
