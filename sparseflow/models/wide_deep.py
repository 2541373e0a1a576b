"""Wide & Deep (Cheng et al., 2016): a linear part over sparse features plus a deep MLP."""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from sparseflow.models.layers import (MLP, check_graph, check_model_inputs, check_module_name,
                                      check_widths, creation_scope, format_repr, stream,
                                      zeros_variable)
from sparseflow.validation import check_int, fail

_DEEP = 1  # seed stream role


class WideDeep(tf.Module):
    """Wide & Deep: ``logits = deep + wide``.

    ::

        deep = concat(e_1, .., e_F, dense) -> ReLU MLP -> linear  [B, n_outputs]
        wide = w_1 + .. + w_W + bias                              [B, 1] + [n_outputs]

    The wide inputs ``w_i`` are the per-sample weights of the linear features: lookups in
    dim-1 tables (pooled with ``sum`` for a multi-hot feature), one ``[B, 1]`` tensor each;
    their sum is broadcast to every output.

    Variables are made on the first call (see ``sparseflow.models.layers``) and reused by
    later calls, in a tf.compat.v1 graph (training and eval towers) as eagerly.

    Example:
      >>> model = WideDeep(deep_mlp=(256, 128), n_outputs=1)
      >>> embeddings = [tf.zeros([4096, 16]) for _ in range(26)]
      >>> wide = [tf.zeros([4096, 1]) for _ in range(26)]   # dim-1 table lookups
      >>> model(tf.zeros([4096, 13]), embeddings, wide).shape
      TensorShape([4096, 1])

    Args:
      deep_mlp: widths of the deep MLP's hidden layers, ints >= 1 (may be empty); the output
        layer of ``n_outputs`` is added.
      n_outputs: logits per sample (one per label), an int >= 1.
      seed: an int in [0, 2^63-1]; initial weights are a function of it.
      name: the module's name and its variables' prefix, a Python identifier.

    Raises:
      TypeError, ValueError: an argument is invalid; the message names it.
    """

    def __init__(self, *, deep_mlp: Sequence[int] = (256, 128), n_outputs: int = 1,
                 seed: int = 0, name: str = "wide_deep"):
        super().__init__(name=check_module_name(name))
        self.deep_mlp = check_widths("deep_mlp", deep_mlp)
        self.n_outputs = check_int("n_outputs", n_outputs, 1)
        self.seed = check_int("seed", seed, 0, 2**63 - 1)
        self.deep = MLP(self.deep_mlp + (self.n_outputs,), activate_last=False, seed=self.seed,
                        stream=stream(_DEEP), scope=f"{name}/deep_mlp", name="deep_mlp")
        self.wide_bias: tf.Variable | None = None

    def __repr__(self) -> str:
        return format_repr(self, deep_mlp=self.deep_mlp, n_outputs=self.n_outputs,
                           seed=self.seed, name=self.name)

    def __call__(self, dense: tf.Tensor | None, embeddings: Sequence[tf.Tensor],
                 wide: Sequence[tf.Tensor] = ()) -> tf.Tensor:
        """Logits of a batch.

        Args:
          dense: float32 ``[batch, n_dense]``, or None (or ``n_dense = 0``) for none.
          embeddings: float32 ``[batch, dim]`` tensors, one per deep feature (pooled).
          wide: float32 ``[batch, 1]`` tensors, one per linear feature (may be empty: the
            linear part is then its bias alone).

        Returns:
          float32 ``[batch, n_outputs]``.

        Raises:
          TypeError: an input is not float32, or ``embeddings``/``wide`` is not a list.
          ValueError: no deep inputs, a ``wide`` tensor is not ``[batch, 1]``, or an input's
            width differs from the first call's.
        """
        dense, embeddings = check_model_inputs(dense, embeddings)
        if not isinstance(wide, (list, tuple)):
            fail("wide", "a list of float32 [batch, 1] tensors", type(wide).__name__, TypeError)
        wide = [tf.convert_to_tensor(w) for w in wide]
        for i, w in enumerate(wide):
            if w.dtype != tf.float32:
                fail(f"wide[{i}]", "a float32 tensor", f"dtype {w.dtype.name}", TypeError)
            if w.shape.rank != 2 or w.shape[1] != 1:
                fail(f"wide[{i}]", "a [batch, 1] tensor", f"shape {w.shape}")
        deep_inputs = embeddings + ([dense] if dense is not None else [])
        if not deep_inputs:
            fail("embeddings", "non-empty when there are no dense features", embeddings)
        with tf.name_scope(self.name):
            x = tf.concat(deep_inputs, 1) if len(deep_inputs) > 1 else deep_inputs[0]
            deep = self.deep(x)
            if self.wide_bias is None:
                with creation_scope(f"{self.name}/wide"):
                    self.wide_bias = zeros_variable(self.n_outputs, "bias")
            else:
                check_graph(self.wide_bias, f"{self.name}/wide")
            if not wide:
                return tf.nn.bias_add(deep, self.wide_bias)
            # Plain broadcasting adds: grappler mis-rewrites BiasAdd(deep + [B, 1] sum).
            linear = (tf.add_n(wide) if len(wide) > 1 else wide[0]) + self.wide_bias
            return deep + linear
