"""DLRM (Naumov et al., 2019): bottom MLP over dense features, pairwise dot interactions."""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from sparseflow.models.layers import (MLP, DotInteraction, check_model_inputs, check_module_name,
                                      check_no_wide, check_widths, format_repr, stream)
from sparseflow.validation import check_int, check_one_of, fail

INTERACTIONS = ("dot", "cat")
_BOTTOM, _TOP = 1, 2  # seed stream roles


class DLRM(tf.Module):
    """DLRM's dense part: bottom MLP, feature interaction, top MLP.

    ::

        dense [B, n_dense] -> bottom MLP (ReLU on every layer) -> x [B, d]
        dot: Z = [x, e_1, .., e_F]                      (T = F + 1 vectors of width d)
             features = concat(x, <z_i, z_j> for i < j)   [B, d + T (T - 1) / 2]
        cat: features = concat(x, e_1, .., e_F)
        features -> top MLP (ReLU hidden layers) -> linear -> logits [B, n_outputs]

    Without dense features (``dense`` None or ``[B, 0]``) there is no ``x``: the vectors are
    the embeddings alone and the features are their interactions (dot) or concatenation (cat).

    Variables are made on the first call (see ``sparseflow.models.layers``) and reused by
    later calls, in a tf.compat.v1 graph (training and eval towers) as eagerly.

    Example:
      >>> model = DLRM(bottom_mlp=(64, 16), top_mlp=(256, 128), n_outputs=2)
      >>> dense = tf.zeros([4096, 13])
      >>> embeddings = [tf.zeros([4096, 16]) for _ in range(26)]
      >>> model(dense, embeddings).shape
      TensorShape([4096, 2])

    Args:
      bottom_mlp: widths of the bottom MLP, ints >= 1. With dot interaction its last width
        must equal the embeddings' dim (empty: the dense features themselves are ``x``).
      top_mlp: widths of the top MLP's hidden layers, ints >= 1 (may be empty); the output
        layer of ``n_outputs`` is added.
      n_outputs: logits per sample (one per label), an int >= 1.
      interaction: ``"dot"`` or ``"cat"``.
      seed: an int in [0, 2^63-1]; initial weights are a function of it.
      name: the module's name and its variables' prefix, a Python identifier.

    Raises:
      TypeError, ValueError: an argument is invalid; the message names it.
    """

    def __init__(self, *, bottom_mlp: Sequence[int] = (64, 16),
                 top_mlp: Sequence[int] = (256, 128), n_outputs: int = 1,
                 interaction: str = "dot", seed: int = 0, name: str = "dlrm"):
        super().__init__(name=check_module_name(name))
        self.bottom_mlp = check_widths("bottom_mlp", bottom_mlp)
        self.top_mlp = check_widths("top_mlp", top_mlp)
        self.n_outputs = check_int("n_outputs", n_outputs, 1)
        self.interaction = check_one_of("interaction", interaction, INTERACTIONS)
        self.seed = check_int("seed", seed, 0, 2**63 - 1)
        self.bottom = MLP(self.bottom_mlp, activate_last=True, seed=self.seed,
                          stream=stream(_BOTTOM), scope=f"{name}/bottom_mlp", name="bottom_mlp")
        self.top = MLP(self.top_mlp + (self.n_outputs,), activate_last=False, seed=self.seed,
                       stream=stream(_TOP), scope=f"{name}/top_mlp", name="top_mlp")
        self.dot = DotInteraction()

    def __repr__(self) -> str:
        return format_repr(self, bottom_mlp=self.bottom_mlp, top_mlp=self.top_mlp,
                           n_outputs=self.n_outputs, interaction=self.interaction,
                           seed=self.seed, name=self.name)

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
          ValueError: ``wide`` is not empty; no inputs; with dot interaction: fewer than two
            vectors to interact, embeddings of different dims, or ``bottom_mlp``'s last width
            is not their dim; an input's width differs from the first call's.
        """
        dense, embeddings = check_model_inputs(dense, embeddings)
        check_no_wide(wide)
        with tf.name_scope(self.name):
            vectors = list(embeddings)
            bottom = None
            if dense is not None:
                bottom = self.bottom(dense)
                vectors.insert(0, bottom)
            if not vectors:
                fail("embeddings", "non-empty when there are no dense features", embeddings)
            if self.interaction == "cat":
                return self.top(tf.concat(vectors, 1) if len(vectors) > 1 else vectors[0])
            self._check_dot(bottom, embeddings)
            interactions = self.dot(vectors)
            features = interactions if bottom is None else tf.concat([bottom, interactions], 1)
            return self.top(features)

    def _check_dot(self, bottom, embeddings) -> None:
        dims = [int(e.shape[1]) for e in embeddings]
        if len(set(dims)) > 1:
            fail("embeddings", "tensors of one dim for dot interaction", f"dims {dims}")
        if bottom is not None and dims and bottom.shape[1] != dims[0]:
            fail("bottom_mlp", f"a list whose last width is the embeddings' dim {dims[0]} (dot "
                 "interaction; empty: n_dense must be that dim)", self.bottom_mlp)
        if len(embeddings) + (bottom is not None) < 2:
            fail("embeddings", "at least two vectors to interact (dense counts as one) for dot "
                 "interaction", f"{len(embeddings)} embedding(s), "
                 f"{'with' if bottom is not None else 'no'} dense features")
