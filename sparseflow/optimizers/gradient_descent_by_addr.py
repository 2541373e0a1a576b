"""SGD by address, for dynamic expansion (Rec SDK
``mx_rec.optimizers.gradient_descent_by_addr``)."""

from __future__ import annotations

from sparseflow.optimizers.by_address import ByAddressOptimizer
from sparseflow.optimizers.gradient_descent import GradientDescent
from sparseflow.optimizers.hparams import check_learning_rate
from sparseflow.validation import check_float, check_str

_NAME_MAX_LEN = 200


class GradientDescentByAddr(ByAddressOptimizer, GradientDescent):
    """``w -= lr * (g + weight_decay * w)`` at the rows named by addresses; no slots.

    Rec SDK documents the range of ``weight_decay`` but not where it enters; this is the same
    coupled L2 step as ``gradient_descent.create_hash_optimizer(weight_decay=...)``, applied
    to touched rows only (lazy).
    """


def create_hash_optimizer_by_addr(learning_rate, weight_decay=1e-4, use_locking=False,
                                  name="GradientDescentByAddr") -> GradientDescentByAddr:
    """Creates an SGD by-address optimizer (dynamic expansion only).

    Args:
      learning_rate: in [0, 10].
      weight_decay: in [0, 1]; 0 turns decay off.
      use_locking: accepted for Rec SDK compatibility.
      name: 1–200 characters.

    Returns:
      A :class:`GradientDescentByAddr`.

    Raises:
      NotInitializedError: ``init`` was not called.
      TypeError, ValueError: a hyper-parameter is out of range, or dynamic expansion is off.
    """
    return GradientDescentByAddr({
        "learning_rate": check_learning_rate("learning_rate", learning_rate),
        "weight_decay": check_float("weight_decay", weight_decay, 0.0, 1.0),
        "name": check_str("name", name, 1, _NAME_MAX_LEN),
    })


# The spelling of Rec SDK's other by-address modules.
create_hash_optimizer_by_address = create_hash_optimizer_by_addr
