"""Rec SDK ``mx_rec.optimizers.gradient_descent_by_addr`` (dynamic expansion)."""

from sparseflow.optimizers.gradient_descent_by_addr import (create_hash_optimizer_by_addr,
                                                            create_hash_optimizer_by_address)

__all__ = ["create_hash_optimizer_by_addr", "create_hash_optimizer_by_address"]
