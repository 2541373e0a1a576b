"""``export.ServingInputReceiver`` and ``export.PredictOutput``: what
``Estimator.export_saved_model`` is given (tf.estimator.export's names)."""

from __future__ import annotations

import tensorflow as tf

from sparseflow.validation import fail


def _tensor_dict(argument: str, value, default_key: str) -> dict:
    if isinstance(value, (tf.Tensor, tf.SparseTensor)):
        return {default_key: value}
    if not isinstance(value, dict) or not value:
        fail(argument, "a tensor or a non-empty dict of str -> tensor", value, TypeError)
    for key, tensor in value.items():
        if not isinstance(key, str) or not isinstance(tensor, (tf.Tensor, tf.SparseTensor)):
            fail(argument, "a tensor or a non-empty dict of str -> tensor", {key: tensor},
                 TypeError)
    return dict(value)


class ServingInputReceiver:
    """A serving graph's inputs: what ``serving_input_receiver_fn`` returns.

    Args:
      features: a tensor or dict of tensors, passed to ``model_fn`` as ``features``.
      receiver_tensors: a tensor or dict of tensors (usually placeholders): the SavedModel
        signature's inputs. A single tensor is named "input".
      receiver_tensors_alternatives: accepted for compatibility; not exported.

    Raises:
      TypeError: an argument is not a tensor or dict of tensors.
    """

    def __init__(self, features, receiver_tensors, receiver_tensors_alternatives=None):
        self.features = (features if isinstance(features, (tf.Tensor, tf.SparseTensor))
                         else _tensor_dict("features", features, "feature"))
        self.receiver_tensors = _tensor_dict("receiver_tensors", receiver_tensors, "input")
        self.receiver_tensors_alternatives = receiver_tensors_alternatives


class PredictOutput:
    """A prediction signature's outputs (``EstimatorSpec(export_outputs={name: ...})``).

    Args:
      outputs: a tensor (named "output") or a dict of str -> tensor.

    Raises:
      TypeError: ``outputs`` is not a tensor or dict of tensors.
    """

    def __init__(self, outputs):
        self.outputs = _tensor_dict("outputs", outputs, "output")


def build_raw_serving_input_receiver_fn(features, default_batch_size=None):
    """A ``serving_input_receiver_fn`` whose signature takes ``features`` as they are: one
    placeholder per feature, of its dtype and shape (the batch dimension ``default_batch_size``).

    Args:
      features: a dict of str -> tensor (or ``tf.TensorSpec``) giving dtypes and shapes.
      default_batch_size: None (any) or an int.

    Raises:
      TypeError: ``features`` is not a dict.
    """
    if not isinstance(features, dict) or not features:
        fail("features", "a non-empty dict of str -> tensor or tf.TensorSpec", features,
             TypeError)

    def serving_input_receiver_fn():
        placeholders = {}
        for key, value in features.items():
            shape = tf.TensorShape(value.shape).as_list()
            if shape:
                shape[0] = default_batch_size
            placeholders[key] = tf.compat.v1.placeholder(value.dtype, shape, name=key)
        return ServingInputReceiver(placeholders, placeholders)

    return serving_input_receiver_fn
