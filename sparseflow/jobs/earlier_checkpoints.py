"""A checkpoint of earlier versions' multi-worker trainer (``world.json`` +
``worker-r-of-N/`` + ``dense/``) as a single-process checkpoint, which ``sparseflow eval`` and
``export`` read and ``sparseflow train`` resumes from: every table's shards merged
(``rebucket`` to one worker), the dense model loaded into the job's Session graph, saved with
its ``Saver`` next to the shards (``single-process/model-<step>``; with the optimizer's slots,
``single-process-training/``), once."""

from __future__ import annotations

import os

import tensorflow as tf

from sparseflow.checkpoint import table_state
from sparseflow.distributed.shard_files import open_shards, owned_state, read_world
from sparseflow.jobs.graph import job_graph

SINGLE_PROCESS_DIR = "single-process"


def to_single_process(cfg, path: str, training: bool = False) -> str:
    """The single-process checkpoint prefix of the sharded checkpoint ``path`` (written on
    the first call).

    Args:
      training: keep the sparse optimizer's slots too (to train on from it; the job's
        training graph is built to convert it, under ``single-process-training/``).

    Raises:
      CheckpointError: a missing, truncated or corrupt file; a table the checkpoint lacks.
    """
    step = int(read_world(path)["step"])
    prefix = os.path.join(path, SINGLE_PROCESS_DIR + ("-training" if training else ""),
                          "model")
    if os.path.exists(f"{prefix}-{step}.index"):
        return f"{prefix}-{step}"
    with job_graph(cfg, training=training, evaluation=False) as job, \
            tf.compat.v1.Session(graph=job.graph) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        status = tf.train.Checkpoint(model=job.model).read(os.path.join(path, "dense", "ckpt"))
        status.expect_partial().run_restore_ops(sess)
        shards = open_shards(path)
        for name, table in job.tables.items():
            table_state.apply(table, owned_state(path, shards, name, 1, 0), path, sess)
        sess.run(job.global_step.assign(step))
        return job.saver.save(sess, prefix, global_step=step, write_meta_graph=False)
