"""``ModeKeys`` and ``EstimatorSpec``: what a ``model_fn`` is called with and returns."""

from __future__ import annotations

import collections

import tensorflow as tf

from sparseflow.validation import fail


class ModeKeys:
    """The modes a ``model_fn`` is called in (tf.estimator's values)."""

    TRAIN = "train"
    EVAL = "eval"
    PREDICT = "infer"


MODES = (ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT)

_FIELDS = ("mode", "predictions", "loss", "train_op", "eval_metric_ops", "export_outputs",
           "training_chief_hooks", "training_hooks", "scaffold", "evaluation_hooks",
           "prediction_hooks")


def check_hooks(argument: str, hooks) -> list:
    """``hooks`` (None or an iterable of ``SessionRunHook``) as a list.

    Raises:
      TypeError: an element is not a hook, naming ``argument``.
    """
    hooks = list(hooks or ())
    for hook in hooks:
        if not isinstance(hook, tf.compat.v1.train.SessionRunHook):
            fail(argument, "a list of tf.compat.v1.train.SessionRunHook", hook, TypeError)
    return hooks


def _scalar_loss(loss) -> tf.Tensor:
    if not isinstance(loss, tf.Tensor) or not loss.dtype.is_floating:
        fail("loss", "a scalar float tensor", loss, TypeError)
    if loss.shape.rank not in (None, 0):
        if loss.shape.num_elements() != 1:
            fail("loss", "a scalar float tensor (shape [] or [1])", loss.shape)
        loss = tf.reshape(loss, [])
    return loss


class EstimatorSpec(collections.namedtuple("EstimatorSpec", _FIELDS)):
    """What a ``model_fn`` returns (tf.estimator's ``EstimatorSpec``).

    Args:
      mode: a ``ModeKeys`` value.
      predictions: PREDICT: a tensor or a dict of tensors (required).
      loss: TRAIN and EVAL: a scalar float tensor (required).
      train_op: TRAIN: the op one training step runs (required); it must increment the global
        step (``tf.compat.v1.train.get_global_step()``).
      eval_metric_ops: EVAL: dict name -> ``(value, update_op)`` (``tf.compat.v1.metrics.*``);
        "loss" is the Estimator's own.
      export_outputs: dict signature name -> ``export.PredictOutput``, for
        ``export_saved_model`` (default: the predictions under "serving_default").
      training_chief_hooks, training_hooks, evaluation_hooks, prediction_hooks: lists of
        ``tf.compat.v1.train.SessionRunHook`` run in that mode.
      scaffold: a ``tf.compat.v1.train.Scaffold``, or None.

    Raises:
      TypeError, ValueError: a field is missing for ``mode`` or of the wrong type.
    """

    def __new__(cls, mode, predictions=None, loss=None, train_op=None, eval_metric_ops=None,
                export_outputs=None, training_chief_hooks=None, training_hooks=None,
                scaffold=None, evaluation_hooks=None, prediction_hooks=None):
        if mode not in MODES:
            fail("mode", f"one of {list(MODES)} (ModeKeys.TRAIN / EVAL / PREDICT)", mode)
        if mode in (ModeKeys.TRAIN, ModeKeys.EVAL):
            if loss is None:
                fail("loss", f"a scalar float tensor in mode={mode!r} (EstimatorSpec(mode, "
                     f"loss=..., ...))", loss)
            loss = _scalar_loss(loss)
        elif loss is not None:
            loss = _scalar_loss(loss)
        if mode == ModeKeys.TRAIN and train_op is None:
            fail("train_op", "an op (or tensor) that runs one training step in mode='train'",
                 train_op)
        if train_op is not None and not isinstance(train_op, (tf.Operation, tf.Tensor)):
            fail("train_op", "a tf.Operation or tensor", train_op, TypeError)
        if mode == ModeKeys.PREDICT and predictions is None:
            fail("predictions", "a tensor or a dict of tensors in mode='infer'", predictions)
        if predictions is not None:
            for value in tf.nest.flatten(predictions):
                if not isinstance(value, tf.Tensor):
                    fail("predictions", "a tensor or a dict of tensors", predictions, TypeError)
        eval_metric_ops = dict(eval_metric_ops or {})
        for key, value in eval_metric_ops.items():
            if not isinstance(key, str) or not (isinstance(value, tuple) and len(value) == 2):
                fail("eval_metric_ops", "a dict of name -> (value tensor, update op) "
                     "(tf.compat.v1.metrics.*)", {key: value}, TypeError)
        if export_outputs is not None:
            from sparseflow.estimator.export import PredictOutput
            if not isinstance(export_outputs, dict) or not all(
                    isinstance(v, PredictOutput) for v in export_outputs.values()):
                fail("export_outputs", "a dict of signature name -> export.PredictOutput",
                     export_outputs, TypeError)
        if scaffold is not None and not isinstance(scaffold, tf.compat.v1.train.Scaffold):
            fail("scaffold", "a tf.compat.v1.train.Scaffold or None", scaffold, TypeError)
        return super().__new__(
            cls, mode, predictions, loss, train_op, eval_metric_ops, export_outputs,
            tuple(check_hooks("training_chief_hooks", training_chief_hooks)),
            tuple(check_hooks("training_hooks", training_hooks)), scaffold,
            tuple(check_hooks("evaluation_hooks", evaluation_hooks)),
            tuple(check_hooks("prediction_hooks", prediction_hooks)))
