"""Sparse lookups of an export graph: a checkpoint's rows read through plain TensorFlow ops.

An exported model (``Estimator.export_saved_model``) must serve in a process with no
sparseflow: no key pipeline, no numpy functions. While the export graph is built, the runtime
carries a :class:`ServingRows` and ``sparse_lookup`` calls :func:`serving_lookup` instead of
its training path: per table, a ``tf.lookup.StaticHashTable`` maps each key to its row of an
embedding variable whose last row is what keys the checkpoint does not hold read (zeros, or
the lookup's ``serving_default_value``, as in evaluation). The key vocabulary is a SavedModel
asset (one key per line), the rows are the SavedModel's variables: neither is a graph
constant, so large tables stay out of the 2 GB GraphDef.
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from sparseflow.featurespec.spec import FeatureSpec
from sparseflow.serving import _key_index
from sparseflow.validation import fail

# The embedding variables of an export graph: not in the dense checkpoint, loaded from the
# sparse one (ServingRows.load).
SERVING_ROWS_COLLECTION = "sparseflow_serving_rows"


class ServingRows:
    """The tables of one checkpoint, for one export graph.

    Args:
      states: dict table name -> ``TableState`` (``saver.read_sparse_states``).
      vocab_dir: a directory for the key vocabularies (copied into the SavedModel's assets).
      source: the checkpoint, for error messages.
    """

    def __init__(self, states: dict, vocab_dir: str, source: str):
        self.states = states
        self.vocab_dir = vocab_dir
        self.source = source
        self._built: dict = {}     # table name -> (key index, embedding variable, rows held)
        self._values: list = []    # (variable, float32 [n + 1, dim]) to load

    def table_rows(self, table):
        """The key index and embedding variable of ``table`` in the current graph (built on
        first use); returns (index, variable, number of keys held).

        Raises:
          ValueError: the checkpoint holds no such table, or one of another dim.
        """
        name = table.table_name
        if name not in self._built:
            state = self.states.get(name)
            if state is None:
                raise ValueError(f"Checkpoint {self.source!r} holds no table `{name}` (it holds "
                                 f"{sorted(self.states)}): export needs a checkpoint of this "
                                 f"model.")
            if state.dim != table.dim:
                raise ValueError(f"Checkpoint {self.source!r} holds table `{name}` with dim "
                                 f"{state.dim}, but the model creates it with dim {table.dim}.")
            n = state.keys.shape[0]
            index = _key_index(state.keys, os.path.join(self.vocab_dir, f"{name}.vocab"))
            variable = tf.compat.v1.get_variable(
                f"sparseflow_serving/{name}", shape=[n + 1, table.dim], dtype=tf.float32,
                initializer=tf.compat.v1.zeros_initializer(), trainable=False,
                collections=[tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, SERVING_ROWS_COLLECTION])
            values = np.zeros((n + 1, table.dim), np.float32)
            values[:n] = state.weights
            self._values.append((variable, values))
            self._built[name] = (index, variable, n)
        return self._built[name]

    def load(self, sess) -> None:
        """Writes the checkpoint's rows into the embedding variables (after their init)."""
        for variable, values in self._values:
            variable.load(values, sess)


def serving_lookup(serving: ServingRows, table, ids, batch, serving_default_value, name):
    """``sparse_lookup`` in an export graph: the embeddings of ``ids`` (shape ``ids.shape +
    [dim]``), read from the checkpoint's rows.

    Args:
      serving: the runtime's :class:`ServingRows`.
      table: the SparseTable looked up.
      ids: a FeatureSpec (its ``index_key`` read from ``batch``, the serving features) or an
        int tensor of keys.
      batch: the serving features (dict) for a FeatureSpec.
      serving_default_value: None or a float32 tensor broadcastable to ``[dim]``: what keys
        the checkpoint does not hold read (default zeros).
      name: the lookup's name scope, or None.

    Raises:
      TypeError, ValueError: a FeatureSpec whose key is not among the serving features, or
        keys that are not integers.
    """
    if isinstance(ids, FeatureSpec):
        if not isinstance(batch, dict) or ids.index_key not in batch:
            fail("batch", f"the serving features, holding FeatureSpec `{ids.name}`'s key "
                 f"{ids.index_key!r} (build it in serving_input_receiver_fn's features)",
                 sorted(batch) if isinstance(batch, dict) else batch)
        ids = batch[ids.index_key]
    ids = tf.convert_to_tensor(ids)
    if not ids.dtype.is_integer:
        fail("ids", "integer keys", ids.dtype.name, TypeError)
    index, variable, n = serving.table_rows(table)
    with tf.name_scope(name or f"{table.table_name}_serving_lookup"):
        flat = tf.reshape(tf.cast(ids, tf.int64), [-1])
        rows = index.lookup(flat)
        emb = tf.gather(variable, rows)
        if serving_default_value is not None:
            default = tf.broadcast_to(serving_default_value, [table.dim])
            emb = tf.where(tf.expand_dims(rows < n, 1), emb, tf.expand_dims(default, 0))
        shape = tf.concat([tf.shape(ids), [table.dim]], 0)
        out = tf.reshape(emb, shape)
        out.set_shape(ids.shape.concatenate([table.dim]))
        return out
