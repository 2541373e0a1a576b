"""``SparseEmbedding``: a Keras 3 layer over one sparseflow table.

The layer takes raw int ids (any int64 value: the table hashes them) and returns their
embeddings, combined per example or per sequence position as ``sparseflow.tf2`` does. It
trains under ``model.fit`` with its own lazy sparse optimizer (``sparseflow.tf2.Adam`` ...):
the update of the rows a batch touched runs inside the backward pass (a custom gradient whose
gradient function applies it), so Keras' optimizer only ever sees one scalar "anchor"
variable, whose gradient is zero. ``model.save`` / ``load_model`` and
``save_weights`` / ``load_weights`` keep the table by key (``save_own_variables``).

Key processing happens in the layer, per call: training calls count, admit and assign rows;
``predict`` / ``evaluate`` only read (unknown keys give zeros).
"""

from __future__ import annotations

import re

import keras
import numpy as np

from sparseflow.embed.limits import TABLE_NAME_CHARS, TABLE_NAME_MAX_LEN
from sparseflow.keras import table_store
from sparseflow.keras.anchored import shaped, sparse_optimizer, train_lookup
from sparseflow.tf2.config import FeatureConfig, TableConfig
from sparseflow.tf2.embedding import Embedding
from sparseflow.validation import fail

_NOT_IN_A_TABLE_NAME = re.compile(f"[^{TABLE_NAME_CHARS}]")


@keras.saving.register_keras_serializable(package="sparseflow")
class SparseEmbedding(keras.layers.Layer):
    """Embeddings of raw int ids from a sparseflow hash table.

    Args:
      vocabulary_size: rows of the table, in [1, 1e9].
      dim: embedding width, in [1, 8192].
      initializer: a Keras initializer (object or name); default truncated normal with
        stddev ``1/sqrt(dim)``. New rows draw from it per key, deterministically.
      optimizer: the table's sparse optimizer (``sparseflow.tf2.SGD``, ``Adagrad``,
        ``Adam``, ``FTRL``); default ``Adam(0.001)``.
      combiner: "sum", "mean" or "sqrtn": how the ids of one example are combined.
      max_sequence_length: 0 to combine; > 0 for one embedding per position
        (``[batch, max_sequence_length, dim]``).
      access_threshold: as ``sparseflow.tf2.TableConfig``.
      eviction_threshold: not supported by the layer yet (it sees no timestamps): must be
        None; use ``sparseflow.tf2.Embedding`` for eviction.
      padding_key: None (every id is a key: keys are any int64 value) or the int that pads
        ``[batch, n]`` inputs (e.g. -1), ignored.
      **kwargs: Keras layer arguments (``name`` also names the table, with characters
        outside ``[A-Za-z0-9_.]`` replaced by ``_``).

    Called twice in one model (a shared layer), it applies two updates per training step,
    one per call, where ``sparseflow.tf2.Embedding`` sums the features sharing a table into
    one: Adam's and Adagrad's numbers then differ from that API's.

    Inputs: int ids ``[batch]`` or ``[batch, n]``, or a ``tf.RaggedTensor``. Output: float32 ``[batch, dim]`` (or ``[batch,
    max_sequence_length, dim]``).

    Raises:
      TypeError, ValueError: an argument is invalid.
    """

    def __init__(self, vocabulary_size: int, dim: int, initializer=None, optimizer=None,
                 combiner: str = "mean", max_sequence_length: int = 0,
                 access_threshold: int | None = None, eviction_threshold: int | None = None,
                 padding_key: int | None = None, **kwargs):
        super().__init__(**kwargs)
        if eviction_threshold is not None:
            fail("eviction_threshold", "None: the layer sees no timestamps, so it cannot "
                 "evict (use sparseflow.tf2.Embedding with preprocess(timestamp=...))",
                 eviction_threshold)
        optimizer = sparse_optimizer(optimizer)
        self.initializer = keras.initializers.get(
            initializer if initializer is not None
            else keras.initializers.TruncatedNormal(stddev=1.0 / np.sqrt(max(int(dim), 1))))
        self.optimizer = optimizer
        self._args = dict(vocabulary_size=vocabulary_size, dim=dim, combiner=combiner,
                          max_sequence_length=max_sequence_length,
                          access_threshold=access_threshold,
                          eviction_threshold=eviction_threshold, padding_key=padding_key)
        table_name = (_NOT_IN_A_TABLE_NAME.sub("_", self.name)[:TABLE_NAME_MAX_LEN]
                      or "sparse_embedding")
        self.table_config = TableConfig(vocabulary_size, dim, self.initializer,
                                        combiner=combiner, name=table_name,
                                        access_threshold=access_threshold,
                                        eviction_threshold=eviction_threshold)
        self.feature_config = FeatureConfig(self.table_config,
                                            max_sequence_length=max_sequence_length,
                                            name="ids", padding_key=padding_key)
        self.embedding = Embedding({"ids": self.feature_config}, optimizer,
                                   name=f"{table_name}_embedding")
        self.dim = int(dim)
        self.max_sequence_length = int(max_sequence_length)
        # The numpy functions have no XLA kernel: keep model.fit's "auto" jit off.
        self.supports_jit = False
        # Keras differentiates the loss w.r.t. this; its (zero) gradient runs the sparse
        # update. Not a weight of the model in any other sense.
        self.anchor = self.add_weight(name="sparse_update_anchor", shape=(),
                                      initializer="zeros", trainable=True)

    @property
    def table(self):
        """The live :class:`~sparseflow.table.SparseTable` (``stats()``, ``export()``)."""
        return self.embedding.tables[self.table_config]

    def call(self, inputs, training=None):
        batch = self.embedding.preprocess({"ids": inputs}, training=bool(training))
        if training:
            (out,) = train_lookup(self.embedding, batch, self.anchor)
        else:
            out = self.embedding.activations(batch, training=False)[0]
        return shaped(out, inputs, self.compute_output_shape)

    def compute_output_shape(self, input_shape):
        batch = tuple(input_shape)[:1]
        if self.max_sequence_length:
            return batch + (self.max_sequence_length, self.dim)
        return batch + (self.dim,)

    def get_config(self) -> dict:
        return {**super().get_config(), **self._args,
                "initializer": keras.initializers.serialize(self.initializer),
                "optimizer": self.optimizer.get_config()}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["initializer"] = keras.initializers.deserialize(config["initializer"])
        return cls(**config)

    # -- the table in .keras / .weights.h5 files -------------------------------------------

    def save_own_variables(self, store):
        super().save_own_variables(store)          # the anchor, as "0"
        table_store.save_table(store, self.table, self.embedding.world())

    def load_own_variables(self, store):
        source = f"the saved layer `{self.name}`"
        # Refused: nothing of the layer changes.
        states = table_store.read_tables([(store, self.table)], self.embedding.world(), source)
        # Not super(): it expects the store to hold the Keras variables only.
        self.anchor.assign(np.asarray(store["0"]))
        table_store.apply_tables([self.table], states, source)
