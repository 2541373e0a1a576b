"""``pool``: one vector per sample from a multi-hot feature's looked-up embeddings."""

from __future__ import annotations

import tensorflow as tf

from sparseflow.validation import check_one_of, fail

COMBINERS = ("sum", "mean", "sqrtn")
PADDING_KEY = -1


def pool(embeddings: tf.Tensor, keys: tf.Tensor | None, combiner: str = "mean") -> tf.Tensor:
    """Pools a multi-hot feature's embeddings over its ids, padding masked out.

    ::

        embeddings [batch, L, dim]   keys [batch, L]          ->  [batch, dim]
          row b: e_b0 e_b1 .. e_bL     k_b0 k_b1 .. -1 -1
        sum:   sum of e_bl over the n_b non-padding l (keys != -1)
        mean:  sum / n_b            sqrtn: sum / sqrt(n_b)     (n_b = 0: a zero row)

    Only the key ``-1`` is padding: keys hashed over the whole int64 range may be negative.

    Args:
      embeddings: float32 ``[batch, L, dim]`` from ``sparse_lookup`` of a multi-hot feature,
        or ``[batch, dim]`` (a single-hot feature), which is returned unchanged.
      keys: int32/int64 ``[batch, L]``, the feature's keys (``-1`` = padding); None when
        there is no padding (every id counts).
      combiner: ``"sum"``, ``"mean"`` or ``"sqrtn"``.

    Returns:
      float32 ``[batch, dim]``.

    Raises:
      ValueError: ``combiner`` is not one of the above, ``embeddings`` is not rank 2 or 3, or
        ``keys``' static shape is not ``embeddings``' first two dimensions.
      TypeError: ``keys`` is not an integer tensor.
    """
    check_one_of("combiner", combiner, COMBINERS)
    embeddings = tf.convert_to_tensor(embeddings)
    rank = embeddings.shape.rank
    if rank == 2:
        return embeddings
    if rank != 3:
        fail("embeddings", "a rank-3 [batch, L, dim] or rank-2 [batch, dim] tensor",
             f"shape {embeddings.shape}")
    if keys is None:
        summed = tf.reduce_sum(embeddings, axis=1)
        if combiner == "sum":
            return summed
        n = tf.cast(tf.shape(embeddings)[1], embeddings.dtype)
        return summed / (n if combiner == "mean" else tf.sqrt(n))
    keys = tf.convert_to_tensor(keys)
    if not keys.dtype.is_integer:
        fail("keys", "an int32 or int64 tensor", f"dtype {keys.dtype.name}", TypeError)
    if not keys.shape.is_compatible_with(embeddings.shape[:2]):
        fail("keys", f"of shape {embeddings.shape[:2].as_list()} (embeddings' [batch, L])",
             f"shape {keys.shape}")
    mask = tf.cast(tf.not_equal(keys, tf.constant(PADDING_KEY, keys.dtype)), embeddings.dtype)
    summed = tf.reduce_sum(embeddings * mask[:, :, None], axis=1)
    if combiner == "sum":
        return summed
    count = tf.maximum(tf.reduce_sum(mask, axis=1, keepdims=True), 1.0)  # all padding: 0 / 1
    return summed / count if combiner == "mean" else summed * tf.math.rsqrt(count)
