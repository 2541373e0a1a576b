"""``sparseflow.estimator``: the tf.estimator API on ``tf.compat.v1`` graphs, for TensorFlow
versions that no longer ship ``tf.estimator`` (2.16 and later), with sparseflow tables as
first-class state. See docs/estimator.md.

After ``import mx_rec``, ``tf.estimator`` resolves to this module when TensorFlow has none.
"""

import tensorflow as _tf

from sparseflow.estimator import export
from sparseflow.estimator.estimator import Estimator
from sparseflow.estimator.run_config import RunConfig
from sparseflow.estimator.spec import EstimatorSpec, ModeKeys
from sparseflow.estimator.training import EvalSpec, TrainSpec, train_and_evaluate
from sparseflow.pipeline.graph_modifier import GraphModifierHook

# tf.estimator's hook names, for scripts that take them from there.
SessionRunHook = _tf.compat.v1.train.SessionRunHook
LoggingTensorHook = _tf.compat.v1.train.LoggingTensorHook
CheckpointSaverHook = _tf.compat.v1.train.CheckpointSaverHook
CheckpointSaverListener = _tf.compat.v1.train.CheckpointSaverListener

__all__ = ["CheckpointSaverHook", "CheckpointSaverListener", "Estimator", "EstimatorSpec",
           "EvalSpec", "GraphModifierHook", "LoggingTensorHook", "ModeKeys", "RunConfig",
           "SessionRunHook", "TrainSpec", "export", "train_and_evaluate"]
