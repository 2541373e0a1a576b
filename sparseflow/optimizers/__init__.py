"""Lazy sparse optimizers, one module per optimizer as in Rec SDK (``lazy_adam``,
``gradient_descent``, ``adagrad``, ``ftrl``), each with ``create_hash_optimizer``; and the
by-address optimizers of dynamic expansion (``lazy_adam_by_addr``,
``gradient_descent_by_addr``, ``adagrad_by_addr``)."""

from sparseflow.optimizers import (adagrad, adagrad_by_addr, ftrl, gradient_descent,
                                   gradient_descent_by_addr, lazy_adam, lazy_adam_by_addr)

__all__ = ["adagrad", "adagrad_by_addr", "ftrl", "gradient_descent", "gradient_descent_by_addr",
           "lazy_adam", "lazy_adam_by_addr"]
