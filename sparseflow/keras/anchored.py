"""How the Keras layers train an :class:`~sparseflow.tf2.Embedding` under ``model.fit``.

Keras differentiates the loss w.r.t. the layer's trainable variables only. The layers
therefore expose one scalar "anchor" variable and read their activations through a custom
gradient of it: computing the anchor's gradient (always zero) applies the tables' sparse
update to the rows the batch touched, so Keras' optimizer never sees a table.
"""

from __future__ import annotations

import tensorflow as tf

from sparseflow.custom_gradient import custom_gradient
from sparseflow.tf2.optimizers import OPTIMIZERS, Adam, optimizer_from_config
from sparseflow.validation import fail
from sparseflow.weak_owner import weak


def sparse_optimizer(optimizer):
    """A layer's ``optimizer`` argument as a ``sparseflow.tf2`` optimizer: None gives
    ``Adam(0.001)``, a dict (a saved layer's config) is rebuilt.

    Raises:
      TypeError: anything else than a ``sparseflow.tf2`` optimizer.
      ValueError: a dict naming no such optimizer.
    """
    if optimizer is None:
        return Adam(0.001)
    if isinstance(optimizer, dict):
        optimizer = optimizer_from_config(optimizer)
    if not isinstance(optimizer, OPTIMIZERS):
        fail("optimizer", "one of sparseflow.tf2.SGD, Adagrad, Adam, FTRL", optimizer,
             TypeError)
    return optimizer


def train_lookup(embedding, batch: dict, anchor) -> list:
    """The training activations of a processed ``batch`` (flat, in feature order), whose
    gradient w.r.t. ``anchor`` applies the sparse update once, for every feature.

    Args:
      embedding: the layer's ``sparseflow.tf2.Embedding``.
      batch: what ``embedding.preprocess(..., training=True)`` returned.
      anchor: the layer's scalar anchor variable.

    Returns:
      One float32 tensor per feature, as ``embedding.activations`` returns them.
    """
    # Held weakly by the gradient: Keras' optimizer differentiates through tf.distribute's
    # all-reduce, a tf.custom_gradient that TensorFlow's registry keeps with the train
    # function's graph for the life of the process; the tables must not stay with it.
    embedding_ref = weak(embedding, "sparseflow.tf2.Embedding")

    @custom_gradient
    def lookup(anchor_value):
        activations = embedding.activations(batch, training=True)

        def grad(*dys):
            applied = embedding_ref().update(batch, list(dys))
            # Zero, computed from the update's output: a control dependency on a
            # constant zero is dropped by graph optimization, and the update with it.
            return tf.reshape(tf.cast(applied, tf.float32) * 0.0, tf.shape(anchor_value))

        return activations, grad

    out = lookup(tf.convert_to_tensor(anchor))
    return list(out) if isinstance(out, (list, tuple)) else [out]


def shaped(out: tf.Tensor, ids, output_shape) -> tf.Tensor:
    """``out`` with its static shape set to ``output_shape(ids.shape)`` (the layer's
    ``compute_output_shape``); ragged or shapeless ``ids``: ``out`` as is."""
    if isinstance(ids, tf.RaggedTensor) or not hasattr(ids, "shape"):
        return out
    return tf.ensure_shape(out, output_shape(tuple(ids.shape)))
