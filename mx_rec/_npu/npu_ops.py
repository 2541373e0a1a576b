"""The Ascend TF adapter's ``npu_ops`` that Rec SDK models call: ``dropout``."""

from __future__ import annotations

import numbers

import tensorflow as tf

from sparseflow.validation import fail

__all__ = ["dropout"]


def dropout(x, keep_prob, noise_shape=None, seed=None, name=None):
    """``npu_ops.dropout``: keeps each element with probability ``keep_prob``, scaled by
    ``1 / keep_prob`` (``tf.nn.dropout`` with ``rate = 1 - keep_prob``).

    Args:
      x: a float tensor.
      keep_prob: float in (0, 1], or a float scalar tensor.
      noise_shape, seed, name: as in ``tf.nn.dropout``.

    Returns:
      A tensor of ``x``'s shape and dtype.

    Raises:
      TypeError, ValueError: ``keep_prob`` is not a number in (0, 1] or a tensor.
    """
    if isinstance(keep_prob, numbers.Real) and not isinstance(keep_prob, bool):
        if not 0.0 < keep_prob <= 1.0:
            fail("keep_prob", "a float in (0, 1]", keep_prob)
    elif not tf.is_tensor(keep_prob):
        fail("keep_prob", "a float in (0, 1] or a float tensor", keep_prob, TypeError)
    return tf.nn.dropout(x, rate=1.0 - keep_prob, noise_shape=noise_shape, seed=seed, name=name)
