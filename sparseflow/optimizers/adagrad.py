"""Lazy Adagrad over host or device rows (Rec SDK ``mx_rec.optimizers.adagrad``)."""

from __future__ import annotations

from sparseflow.ops.optimizer_kernels import apply_adagrad
from sparseflow.optimizers.base import SparseOptimizer
from sparseflow.optimizers.hparams import adagrad_hparams


class Adagrad(SparseOptimizer):
    """``acc += g^2; w -= lr * g / sqrt(acc)`` at the touched rows (TF ApplyAdagrad)."""

    slot_names = ("accumulator",)

    def _device_update(self, rows, indices, grads):
        return rows.apply_adagrad(indices, grads, learning_rate=self.hparams["learning_rate"])

    @property
    def slot_initial_values(self):
        return (self.hparams["initial_accumulator_value"],)

    def _update(self, storage, rows, grads, step):
        apply_adagrad(storage, rows, grads, learning_rate=self.hparams["learning_rate"])


def create_hash_optimizer(learning_rate=0.001, initial_accumulator_value=0.9, use_locking=False,
                          name="Adagrad") -> Adagrad:
    """Creates a lazy Adagrad sparse optimizer.

    Args:
      learning_rate: in [0, 10]. initial_accumulator_value: in (0, 1], each new row's
        accumulator. use_locking: accepted for Rec SDK compatibility. name: 1–200 characters.

    Returns:
      An :class:`Adagrad`.

    Raises:
      NotInitializedError, TypeError, ValueError: as for lazy Adam.
    """
    return Adagrad(adagrad_hparams(learning_rate=learning_rate,
                                   initial_accumulator_value=initial_accumulator_value, name=name))
