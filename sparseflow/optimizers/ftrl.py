"""Lazy FTRL-Proximal over host or device rows (Rec SDK ``mx_rec.optimizers.ftrl``)."""

from __future__ import annotations

from sparseflow.ops.optimizer_kernels import apply_ftrl
from sparseflow.optimizers.base import SparseOptimizer
from sparseflow.optimizers.hparams import ftrl_hparams


class Ftrl(SparseOptimizer):
    """TF's ApplyFtrl at the touched rows; slots ``accum`` and ``linear``."""

    slot_names = ("accum", "linear")

    @property
    def slot_initial_values(self):
        return (self.hparams["initial_accumulator_value"], 0.0)

    def _device_update(self, rows, indices, grads):
        h = self.hparams
        return rows.apply_ftrl(indices, grads, learning_rate=h["learning_rate"],
                               learning_rate_power=h["learning_rate_power"],
                               l1=h["l1_regularization_strength"],
                               l2=h["l2_regularization_strength"])

    def _update(self, storage, rows, grads, step):
        h = self.hparams
        apply_ftrl(storage, rows, grads, learning_rate=h["learning_rate"],
                   learning_rate_power=h["learning_rate_power"],
                   l1=h["l1_regularization_strength"], l2=h["l2_regularization_strength"])


def create_hash_optimizer(learning_rate, use_locking=False, name="Ftrl", **kwargs) -> Ftrl:
    """Creates a lazy FTRL sparse optimizer.

    Args:
      learning_rate: in [0, 10].
      use_locking: accepted for Rec SDK compatibility.
      name: 1–200 characters.
      **kwargs: ``learning_rate_power`` (<= 0, default -0.5), ``initial_accumulator_value``
        ((0, 1], default 0.1), ``l1_regularization_strength`` / ``l1`` and
        ``l2_regularization_strength`` / ``l2`` (in [0, 1e4], default 0).

    Returns:
      An :class:`Ftrl`.

    Raises:
      NotInitializedError, TypeError, ValueError: as for lazy Adam.
    """
    hparams = ftrl_hparams(learning_rate=learning_rate, name=name, **kwargs)
    if hparams.get("l2_shrinkage_regularization_strength", 0.0) > 0.0:
        raise ValueError("Argument `l2_shrinkage_regularization_strength` must be 0: the lazy "
                         "FTRL kernel does not implement shrinkage. Received: "
                         f"{hparams['l2_shrinkage_regularization_strength']!r}")
    return Ftrl(hparams)
