"""The batch clock: the one place that turns a batch's per-row timestamps into the batch's time.

Rec SDK's eviction semantics (``../shared/REC_SDK.md``, Eviction): a batch's timestamp is the
latest of its rows' timestamps; the table clock is the largest batch timestamp seen, and every
key in a training batch has its last-seen time refreshed to the batch's timestamp. Every face
(the ``get_asc_insert_func`` map function, over ranks its routing, and the TF2
``Embedding.preprocess``) reduces its timestamp column here, so that they cannot disagree.
"""

from __future__ import annotations

import tensorflow as tf

# The timestamp handed to the key processing when a batch carries none (or is an eval batch).
NO_TIMESTAMP = -1


def batch_timestamp(timestamps) -> tf.Tensor:
    """The timestamp of one batch: the latest of its rows' timestamps.

    Args:
      timestamps: a numeric tensor of any shape (a scalar, ``[batch]``, ``[batch, 1]``...):
        each row's timestamp, in the unit of the eviction thresholds (usually seconds);
        floats are truncated to int64 first.

    Returns:
      An int64 scalar tensor, the maximum over every element. A batch with no rows yields
      the smallest int64, which moves no clock (a table's clock starts there).

    Raises:
      TypeError: ``timestamps`` is not a numeric tensor.
    """
    timestamps = tf.convert_to_tensor(timestamps)
    if not (timestamps.dtype.is_integer or timestamps.dtype.is_floating):
        raise TypeError(f"Argument `timestamps` must be a numeric tensor (each row's time, "
                        f"e.g. int64 seconds). Received: dtype {timestamps.dtype.name}")
    flat = tf.reshape(tf.cast(timestamps, tf.int64), [-1])
    return tf.reduce_max(flat)


def no_timestamp() -> tf.Tensor:
    """The int64 scalar tensor that stands for "this batch carries no timestamp"."""
    return tf.constant(NO_TIMESTAMP, tf.int64)
