"""Exports a trained YAML job as one SavedModel that serves predictions from raw features.

The SavedModel needs only TensorFlow. Its ``serving_default`` signature takes raw features —
one tensor per sparse column (``[batch]`` single-hot, ``[batch, length]`` multi-hot): the
tokens themselves for ``encoding: string`` columns (empty string = missing / padding, hashed
inside as the data pipeline hashes them), int64 keys otherwise (-1 = missing / padding); and
``dense`` (float32 ``[batch, n_dense]``, raw values: the config's ``dense_transform`` is
applied inside) — and returns ``probabilities`` (float32 ``[batch, n_labels]``). Each table is a ``tf.lookup.StaticHashTable`` from key to row
of a constant embedding variable whose last row (zeros) is what keys the table does not hold
read — as in training, where such keys read zeros.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf

from sparseflow.jobs.graph import apply_model, call_on_zeros, job_graph
from sparseflow.jobs.runner import resolve_checkpoint
from sparseflow.jobs.schema import JobConfig
from sparseflow.models import build_model, pool
from sparseflow.serving import _key_index, _snapshot

SIGNATURE = "serving_default"


def export(cfg: JobConfig, checkpoint: str, out: str) -> str:
    """Restores ``checkpoint`` into the job's graph and writes the serving SavedModel to ``out``.

    Args:
      cfg: the validated job config the checkpoint was trained with.
      checkpoint: a checkpoint prefix or a directory holding checkpoints (newest used).
      out: the SavedModel directory; it must not exist or be empty.

    Returns:
      ``out`` as an absolute path.

    Raises:
      ValueError: no checkpoint at ``checkpoint``; ``out`` exists and is not empty.
    """
    prefix = resolve_checkpoint(checkpoint, cfg)
    out = os.path.abspath(os.path.expanduser(str(out)))
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise ValueError(f"Argument `out` must be a new or empty directory. Received: {out!r}")
    with job_graph(cfg, training=False, evaluation=False) as job, \
            tf.compat.v1.Session(graph=job.graph) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        job.saver.restore(sess, prefix)
        snapshots = {name: _snapshot(table, sess) for name, table in job.tables.items()}
        dense_values = sess.run(list(job.model.variables))
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.tmp-", dir=parent)
    try:
        # Eagerly, in a thread of its own: execution mode and the graph stack are per thread.
        with concurrent.futures.ThreadPoolExecutor(1) as pool_:
            pool_.submit(_save, cfg, snapshots, dense_values, tmp).result()
        if os.path.isdir(out):
            os.rmdir(out)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _save(cfg: JobConfig, snapshots: dict, dense_values: list, export_dir: str) -> None:
    from tensorflow.python.eager import context  # eager even if the process disabled it

    with context.eager_mode():
        vocab_dir = tempfile.mkdtemp(prefix="sparseflow-vocab-")
        try:
            module = _serving_module(cfg, snapshots, dense_values, vocab_dir)
            tf.saved_model.save(module, export_dir,
                                signatures={SIGNATURE: module.serve})
        finally:
            shutil.rmtree(vocab_dir, ignore_errors=True)


def _serving_module(cfg: JobConfig, snapshots: dict, dense_values: list, vocab_dir: str):
    module = tf.Module(name="sparseflow_job")
    module.model = build_model(cfg.model.name, cfg.model.params,
                               n_outputs=len(cfg.columns.labels), seed=cfg.schedule.seed)
    call_on_zeros(module.model, cfg)
    if len(module.model.variables) != len(dense_values):
        raise RuntimeError("The exported model's variables do not match the checkpoint's: "
                           f"{len(module.model.variables)} vs {len(dense_values)}.")
    for variable, value in zip(module.model.variables, dense_values):
        variable.assign(value)
    module.key_index, module.embeddings = {}, {}
    for i, (name, (keys, rows)) in enumerate(snapshots.items()):
        module.key_index[name] = _key_index(keys, os.path.join(vocab_dir, f"vocab_{i}"))
        dim = cfg.table(name).dim
        module.embeddings[name] = tf.Variable(
            np.concatenate([rows, np.zeros((1, dim), np.float32)]), trainable=False,
            name=f"embeddings_{i}")
    columns = cfg.columns
    hashed = {c.name for c in columns.sparse
              if c.encoding == "string" and cfg.data.source != "generator"}
    signature = {c.name: tf.TensorSpec([None] if c.length == 1 else [None, c.length],
                                       tf.string if c.name in hashed else tf.int64, name=c.name)
                 for c in columns.sparse}
    if columns.dense:
        signature["dense"] = tf.TensorSpec([None, len(columns.dense)], tf.float32, name="dense")

    @tf.function(input_signature=[signature])
    def serve(features):
        keys_of = {name: _string_keys(features[name]) if name in hashed else features[name]
                   for name in signature if name != "dense"}
        pooled = []
        for feature in cfg.features:
            keys = keys_of[feature.index_key]
            rows = module.key_index[feature.table].lookup(keys)
            emb = tf.gather(module.embeddings[feature.table], rows)
            pooled.append(pool(emb, keys, feature.combiner))
        dense = None
        if columns.dense:
            dense = features["dense"]
            if columns.dense_transform == "log1p":
                dense = tf.math.log1p(tf.maximum(dense, 0.0))
        logits = apply_model(module.model, cfg, dense, pooled)
        return {"probabilities": tf.sigmoid(logits)}

    module.serve = serve
    return module


def _string_keys(tokens: tf.Tensor) -> tf.Tensor:
    """The keys the data pipeline gives string tokens: farmhash Fingerprint64 modulo 2^63 - 1
    (what ``tf.strings.to_hash_bucket_fast`` computes), and -1 for the empty string (missing
    or padding)."""
    keys = tf.strings.to_hash_bucket_fast(tokens, 2**63 - 1)
    return tf.where(tf.equal(tokens, ""), tf.constant(-1, tf.int64), keys)
