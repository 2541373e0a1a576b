"""CPU stand-ins for the Ascend TF adapter's modules that Rec SDK scripts call
(``hccl_ops``, ``npu_ops``), reached through ``mx_rec.util.tf_version_adapter``."""
