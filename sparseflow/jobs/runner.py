"""Runs a YAML job: ``train``, ``evaluate`` and ``export``.

``train`` resumes from the newest checkpoint in ``<output.dir>/checkpoints`` when there is one
(the step counter is saved with it, so ``max_steps`` counts the whole run), evaluates every
``eval_every`` steps and at the end, checkpoints every ``save_every`` steps and at the end,
evicts on ``eviction.every_steps`` / ``every_seconds``, writes TensorBoard scalars and ``summary.json`` to
the output directory, and returns the summary.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
import time
from typing import IO, Iterator

import numpy as np
import tensorflow as tf

import sparseflow as sf
from sparseflow.jobs.graph import JobGraph, job_graph
from sparseflow.jobs.progress import Progress, format_table
from sparseflow.jobs.schema import JobConfig, output_dir
from sparseflow.jobs.summaries import ScalarWriter, input_wait_seconds, traced_run_options
from sparseflow.metrics import auc

CHECKPOINT_SUBDIR = "checkpoints"
SUMMARY_FILE = "summary.json"
# One traced step (per-op timing) in this many: enough samples for the input-wait share
# without the tracing cost showing in the throughput (traced steps are not timed).
_TRACE_EVERY = 25
logger = logging.getLogger("sparseflow")
# How long a session may take to close before the trainer leaves it (as TF's Session.__exit__).
_CLOSE_SECONDS = 30.0
# sparseflow's errors that a numpy function in the input pipeline or the step may raise:
# TensorFlow re-raises them wrapped in its own error and traceback.
_PIPELINE_ERRORS = ("CacheFullError", "TableFullError", "SendCountOverflowError",
                    "CheckpointError")


class EvictionTimer:
    """When ``schedule.eviction`` says to evict: after every ``every_steps``-th step, and
    after the first step ending ``every_seconds`` or more after the previous eviction (or
    the start of training)."""

    def __init__(self, cfg: JobConfig):
        self.every_steps = cfg.schedule.eviction.every_steps
        self.every_seconds = cfg.schedule.eviction.every_seconds
        self.last = time.monotonic()

    def due(self, step: int) -> bool:
        """Whether to evict after ``step`` (asked once per step)."""
        return bool((self.every_steps and step % self.every_steps == 0) or (
            self.every_seconds and time.monotonic() - self.last >= self.every_seconds))

    def evicted(self) -> None:
        """Starts the next time interval."""
        self.last = time.monotonic()


def train(cfg: JobConfig, *, stream: IO[str] | None = None, tty: bool | None = None) -> dict:
    """Trains the job to ``schedule.max_steps`` and returns the run's summary.

    One process, or one of N workers: when this process is one of several ranks
    (``sparseflow train --workers N`` starts them, each with its ``TF_CONFIG``), or inside
    ``graph_world.one_rank()`` (``--workers 1``), the tables are sharded by key over the
    workers (``docs/multi-worker.md``): each worker trains its part of every global batch,
    keys are counted, admitted, stamped and evicted at their owner in the step, and the
    dense gradients are summed; worker 0 writes the output files.

    Args:
      cfg: the validated job config.
      stream: progress and log output; default ``sys.stdout``.
      tty: force the progress bar on or off; default: whether ``stream`` is a terminal.

    Returns:
      The summary also written to ``<output.dir>/summary.json``: steps, samples, seconds,
      samples/s, input-wait share, each step's loss and the last window's, evaluation
      metrics, per-table statistics (summed over the workers' shards), the workers, the
      bytes a worker sent per step, and the final checkpoint.

    Raises:
      ValueError: the data cannot be read as configured, the batch does not split over the
        workers, or one of sparseflow's errors stopped the input pipeline or the step (a
        full table or fast tier: ``"training stopped after step N: CacheFullError: ..."``).
      RankLostError: over workers, a collective did not complete (another worker died or
        hangs); the message names the last checkpoint every worker completed.
      tf.errors.OpError: TensorFlow failed while running the step.

    Whatever ends the run, its session (and with it the input pipeline) is closed and
    deleted before the tables are, and before the error leaves.
    """
    stream = stream if stream is not None else sys.stdout
    out = output_dir(cfg)
    ckpt_dir = os.path.join(out, CHECKPOINT_SUBDIR)
    os.makedirs(out, exist_ok=True)
    sched = cfg.schedule
    earlier = _earlier_trainer_checkpoint(cfg, ckpt_dir)
    has_eval = has_eval_split(cfg)
    step = 0
    # Outermost, the errors: they leave after the session and the tables are released.
    with _clear_errors(lambda: step), contextlib.ExitStack() as closing, \
            job_graph(cfg, training=True, evaluation=has_eval) as job, \
            _session(job.graph) as sess:
        world = job.world
        chief = world is None or world.rank == 0
        if chief:
            with open(os.path.join(out, "config.json"), "w") as f:
                json.dump(cfg.to_dict(), f, indent=2)
        writer = closing.enter_context(contextlib.closing(
            ScalarWriter(out if cfg.output.tensorboard and chief else None)))
        sess.run(tf.compat.v1.global_variables_initializer())
        latest = earlier or sf.latest_checkpoint(ckpt_dir)
        if latest:
            _restore(sess, job, latest)
            stream.write(f"resumed from {latest} (step {int(sess.run(job.global_step))})\n")
        step = int(sess.run(job.global_step))
        if world is not None:
            _check_same_start(sess, job, step)
        # After the restore, and past the batches already trained on: a resumed run reads
        # the batches the uninterrupted run would have read next.
        sess.run(job.train_iterator.initializer, {job.train_skip: step})
        start_step = step
        progress = Progress(sched.max_steps, desc="step", unit="step", initial=start_step,
                            every=sched.log_every, stream=stream, tty=tty)
        eviction = EvictionTimer(cfg)
        timed_seconds, timed_steps, losses = 0.0, 0, []
        waits, traced_seconds = [], []
        eval_metrics: dict = {}
        last_saved = None
        fetches = [job.train_op, job.train.loss]  # each run adds 1 to the global step
        if world is not None:   # every worker evicts after the same steps
            fetches.append(job.evict_due_anywhere)
        while step < sched.max_steps:
            traced = (step - start_step) % _TRACE_EVERY == _TRACE_EVERY - 1
            feed = {job.evict_due: int(eviction.due(step + 1))} if world is not None else None
            begin = time.perf_counter()
            if traced:
                meta = tf.compat.v1.RunMetadata()
                values = sess.run(fetches, feed, options=traced_run_options(),
                                  run_metadata=meta)
                traced_seconds.append(time.perf_counter() - begin)
                waits.append(input_wait_seconds(meta))
            else:
                values = sess.run(fetches, feed)
                if step > start_step:  # the first step compiles kernels and allocates
                    timed_seconds += time.perf_counter() - begin
                    timed_steps += 1
            step += 1
            losses.append(float(values[1]))
            due = values[2] > 0 if world is not None else eviction.due(step)
            if due:
                sf.evict()   # over workers: each its own shards
                eviction.evicted()
            status = None
            if step % sched.log_every == 0 or step == sched.max_steps:
                rate = timed_steps / timed_seconds if timed_seconds else 0.0
                window = float(np.mean(losses[-sched.log_every:]))
                status = f"loss {window:.4f}"
                writer.scalars(step, {"train/loss": window, "train/steps_per_sec": rate,
                                      **_table_scalars(_table_stats(sess, job))})
            progress.update(step, status)
            if has_eval and sched.eval_every and step % sched.eval_every == 0 \
                    and step < sched.max_steps:
                eval_metrics = _evaluate(sess, job)
                progress.message(eval_line(step, eval_metrics))
                writer.scalars(step, {f"eval/{k}": v for k, v in eval_metrics.items()})
            if sched.save_every and step % sched.save_every == 0 and step < sched.max_steps:
                last_saved = _save(sess, job, ckpt_dir, step)
        progress.close()
        if has_eval:
            eval_metrics = _evaluate(sess, job)
            stream.write(eval_line(step, eval_metrics) + "\n")
            writer.scalars(step, {f"eval/{k}": v for k, v in eval_metrics.items()})
        if step > start_step or last_saved is None:
            last_saved = _save(sess, job, ckpt_dir, step)
        wait_share = (sum(waits) / sum(traced_seconds)) if traced_seconds else None
        if wait_share is not None:
            writer.scalars(step, {"train/input_wait_share": wait_share})
        tables = _table_stats(sess, job)
        summary = {
            "name": cfg.name, "workers": 1 if world is None else world.size,
            "steps": step, "steps_this_run": step - start_step,
            "batch_size": sched.batch_size,
            "samples_this_run": (step - start_step) * sched.batch_size,
            "train_seconds_timed": timed_seconds, "timed_steps": timed_steps,
            "samples_per_sec": (timed_steps * sched.batch_size / timed_seconds
                                if timed_seconds else None),
            "input_wait_share": wait_share,
            "train_loss": float(np.mean(losses[-sched.log_every:])) if losses else None,
            "losses": losses,
            "eval": eval_metrics,
            "tables": tables,
            "bytes_sent_per_step": _bytes_per_step(job),
            # Over workers, where a step's time goes outside TensorFlow's kernels: routing a
            # batch's keys (in tf.data, overlapping the step), and at the owner, in the step,
            # key processing, the rows' read and the update (evaluation included).
            "ms_per_step": _owner_ms_per_step(job, step - start_step),
            "checkpoint": last_saved,
        }
    if chief:
        with open(os.path.join(out, SUMMARY_FILE), "w") as f:
            json.dump(summary, f, indent=2, default=_json_scalar)
    stream.write(summary_text(summary) + "\n")
    return summary


def _restore(sess, job: JobGraph, prefix: str) -> None:
    """Restores ``prefix`` into the job.

    Raises:
      ValueError: the checkpoint's dense variables are not this job's model (names or
        shapes differ: the model section changed).
    """
    def refuse(why: str):
        return ValueError(f"Checkpoint {prefix!r} does not hold this job's dense model (was "
                          f"the model section changed?): {why[:300]}")

    # TF's Saver would load a variable of another shape without a word (a resource
    # variable's assign takes any shape): compare first.
    saved = tf.train.load_checkpoint(prefix).get_variable_to_shape_map()
    for variable in job.model.variables:
        name = variable.name.split(":")[0]
        if name not in saved:
            raise refuse(f"it has no variable {name!r}")
        if list(saved[name]) != variable.shape.as_list():
            raise refuse(f"{name!r} is {list(saved[name])} there, "
                         f"{variable.shape.as_list()} in this job")
    try:
        job.saver.restore(sess, prefix)
    except (tf.errors.NotFoundError, tf.errors.InvalidArgumentError) as err:
        lines = [line for line in str(err).splitlines() if line.strip()]
        raise refuse(lines[0] if lines else type(err).__name__) from None


def _earlier_trainer_checkpoint(cfg: JobConfig, ckpt_dir: str) -> str | None:
    """A checkpoint of the multi-worker trainer of earlier versions (``step-N/world.json``)
    in ``ckpt_dir`` with no newer checkpoint beside it: converted once into a one-process
    checkpoint, which resumes on any number of workers (None: none there).

    Raises:
      ValueError: over several workers (the conversion builds the job in one process:
        resume once with ``--workers 1``, then train on with any number).
    """
    from sparseflow.distributed import ranks
    from sparseflow.jobs.earlier_checkpoints import to_single_process
    from sparseflow.distributed.shard_files import complete_checkpoints, read_world

    sharded = complete_checkpoints(ckpt_dir)
    if not sharded:
        return None
    latest = sf.latest_checkpoint(ckpt_dir)
    if latest is not None and _step_of(latest) >= int(read_world(sharded[-1])["step"]):
        return None
    if ranks.detect().size > 1:
        raise ValueError(
            f"{ckpt_dir} holds a checkpoint of sparseflow's earlier multi-worker trainer "
            f"({sharded[-1]}), which is resumed by converting it in one process: run "
            f"`sparseflow train` with --workers 1 once, then train on with any number of "
            f"workers.")
    logger.warning("Resuming %s, a checkpoint of sparseflow's earlier multi-worker trainer: "
                   "the model, the tables and the step are restored; the dense optimizer's "
                   "state (e.g. Adam's moments) starts afresh.", sharded[-1])
    return to_single_process(cfg, sharded[-1], training=True)


def _table_stats(sess, job: JobGraph) -> dict:
    """Per table, its statistics; over workers the counts summed over every worker's shard
    (``keys_held_here``: this worker's)."""
    stats = {name: table.stats() for name, table in job.tables.items()}
    if job.world is None:
        return stats
    fields = ("keys_held", "keys_evicted", "keys_counted_not_admitted", "capacity")
    local = np.array([[stats[name][k] or 0 for k in fields] for name in job.tables],
                     np.float64)
    total = sess.run(job.table_stats_summed, {job.table_stats: local})
    for (name, table_stats), row, mine in zip(stats.items(), total, local[:, 0]):
        counted = table_stats["keys_counted_not_admitted"]
        table_stats.update({k: int(v) for k, v in zip(fields, row)})
        if counted is None:   # sketch counting: no exact count to sum
            table_stats["keys_counted_not_admitted"] = None
        table_stats["keys_held_here"] = int(mine)
    return stats


def _owner_ms_per_step(job: JobGraph, steps: int) -> dict | None:
    """Per stage of the sharded layer's key routing (``KeyRouter.seconds``), ms per step
    of this run; None in one process."""
    if job.world is None or not steps:
        return None
    routers = _training_routers()
    stages = sorted({stage for router in routers for stage in router.seconds})
    return {stage: 1000 * sum(r.seconds[stage] for r in routers) / steps for stage in stages}


def _bytes_per_step(job: JobGraph) -> float:
    """What a worker sent per training step (0.0 in one process; see
    ``batch_exchange.step_bytes``)."""
    from sparseflow.distributed.batch_exchange import step_bytes

    world = job.world
    if world is None or world.size == 1:
        return 0.0
    dense = sum(int(np.prod(v.shape)) for v in job.model.trainable_variables)
    return sum(step_bytes(list(router.widths), world.size, len(router.tables), router.max_dim,
                          flags=True) for router in _training_routers()) \
        + step_bytes([], world.size, 0, 0, dense_parameters=dense + 1)


def _training_routers() -> list:
    """The key routers of the training batches (not the evaluation's)."""
    rt = sf.runtime.current("summary")
    return [router for plan_id, router in rt.routers.items()
            if rt.insert_plans[plan_id].is_training]


def _check_same_start(sess, job: JobGraph, step: int) -> None:
    """Over workers: every worker resumed from the same step.

    Raises:
      ValueError: they did not (a worker saw another output.dir, or a stale view of it).
    """
    most, negative_least = sess.run(job.start_steps_max, {job.start_steps: [step, -step]})
    if most != -negative_least:
        raise ValueError(
            f"Workers resumed from different checkpoints (steps {-negative_least} to {most}; "
            f"worker {job.world.rank} from step {step}): every worker must see the same "
            f"output.dir (a shared file system for workers on several machines).")


def evaluate(cfg: JobConfig, checkpoint: str, *, stream: IO[str] | None = None,
             tty: bool | None = None) -> dict:
    """Evaluates a checkpoint on the job's eval split.

    Args:
      cfg: the validated job config (its ``data.eval`` split is read).
      checkpoint: a checkpoint prefix, or a directory holding checkpoints (the newest is used).
      stream: progress and the result line; default ``sys.stdout``.
      tty: force the progress bar on or off; default: whether ``stream`` is a terminal.

    Returns:
      dict: ``loss``, ``auc`` (first label), ``auc/<label>`` per label, ``batches``.

    Raises:
      ValueError: no checkpoint at ``checkpoint``, or the job has no eval split.
    """
    stream = stream if stream is not None else sys.stdout
    prefix = resolve_checkpoint(checkpoint, cfg)
    with job_graph(cfg, training=False, evaluation=True) as job, _session(job.graph) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        job.saver.restore(sess, prefix)
        # The batches in the split are known only with eval_steps: without it, no ETA.
        with Progress(cfg.schedule.eval_steps or None, desc="eval batch", unit="batch",
                      every=cfg.schedule.log_every, stream=stream, tty=tty) as progress:
            metrics = _evaluate(sess, job, progress)
    stream.write(eval_line(None, metrics) + "\n")
    return metrics


@contextlib.contextmanager
def _session(graph: tf.Graph) -> Iterator[tf.compat.v1.Session]:
    """A Session on ``graph`` (the default one inside), closed *and deleted* on exit, error
    or not.

    TensorFlow destroys a session's input pipelines (iterators, their threads, the numpy
    functions in flight on them) only when it deletes the session, which ``close()`` does not
    do. Left to the garbage collector, a session whose run failed lives on in the error's
    traceback, often until interpreter shutdown, when a pipeline thread can no longer take
    the GIL and the iterator's destructor waits for it. Deleted here, the pipelines end
    before the tables they call into are closed (``job_graph``'s exit, next), while the
    interpreter is whole.
    """
    sess = tf.compat.v1.Session(graph=graph)
    try:
        with graph.as_default(), sess.as_default():
            yield sess
    finally:
        # TensorFlow bounds its own close after an error the same way (Session.__exit__):
        # a close that does not return is left behind, and so is the session, undeleted.
        closer = threading.Thread(target=sess.close, name="sparseflow-session-close",
                                  daemon=True)
        closer.start()
        closer.join(_CLOSE_SECONDS)
        if closer.is_alive():
            logger.error("The session did not close within %.0f s; it is left open.",
                         _CLOSE_SECONDS)
        else:
            sess.__del__()   # TF_DeleteSession now (idempotent)


@contextlib.contextmanager
def _clear_errors(steps_done) -> Iterator[None]:
    """Turns a TensorFlow error that wraps one of sparseflow's (raised in a numpy function:
    a full table or fast tier, too many keys for ``send_count``) into a ValueError with
    sparseflow's message and ``steps_done()``, without TensorFlow's traceback."""
    try:
        yield
    except tf.errors.OpError as err:
        ours = sparseflow_error(str(err))
        if ours is None:
            raise
        raise ValueError(f"training stopped after step {steps_done()}: {ours}") from None


def sparseflow_error(message: str) -> str | None:
    """``"TableFullError: Table `t` is full: ..."`` when the message of a TensorFlow error
    wraps one of sparseflow's errors (raised in a numpy function), else None."""
    for line in message.splitlines():
        for name in _PIPELINE_ERRORS:
            if f"{name}: " in line:
                return line[line.index(name):].strip()
    return None


def _save(sess, job: JobGraph, ckpt_dir: str, step: int) -> str:
    # No meta graph: the job rebuilds its graph from the config, and the table collection
    # holds Python objects a MetaGraphDef cannot store.
    return job.saver.save(sess, os.path.join(ckpt_dir, "model"), global_step=step,
                          write_meta_graph=False)


def has_eval_split(cfg: JobConfig) -> bool:
    """Whether the job's data has an eval split."""
    data = cfg.data
    if data.source == "generator":
        return data.generator.eval_rows > 0
    if data.source == "movielens":
        return data.movielens.eval_fraction > 0
    return bool(data.eval)


def resolve_checkpoint(checkpoint: str, cfg: JobConfig | None = None) -> str:
    """A checkpoint prefix from a prefix or a directory (its newest checkpoint, also looking in
    its ``checkpoints/`` subdirectory, where ``train`` writes them). With ``cfg``, a sharded
    checkpoint of multi-worker training there is merged into a single-process one first
    (``sparseflow.jobs.earlier_checkpoints``), once.

    Raises:
      ValueError: nothing restorable there.
      CheckpointError: a sharded checkpoint with a missing or corrupt file.
    """
    path = os.path.abspath(os.path.expanduser(str(checkpoint)))
    if os.path.isdir(path):
        latest = None
        for directory in (path, os.path.join(path, CHECKPOINT_SUBDIR)):
            latest = sf.latest_checkpoint(directory)
            if latest:
                break
        if cfg is not None:
            from sparseflow.jobs.earlier_checkpoints import to_single_process
            from sparseflow.distributed.shard_files import read_world, sharded_checkpoint

            sharded = sharded_checkpoint(path, CHECKPOINT_SUBDIR)
            # Both layouts in one place: the newer step (a run went on after an upgrade).
            if sharded and (latest is None or read_world(sharded)["step"] > _step_of(latest)):
                return to_single_process(cfg, sharded)
        if latest:
            return latest
    elif os.path.exists(path + ".index"):
        return path
    raise ValueError(f"Argument `checkpoint` must be a checkpoint prefix or a directory holding "
                     f"checkpoints (e.g. the job's output directory). Received: {checkpoint!r}")


def _step_of(prefix: str) -> int:
    """The step of a ``.../model-<step>`` checkpoint prefix (-1 without one)."""
    tail = prefix.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


def _json_scalar(value):
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _evaluate(sess, job: JobGraph, progress: Progress | None = None) -> dict:
    """Loss and AUC over the eval split (or ``eval_steps`` batches of it); ``progress``, if
    given, moves on after each batch."""
    sess.run(job.eval_iterator.initializer)
    limit = job.cfg.schedule.eval_steps or None
    losses, probs, labels = [], [], []
    while limit is None or len(losses) < limit:
        try:
            loss, p, y = sess.run([job.eval.loss, job.eval.probabilities, job.eval.labels])
        except tf.errors.OutOfRangeError:
            break
        losses.append(loss)
        probs.append(p)
        labels.append(y)
        if progress is not None:
            progress.update(len(losses))
    return eval_metrics(job.cfg, losses, probs, labels)


def eval_metrics(cfg: JobConfig, losses: list, probs: list, labels: list) -> dict:
    """``loss`` (the mean of the batches' mean losses), ``batches``, ``auc/<label>`` per
    label and ``auc`` (the first label's) from each eval batch's loss, probabilities and
    labels ``[batch, n_labels]``.

    Raises:
      ValueError: no batch (the eval split is smaller than a batch).
    """
    if not losses:
        raise ValueError("The eval split produced no batch: it has fewer rows than "
                         f"schedule.batch_size ({cfg.schedule.batch_size}).")
    p, y = np.concatenate(probs), np.concatenate(labels)
    metrics = {"loss": float(np.mean(losses)), "batches": len(losses)}
    for i, name in enumerate(cfg.columns.labels):
        metrics[f"auc/{name}"] = auc(y[:, i], p[:, i])
    metrics["auc"] = metrics[f"auc/{cfg.columns.labels[0]}"]
    return metrics


def _table_scalars(tables: dict) -> dict:
    """TensorBoard scalars of :func:`_table_stats`' statistics."""
    values = {}
    for name, stats in tables.items():
        values[f"tables/{name}/keys_held"] = stats["keys_held"]
        values[f"tables/{name}/keys_evicted"] = stats["keys_evicted"]
        if stats["keys_counted_not_admitted"] is not None:
            values[f"tables/{name}/keys_waiting_admission"] = stats["keys_counted_not_admitted"]
    return values


def eval_line(step, metrics: dict) -> str:
    """One log line of evaluation metrics (``step`` None: without a step)."""
    aucs = "  ".join(f"{k} {v:.4f}" for k, v in metrics.items() if k.startswith("auc/"))
    where = f"step {step}: " if step is not None else ""
    return f"{where}eval loss {metrics['loss']:.4f}  {aucs}  ({metrics['batches']} batches)"


def summary_text(summary: dict) -> str:
    """The final summary table printed after training."""
    rows = [("steps", summary["steps"]),
            ("samples this run", summary["samples_this_run"])]
    if summary["samples_per_sec"]:
        rows.append(("throughput (samples/s)", round(summary["samples_per_sec"])))
    if summary["input_wait_share"] is not None:
        rows.append(("input wait (share of step)", f"{100 * summary['input_wait_share']:.1f}%"))
    if summary["train_loss"] is not None:
        rows.append(("train loss (last window)", summary["train_loss"]))
    for key, value in summary["eval"].items():
        if key not in ("batches", "auc"):  # "auc" repeats the first label's
            rows.append((f"eval {key}", value))
    rows.append(("checkpoint", summary["checkpoint"]))
    text = [f"== {summary['name']} ==", format_table(("metric", "value"), rows), ""]
    table_rows = [(name, s["keys_held"], s["capacity"], s["keys_evicted"],
                   "-" if s["keys_counted_not_admitted"] is None
                   else s["keys_counted_not_admitted"])
                  for name, s in summary["tables"].items()]
    text.append(format_table(("table", "keys held", "capacity", "evicted", "not yet admitted"),
                             table_rows))
    return "\n".join(text)
