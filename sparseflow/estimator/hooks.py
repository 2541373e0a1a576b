"""The session hooks an Estimator adds to every train / evaluate / predict run."""

from __future__ import annotations

import logging
import time

import tensorflow as tf

from sparseflow import runtime as _runtime
from sparseflow.pipeline import graph_modifier

logger = logging.getLogger("sparseflow.estimator")


class DatasetInitializerHook(tf.compat.v1.train.SessionRunHook):
    """Starts the iterator the Estimator made over ``input_fn``'s dataset, unless graph
    modification replaced it (the rewritten iterator is started by whoever rewrote it)."""

    def __init__(self, iterator, get_next: tf.Operation):
        self._iterator = iterator
        self._get_next = get_next

    def after_create_session(self, session, coord):
        if not graph_modifier.was_rewritten(self._get_next):
            session.run(self._iterator.initializer)


class StartPipelineHook(tf.compat.v1.train.SessionRunHook):
    """Starts the key pipeline at ``begin`` when nothing else did (no ``GraphModifierHook``
    among the user's hooks): what ``GraphModifierHook`` does, with graph modification when
    modify-graph lookups wait for it. A model without tables needs no pipeline."""

    def __init__(self):
        self._modifier = None

    def begin(self):
        rt = _runtime.current("Estimator")
        if rt.pipeline_started or not rt.tables:
            return
        pending = rt.modify is not None and bool(rt.modify.lookups)
        self._modifier = graph_modifier.GraphModifierHook(modify_graph=pending)
        self._modifier.begin()

    def after_create_session(self, session, coord):
        if self._modifier is not None:
            self._modifier.after_create_session(session, coord)


class GlobalStepCheckHook(tf.compat.v1.train.SessionRunHook):
    """Fails the first training step that leaves the global step where it was: the stop at
    ``steps`` / ``max_steps`` and every checkpoint count on it (tf.estimator only warned and
    could train forever)."""

    def __init__(self, global_step):
        self._global_step = global_step
        self._before = None
        self._checked = False

    def after_create_session(self, session, coord):
        self._before = int(session.run(self._global_step))

    def after_run(self, run_context, run_values):
        if self._checked:
            return
        self._checked = True
        after = int(run_context.session.run(self._global_step))
        if after == self._before:
            raise RuntimeError(
                f"model_fn's train_op did not increase the global step (still {after} after "
                f"a training step): increment it in train_op, e.g. optimizer.minimize(loss, "
                f"global_step=tf.compat.v1.train.get_global_step()) or tf.group(train_op, "
                f"tf.compat.v1.assign_add(tf.compat.v1.train.get_global_step(), 1)).")


class LogHook(tf.compat.v1.train.SessionRunHook):
    """Logs the loss, the global step and global steps per second every ``every_n`` steps
    (``RunConfig.log_step_count_steps``) on the ``sparseflow.estimator`` logger at INFO."""

    def __init__(self, loss, global_step, every_n: int):
        self._loss = loss
        self._global_step = global_step
        self._every_n = every_n
        self._count = 0
        self._last = None

    def begin(self):
        self._count = 0
        self._last = None

    def before_run(self, run_context):
        self._count += 1
        if self._count % self._every_n == 0 or self._count == 1:
            return tf.compat.v1.train.SessionRunArgs({"loss": self._loss})
        return None

    def after_run(self, run_context, run_values):
        if not run_values.results:
            return
        now = time.monotonic()
        # Read after the step: fetched with the train op, the global step may be read before
        # or after its increment.
        step = int(run_context.session.run(self._global_step))
        if self._last is None:
            logger.info("loss = %.6g, step = %d", run_values.results["loss"], step)
        else:
            rate = (step - self._last[1]) / max(now - self._last[0], 1e-9)
            logger.info("loss = %.6g, step = %d (%.3f global steps/s)",
                        run_values.results["loss"], step, rate)
        self._last = (now, step)


class StopAfterNHook(tf.compat.v1.train.SessionRunHook):
    """Stops after ``n`` runs (evaluation and prediction ``steps``); None: at the data's end."""

    def __init__(self, n: int | None):
        self._n = n
        self._done = 0

    def after_run(self, run_context, run_values):
        self._done += 1
        if self._n is not None and self._done >= self._n:
            run_context.request_stop()


class CheckpointHook(tf.compat.v1.train.CheckpointSaverHook):
    """TF's ``CheckpointSaverHook`` whose event records (graph, checkpoint logs) go to
    ``summary_dir``: the model directory on rank 0, a directory of its own on other ranks
    (writers of several ranks would otherwise share an event file name).

    Over several ranks, every rank must save at the same step (a save takes part in
    collectives), which each rank's own clock would not give: with ``ranks_save_secs``, each
    training step also takes the largest over the ranks of "my ``ranks_save_secs`` have
    passed since the last save" (one scalar all-reduce in the step), and every rank saves
    after the step where any rank's time was up.

    Args:
      checkpoint_dir: where checkpoints go (the model directory).
      summary_dir: where the hook's event records go.
      ranks_save_secs: the seconds between saves agreed over the ranks, or None (then
        ``save_secs`` / ``save_steps`` in ``kwargs`` decide, on this rank's own).
      **kwargs: ``CheckpointSaverHook``'s other arguments.
    """

    def __init__(self, checkpoint_dir, *, summary_dir, ranks_save_secs=None, **kwargs):
        super().__init__(checkpoint_dir, **kwargs)
        self._summary_dir = summary_dir
        self._ranks_save_secs = ranks_save_secs
        self._due = self._agreed = None
        self._last_save = time.monotonic()

    def begin(self):
        super().begin()
        from tensorflow.python.training.summary_io import SummaryWriterCache
        self._summary_writer = SummaryWriterCache.get(self._summary_dir)
        if self._ranks_save_secs is not None:
            from sparseflow.distributed import collectives
            self._due = tf.compat.v1.placeholder_with_default(
                tf.constant(0, tf.int32), [], name="sparseflow_checkpoint_due")
            self._agreed = collectives.all_reduce(self._due, "max")

    def after_create_session(self, session, coord):
        super().after_create_session(session, coord)
        self._last_save = time.monotonic()

    def before_run(self, run_context):
        args = super().before_run(run_context)
        if self._agreed is None:
            return args
        due = int(time.monotonic() - self._last_save >= self._ranks_save_secs)
        return tf.compat.v1.train.SessionRunArgs([args.fetches, self._agreed],
                                                 feed_dict={self._due: due})

    def after_run(self, run_context, run_values):
        if self._agreed is None:
            return super().after_run(run_context, run_values)
        _, agreed = run_values.results
        if agreed:
            step = run_context.session.run(self._global_step_tensor)
            self._timer.update_last_triggered_step(step)
            self._last_save = time.monotonic()
            if self._save(run_context.session, step):
                run_context.request_stop()


class SumMetricsHook(tf.compat.v1.train.SessionRunHook):
    """Over several ranks, at the end of an evaluation: every metric variable (the totals,
    counts and confusion counts ``tf.compat.v1.metrics`` accumulate) summed over the ranks,
    so that the final metric values read after it are those of all the ranks' data. The
    variables under ``skip_scope`` (a metric whose input is summed over the ranks already)
    are left as they are. Built at ``begin`` (the graph is finalized later)."""

    def __init__(self, skip_scope: str):
        self._skip_scope = skip_scope
        self._sum = None

    def begin(self):
        from sparseflow.distributed import collectives
        variables = [v for v in tf.compat.v1.get_collection(
            tf.compat.v1.GraphKeys.METRIC_VARIABLES)
            if not v.op.name.startswith(self._skip_scope)]
        self._sum = tf.group(*[v.assign(collectives.all_reduce(v.read_value(), "sum"))
                               for v in variables])

    def end(self, session):
        session.run(self._sum)
