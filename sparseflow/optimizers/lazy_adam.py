"""Lazy Adam over host or device rows (Rec SDK ``mx_rec.optimizers.lazy_adam``)."""

from __future__ import annotations

import tensorflow as tf

from sparseflow.ops.op_shards import op_shards
from sparseflow.ops.optimizer_kernels import apply_lazy_adam, apply_lazy_adam_tables
from sparseflow.optimizers.base import SparseOptimizer
from sparseflow.optimizers.hparams import lazy_adam_hparams


class LazyAdam(SparseOptimizer):
    """Adam whose moments and weights change only at the rows a batch touched.

    ``lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t)`` with t the table's update count;
    ``m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; w -= lr_t m / (sqrt(v) + eps)``.
    """

    slot_names = ("momentum", "velocity")

    def _device_update(self, rows, indices, grads):
        # The table's step counts its updates, in the same counter as the host path's.
        step = self._step_tensor(rows.name)
        h = self.hparams
        return rows.apply_lazy_adam(indices, grads, step, learning_rate=h["learning_rate"],
                                    beta1=h["beta1"], beta2=h["beta2"], epsilon=h["epsilon"])

    def _update(self, storage, rows, grads, step):
        h = self.hparams
        apply_lazy_adam(storage, rows, grads, learning_rate=h["learning_rate"],
                        beta1=h["beta1"], beta2=h["beta2"], epsilon=h["epsilon"], step=step)

    def _compiled_update(self, pairs):
        from sparseflow.ops import optimizer_ops  # loads the op's kernel: only when used

        h = self.hparams
        # The tables split over a few ops that TensorFlow runs side by side, as the gather's.
        updates = []
        for run in op_shards([1] * len(pairs)):
            shard = [pairs[i] for i in run]
            updates.append(optimizer_ops.lazy_adam_tables(
                [self._registry_token(table) for _, table in shard],
                [grad.indices for grad, _ in shard], [grad.values for grad, _ in shard],
                learning_rate=h["learning_rate"], beta1=h["beta1"], beta2=h["beta2"],
                epsilon=h["epsilon"], name="sparseflow_update"))
        return tf.add_n(updates)

    def _update_tables(self, storages, rows, grads, steps):
        h = self.hparams
        apply_lazy_adam_tables(storages, rows, grads, steps, learning_rate=h["learning_rate"],
                               beta1=h["beta1"], beta2=h["beta2"], epsilon=h["epsilon"])


def create_hash_optimizer(learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8,
                          name="LazyAdam", use_fusion_optim=False) -> LazyAdam:
    """Creates a lazy Adam sparse optimizer.

    Args:
      learning_rate: in [0, 10]. beta1: in (0, 1). beta2: in [0, 1]. epsilon: in (0, 1].
      name: 1–200 characters.
      use_fusion_optim: accepted for Rec SDK compatibility; updates are always fused here.

    Returns:
      A :class:`LazyAdam`.

    Raises:
      NotInitializedError: ``init`` was not called.
      TypeError, ValueError: a hyper-parameter is out of range, or dynamic expansion is on.
    """
    return LazyAdam(lazy_adam_hparams(learning_rate=learning_rate, beta1=beta1, beta2=beta2,
                                      epsilon=epsilon, name=name))
