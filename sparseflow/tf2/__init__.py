"""The TF2 API: sparse embedding tables for eager code and ``tf.function`` training loops,
in the shape of ``tf.tpu.experimental.embedding`` (``TableConfig``, ``FeatureConfig``, an
``Embedding`` with ``enqueue`` / ``dequeue`` / ``apply_gradients``, and its optimizers).

It needs no ``sparseflow.init()``: an :class:`Embedding` owns its tables. See
``docs/tf2-and-keras.md``.
"""

import sparseflow.autograph_rules  # noqa: F401  (our functions traced as written, not rewritten)
from sparseflow.tf2.config import FeatureConfig, TableConfig
from sparseflow.tf2.embedding import Embedding
from sparseflow.tf2.merge_shards import merge_checkpoint_shards
from sparseflow.tf2.optimizers import FTRL, SGD, Adagrad, Adam

__all__ = ["Adagrad", "Adam", "Embedding", "FTRL", "FeatureConfig", "SGD", "TableConfig",
           "merge_checkpoint_shards"]
