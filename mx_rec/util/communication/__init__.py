"""Rec SDK ``mx_rec.util.communication``: this process's rank and the number of ranks."""

from mx_rec.util.communication import hccl_ops

__all__ = ["hccl_ops"]
