"""``npu_device.compat.v1.npu_init``: the Estimator names Rec SDK's ``little_demo_estimator``
imports on TF 2 (from its own ``tf_adapter.py``, which shadows ours: so not from
``tf_adapter`` here), served by sparseflow."""

import mx_rec  # noqa: F401  (tf.estimator, tf.compat.v1.layers... as Rec SDK scripts expect)
from mx_rec._npu.estimator import (DumpConfig, NPUEstimator, NPUEstimatorSpec,  # noqa: F401
                                   NPURunConfig, ProfilingConfig, npu_hooks_append)
