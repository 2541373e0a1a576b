"""Adagrad by address, for dynamic expansion (Rec SDK ``mx_rec.optimizers.adagrad_by_addr``)."""

from __future__ import annotations

from sparseflow.optimizers.adagrad import Adagrad
from sparseflow.optimizers.by_address import ByAddressOptimizer
from sparseflow.optimizers.hparams import adagrad_hparams


class AdagradByAddress(ByAddressOptimizer, Adagrad):
    """Lazy Adagrad (see :class:`~sparseflow.optimizers.adagrad.Adagrad`) on the rows named by
    addresses; rows ``[weights | accumulator]``."""


def create_hash_optimizer_by_address(learning_rate=0.001, initial_accumulator_value=0.9,
                                     name="Adagrad") -> AdagradByAddress:
    """Creates an Adagrad by-address optimizer (dynamic expansion only).

    Args:
      learning_rate: in [0, 10]. initial_accumulator_value: in (0, 1], each new row's
        accumulator. name: 1–200 characters.

    Returns:
      An :class:`AdagradByAddress`.

    Raises:
      NotInitializedError: ``init`` was not called.
      TypeError, ValueError: a hyper-parameter is out of range, or dynamic expansion is off.
    """
    return AdagradByAddress(adagrad_hparams(
        learning_rate=learning_rate, initial_accumulator_value=initial_accumulator_value,
        name=name))
