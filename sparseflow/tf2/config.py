"""``TableConfig`` and ``FeatureConfig`` of the TF2 API (``tf.tpu.experimental.embedding``'s).

A table is a sparseflow hash table: keys are any int64 (not row numbers), rows are assigned as
keys arrive, with admission (``access_threshold``) and eviction (``eviction_threshold``, with
a timestamp) as in the Rec SDK API. ``vocabulary_size`` is the table's capacity in rows.
Several features may share one table.
"""

from __future__ import annotations

import math

import tensorflow as tf

from sparseflow.embed.limits import (ACCESS_THRESHOLD_MAX, ACCESS_THRESHOLD_MIN,
                                     EVICTION_THRESHOLD_MAX, MAX_DIM, MAX_VOCABULARY_SIZE)
from sparseflow.embed.table_config import check_table_name
from sparseflow.tf2.optimizers import OPTIMIZERS
from sparseflow.validation import INT32_MAX, check_int, check_one_of, fail, is_int

COMBINERS = ("sum", "mean", "sqrtn")


class TableConfig:
    """One embedding table.

    Args:
      vocabulary_size: rows the table holds, in [1, 1e9] (keys beyond it raise
        ``TableFullError`` unless admission or eviction keeps them out).
      dim: embedding width, in [1, 8192].
      initializer: a TF/Keras initializer; default truncated normal with stddev
        ``1/sqrt(dim)`` (TPUEmbedding's default). Rows draw from it per key, deterministically.
      optimizer: this table's optimizer (``sparseflow.tf2.SGD``, ``Adagrad``, ``Adam``,
        ``FTRL``), overriding the Embedding's; None to use the Embedding's.
      combiner: how a multi-hot feature's embeddings are combined: "sum", "mean" or "sqrtn".
      name: 1–100 characters of ``[A-Za-z0-9_.]``; default ``table_<i>`` by position.
      access_threshold: admission: a key gets a row once seen this many times; None or -1
        for every key at once.
      eviction_threshold: keys unseen for this long (timestamp units) are removed by
        ``Embedding.evict()``; None for no eviction.

    Raises:
      TypeError, ValueError: an argument is invalid.
    """

    def __init__(self, vocabulary_size: int, dim: int, initializer=None, optimizer=None,
                 combiner: str = "mean", name: str | None = None,
                 access_threshold: int | None = None, eviction_threshold: int | None = None):
        self.vocabulary_size = check_int("vocabulary_size", vocabulary_size, 1,
                                         MAX_VOCABULARY_SIZE)
        self.dim = check_int("dim", dim, 1, MAX_DIM)
        if initializer is None:
            initializer = tf.compat.v1.truncated_normal_initializer(
                stddev=1.0 / math.sqrt(self.dim))
        self.initializer = initializer
        if optimizer is not None and not isinstance(optimizer, OPTIMIZERS):
            fail("optimizer", "None or one of sparseflow.tf2.SGD, Adagrad, Adam, FTRL",
                 optimizer, TypeError)
        self.optimizer = optimizer
        self.combiner = check_one_of("combiner", combiner, COMBINERS)
        self.name = None if name is None else check_table_name(name)
        self.access_threshold = (-1 if access_threshold is None
                                 else check_int("access_threshold", access_threshold,
                                                ACCESS_THRESHOLD_MIN, ACCESS_THRESHOLD_MAX))
        self.eviction_threshold = (None if eviction_threshold is None
                                   else check_int("eviction_threshold", eviction_threshold,
                                                  0, EVICTION_THRESHOLD_MAX))

    def __repr__(self) -> str:
        return (f"TableConfig(vocabulary_size={self.vocabulary_size}, dim={self.dim}, "
                f"combiner={self.combiner!r}, name={self.name!r})")


class FeatureConfig:
    """One feature looked up in a table.

    Args:
      table: its :class:`TableConfig` (features may share one).
      max_sequence_length: 0 for a pooled feature (its ids combined by the table's combiner
        into one ``[dim]`` vector per example); > 0 for a sequence feature: one embedding per
        position, ``[batch, max_sequence_length, dim]``, longer sequences truncated, missing
        positions zeros.
      output_shape: None, or the shape the activations are reshaped to before ``dim``: a
        list of positive ints whose product is the number of vectors a batch yields (the
        batch size for a pooled feature, batch x ``max_sequence_length`` for a sequence
        feature), e.g. ``[4, 1]`` for a batch of 4.
      name: the feature's name (messages, checkpoints); default its position.
      padding_key: None (every id of a dense input is a key: keys are any int64 value), or
        the int that pads dense ``[batch, n]`` inputs to n ids (e.g. -1); ids equal to it
        are ignored. Sparse and ragged inputs need no padding.

    Raises:
      TypeError, ValueError: an argument is invalid.
    """

    def __init__(self, table: TableConfig, max_sequence_length: int = 0, output_shape=None,
                 name: str | None = None, padding_key: int | None = None):
        if not isinstance(table, TableConfig):
            fail("table", "a sparseflow.tf2.TableConfig", table, TypeError)
        self.table = table
        self.max_sequence_length = check_int("max_sequence_length", max_sequence_length, 0,
                                             INT32_MAX)
        if output_shape is not None:
            if isinstance(output_shape, tf.TensorShape):
                output_shape = output_shape.as_list()
            if (not isinstance(output_shape, (list, tuple)) or not output_shape
                    or not all(is_int(d) for d in output_shape)):
                fail("output_shape", "None or a non-empty list of positive ints",
                     output_shape, TypeError)
            if not all(int(d) >= 1 for d in output_shape):
                fail("output_shape", "None or a non-empty list of positive ints",
                     output_shape)
            output_shape = [int(d) for d in output_shape]
        self.output_shape = output_shape
        self.name = None if name is None else check_table_name(name, "name")
        self.padding_key = (None if padding_key is None
                            else check_int("padding_key", padding_key, -(2**63), 2**63 - 1))

    def __repr__(self) -> str:
        return (f"FeatureConfig(table={self.table!r}, max_sequence_length="
                f"{self.max_sequence_length}, name={self.name!r})")
