"""``npu_device.compat.v1.npu_init``: the Estimator names Rec SDK's ``little_demo_estimator``
imports on TF 2 (its ``tf_adapter.py``), served by sparseflow (tf_adapter)."""

from tf_adapter import (DumpConfig, NPUEstimator, NPUEstimatorSpec, NPURunConfig,  # noqa: F401
                        ProfilingConfig, npu_hooks_append)
