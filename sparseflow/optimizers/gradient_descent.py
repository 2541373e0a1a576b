"""Lazy SGD over host or device rows (Rec SDK ``mx_rec.optimizers.gradient_descent``)."""

from __future__ import annotations

from sparseflow.ops.optimizer_kernels import apply_sgd
from sparseflow.optimizers.base import SparseOptimizer
from sparseflow.optimizers.hparams import sgd_hparams


class GradientDescent(SparseOptimizer):
    """``w -= lr * (g + weight_decay * w)`` at the touched rows; no slots."""

    def _device_update(self, rows, indices, grads):
        return rows.apply_sgd(indices, grads, learning_rate=self.hparams["learning_rate"],
                              weight_decay=self.hparams["weight_decay"])

    def _update(self, storage, rows, grads, step):
        apply_sgd(storage, rows, grads, learning_rate=self.hparams["learning_rate"],
                  weight_decay=self.hparams["weight_decay"])


def create_hash_optimizer(learning_rate, use_locking=False, name="GradientDescent",
                          use_fusion_optim=False, weight_decay=None) -> GradientDescent:
    """Creates a lazy SGD sparse optimizer.

    Args:
      learning_rate: in [0, 10]. weight_decay: None or in [1e-5, 1e-2].
      use_locking, use_fusion_optim: accepted for Rec SDK compatibility.
      name: 1–200 characters.

    Returns:
      A :class:`GradientDescent`.

    Raises:
      NotInitializedError, TypeError, ValueError: as for lazy Adam.
    """
    return GradientDescent(sgd_hparams(learning_rate=learning_rate, weight_decay=weight_decay,
                                       name=name))
