"""``Embedding``: the TF2 mid-level API, in the shape of TPUEmbedding's.

Per batch, in this order:

1. :meth:`Embedding.preprocess` — in a ``tf.data`` map (or inline, by :meth:`enqueue` given
   raw ids): one ``tf.numpy_function`` runs every table's key processor (dedup, admission
   counts, timestamps, key → row) over the ids of the features sharing it, and the batch
   becomes per table its unique rows, per feature each id's position among them
   (``restore``) and the example (or sequence slot) it belongs to (``segments``).
2. :meth:`Embedding.enqueue` — remembers the processed batch.
3. :meth:`Embedding.dequeue` — compiled ops (per embedding width, its tables split over
   one op per core: ``ops/op_shards.py``) gather every feature's embeddings from the host
   rows (``ops/batch_ops.py``), then TF ops combine them per example (sum / mean / sqrtn) or
   place them per sequence position: the activations.
4. :meth:`Embedding.apply_gradients` — given the gradients of the loss w.r.t. the
   activations (``tape.gradient(loss, activations)``), TF ops spread each back to its ids,
   compiled ops split the same way sum them per unique row (features of one table together), and
   each table's lazy sparse optimizer applies them there (a compiled op for lazy Adam,
   ``ops/optimizer_ops.py``; a numpy function running the numba kernel otherwise).

Everything works eagerly and inside ``tf.function`` (including a ``tf.range`` loop). The rows
are host rows updated by the same numba kernels as the Rec SDK API, so both APIs give the same
numbers. State lives outside TF variables; the Embedding is a ``tf.Module`` that
``tf.train.Checkpoint`` saves and restores (its tables, by key, like ``sparseflow.Saver``).
"""

from __future__ import annotations

import functools

import numpy as np
import tensorflow as tf

from sparseflow import tensor_buffers
from sparseflow.checkpoint import table_state
from sparseflow.distributed import op_chains
from sparseflow.ops.op_shards import width_shards
from sparseflow.optimizers.base import host_update_by_optimizer
from sparseflow.pipeline.batch_clock import batch_timestamp, no_timestamp
from sparseflow.pipeline.key_processor import borrow_scratch, process_tables
from sparseflow.row_sums import sum_rows_by_index
from sparseflow.table import SparseTable, host_table
from sparseflow.tf2 import saved_state
from sparseflow.tf2.config import FeatureConfig, TableConfig
from sparseflow.tf2.optimizers import OPTIMIZERS
from sparseflow.tf2.sharding import states_for_this_rank
from sparseflow.validation import fail
from sparseflow.weak_owner import weak

# A processed batch carries one of these keys: its channel, readable at trace time (a key of
# the dict, not a tensor's value).
_TRAINING_MARK = "__sparseflow_tf2_training__"
_EVALUATION_MARK = "__sparseflow_tf2_evaluation__"


class _Feature:
    """A feature's static facts: its config, name, table and its slot among the table's."""

    def __init__(self, config: FeatureConfig, name: str, table: SparseTable, table_index: int):
        self.config = config
        self.name = name
        self.table = table
        self.table_index = table_index
        self.dim = table.dim
        self.combiner = config.table.combiner
        self.max_len = config.max_sequence_length


def _in_own_chain(method):
    """Builds ``method``'s stateful ops in the Embedding's own op chain (``op_chains``)."""
    @functools.wraps(method)
    def in_chain(self, *args, **kwargs):
        with op_chains.chain(self._chain):
            return method(self, *args, **kwargs)

    return in_chain


class Embedding(tf.Module):
    """Sparse embedding tables for TF2 training loops (TPUEmbedding's mid-level API).

    Args:
      feature_config: a :class:`FeatureConfig` or a nested structure (dict, list, tuple) of
        them; activations come back in the same structure.
      optimizer: the default optimizer (``sparseflow.tf2.SGD``, ``Adagrad``, ``Adam``,
        ``FTRL``) for tables that set none; may be None if every table sets one, or if the
        Embedding only serves.
      name: the module's name.

    Over several ranks (``sparseflow launch``, ``TF_CONFIG``) create it under
    ``tf.distribute.MultiWorkerMirroredStrategy().scope()`` (one replica per rank): each
    rank then holds the keys ``key mod N`` of every table, and every batch's keys travel to
    their owners and rows back on the strategy's collectives (``sharding.py``, and
    docs/multi-worker.md); dense gradients are the training loop's to all-reduce.

    Raises:
      RuntimeError: several ranks and no such strategy.
      TypeError, ValueError: a config is invalid, two tables share a name, or a table has
        no optimizer while training needs one (at :meth:`apply_gradients`).
    """

    def __init__(self, feature_config, optimizer=None, name: str = "sparseflow_embedding"):
        from sparseflow.tf2.sharding import Tf2Sharding
        sharding = Tf2Sharding.for_process("sparseflow.tf2.Embedding")
        super().__init__(name=name)
        # Its stateful ops keep their order among themselves only, so that several
        # Embeddings' (Keras layers') key processing and exchanges run side by side.
        self._chain = op_chains.unique_name(self.name)
        if optimizer is not None and not isinstance(optimizer, OPTIMIZERS):
            fail("optimizer", "None or one of sparseflow.tf2.SGD, Adagrad, Adam, FTRL",
                 optimizer, TypeError)
        # Not tracked by tf.Module (which would wrap it): dequeue() returns this structure.
        self._feature_config = self._no_dependency(feature_config)
        flat = tf.nest.flatten(feature_config)
        if not flat or not all(isinstance(f, FeatureConfig) for f in flat):
            fail("feature_config", "a FeatureConfig or a nested structure of them",
                 feature_config, TypeError)
        self._table_configs: list[TableConfig] = []
        for f in flat:
            if not any(f.table is t for t in self._table_configs):
                self._table_configs.append(f.table)
        names = [t.name or f"table_{i}" for i, t in enumerate(self._table_configs)]
        if len(set(names)) != len(names):
            fail("feature_config", "tables with distinct names", names)
        kernels = {}   # one kernel optimizer per optimizer description (per-table step counts)
        self._tables: list[SparseTable] = []
        for config, table_name in zip(self._table_configs, names):
            self._tables.append(self._make_table(config, table_name,
                                                 config.optimizer or optimizer, kernels))
        self._features: list[_Feature] = []
        for i, f in enumerate(flat):
            t = next(j for j, c in enumerate(self._table_configs) if c is f.table)
            self._features.append(_Feature(f, f.name or f"feature_{i}", self._tables[t], t))
        self._by_table = [[k for k, f in enumerate(self._features) if f.table_index == t]
                          for t in range(len(self._tables))]
        # The tables by embedding width, each width's split over a few ops that TensorFlow
        # runs side by side (ops/op_shards.py; a table in one op only: the op releases its
        # batch). Per op, the batch kernels' members (``ops/batch_kernels.py``): the
        # gather's features in feature order, one output; the gradient sum's by table.
        n_tables = len(self._tables)

        def layout(features):
            return _layout([(self._features[k].table_index, n_tables + k) for k in features])

        self._dim_groups, self._gather_layouts, self._sum_groups = [], [], []
        for dim, table_ids in width_shards([t.dim for t in self._tables],
                                           [len(m) for m in self._by_table]):
            chosen = set(table_ids)
            gathered = [k for k, f in enumerate(self._features) if f.table_index in chosen]
            self._dim_groups.append((dim, gathered))
            self._gather_layouts.append(layout(gathered))
            summed = [k for t in table_ids for k in self._by_table[t]]
            self._sum_groups.append((dim, table_ids, summed, layout(summed)))
        names = [f.name for f in self._features]
        if len(set(names)) != len(names):
            fail("feature_config", "features with distinct names", names)
        self._enqueued = None
        self._dequeued = None
        # Over several ranks: the routing of keys to their owners (None in one process).
        self._sharding = self._no_dependency(
            sharding.bind(self._tables, [f.table_index for f in self._features])
            if sharding is not None else None)

    @staticmethod
    def _make_table(config: TableConfig, name: str, optimizer, kernels: dict) -> SparseTable:
        if optimizer is not None and id(optimizer) not in kernels:
            kernels[id(optimizer)] = optimizer.build()
        return host_table(name, config.dim, config.initializer, config.vocabulary_size,
                          access_threshold=config.access_threshold,
                          eviction_threshold=config.eviction_threshold,
                          optimizer=None if optimizer is None else kernels[id(optimizer)],
                          size_hint="vocabulary_size")

    # -- what users read -----------------------------------------------------------------

    @property
    def tables(self) -> dict:
        """``{TableConfig: SparseTable}``: the live tables (``stats()``, ``export()``)."""
        return dict(zip(self._table_configs, self._tables))

    @property
    def embedding_tables(self) -> dict:
        """``{TableConfig: tf.Variable [vocabulary_size, dim]}`` for serving on the CPU with
        ``tf.nn.embedding_lookup``: row i holds key i's embedding, zeros for a key the table
        does not hold (as a lookup of it returns). Only keys in ``[0, vocabulary_size)``
        appear; a table of hashed keys is read with ``tables[config].export()``."""
        out = {}
        for config, table in zip(self._table_configs, self._tables):
            keys = np.arange(config.vocabulary_size, dtype=np.int64)
            rows = table.processor.lookup(keys)
            out[config] = tf.Variable(table.rows.gather(rows.astype(np.int32)),
                                      trainable=False, name=f"{table.table_name}_serving")
        return out

    def reserve_memory(self) -> None:
        """Commits every table's row memory now rather than page by page as rows are first
        written (see ``SparseTable.reserve_memory``): steadier step times from the first
        batch, ``vocabulary_size x dim x (1 + optimizer slots) x 4`` bytes per table."""
        for table in self._tables:
            with table.processor.lock:
                table.rows.commit_memory(table.processor.rows_ever_used)

    def evict(self) -> dict:
        """Removes, in every table with an ``eviction_threshold``, the keys unseen for that
        long (by the timestamps given to :meth:`preprocess`). Returns ``{table name:
        EvictionResult}``."""
        return {t.table_name: t.processor.evict(t.eviction_threshold)
                for t in self._tables if t.eviction_threshold >= 0}

    # -- 1. key processing ---------------------------------------------------------------

    @_in_own_chain
    def preprocess(self, features, training: bool = True, timestamp=None) -> dict:
        """The key processing of one batch of raw ids, as a ``tf.data`` map function.

        Args:
          features: ids in the structure of ``feature_config``: per feature an int tensor
            ``[batch]`` or ``[batch, n]`` (dense: n ids per example, every one a key unless
            it equals the feature's ``padding_key``), a ``tf.SparseTensor`` or a
            ``tf.RaggedTensor`` ``[batch, None]``. Keys are any int64 value.
          training: the training channel (counts keys, admits them, assigns rows) or
            evaluation (reads only: unknown keys look up zeros).
          timestamp: for eviction, the batch's time: an int scalar, or every example's
            time (an int tensor ``[batch]``), of which the latest is the batch's; or None.

        Returns:
          A flat dict of tensors, to pass to :meth:`enqueue`.

        Raises:
          TypeError, ValueError: ``features`` does not match ``feature_config``, or
            ``training`` is not a Python bool.
        """
        if not isinstance(training, bool):
            fail("training", "a Python bool (the channel is fixed when the map is traced)",
                 training, TypeError)
        flat = self._flatten(features)
        parts = [self._ids_and_segments(f, x) for f, x in zip(self._features, flat)]
        ts = no_timestamp() if timestamp is None else batch_timestamp(timestamp)
        n_tables, n_features = len(self._tables), len(self._features)
        if self._sharding is not None:   # keys go to their owners in the step
            mark = _TRAINING_MARK if training else _EVALUATION_MARK
            out = {mark: tf.constant(True)}
            out.update(self._sharding.route(ts, [p[0] for p in parts], timestamp is not None))
            for f, (_, segments, n_segments) in zip(self._features, parts):
                if segments is not None:
                    out[f"segments/{f.name}"] = segments
                    out[f"n_segments/{f.name}"] = n_segments
            return out

        # Features in table order, for one dedup over every table.
        order = [k for t in range(n_tables) for k in self._by_table[t]]
        table_segs = np.cumsum([len(self._by_table[t]) for t in range(n_tables)],
                               dtype=np.int64)
        ones = np.ones(n_features, np.int32)
        # TensorFlow keeps a numpy function built in TF2 (traced in a tf.function or a
        # dataset's map, or run eagerly) for the life of the process, on its global graph:
        # it reaches the tables only through the Embedding, held weakly, so that they go with
        # it (sparseflow/weak_owner.py).
        embedding = weak(self, "sparseflow.tf2.Embedding")

        @tf.autograph.experimental.do_not_convert
        def process(ts, *ids):
            stamp = None if timestamp is None else int(ts)
            keys = [ids[k] for k in order]
            lengths = np.fromiter((k.shape[0] for k in keys), np.int64, n_features)
            ends = np.cumsum(lengths)
            with borrow_scratch() as scratch:   # the batch's key arrays, reused
                batch, results = process_tables([t.processor for t in embedding()._tables],
                                                scratch.joined_keys(keys), ends, ones,
                                                table_segs, bool(training), stamp,
                                                scratch=scratch)
                restores = [None] * n_features
                for k, start, end in zip(order, ends - lengths, ends):
                    restores[k] = batch.restore[start:end]
                parts = [result.rows for result in results] + restores
                sizes = np.fromiter([p.shape[0] for p in parts] + [r.seq for r in results],
                                    np.int64, len(parts) + n_tables)
                return tensor_buffers.concatenate(parts, np.int32), sizes

        # One int32 tensor of every table's unique rows then every feature's restore vector,
        # and their sizes (then each table's batch number): two tensors per batch, whatever
        # the number of features (a tensor per part made the step's call and the dataset's
        # elements several times dearer with 26 features).
        packed, sizes = tf.numpy_function(process, [ts] + [p[0] for p in parts],
                                          [tf.int32, tf.int64], stateful=True,
                                          name="sparseflow_tf2_keys")
        mark = _TRAINING_MARK if training else _EVALUATION_MARK
        out = {mark: tf.constant(True), "packed": tf.ensure_shape(packed, [None]),
               "sizes": tf.ensure_shape(sizes, [2 * n_tables + n_features])}
        for f, (_, segments, n_segments) in zip(self._features, parts):
            if segments is not None:   # absent: one id per example (static, at trace time)
                out[f"segments/{f.name}"] = segments
                out[f"n_segments/{f.name}"] = n_segments
        return out

    def _feature_lengths(self, batch, members) -> tf.Tensor:
        """The ids of each of ``members`` (feature indices) in a packed batch."""
        n_tables = len(self._tables)
        return tf.gather(batch["sizes"], [n_tables + k for k in members])

    def _id_count(self, batch, k: int) -> tf.Tensor:
        """Feature ``k``'s ids in a processed batch (int32 scalar)."""
        return tf.cast(batch["sizes"][len(self._tables) + k], tf.int32)

    def _flatten(self, features) -> list:
        try:
            tf.nest.assert_same_structure(self._feature_config, features)
        except (TypeError, ValueError) as e:
            raise ValueError(f"Argument `features` must have the structure of feature_config "
                             f"({len(self._features)} features): {e}") from None
        return tf.nest.flatten(features)

    def _ids_and_segments(self, feature: _Feature, x):
        """(int64 ids [n], int32 segments [n] or None, int32 number of segments): segment =
        example (pooled) or example * max_sequence_length + position (sequence); None when
        every example has exactly one id (a dense ``[batch]`` or ``[batch, 1]`` input of a
        pooled feature without ``padding_key``): the activations are then the embeddings
        themselves, whatever the combiner."""
        max_len = feature.max_len
        padding = feature.config.padding_key
        if isinstance(x, tf.SparseTensor):
            if x.shape.rank is not None and x.shape.rank > 2:
                fail(f"features[{feature.name}]", "a SparseTensor of rank 1 or 2 ([batch, n])",
                     f"rank {x.shape.rank}")
            ids, indices = x.values, x.indices
            rows = indices[:, 0]
            cols = indices[:, -1] if x.shape.rank != 1 else tf.zeros_like(rows)
            batch = x.dense_shape[0]
        elif isinstance(x, tf.RaggedTensor):
            if x.ragged_rank > 1:
                if max_len:
                    fail(f"features[{feature.name}]", "a RaggedTensor [batch, None] (ragged "
                         "rank 1) for a sequence feature", f"ragged rank {x.ragged_rank}")
                x = x.merge_dims(1, -1)   # pooled: every id of an example, in order
            ids = x.flat_values
            rows = x.value_rowids()
            cols = tf.range(tf.shape(ids, out_type=tf.int64)[0]) - tf.gather(x.row_starts(),
                                                                              rows)
            batch = x.nrows()
        else:
            x = tf.convert_to_tensor(x)
            if x.shape.rank == 0:
                fail(f"features[{feature.name}]", "ids of rank >= 1 ([batch] or [batch, n])",
                     x.shape)
            if not x.dtype.is_integer:
                fail(f"features[{feature.name}]", "integer ids", x.dtype.name, TypeError)
            if x.shape.rank == 1:
                x = tf.expand_dims(x, 1)
            x = tf.reshape(x, [tf.shape(x)[0], -1])
            batch = tf.shape(x, out_type=tf.int64)[0]
            if not max_len and padding is None and x.shape[1] == 1:
                return tf.cast(tf.reshape(x, [-1]), tf.int64), None, tf.cast(batch, tf.int32)
            width = tf.shape(x, out_type=tf.int64)[1]
            ids = tf.reshape(x, [-1])
            position = tf.range(tf.size(ids, out_type=tf.int64))
            rows, cols = position // width, position % width
            if padding is not None:
                keep = tf.not_equal(ids, tf.cast(padding, ids.dtype))
                ids, rows, cols = (tf.boolean_mask(ids, keep), tf.boolean_mask(rows, keep),
                                   tf.boolean_mask(cols, keep))
        if not ids.dtype.is_integer:
            fail(f"features[{feature.name}]", "integer ids", ids.dtype.name, TypeError)
        ids = tf.cast(ids, tf.int64)
        rows, cols = tf.cast(rows, tf.int64), tf.cast(cols, tf.int64)
        if max_len:
            keep = cols < max_len
            ids = tf.boolean_mask(ids, keep)
            segments = tf.boolean_mask(rows * max_len + cols, keep)
            n_segments = tf.cast(batch, tf.int64) * max_len
        else:
            segments, n_segments = rows, tf.cast(batch, tf.int64)
        return ids, tf.cast(segments, tf.int32), tf.cast(n_segments, tf.int32)

    # -- 2. enqueue ----------------------------------------------------------------------

    def enqueue(self, features, training: bool = True, timestamp=None) -> None:
        """Takes one batch: the dict :meth:`preprocess` made (in the ``tf.data`` pipeline),
        or raw ids, processed here (``training`` and ``timestamp`` as for
        :meth:`preprocess`).

        Raises:
          ValueError: a processed batch of the other channel than ``training`` says (a
            batch preprocessed for evaluation cannot train, and the reverse would count its
            keys for nothing), or ``training`` is not a Python bool.
          RuntimeError: under a strategy with several replicas (not supported yet: each
            replica would apply the whole batch's update).
        """
        if not isinstance(training, bool):
            fail("training", "a Python bool (the channel is fixed when the step is traced)",
                 training, TypeError)
        self._check_replicas()
        if isinstance(features, dict) and (_TRAINING_MARK in features
                                           or _EVALUATION_MARK in features):
            if (_TRAINING_MARK in features) != training:
                fail("training", f"{_TRAINING_MARK in features}, the channel the batch was "
                     f"preprocessed for (preprocess(features, training=...))", training)
        else:
            features = self.preprocess(features, training, timestamp)
        self._enqueued = (features, training)

    def _check_replicas(self) -> None:
        """One replica per rank: the ranks (several under MultiWorkerMirroredStrategy) or
        one process."""
        replica = tf.distribute.get_replica_context()
        n = (replica.num_replicas_in_sync if replica is not None
             else tf.distribute.get_strategy().num_replicas_in_sync)
        ranks = 1 if self._sharding is None else self._sharding.world_size
        if n != ranks:
            raise RuntimeError(
                f"sparseflow.tf2.Embedding runs one replica per rank ({ranks} here); this "
                f"strategy has {n} replicas. Several replicas in one process would each "
                f"gather and update the whole batch: run one process per replica "
                f"(MultiWorkerMirroredStrategy over `sparseflow launch -n N`).")

    # -- 3. dequeue ----------------------------------------------------------------------

    def dequeue(self):
        """The activations of the enqueued batch, in the structure of ``feature_config``:
        float32 ``[batch, dim]`` per pooled feature, ``[batch, max_sequence_length, dim]``
        per sequence feature (reshaped to ``output_shape + [dim]`` when set).

        Raises:
          RuntimeError: nothing was enqueued.
        """
        if self._enqueued is None:
            raise RuntimeError("Embedding.dequeue() needs a batch: call enqueue() first.")
        self._check_replicas()
        batch, training = self._enqueued
        activations = self.activations(batch, training)
        self._dequeued = (batch, training)
        return tf.nest.pack_sequence_as(self._feature_config, activations)

    @_in_own_chain
    def activations(self, batch: dict, training: bool) -> list:
        """The activations of a processed batch, flat in feature order (what
        :meth:`dequeue` returns, unstructured): one gather for every feature (one output
        per embedding width), then TF combiners."""
        features, groups = self._features, self._dim_groups
        if self._sharding is not None:
            flats = self._sharding.embeddings(batch, training, [f.dim for f in features])
            return [self._combine(f, flat, batch) for f, flat in zip(features, flats)]
        outs = self._gather(batch)
        flats = [None] * len(features)
        for (dim, members), out in zip(groups, outs):
            out = tf.ensure_shape(out, [None, dim])
            pieces = (tf.split(out, self._feature_lengths(batch, members), num=len(members))
                      if len(members) > 1 else [out])
            for k, piece in zip(members, pieces):
                flats[k] = piece
        return [self._combine(f, flat, batch) for f, flat in zip(features, flats)]

    def _gather(self, batch: dict) -> list:
        """One compiled op per width and shard (``ops/batch_ops.py``): the features' embeddings in
        feature order; it releases each table's batch through the registry."""
        from sparseflow.ops import batch_ops   # loads the kernels: only when used

        n_parts = len(self._tables) + len(self._features)
        outs = []
        for (dim, _), (table_of, rows_of, restore_of) in zip(self._dim_groups,
                                                             self._gather_layouts):
            tokens = np.asarray([self._tables[t].registry_token() for t in table_of],
                                np.int64)
            outs.append(batch_ops.gather_tables(batch["packed"], batch["sizes"], tokens,
                                                rows_of, restore_of, n_parts, dim,
                                                name="sparseflow_tf2_gather"))
        return outs

    def _scale(self, feature: _Feature, batch) -> tf.Tensor | None:
        """Per id, the factor its embedding enters its example's activation with (None: 1)."""
        if (feature.max_len or feature.combiner == "sum"
                or f"segments/{feature.name}" not in batch):
            return None
        segments = batch[f"segments/{feature.name}"]
        counts = tf.math.unsorted_segment_sum(tf.ones_like(segments, tf.float32), segments,
                                              batch[f"n_segments/{feature.name}"])
        per_id = tf.gather(counts, segments)
        return 1.0 / (per_id if feature.combiner == "mean" else tf.sqrt(per_id))

    def _combine(self, feature: _Feature, flat: tf.Tensor, batch) -> tf.Tensor:
        if f"segments/{feature.name}" not in batch:   # one id per example: nothing to combine
            out = flat
        else:
            segments = batch[f"segments/{feature.name}"]
            n_segments = batch[f"n_segments/{feature.name}"]
            scale = self._scale(feature, batch)
            if scale is not None:
                flat = flat * tf.expand_dims(scale, 1)
            out = sum_rows_by_index(flat, segments, n_segments)
        if feature.max_len:
            out = tf.reshape(out, [-1, feature.max_len, feature.dim])
        if feature.config.output_shape is not None:
            out = tf.reshape(out, feature.config.output_shape + [feature.dim])
        return out

    # -- 4. apply_gradients --------------------------------------------------------------

    def apply_gradients(self, gradients) -> None:
        """Applies the gradients of the loss w.r.t. the dequeued activations (same
        structure; None for a feature without one) to the rows they came from, with each
        table's optimizer.

        Raises:
          RuntimeError: nothing was dequeued, or it was an evaluation batch
            (``training=False``).
          ValueError: a table has no optimizer, or ``gradients`` has another structure.
        """
        if self._dequeued is None:
            raise RuntimeError("Embedding.apply_gradients() needs the activations of a "
                               "batch: call enqueue() and dequeue() first.")
        batch, training = self._dequeued
        if not training:
            raise RuntimeError("Embedding.apply_gradients() on an evaluation batch: enqueue "
                               "it with training=True (and preprocess it so).")
        for t in self._tables:
            if t.rows.optimizer is None:
                fail("optimizer", f"an optimizer for table `{t.table_name}` (on its "
                     f"TableConfig or the Embedding)", None)
        self.update(batch, self._flatten(gradients))

    @_in_own_chain
    def update(self, batch: dict, gradients: list) -> tf.Tensor:
        """Applies ``gradients`` (flat in feature order, None allowed) of a processed
        training batch's activations (what :meth:`apply_gradients` does, unstructured):
        TF ops give each id its gradient; compiled ops sum them per unique row and run each
        table's optimizer. Returns the update's output (int64), for control dependencies."""
        tables, features = self._tables, self._features
        n_tables = len(tables)
        per_id = []
        for k, (f, grad) in enumerate(zip(features, gradients)):
            if grad is None:
                n = (self._sharding.id_count(batch, k) if self._sharding is not None
                     else self._id_count(batch, k))
                per_id.append(tf.zeros(tf.stack([n, f.dim])))
                continue
            grad = tf.convert_to_tensor(grad, tf.float32)
            if grad.shape.rank != 2 or grad.shape[1] != f.dim:
                grad = tf.reshape(grad, [-1, f.dim])
            if f"segments/{f.name}" not in batch:   # one id per example
                per_id.append(grad)
                continue
            d = tf.gather(grad, batch[f"segments/{f.name}"])
            scale = self._scale(f, batch)
            per_id.append(d if scale is None else d * tf.expand_dims(scale, 1))
        if self._sharding is not None:   # to the owners, who sum and apply them
            return self._sharding.update(batch, per_id)
        return self._update_ops(batch, per_id)

    def _update_ops(self, batch: dict, per_id: list) -> tf.Tensor:
        """The update as compiled ops: per width and shard one gradient sum
        (``ops/batch_ops.py``), then per optimizer its update
        (``SparseOptimizer.host_update``)."""
        from sparseflow.ops import batch_ops   # loads the kernels: only when used

        tables = self._tables
        n_tables = len(tables)
        n_parts = n_tables + len(self._features)
        sizes = batch["sizes"]
        with tf.control_dependencies([self._check_gradient_rows(sizes, per_id)]):
            rows = tf.split(batch["packed"], sizes[:n_parts], num=n_parts)[:n_tables]
            per_id = [tf.identity(g) for g in per_id]
        pairs = []   # (IndexedSlices over the table's unique rows, table)
        for dim, table_ids, members, (_, rows_of, restore_of) in self._sum_groups:
            summed = batch_ops.sum_tables(batch["packed"], sizes, rows_of, restore_of,
                                          n_parts, [per_id[k] for k in members],
                                          name="sparseflow_tf2_gradient")
            pieces = (tf.split(summed, tf.gather(sizes, table_ids), num=len(table_ids))
                      if len(table_ids) > 1 else [summed])
            for t, piece in zip(table_ids, pieces):
                pairs.append((tf.IndexedSlices(piece, rows[t]), tables[t]))
        # The rows are the batch's unique keys' rows: distinct.
        return host_update_by_optimizer(pairs, "sparseflow_tf2_update")

    def _check_gradient_rows(self, sizes, per_id: list) -> tf.Operation:
        """An assertion that each feature's gradient has one row per id of its activations,
        naming the first feature that does not (the sum's kernel would only say that some
        gradient does not fit)."""
        features = self._features
        n_tables = len(self._tables)
        got = tf.stack([tf.shape(g, out_type=tf.int64)[0] for g in per_id])
        want = sizes[n_tables:n_tables + len(features)]
        wrong = tf.not_equal(got, want)
        first = tf.argmax(tf.cast(wrong, tf.int32))
        message = tf.strings.join([
            "Argument `gradients` for feature `",
            tf.gather(tf.constant([f.name for f in features]), first),
            "` must match its activations: ", tf.strings.as_string(tf.gather(want, first)),
            " embedding rows of ",
            tf.strings.as_string(tf.gather(tf.constant([f.dim for f in features]), first)),
            " values reach it, got a gradient giving ",
            tf.strings.as_string(tf.gather(got, first)), "."])
        return tf.debugging.Assert(tf.logical_not(tf.reduce_any(wrong)), [message])

    # -- checkpoints (tf.train.Checkpoint) -----------------------------------------------

    def _serialize_to_tensors(self):
        tensors = {}
        for table in self._tables:
            arrays = saved_state.checkpoint_arrays(table_state.capture(table), self.world())
            tensors.update({f"{table.table_name}-{field}":
                            tf.constant(value, tf.string if field == "slot_names" else None)
                            for field, value in arrays.items()})
        return tensors

    def world(self) -> list[int]:
        """``[rank, size]`` of this Embedding's shard of its tables ([0, 1] in one
        process)."""
        sharding = self._sharding
        return [0, 1] if sharding is None else [sharding.rank, sharding.world_size]

    def _restore_from_tensors(self, restored_tensors):
        source = f"the checkpoint of Embedding `{self.name}`"
        states, saved = [], [0, 1]
        for table in self._tables:
            name = table.table_name
            state, saved = saved_state.state_from_checkpoint(
                lambda field, name=name: restored_tensors[f"{name}-{field}"].numpy())
            states.append(state)
        states = states_for_this_rank(states, saved, self.world(), source)
        # Every table checked before any changes: a refused one leaves all as they were.
        for table, state in zip(self._tables, states):
            table_state.check_fits(table, state, source)
        for table, state in zip(self._tables, states):
            table_state.apply(table, state, source=source)


def _layout(members: list) -> tuple:
    """The batch kernels' member arrays from ``(table index, restore part)`` pairs: a table's
    rows are part ``table index`` of a packed batch."""
    tables = np.asarray([t for t, _ in members], np.int64).reshape(-1)
    return tables, tables.copy(), np.asarray([r for _, r in members], np.int64).reshape(-1)
