"""The Ascend TF adapter's Estimator names, from the package of the TensorFlow in use."""

import tensorflow as tf

if tf.__version__.startswith("1"):
    from npu_bridge.npu_init import DumpConfig, NPUEstimator, NPURunConfig, npu_hooks_append
else:
    from npu_device.compat.v1.npu_init import (DumpConfig, NPUEstimator, NPURunConfig,
                                               npu_hooks_append)

__all__ = ["DumpConfig", "NPUEstimator", "NPURunConfig", "npu_hooks_append"]
