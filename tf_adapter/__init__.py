"""Ascend's TF adapter Estimator names for Rec SDK scripts on sparseflow (CPU/GPU):
``from tf_adapter import NPURunConfig, NPUEstimator, npu_hooks_append, DumpConfig``.
See mx_rec/_npu/estimator.py and docs/estimator.md."""

import mx_rec  # noqa: F401  (tf.estimator, tf.compat.v1.layers... as Rec SDK scripts expect)
from mx_rec._npu.estimator import (DumpConfig, NPUEstimator, NPUEstimatorSpec, NPURunConfig,
                                   ProfilingConfig, npu_hooks_append)

__all__ = ["DumpConfig", "NPUEstimator", "NPUEstimatorSpec", "NPURunConfig", "ProfilingConfig",
           "npu_hooks_append"]
