"""Lazy Adam by address, for dynamic expansion (Rec SDK ``mx_rec.optimizers.lazy_adam_by_addr``)."""

from __future__ import annotations

from sparseflow.optimizers.by_address import ByAddressOptimizer
from sparseflow.optimizers.hparams import lazy_adam_hparams
from sparseflow.optimizers.lazy_adam import LazyAdam


class LazyAdamByAddress(ByAddressOptimizer, LazyAdam):
    """Lazy Adam (see :class:`~sparseflow.optimizers.lazy_adam.LazyAdam`) on the rows named by
    addresses; rows ``[weights | momentum | velocity]``."""


def create_hash_optimizer_by_address(learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8,
                                     name="LazyAdamByAddress") -> LazyAdamByAddress:
    """Creates a lazy Adam by-address optimizer (dynamic expansion only).

    Args:
      learning_rate: in [0, 10]. beta1: in (0, 1). beta2: in [0, 1]. epsilon: in (0, 1].
      name: 1–200 characters.

    Returns:
      A :class:`LazyAdamByAddress`; its ``apply_gradients`` takes (gradient, address) pairs
      (see ``sparseflow/optimizers/by_address.py``).

    Raises:
      NotInitializedError: ``init`` was not called.
      TypeError, ValueError: a hyper-parameter is out of range, or dynamic expansion is off.
    """
    return LazyAdamByAddress(lazy_adam_hparams(learning_rate=learning_rate, beta1=beta1,
                                               beta2=beta2, epsilon=epsilon, name=name))
