"""Keras 3 layers over sparseflow tables: ``SparseEmbedding`` (one table per layer) and
``DistributedEmbedding`` (every table of a model in one layer, one exchange per step). See
docs/tf2-and-keras.md."""

import sparseflow.autograph_rules  # noqa: F401  (our functions traced as written, not rewritten)
from sparseflow.keras.distributed_embedding import DistributedEmbedding
from sparseflow.keras.layers import SparseEmbedding
from sparseflow.keras.merge_shards import merge_weight_shards

__all__ = ["DistributedEmbedding", "SparseEmbedding", "merge_weight_shards"]
