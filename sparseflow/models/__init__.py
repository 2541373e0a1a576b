"""Built-in models: the dense part of a recommendation model, from pooled embeddings to logits.

Each is a ``tf.Module`` called as ``model(dense, embeddings, wide=())`` and returning float32
logits ``[batch, n_outputs]``; see ``docs/yaml-pipelines.md``, "Built-in models".
"""

from __future__ import annotations

import tensorflow as tf

import sparseflow.autograph_rules  # noqa: F401  (our functions traced as written, not rewritten)
from sparseflow.models.dcn_v2 import DCNv2
from sparseflow.models.dlrm import DLRM
from sparseflow.models.layers import MLP, CrossNetwork, Dense, DotInteraction
from sparseflow.models.pooling import COMBINERS, pool
from sparseflow.models.wide_deep import WideDeep
from sparseflow.validation import check_int, check_one_of, fail

MODELS = {"dlrm": DLRM, "wide_deep": WideDeep, "dcn_v2": DCNv2}

# YAML keys per model (the constructor's, less n_outputs/seed/name), and keys read elsewhere.
_KEYS = {"dlrm": ("bottom_mlp", "top_mlp", "interaction"),
         "wide_deep": ("deep_mlp",),
         "dcn_v2": ("cross_layers", "deep_mlp", "low_rank", "structure")}
_PIPELINE_KEYS = {"wide_deep": ("wide_features",)}  # the pipeline's: which features are wide


def build_model(name: str, params: dict, *, n_outputs: int, seed: int = 0) -> tf.Module:
    """Builds a built-in model from its YAML keys.

    Args:
      name: ``"dlrm"``, ``"wide_deep"`` or ``"dcn_v2"``.
      params: the model's YAML keys other than ``name`` (lists are taken as tuples; the dict
        is not modified). ``wide_deep``'s ``wide_features`` is accepted and ignored here: the
        pipeline routes those features to the ``wide`` argument.
      n_outputs: logits per sample (one per label), an int >= 1.
      seed: the initial weights' seed, an int in [0, 2^63-1].

    Returns:
      The model (``DLRM``, ``WideDeep`` or ``DCNv2``), its module name ``name``.

    Raises:
      TypeError: ``params`` is not a dict, or a value has the wrong type.
      ValueError: ``name`` is unknown, ``params`` has a key the model does not take, or a
        value is out of range; the message names the key.
    """
    check_one_of("name", name, list(MODELS))
    if not isinstance(params, dict):
        fail("params", "a dict of the model's keys", params, TypeError)
    allowed = _KEYS[name] + _PIPELINE_KEYS.get(name, ())
    for key in params:
        if key not in allowed:
            fail("params", f"a dict with keys among {', '.join(allowed)} (model {name!r})", key)
    kwargs = {k: tuple(v) if isinstance(v, list) else v
              for k, v in params.items() if k in _KEYS[name]}
    return MODELS[name](**kwargs, n_outputs=check_int("n_outputs", n_outputs, 1),
                        seed=seed, name=name)


__all__ = ["COMBINERS", "DLRM", "MLP", "MODELS", "CrossNetwork", "DCNv2", "Dense",
           "DotInteraction", "WideDeep", "build_model", "pool"]
