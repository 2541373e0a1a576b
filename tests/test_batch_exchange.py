"""A routed batch's gradients on their way to the owners (``BatchExchange.to_owners``), in one
process: the all-to-all is the identity, so what would be sent is what comes back. Checked
against numpy: each entry of the ``[N, m, max_dim]`` layout gets the sum of the gradients of
the keys (or unique rows) read from it, zeros where none."""

import numpy as np
import pytest
import tensorflow as tf

from sparseflow.distributed.batch_exchange import BatchExchange


class _LoopbackExchange:
    """What ``to_owners`` needs of an ``Exchange``: the world size and an all-to-all, here
    the identity."""

    def __init__(self, world_size: int):
        self.world_size = world_size

    def all_to_all(self, x):
        return tf.identity(x)


class _Router:
    def __init__(self, max_dim: int):
        self.max_dim = max_dim


def _exchange(n: int, m: int, max_dim: int, where: np.ndarray) -> BatchExchange:
    ex = BatchExchange(_Router(max_dim), _LoopbackExchange(n), None, None, None, None,
                       train=True, stamped=False)
    ex.m = tf.constant(m, tf.int32)
    ex.where = tf.constant(where, tf.int32)
    return ex


@pytest.mark.parametrize("n,m,keys", [(2, 5, 37), (3, 4, 12), (1, 7, 1), (2, 3, 0)])
def test_each_entry_gets_the_sum_of_its_keys_gradients(n, m, keys):
    rng = np.random.default_rng(n * 100 + keys)
    where = rng.integers(0, n * m, keys).astype(np.int32)   # several keys per entry
    dy = rng.normal(size=(keys, 4)).astype(np.float32)
    sent = _exchange(n, m, 4, where).to_owners(tf.constant(dy)).numpy()
    want = np.zeros((n * m, 4), np.float32)
    np.add.at(want, where, dy)
    assert sent.shape == (n, m, 4)
    np.testing.assert_allclose(sent.reshape(n * m, 4), want, rtol=1e-6, atol=1e-6)


def test_an_entry_index_outside_the_layout_is_an_error_not_a_lost_gradient():
    ex = _exchange(2, 3, 2, np.array([0, 6], np.int32))
    with pytest.raises(tf.errors.InvalidArgumentError):
        ex.to_owners(tf.ones([2, 2], tf.float32))
