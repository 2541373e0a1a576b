"""Rec SDK ``mx_rec.optimizers.adagrad_by_addr`` (dynamic expansion)."""

from sparseflow.optimizers.adagrad_by_addr import create_hash_optimizer_by_address

__all__ = ["create_hash_optimizer_by_address"]
