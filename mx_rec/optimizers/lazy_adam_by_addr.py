"""Rec SDK ``mx_rec.optimizers.lazy_adam_by_addr`` (dynamic expansion)."""

from sparseflow.optimizers.lazy_adam_by_addr import create_hash_optimizer_by_address

__all__ = ["create_hash_optimizer_by_address"]
