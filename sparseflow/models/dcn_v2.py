"""DCN-v2 (Wang et al., 2021): explicit feature crosses next to or before a deep MLP."""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from sparseflow.models.layers import (MLP, CrossNetwork, Dense, check_model_inputs,
                                      check_module_name, check_no_wide, check_widths, format_repr,
                                      stream)
from sparseflow.validation import check_int, check_one_of, fail

STRUCTURES = ("stacked", "parallel")
_CROSS, _DEEP, _OUT = 1, 2, 3  # seed stream roles


class DCNv2(tf.Module):
    """DCN-v2: a cross network and a deep MLP, stacked or in parallel.

    ::

        x0 = concat(dense, e_1, .., e_F)                       [B, d]
        cross layer l:  x_{l+1} = x0 * (x_l @ W_l + b_l) + x_l   W_l = V_l @ U_l if low_rank
        stacked:   x0 -> cross -> deep MLP (ReLU) -> linear      [B, n_outputs]
        parallel:  concat(cross(x0), deep(x0)) -> linear         [B, n_outputs]

    Variables are made on the first call (see ``sparseflow.models.layers``) and reused by
    later calls, in a tf.compat.v1 graph (training and eval towers) as eagerly.

    Example:
      >>> model = DCNv2(cross_layers=3, deep_mlp=(256, 128), low_rank=64, n_outputs=1)
      >>> embeddings = [tf.zeros([4096, 16]) for _ in range(26)]
      >>> model(tf.zeros([4096, 13]), embeddings).shape
      TensorShape([4096, 1])

    Args:
      cross_layers: cross layers, an int >= 0.
      deep_mlp: widths of the deep MLP (ReLU on every layer), ints >= 1 (may be empty); the
        output layer of ``n_outputs`` follows it.
      low_rank: 0 for full-rank ``[d, d]`` cross weights, else their rank ``r`` >= 1
        (``V [d, r]``, ``U [r, d]``).
      structure: ``"stacked"`` or ``"parallel"``.
      n_outputs: logits per sample (one per label), an int >= 1.
      seed: an int in [0, 2^63-1]; initial weights are a function of it.
      name: the module's name and its variables' prefix, a Python identifier.

    Raises:
      TypeError, ValueError: an argument is invalid; the message names it.
    """

    def __init__(self, *, cross_layers: int = 3, deep_mlp: Sequence[int] = (256, 128),
                 low_rank: int = 0, structure: str = "stacked", n_outputs: int = 1,
                 seed: int = 0, name: str = "dcn_v2"):
        super().__init__(name=check_module_name(name))
        self.cross_layers = check_int("cross_layers", cross_layers, 0)
        self.deep_mlp = check_widths("deep_mlp", deep_mlp)
        self.low_rank = check_int("low_rank", low_rank, 0)
        self.structure = check_one_of("structure", structure, STRUCTURES)
        self.n_outputs = check_int("n_outputs", n_outputs, 1)
        self.seed = check_int("seed", seed, 0, 2**63 - 1)
        self.cross = CrossNetwork(self.cross_layers, low_rank=self.low_rank, seed=self.seed,
                                  stream=stream(_CROSS), scope=f"{name}/cross", name="cross")
        self.deep = MLP(self.deep_mlp, activate_last=True, seed=self.seed, stream=stream(_DEEP),
                        scope=f"{name}/deep_mlp", name="deep_mlp")
        self.out = Dense(self.n_outputs, seed=(self.seed, stream(_OUT)), scope=f"{name}/output",
                         name="output")

    def __repr__(self) -> str:
        return format_repr(self, cross_layers=self.cross_layers, deep_mlp=self.deep_mlp,
                           low_rank=self.low_rank, structure=self.structure,
                           n_outputs=self.n_outputs, seed=self.seed, name=self.name)

    def __call__(self, dense: tf.Tensor | None, embeddings: Sequence[tf.Tensor],
                 wide: Sequence[tf.Tensor] = ()) -> tf.Tensor:
        """Logits of a batch.

        Args:
          dense: float32 ``[batch, n_dense]``, or None (or ``n_dense = 0``) for none.
          embeddings: float32 ``[batch, dim]`` tensors, one per deep feature (pooled).
          wide: must be empty (only WideDeep has a linear part).

        Returns:
          float32 ``[batch, n_outputs]``.

        Raises:
          TypeError: an input is not float32, or ``embeddings`` is not a list.
          ValueError: ``wide`` is not empty, no inputs, or an input's width differs from the
            first call's.
        """
        dense, embeddings = check_model_inputs(dense, embeddings)
        check_no_wide(wide)
        parts = ([dense] if dense is not None else []) + embeddings
        if not parts:
            fail("embeddings", "non-empty when there are no dense features", embeddings)
        with tf.name_scope(self.name):
            x0 = tf.concat(parts, 1) if len(parts) > 1 else parts[0]
            crossed = self.cross(x0)
            if self.structure == "stacked":
                h = self.deep(crossed)
            else:
                h = tf.concat([crossed, self.deep(x0)], 1)
            return self.out(h)
