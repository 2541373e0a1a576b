"""``Embedding``: the TF2 mid-level API, in the shape of TPUEmbedding's.

Per batch, in this order:

1. :meth:`Embedding.preprocess` — in a ``tf.data`` map (or inline, by :meth:`enqueue` given
   raw ids): one ``tf.numpy_function`` runs every table's key processor (dedup, admission
   counts, timestamps, key → row) over the ids of the features sharing it, and the batch
   becomes per table its unique rows, per feature each id's position among them
   (``restore``) and the example (or sequence slot) it belongs to (``segments``).
2. :meth:`Embedding.enqueue` — remembers the processed batch.
3. :meth:`Embedding.dequeue` — one ``tf.numpy_function`` gathers every feature's embeddings
   (numba, from the host rows), then TF ops combine them per example (sum / mean / sqrtn) or
   place them per sequence position: the activations.
4. :meth:`Embedding.apply_gradients` — given the gradients of the loss w.r.t. the
   activations (``tape.gradient(loss, activations)``), TF ops spread each back to its ids,
   and one ``tf.numpy_function`` sums them per unique row (features of one table together)
   and applies the table's lazy sparse optimizer there.

Everything works eagerly and inside ``tf.function`` (including a ``tf.range`` loop). The rows
are host rows updated by the same numba kernels as the Rec SDK API, so both APIs give the same
numbers. State lives outside TF variables; the Embedding is a ``tf.Module`` that
``tf.train.Checkpoint`` saves and restores (its tables, by key, like ``sparseflow.Saver``).
"""

from __future__ import annotations

import threading

import numpy as np
import tensorflow as tf

from sparseflow.checkpoint import table_state
from sparseflow.embed.table_config import make_table_config
from sparseflow.ops import key_kernels as kk
from sparseflow.table import SparseTable, _default_seed
from sparseflow.tf2.config import FeatureConfig, TableConfig
from sparseflow.tf2.optimizers import OPTIMIZERS
from sparseflow.validation import fail

_MARK = "__sparseflow_tf2__"   # a processed batch carries it


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


class Embedding(tf.Module):
    """Sparse embedding tables for TF2 training loops (TPUEmbedding's mid-level API).

    Args:
      feature_config: a :class:`FeatureConfig` or a nested structure (dict, list, tuple) of
        them; activations come back in the same structure.
      optimizer: the default optimizer (``sparseflow.tf2.SGD``, ``Adagrad``, ``Adam``,
        ``FTRL``) for tables that set none; may be None if every table sets one, or if the
        Embedding only serves.
      name: the module's name.

    Raises:
      TypeError, ValueError: a config is invalid, two tables share a name, or a table has
        no optimizer while training needs one (at :meth:`apply_gradients`).
    """

    def __init__(self, feature_config, optimizer=None, name: str = "sparseflow_embedding"):
        super().__init__(name=name)
        if optimizer is not None and not isinstance(optimizer, OPTIMIZERS):
            fail("optimizer", "None or one of sparseflow.tf2.SGD, Adagrad, Adam, FTRL",
                 optimizer, TypeError)
        self._feature_config = feature_config
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
        self._enqueued = None
        self._dequeued = None
        self._lock = threading.Lock()

    @staticmethod
    def _make_table(config: TableConfig, name: str, optimizer, kernels: dict) -> SparseTable:
        table_config = make_table_config(tf.int64, config.dim, name, config.initializer,
                                         device_vocabulary_size=config.vocabulary_size)
        table = SparseTable(table_config, _default_seed(name), rows_on="host")
        table.access_threshold = config.access_threshold
        table.processor.threshold = config.access_threshold
        if config.eviction_threshold is not None:
            table.eviction_threshold = config.eviction_threshold
            table.processor.track_in_flight = True
        if optimizer is not None:
            if id(optimizer) not in kernels:
                kernels[id(optimizer)] = optimizer.build()
            table.rows.bind_optimizer(kernels[id(optimizer)])
        return table

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

    def evict(self) -> dict:
        """Removes, in every table with an ``eviction_threshold``, the keys unseen for that
        long (by the timestamps given to :meth:`preprocess`). Returns ``{table name:
        EvictionResult}``."""
        return {t.table_name: t.processor.evict(t.eviction_threshold)
                for t in self._tables if t.eviction_threshold >= 0}

    # -- 1. key processing ---------------------------------------------------------------

    def preprocess(self, features, training: bool = True, timestamp=None) -> dict:
        """The key processing of one batch of raw ids, as a ``tf.data`` map function.

        Args:
          features: ids in the structure of ``feature_config``: per feature an int tensor
            ``[batch]`` or ``[batch, n]`` (dense; negative ids are padding), a
            ``tf.SparseTensor`` or a ``tf.RaggedTensor`` ``[batch, None]``.
          training: the training channel (counts keys, admits them, assigns rows) or
            evaluation (reads only: unknown keys look up zeros).
          timestamp: an int64 scalar (seconds) for eviction, or None.

        Returns:
          A flat dict of tensors, to pass to :meth:`enqueue`.

        Raises:
          TypeError, ValueError: ``features`` does not match ``feature_config``.
        """
        flat = self._flatten(features)
        parts = [self._ids_and_segments(f, x) for f, x in zip(self._features, flat)]
        ts = tf.constant(-1, tf.int64) if timestamp is None else tf.cast(
            tf.reshape(timestamp, []), tf.int64)
        n_tables, n_features = len(self._tables), len(self._features)

        @tf.autograph.experimental.do_not_convert
        def process(ts, *ids):
            stamp = None if timestamp is None else int(ts)
            rows_out, seqs, restores = [], [], [None] * n_features
            for t, table in enumerate(self._tables):
                members = self._by_table[t]
                keys = [np.asarray(ids[k], np.int64) for k in members]
                ends = np.cumsum([k.shape[0] for k in keys]).astype(np.int64)
                result = table.processor.process(
                    np.concatenate(keys) if keys else np.zeros(0, np.int64), ends,
                    np.ones(len(members), np.int32), bool(training), stamp)
                rows_out.append(result.rows)
                seqs.append(np.int64(result.seq))
                starts = ends - [k.shape[0] for k in keys]
                for k, start, end in zip(members, starts, ends):
                    restores[k] = result.restore[start:end]
            return rows_out + restores + seqs

        outs = tf.numpy_function(process, [ts] + [p[0] for p in parts],
                                 [tf.int32] * (n_tables + n_features) + [tf.int64] * n_tables,
                                 stateful=True, name="sparseflow_tf2_keys")
        out = {_MARK: tf.constant(bool(training))}
        for t, table in enumerate(self._tables):
            out[f"rows/{table.table_name}"] = tf.ensure_shape(outs[t], [None])
            out[f"seq/{table.table_name}"] = tf.ensure_shape(outs[n_tables + n_features + t],
                                                             [])
        for k, (f, (_, segments, n_segments)) in enumerate(zip(self._features, parts)):
            out[f"restore/{f.name}"] = tf.ensure_shape(outs[n_tables + k], [None])
            out[f"segments/{f.name}"] = segments
            out[f"n_segments/{f.name}"] = n_segments
        return out

    def _flatten(self, features) -> list:
        try:
            tf.nest.assert_same_structure(self._feature_config, features)
        except (TypeError, ValueError) as e:
            raise ValueError(f"Argument `features` must have the structure of feature_config "
                             f"({len(self._features)} features): {e}") from None
        return tf.nest.flatten(features)

    def _ids_and_segments(self, feature: _Feature, x):
        """(int64 ids [n], int32 segments [n], int32 number of segments): segment = example
        (pooled) or example * max_sequence_length + position (sequence)."""
        max_len = feature.max_len
        if isinstance(x, tf.SparseTensor):
            ids, indices = x.values, x.indices
            rows, cols = indices[:, 0], indices[:, -1] if indices.shape[-1] and \
                indices.shape[-1] > 1 else tf.zeros_like(indices[:, 0])
            batch = x.dense_shape[0]
        elif isinstance(x, tf.RaggedTensor):
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
            if x.shape.rank == 1:
                x = tf.expand_dims(x, 1)
            x = tf.reshape(x, [tf.shape(x)[0], -1])
            width = tf.shape(x, out_type=tf.int64)[1]
            batch = tf.shape(x, out_type=tf.int64)[0]
            flat = tf.reshape(x, [-1])
            keep = flat >= 0   # negative ids are padding
            position = tf.range(tf.size(flat, out_type=tf.int64))
            ids = tf.boolean_mask(flat, keep)
            rows = tf.boolean_mask(position // width, keep)
            cols = tf.boolean_mask(position % width, keep)
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
        :meth:`preprocess`)."""
        if not (isinstance(features, dict) and _MARK in features):
            features = self.preprocess(features, training, timestamp)
        self._enqueued = (features, bool(training))

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
        batch, training = self._enqueued
        activations = self.activations(batch, training)
        self._dequeued = (batch, training)
        return tf.nest.pack_sequence_as(self._feature_config, activations)

    def activations(self, batch: dict, training: bool) -> list:
        """The activations of a processed batch, flat in feature order (what
        :meth:`dequeue` returns, unstructured): one numpy gather, then TF combiners."""
        tables, features = self._tables, self._features
        n_tables = len(tables)

        @tf.autograph.experimental.do_not_convert
        def gather(*arrays):
            rows, seqs, restores = arrays[:n_tables], arrays[n_tables:2 * n_tables], \
                arrays[2 * n_tables:]
            outs = []
            for f, restore in zip(features, restores):
                t = f.table_index
                out = np.empty((restore.shape[0], f.dim), np.float32)
                kk.expand_rows(tables[t].rows.allocate(), rows[t], restore, f.dim, out)
                outs.append(out)
            for table, seq in zip(tables, seqs):
                # Read. With training, evicted rows are freed after the update.
                table.release_batch(int(seq), drain=not training)
            return outs

        inputs = ([batch[f"rows/{t.table_name}"] for t in tables]
                  + [batch[f"seq/{t.table_name}"] for t in tables]
                  + [batch[f"restore/{f.name}"] for f in features])
        flats = tf.numpy_function(gather, inputs, [tf.float32] * len(features),
                                  stateful=True, name="sparseflow_tf2_gather")
        if not isinstance(flats, (list, tuple)):   # one output comes back bare
            flats = [flats]
        return [self._combine(f, tf.ensure_shape(flat, [None, f.dim]), batch)
                for f, flat in zip(features, flats)]

    def _scale(self, feature: _Feature, batch) -> tf.Tensor | None:
        """Per id, the factor its embedding enters its example's activation with (None: 1)."""
        if feature.max_len or feature.combiner == "sum":
            return None
        segments = batch[f"segments/{feature.name}"]
        counts = tf.math.unsorted_segment_sum(tf.ones_like(segments, tf.float32), segments,
                                              batch[f"n_segments/{feature.name}"])
        per_id = tf.gather(counts, segments)
        return 1.0 / (per_id if feature.combiner == "mean" else tf.sqrt(per_id))

    def _combine(self, feature: _Feature, flat: tf.Tensor, batch) -> tf.Tensor:
        segments = batch[f"segments/{feature.name}"]
        n_segments = batch[f"n_segments/{feature.name}"]
        scale = self._scale(feature, batch)
        if scale is not None:
            flat = flat * tf.expand_dims(scale, 1)
        out = tf.math.unsorted_segment_sum(flat, segments, n_segments)
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

    def update(self, batch: dict, gradients: list) -> tf.Tensor:
        """Applies ``gradients`` (flat in feature order, None allowed) of a processed
        training batch's activations (what :meth:`apply_gradients` does, unstructured).
        Returns the update's output (int64), for control dependencies."""
        tables, features = self._tables, self._features
        per_id = []
        for f, grad in zip(features, gradients):
            segments = batch[f"segments/{f.name}"]
            if grad is None:
                per_id.append(tf.zeros([tf.shape(segments)[0], f.dim]))
                continue
            grad = tf.reshape(tf.convert_to_tensor(grad, tf.float32), [-1, f.dim])
            d = tf.gather(grad, segments)
            scale = self._scale(f, batch)
            per_id.append(d if scale is None else d * tf.expand_dims(scale, 1))
        n_tables = len(tables)
        by_table = self._by_table

        @tf.autograph.experimental.do_not_convert
        def update(*arrays):
            rows, restores, grads = arrays[:n_tables], arrays[n_tables:n_tables + len(
                features)], arrays[n_tables + len(features):]
            for t, table in enumerate(tables):
                summed = np.zeros((rows[t].shape[0], table.dim), np.float32)
                for k in by_table[t]:
                    kk.sum_by_restore(np.ascontiguousarray(grads[k], np.float32), restores[k],
                                      summed)
                optimizer = table.rows.optimizer
                with optimizer._lock:  # noqa: SLF001 -- the kernel optimizer's step count
                    step = optimizer._steps.get(table.table_name, 0) + 1  # noqa: SLF001
                    optimizer._steps[table.table_name] = step  # noqa: SLF001
                optimizer._update(table.rows.allocate(), rows[t], summed, step)  # noqa: SLF001
                table.after_update(rows[t])
            return np.int64(n_tables)

        inputs = ([batch[f"rows/{t.table_name}"] for t in tables]
                  + [batch[f"restore/{f.name}"] for f in features] + per_id)
        return tf.numpy_function(update, inputs, tf.int64, stateful=True,
                                 name="sparseflow_tf2_update")

    # -- checkpoints (tf.train.Checkpoint) -----------------------------------------------

    def _serialize_to_tensors(self):
        tensors = {}
        for table in self._tables:
            state = table_state.capture(table)
            name = table.table_name
            tensors.update({
                f"{name}-keys": tf.constant(state.keys, tf.int64),
                f"{name}-counts": tf.constant(state.counts, tf.int32),
                f"{name}-last_seen": tf.constant(state.last_seen, tf.int64),
                f"{name}-values": tf.constant(state.values, tf.float32),
                f"{name}-slot_names": tf.constant(list(state.slot_names), tf.string),
                f"{name}-counted_keys": tf.constant(state.counted_keys, tf.int64),
                f"{name}-counted_counts": tf.constant(state.counted_counts, tf.int32),
                f"{name}-clock": tf.constant(state.clock, tf.int64),
                f"{name}-optimizer_steps": tf.constant(state.optimizer_steps, tf.int64)})
        return tensors

    def _restore_from_tensors(self, restored_tensors):
        for table in self._tables:
            name = table.table_name

            def get(key):
                return restored_tensors[f"{name}-{key}"].numpy()

            state = table_state.TableState(
                keys=get("keys"), counts=get("counts"), last_seen=get("last_seen"),
                values=np.ascontiguousarray(get("values"), np.float32),
                slot_names=tuple(s.decode() for s in get("slot_names")),
                counted_keys=get("counted_keys"), counted_counts=get("counted_counts"),
                clock=int(get("clock")), optimizer_steps=int(get("optimizer_steps")))
            table_state.apply(table, state, source=f"the checkpoint of Embedding "
                                                   f"`{self.name}`")
