"""Ascend's TF 2 adapter package, as far as Rec SDK's Estimator scripts import it
(``npu_device.compat.v1.npu_init``), on sparseflow. Nothing here drives an NPU."""
