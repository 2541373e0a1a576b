"""Keras 3 layers over sparseflow tables (``SparseEmbedding``). See docs/tf2-and-keras.md."""

from sparseflow.keras.layers import SparseEmbedding
from sparseflow.keras.merge_shards import merge_weight_shards

__all__ = ["SparseEmbedding", "merge_weight_shards"]
