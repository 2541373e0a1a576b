"""Keras 3 layers over sparseflow tables (``SparseEmbedding``). See docs/tf2-and-keras.md."""

from sparseflow.keras.layers import SparseEmbedding

__all__ = ["SparseEmbedding"]
