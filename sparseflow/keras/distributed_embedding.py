"""``DistributedEmbedding``: one Keras 3 layer over several sparseflow tables.

Where ``SparseEmbedding`` is one table per layer, this layer holds every table of a model and
looks all its features up at once, as keras-rs's ``DistributedEmbedding`` and TPUEmbedding
group their lookups. Under the hood it is one :class:`sparseflow.tf2.Embedding`: per training
step one key-processing numpy function, one gather and one sparse update for every table, and
over several ranks one exchange of keys and rows (where 26 ``SparseEmbedding`` layers make 26).

The sparse update runs in the backward pass through the same zero-gradient anchor variable as
``SparseEmbedding``; ``model.save`` / ``load_model`` and ``save_weights`` / ``load_weights``
keep every table by key, each table in a group of the layer's variables named after it.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from sparseflow.embed.initializers import init_spec_from_tf
from sparseflow.embed.table_config import check_table_name
from sparseflow.keras import table_store
from sparseflow.keras.anchored import shaped, sparse_optimizer, train_lookup
from sparseflow.tf2.config import FeatureConfig, TableConfig
from sparseflow.tf2.embedding import Embedding
from sparseflow.tf2.optimizers import optimizer_from_config
from sparseflow.validation import fail

# The Keras classes a tf.compat.v1 / TF2-core initializer may be rebuilt as, found by the
# name of its own class or of the class implementing it (the per-key rows are checked equal).
_KERAS_EQUIVALENTS = ("TruncatedNormal", "RandomNormal", "RandomUniform", "Constant", "Zeros",
                      "Ones", "VarianceScaling", "GlorotUniform", "GlorotNormal", "HeNormal",
                      "HeUniform", "LecunNormal", "LecunUniform")
_SEEDS_TO_COMPARE = (0, 2**63 + 5)   # a seedless initializer must stay seedless
# Each table's arrays go in this group of the layer's variables, under the table's name.
TABLES_GROUP = "tables"
TABLE_NAMES = "table_names"
_NOT_A_GROUP_NAME = (".", "..")


@keras.saving.register_keras_serializable(package="sparseflow")
class DistributedEmbedding(keras.layers.Layer):
    """Embeddings of several features' raw int ids from sparseflow tables, in one layer.

    Args:
      feature_configs: ``{feature name: sparseflow.tf2.FeatureConfig}``; several features
        may share a table. The layer is called with a dict of the same keys and returns a
        dict of their activations. The dict's keys name the features (a config's own
        ``name`` is replaced by its key; the caller's config is not changed).
      optimizer: the sparse optimizer of tables whose ``TableConfig`` sets none
        (``sparseflow.tf2.SGD``, ``Adagrad``, ``Adam``, ``FTRL``); default ``Adam(0.001)``.
      **kwargs: Keras layer arguments (``name`` ...).

    Each table's initializer must be a Keras initializer, or a TensorFlow one with a Keras
    equivalent (``TableConfig``'s default truncated normal has one), so that ``model.save``
    can write it; tables must not set ``eviction_threshold`` (the layer sees no timestamps)
    and must be named, other than ``.`` and ``..``.

    Every training step updates the rows of every feature the batch looked up, as
    ``sparseflow.tf2.Embedding.apply_gradients`` does: a feature the loss does not use gets a
    zero gradient, which still moves rows under Adam's momentum or a weight decay. Leave
    such a feature out of the layer.

    Inputs: ``{feature name: ids}``, each ``[batch]`` or ``[batch, n]`` int, or a
    ``tf.RaggedTensor``. Output: ``{feature name: float32 [batch, dim]}`` (``[batch,
    max_sequence_length, dim]`` for a sequence feature; ``output_shape + [dim]`` when set).

    Raises:
      TypeError, ValueError: an argument is invalid, naming it.
    """

    def __init__(self, feature_configs, optimizer=None, **kwargs):
        super().__init__(**kwargs)
        if (not isinstance(feature_configs, dict) or not feature_configs
                or not all(isinstance(k, str) for k in feature_configs)
                or not all(isinstance(f, FeatureConfig) for f in feature_configs.values())):
            fail("feature_configs", "a non-empty dict of feature name (str) to "
                 "sparseflow.tf2.FeatureConfig", feature_configs, TypeError)
        for key in feature_configs:   # the keys name the features
            check_table_name(key, "feature_configs")
        optimizer = sparse_optimizer(optimizer)
        self.optimizer = optimizer
        tables: list[TableConfig] = []
        for f in feature_configs.values():
            if not any(f.table is t for t in tables):
                tables.append(f.table)
        for table in tables:
            if table.name is None or table.name in _NOT_A_GROUP_NAME:
                fail("feature_configs", "tables named other than '.' and '..' (a saved layer "
                     "keeps each table in a group of that name)", table)
            if table.eviction_threshold is not None:
                fail("eviction_threshold", f"None for table `{table.name}`: the layer sees no "
                     f"timestamps, so it cannot evict (use sparseflow.tf2.Embedding with "
                     f"preprocess(timestamp=...))", table.eviction_threshold)
        self._keras_initializers = [_keras_initializer(t) for t in tables]
        self._table_configs = tables
        # Named by their keys: copies, the caller's configs stay as they were.
        self.feature_configs = {
            name: FeatureConfig(f.table, max_sequence_length=f.max_sequence_length,
                                output_shape=f.output_shape, name=name,
                                padding_key=f.padding_key)
            for name, f in feature_configs.items()}
        self.embedding = Embedding(self.feature_configs, optimizer,
                                   name=f"{self.name}_embedding")
        self.supports_jit = False   # numpy functions have no XLA kernel
        self.anchor = self.add_weight(name="sparse_update_anchor", shape=(),
                                      initializer="zeros", trainable=True)

    @property
    def tables(self) -> dict:
        """``{table name: SparseTable}``: the live tables (``stats()``, ``export()``)."""
        return {t.table_name: t for t in self.embedding.tables.values()}

    def call(self, inputs, training=None):
        if not isinstance(inputs, dict) or set(inputs) != set(self.feature_configs):
            fail("inputs", f"a dict with exactly the keys {sorted(self.feature_configs)}",
                 sorted(inputs) if isinstance(inputs, dict) else inputs, TypeError)
        batch = self.embedding.preprocess(dict(inputs), training=bool(training))
        if training:
            activations = train_lookup(self.embedding, batch, self.anchor)
        else:
            activations = self.embedding.activations(batch, training=False)
        # The Embedding's features, and so its activations, are in tf.nest's order of the
        # dict (sorted keys), not the order the dict was written in.
        outputs = tf.nest.pack_sequence_as(self.feature_configs, activations)
        return {name: shaped(out, inputs[name],
                             lambda shape, name=name: self._shape_of(name, shape))
                for name, out in outputs.items()}

    def _shape_of(self, name: str, input_shape: tuple) -> tuple:
        f = self.feature_configs[name]
        if f.output_shape is not None:
            return tuple(f.output_shape) + (f.table.dim,)
        if f.max_sequence_length:
            return tuple(input_shape)[:1] + (f.max_sequence_length, f.table.dim)
        return tuple(input_shape)[:1] + (f.table.dim,)

    def compute_output_shape(self, input_shape):
        return {name: self._shape_of(name, tuple(input_shape[name]))
                for name in self.feature_configs}

    def get_config(self) -> dict:
        tables = [{"name": t.name, "vocabulary_size": t.vocabulary_size, "dim": t.dim,
                   "initializer": keras.initializers.serialize(init),
                   "optimizer": None if t.optimizer is None else t.optimizer.get_config(),
                   "combiner": t.combiner,
                   "access_threshold": None if t.access_threshold < 0 else t.access_threshold}
                  for t, init in zip(self._table_configs, self._keras_initializers)]
        features = {name: {"table": f.table.name,
                           "max_sequence_length": f.max_sequence_length,
                           "output_shape": f.output_shape, "padding_key": f.padding_key}
                    for name, f in self.feature_configs.items()}
        return {**super().get_config(), "tables": tables, "feature_configs": features,
                "optimizer": self.optimizer.get_config()}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        tables = {}
        for t in config.pop("tables"):
            t = dict(t)
            t["initializer"] = keras.initializers.deserialize(t["initializer"])
            if t["optimizer"] is not None:
                t["optimizer"] = optimizer_from_config(t["optimizer"])
            tables[t["name"]] = TableConfig(**t)
        features = {name: FeatureConfig(tables[f["table"]],
                                        max_sequence_length=f["max_sequence_length"],
                                        output_shape=f["output_shape"], name=name,
                                        padding_key=f["padding_key"])
                    for name, f in config.pop("feature_configs").items()}
        return cls(features, **config)

    # -- the tables in .keras / .weights.h5 files: one group per table, by its name ---------

    def save_own_variables(self, store):
        super().save_own_variables(store)          # the anchor, as "0"
        world = self.embedding.world()
        # The store lists no groups: the tables' names, as UTF-8 bytes of "a,b,...".
        store[TABLE_NAMES] = np.frombuffer(",".join(self.tables).encode(), np.uint8)
        for name, table in self.tables.items():
            table_store.save_table(table_store.Prefixed(store, f"{TABLES_GROUP}/{name}"),
                                   table, world)

    def load_own_variables(self, store):
        tables = self.tables
        saved = (sorted(bytes(np.asarray(store[TABLE_NAMES], np.uint8)).decode().split(","))
                 if TABLE_NAMES in store.keys() else [])
        if saved != sorted(tables):
            raise ValueError(
                f"The saved layer `{self.name}` holds the tables {saved}; this layer has "
                f"{sorted(tables)}. Weights load into a layer with the same tables (nothing "
                f"was loaded).")
        states = table_store.read_tables(
            [(table_store.Prefixed(store, f"{TABLES_GROUP}/{name}"), table)
             for name, table in tables.items()],
            self.embedding.world(), f"the saved layer `{self.name}`")
        # Not super(): it expects the store to hold the Keras variables only.
        self.anchor.assign(store["0"])
        table_store.apply_tables(list(tables.values()), states, f"the saved layer "
                                                                f"`{self.name}`")


def _keras_initializer(table: TableConfig):
    """``table``'s initializer as a Keras initializer drawing the same rows.

    Raises:
      TypeError: it has no Keras equivalent.
    """
    init = table.initializer
    if isinstance(init, keras.initializers.Initializer):
        return init
    shape = (table.vocabulary_size, table.dim)
    owner = next((k for k in type(init).__mro__ if "__call__" in k.__dict__), type(init))
    config = init.get_config() if callable(getattr(init, "get_config", None)) else None
    names = dict.fromkeys((type(init).__name__, owner.__name__)) if config is not None else ()
    for name in names:
        if name not in _KERAS_EQUIVALENTS:
            continue
        try:
            equivalent = getattr(keras.initializers, name)(
                **{k: v for k, v in config.items() if k != "dtype"})
            if all(init_spec_from_tf(init, shape, seed) == init_spec_from_tf(equivalent, shape,
                                                                              seed)
                   for seed in _SEEDS_TO_COMPARE):
                return equivalent
        except (TypeError, ValueError):
            continue
    fail("initializer", f"a Keras initializer (keras.initializers.*) for table "
         f"`{table.name}`, or a TensorFlow one with a Keras equivalent, so that the "
         f"layer's config can be saved", init, TypeError)
