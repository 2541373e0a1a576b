"""Trains a YAML job on N workers: tables sharded by key, dense variables replicated.

Every worker runs this with its own ``TF_CONFIG`` (``sparseflow train --workers N`` starts N
local ones). ``tf.distribute.MultiWorkerMirroredStrategy`` starts TensorFlow's gRPC server
and collective executor; each step then makes the same sequence of collectives on every
worker (``Exchange``): keys to their owners, embeddings back, gradients to the owners, and
one all-reduce of the dense gradients and the loss. Worker r reads rows ``[r*B/N,
(r+1)*B/N)`` of every global batch of ``schedule.batch_size`` rows, so N workers train on
the same global batches as one. See docs/multi-worker.md.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import sys
import time
from typing import IO

import numpy as np
import tensorflow as tf

from sparseflow.checkpoint import sparse_format as fmt
from sparseflow.checkpoint import table_state
from sparseflow.distributed.cluster import World, start_server
from sparseflow.distributed.exchange import GROUP_KEY, Exchange
from sparseflow.distributed.routing import KeyRouter
from sparseflow.distributed.shard_files import (WORLD_FILE, complete_checkpoints, open_shards,
                                                owned_state, read_world, table_shards)
from sparseflow.distributed.sharding import PAD_KEY
from sparseflow.jobs.data import make_dataset
from sparseflow.jobs.graph import apply_model, call_on_zeros, dense_optimizer, table_initializer
from sparseflow.jobs.progress import Progress
from sparseflow.jobs.runner import (CHECKPOINT_SUBDIR, SUMMARY_FILE, EvictionTimer,
                                    eval_line, eval_metrics, has_eval_split, output_dir,
                                    sparseflow_error)
from sparseflow.jobs.schema import JobConfig
from sparseflow.jobs.summaries import ScalarWriter
from sparseflow.checkpoint.saver import latest_checkpoint
from sparseflow.models import build_model, pool
from sparseflow.pipeline.batch_clock import batch_timestamp, no_timestamp
from sparseflow.optimizers.adagrad import Adagrad
from sparseflow.optimizers.ftrl import Ftrl
from sparseflow.optimizers.gradient_descent import GradientDescent
from sparseflow.optimizers.hparams import (adagrad_hparams, ftrl_hparams, lazy_adam_hparams,
                                           sgd_hparams)
from sparseflow.optimizers.lazy_adam import LazyAdam
from sparseflow.table import SparseTable, host_table

_SPARSE_KERNELS = {"lazy_adam": (LazyAdam, lazy_adam_hparams), "sgd": (GradientDescent, sgd_hparams),
                   "adagrad": (Adagrad, adagrad_hparams), "ftrl": (Ftrl, ftrl_hparams)}
KEEP_CHECKPOINTS = 3
CHECKPOINT_TIMEOUT_SECONDS = 3600.0
# What a lost peer looks like from a collective: its timeout, the coordination service's
# heartbeats, or the collective executor cancelled after another collective failed.
_PEER_ERRORS = (tf.errors.DeadlineExceededError, tf.errors.UnavailableError,
                tf.errors.CancelledError, tf.errors.AbortedError)


class WorkerLostError(RuntimeError):
    """A collective did not complete: another worker died, hung or left."""


def shard_tables(cfg: JobConfig) -> list[SparseTable]:
    """This worker's shard of every table of ``cfg``: host rows, each shard with room for
    ``vocabulary_size`` keys (Rec SDK's per-device size), the job's admission, eviction and
    sparse optimizer.

    Raises:
      ValueError: a table asks for device rows or a host/disk tier (not sharded yet).
    """
    kernel_cls, hparams = _SPARSE_KERNELS[cfg.sparse_optimizer.name]
    kernel = kernel_cls(hparams(learning_rate=cfg.sparse_optimizer.learning_rate,
                                **cfg.sparse_optimizer.params), runtime=False)
    tables = []
    for i, entry in enumerate(cfg.tables):
        if entry.rows_on == "device" or entry.host_vocabulary_size or entry.ssd_vocabulary_size:
            raise ValueError(
                f"tables.{entry.name}: multi-worker training keeps every shard's rows in host "
                f"memory; rows_on must be host or auto and host_vocabulary_size / "
                f"ssd_vocabulary_size 0, got rows_on={entry.rows_on}, host_vocabulary_size="
                f"{entry.host_vocabulary_size}, ssd_vocabulary_size="
                f"{entry.ssd_vocabulary_size}.")
        table = host_table(entry.name, entry.dim, table_initializer(entry, cfg.schedule.seed + i),
                           entry.vocabulary_size, access_threshold=entry.access_threshold,
                           eviction_threshold=entry.eviction_threshold, optimizer=kernel,
                           size_hint=f"tables.{entry.name}.vocabulary_size",
                           admission_counter=entry.admission_counter)
        tables.append(table)
    return tables


class ShardedJob:
    """A job's model, table shards, data and steps on one worker of ``world``.

    Args:
      cfg: the validated job.
      world: this worker's place (``World(0, 1)``: one worker, no collectives).
    """

    def __init__(self, cfg: JobConfig, world: World):
        self.cfg, self.world = cfg, world
        n = world.size
        if cfg.schedule.batch_size % n:
            raise ValueError(f"schedule.batch_size ({cfg.schedule.batch_size}) must be a "
                             f"multiple of the number of workers ({n}): each worker trains "
                             f"on an equal part of every global batch.")
        self.local_batch = cfg.schedule.batch_size // n
        self.exchange = Exchange(n, cfg.distributed.timeout_seconds)
        self.key_exchange = Exchange(n, cfg.distributed.timeout_seconds,
                                     group_key=GROUP_KEY + 1)
        self.tables = shard_tables(cfg)
        names = [t.name for t in cfg.tables]
        self.router = KeyRouter(self.tables, [names.index(f.table) for f in cfg.features],
                                [f.faae_coefficient for f in cfg.features], n,
                                cfg.distributed.hash, cfg.distributed.send_count)
        self.model = build_model(cfg.model.name, cfg.model.params,
                                 n_outputs=len(cfg.columns.labels), seed=cfg.schedule.seed)
        call_on_zeros(self.model, cfg)
        self.optimizer = dense_optimizer(cfg)
        self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self.dims = [cfg.table(f.table).dim for f in cfg.features]
        self.bytes_sent = 0.0           # this worker's collective payload, for the summary
        # Traced once, for the data's signature.
        self._keys_step = self._train_step = self._eval_step = None
        # Checkpoint barriers wait for the slowest worker's writes or reads, which may take
        # far longer than a step: their own group and a long timeout (a dead peer is still
        # reported within seconds by the coordination service's heartbeats).
        self.checkpoint_exchange = Exchange(n, CHECKPOINT_TIMEOUT_SECONDS,
                                            group_key=GROUP_KEY + 2)
        self._agree = tf.function(lambda x: self.checkpoint_exchange.reduce(x, "Max"))
        n_dense = sum(int(np.prod(v.shape)) for v in self.model.trainable_variables)
        self.dense_parameters = n_dense

    # -- data ------------------------------------------------------------------------------

    def dataset(self, split: str, skip: int = 0) -> tf.data.Dataset:
        """This worker's part of every global batch of ``split``, its keys routed."""
        cfg, r, b = self.cfg, self.world.index, self.local_batch
        ds = make_dataset(cfg.data, cfg.columns, split, batch_size=cfg.schedule.batch_size,
                          seed=cfg.schedule.seed, repeat=split == "train")
        if skip:
            ds = ds.skip(skip)
        ds = ds.map(lambda batch: {k: v[r * b:(r + 1) * b] for k, v in batch.items()})
        features, ts_column = cfg.features, cfg.columns.timestamp
        router = self.router

        @tf.autograph.experimental.do_not_convert
        def route(*keys):
            return router.route(list(keys))

        def with_routes(batch):
            keys = [tf.reshape(tf.cast(batch[f.index_key], tf.int64), [-1]) for f in features]
            send, counts, place, gather, sizes = tf.numpy_function(
                route, keys, [tf.int64, tf.int32, tf.int32, tf.int32, tf.int64],
                stateful=False, name="sparseflow_route_keys")
            n, t = self.world.size, len(self.tables)
            out = dict(batch)
            out.update({"route/send": tf.ensure_shape(send, [n, None, 2]),
                        "route/counts": tf.ensure_shape(counts, [n, t]),
                        "route/place": tf.ensure_shape(place, [None, 2]),
                        "route/gather": tf.ensure_shape(gather, [None]),
                        "route/sizes": tf.ensure_shape(sizes, [t + len(features)])})
            out["route/timestamp"] = (batch_timestamp(batch[ts_column])
                                      if ts_column and split == "train" else no_timestamp())
            return out

        return ds.map(with_routes, num_parallel_calls=2, deterministic=True).prefetch(2)

    # -- one step ----------------------------------------------------------------------------

    def _keys(self, batch: dict, train: bool):
        """Keys to their owners and the owners' key processing: the token of this worker's
        share of the step, and the agreed width m. Its own collective group, so that it can
        run one batch ahead of the step on another thread."""
        router = self.router
        received, counts, timestamp = self.key_exchange.all_to_all_dynamic(
            batch["route/send"], batch["route/counts"], PAD_KEY, batch["route/timestamp"])
        m = tf.shape(received)[1]

        stamped = bool(self.cfg.columns.timestamp) and train   # static: any int64 is a time

        @tf.autograph.experimental.do_not_convert
        def process(received, counts, timestamp):
            return router.process(received, counts, int(timestamp) if stamped else None,
                                  train)

        token = tf.numpy_function(process, [received, counts, timestamp], tf.int64,
                                  stateful=True, name="sparseflow_owner_keys")
        return token, m

    def _embeddings(self, batch: dict, token: tf.Tensor, m: tf.Tensor):
        """The owners' rows of a processed step read and sent back: every unique key's
        embedding ``[U, max_dim]`` (in ``route/place`` order) and each key's flat place in
        the ``[N * m]`` reply."""
        router = self.router
        reply = tf.numpy_function(router.gather, [token], tf.float32, stateful=True,
                                  name="sparseflow_owner_gather")
        reply = tf.ensure_shape(reply, [self.world.size, None, router.max_dim])
        back = self.exchange.all_to_all(reply)
        place = batch["route/place"]
        where = place[:, 0] * m + place[:, 1]
        return tf.gather(tf.reshape(back, [-1, router.max_dim]), where), where

    def _logits(self, batch: dict, unique: tf.Tensor) -> tf.Tensor:
        pooled, start = [], 0
        for f, dim in zip(self.cfg.features, self.dims):
            keys = batch[f.index_key]
            n = int(np.prod(keys.shape.as_list()))   # static: every key of the feature
            index = batch["route/gather"][start:start + n]
            start += n
            emb = tf.gather(unique[:, :dim], index)
            emb = tf.reshape(emb, keys.shape.as_list() + [dim])
            pooled.append(pool(emb, keys, f.combiner))
        return apply_model(self.model, self.cfg, batch.get("dense"), pooled)

    def _scale(self) -> float:
        """Per-example losses summed and divided by this: the global batch's mean."""
        return float(self.cfg.schedule.batch_size * len(self.cfg.columns.labels))

    def _train(self, batch: dict, token: tf.Tensor, m: tf.Tensor):
        ex = self.exchange
        unique, where = self._embeddings(batch, token, m)
        variables = list(self.model.trainable_variables)
        with tf.GradientTape() as tape:
            tape.watch(unique)
            logits = self._logits(batch, unique)
            loss = tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(
                labels=batch["labels"], logits=logits)) / self._scale()
        grads = tape.gradient(loss, variables + [unique])
        sparse = tf.convert_to_tensor(grads[-1])
        dims = self.router.max_dim
        to_owners = tf.scatter_nd(where[:, None], sparse,
                                  tf.stack([self.world.size * m, dims]))
        received = ex.all_to_all(tf.reshape(to_owners, [self.world.size, -1, dims]))
        updated = tf.numpy_function(self.router.update, [token, received], tf.int64,
                                    stateful=True, name="sparseflow_owner_update")
        dense = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
                 for g, v in zip(grads[:-1], variables)]
        flat = ex.reduce(tf.concat([tf.reshape(g, [-1]) for g in dense]
                                   + [tf.reshape(loss, [1])], 0), "Add")
        summed, start = [], 0
        for v in variables:
            size = int(np.prod(v.shape))
            summed.append(tf.reshape(flat[start:start + size], v.shape))
            start += size
        with tf.control_dependencies([updated]):
            apply = self.optimizer.apply_gradients(zip(summed, variables),
                                                   global_step=self.global_step)
        with tf.control_dependencies([apply]):
            return tf.identity(flat[-1]), m

    def _evaluate(self, batch: dict):
        token, m = self._keys(batch, False)
        unique, _ = self._embeddings(batch, token, m)
        logits = self._logits(batch, unique)
        loss = tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(
            labels=batch["labels"], logits=logits))
        return loss, tf.sigmoid(logits), batch["labels"], m

    def step_bytes(self, m: int) -> float:
        """What this worker sends in one training step: counts, keys (with weights),
        embeddings and gradients to the N-1 others, and a ring all-reduce of the dense
        gradients (2 (N-1)/N of them)."""
        n, t, d = self.world.size, len(self.tables), self.router.max_dim
        if n == 1:
            return 0.0
        others = n - 1
        all_to_all = others * (t * 4 + m * 16 + 2 * m * d * 4)
        return all_to_all + 2.0 * others / n * (self.dense_parameters + 1) * 4

    # -- the loop ----------------------------------------------------------------------------

    def _signature(self, batch: dict) -> list:
        """The batch's structure with the routing buffers' step-dependent sizes left open,
        so that a step is traced once (a retrace costs seconds)."""
        open_shapes = {"route/send": [self.world.size, None, 2], "route/place": [None, 2],
                       "route/gather": [None]}
        return [{k: tf.TensorSpec(open_shapes.get(k, v.shape), v.dtype)
                 for k, v in batch.items()}]

    def process_keys(self, batch: dict):
        """The first half of a training step: the batch's keys to their owners, processed
        there. Returns what :meth:`run_step` takes; may run on another thread while the
        previous batch's :meth:`run_step` runs."""
        if self._keys_step is None:
            self._keys_step = tf.function(lambda b: self._keys(b, True),
                                          input_signature=self._signature(batch))
        return self._keys_step(batch)

    def run_step(self, batch: dict, keys=None) -> float:
        """The rest of a training step (``keys`` from :meth:`process_keys`; None: process
        them now); returns the global batch's loss."""
        keys = self.process_keys(batch) if keys is None else keys
        if self._train_step is None:
            signature = self._signature(batch) + [tf.TensorSpec([], tf.int64),
                                                  tf.TensorSpec([], tf.int32)]
            self._train_step = tf.function(self._train, input_signature=signature)
        loss, m = self._train_step(batch, *keys)
        self.bytes_sent += self.step_bytes(int(m))
        return float(loss)

    def evaluate(self) -> dict:
        """Loss and AUC over the eval split (or ``eval_steps`` global batches), each worker
        on its part of every batch; the same numbers on every worker."""
        limit = self.cfg.schedule.eval_steps or None
        sums, probs, labels = [], [], []
        for batch in self.dataset("eval"):
            if self._eval_step is None:
                self._eval_step = tf.function(self._evaluate,
                                              input_signature=self._signature(batch))
            loss, p, y, _ = self._eval_step(batch)
            sums.append(float(loss))
            probs.append(p.numpy())
            labels.append(y.numpy())
            if limit is not None and len(sums) >= limit:
                break
        if not sums:
            return eval_metrics(self.cfg, [], [], [])   # raises: no batch
        gather = tf.function(self.exchange.gather)
        add = tf.function(lambda x: self.exchange.reduce(x, "Add"))
        p = gather(tf.constant(np.concatenate(probs))).numpy()
        y = gather(tf.constant(np.concatenate(labels))).numpy()
        losses = add(tf.constant(sums, tf.float64)).numpy() / self._scale()
        return eval_metrics(self.cfg, list(losses), [p], [y])

    def evict(self) -> dict:
        """Evicts stale keys from this worker's shards; ``{table: keys removed}``."""
        return {t.table_name: t.processor.evict(t.eviction_threshold).keys_removed
                for t in self.tables if t.eviction_threshold >= 0}

    def table_stats(self) -> dict:
        """Per table, the sums over all workers' shards of keys held, keys evicted, keys
        counted but not admitted, capacity, and the keys this worker holds."""
        fields = ("keys_held", "keys_evicted", "keys_counted_not_admitted", "capacity")
        local = np.array([[t.stats()[k] or 0 for k in fields] for t in self.tables],
                         np.float64)
        total = tf.function(lambda x: self.exchange.reduce(x, "Add"))(
            tf.constant(local)).numpy()
        return {t.table_name: {**{k: int(v) for k, v in zip(fields, row)},
                               "keys_held_here": int(mine)}
                for t, row, mine in zip(self.tables, total, local[:, 0])}

    def barrier(self, value: int = 0) -> tuple[int, int]:
        """Returns once every worker has reached it: the largest and smallest ``value`` any
        worker passed."""
        most = self._agree(tf.constant([value, -value], tf.int64)).numpy()
        return int(most[0]), int(-most[1])

    # -- checkpoints -------------------------------------------------------------------------

    def _dense_checkpoint(self) -> tf.train.Checkpoint:
        return tf.train.Checkpoint(model=self.model, optimizer=self.optimizer,
                                   global_step=self.global_step)

    def save(self, ckpt_dir: str, step: int) -> str:
        """Writes this worker's shards, then (worker 0) the dense variables and the
        ``world.json`` that marks the checkpoint complete; every worker returns once it is.

        Returns:
          The checkpoint's directory.
        """
        n, r = self.world.size, self.world.index
        final = os.path.join(ckpt_dir, f"step-{step:09d}")
        shard = os.path.join(final, f"worker-{r}-of-{n}")
        if os.path.isdir(shard):  # a crashed earlier save of this step
            shutil.rmtree(shard)
        entries = {}
        for t in self.tables:
            config = {"dim": t.dim, "capacity": t.capacity(),
                      "access_threshold": t.access_threshold,
                      "eviction_threshold": t.eviction_threshold}
            entries[t.table_name] = fmt.write_table_state(shard, t.table_name,
                                                          table_state.capture(t), t.dim, config)
            t.processor.mark_saved()   # no incremental saves: drop the eviction tombstones
        fmt.write_manifest(shard, entries)
        self.barrier()          # every shard written
        if self.world.chief:
            self._dense_checkpoint().write(os.path.join(final, "dense", "ckpt"))
            meta = {"step": step, "world_size": n, "hash": self.cfg.distributed.hash,
                    "tables": [t.table_name for t in self.tables]}
            tmp = os.path.join(final, WORLD_FILE + ".tmp")
            with open(tmp, "w") as f:
                json.dump(meta, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, os.path.join(final, WORLD_FILE))
        self.barrier()          # complete before anyone goes on
        if self.world.chief:
            _prune(ckpt_dir)
        return final

    def restore(self, path: str) -> int:
        """Loads a checkpoint saved by any number of workers: each table's shards re-bucketed
        to this world's owners, the dense variables from worker 0's copy. Returns its step.

        Raises:
          CheckpointError: a missing, truncated or corrupt file, or a table the checkpoint
            lacks.
        """
        meta = read_world(path)
        old_n = int(meta["world_size"])
        same = old_n == self.world.size and meta["hash"] == self.cfg.distributed.hash
        # Same owners: this worker's own shard is all it needs (each worker reads 1/N).
        shards = open_shards(path, self.world.index if same else None)
        source = f"{path} ({old_n} workers)"
        states = [table_shards(path, shards, t.table_name)[0] if same else owned_state(
            path, shards, t.table_name, self.world.size, self.world.index,
            self.cfg.distributed.hash) for t in self.tables]
        for t, mine in zip(self.tables, states):   # all checked before any table changes
            table_state.check_fits(t, mine, source)
        for t, mine in zip(self.tables, states):
            table_state.apply(t, mine, source)
        try:
            self._dense_checkpoint().read(os.path.join(
                path, "dense", "ckpt")).assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as err:
            raise fmt.CheckpointError(
                f"Checkpoint {path!r} does not hold this job's dense model (was the model "
                f"section changed?): {str(err).strip().splitlines()[0][:300]}") from None
        return int(meta["step"])


def train(cfg: JobConfig, world: World, *, stream: IO[str] | None = None,
          tty: bool | None = None) -> dict:
    """Trains ``cfg`` as worker ``world.index`` of ``world.size`` to ``schedule.max_steps``,
    resuming from the newest complete checkpoint in ``<output.dir>/checkpoints`` (saved by
    any number of workers).

    Progress and log lines go to ``stream`` (default ``sys.stdout``), each marked
    ``[worker r/N]``: a progress bar when ``tty`` (default: ``stream`` is a terminal), else
    a line every ``schedule.log_every`` steps.

    Returns:
      The run's summary (worker 0 also writes it to ``<output.dir>/summary.json``): steps,
      samples/s, the loss of every step of this run, evaluation metrics, table statistics
      summed over the shards, bytes this worker sent per step.

    Raises:
      WorkerLostError: a collective did not complete within ``distributed.timeout_seconds``
        (another worker died or hangs); the message names the last complete checkpoint.
      ValueError: the data or the config cannot be trained on this many workers.
    """
    stream = stream if stream is not None else sys.stdout
    out = output_dir(cfg)
    ckpt_dir = os.path.join(out, CHECKPOINT_SUBDIR)
    os.makedirs(out, exist_ok=True)
    if world.size > 1:
        # Starts this worker's gRPC server and the collective executor from TF_CONFIG.
        start_server(world)
    job = ShardedJob(cfg, world)
    sched = cfg.schedule
    prefix = f"[worker {world.index}/{world.size}] "

    def log(text: str) -> None:
        progress.message(prefix + text)

    complete = complete_checkpoints(ckpt_dir)
    if not complete and latest_checkpoint(ckpt_dir):
        raise ValueError(
            f"{ckpt_dir} holds checkpoints of the single-process trainer (sparseflow train "
            f"without --workers or TF_CONFIG), which the sharded trainer does not resume: "
            f"train on with the single-process trainer, or use another output.dir.")
    start = job.restore(complete[-1]) if complete else 0
    last_saved = complete[-1] if complete else None
    most, least = job.barrier(start)   # every worker restored, from the same step
    if most != least:
        raise ValueError(
            f"Workers resumed from different checkpoints (steps {least} to {most}; worker "
            f"{world.index} from step {start}): every worker must see the same output.dir "
            f"(a shared file system for workers on several machines).")
    progress = Progress(sched.max_steps, desc=prefix + "step", unit="step", initial=start,
                        every=sched.log_every, stream=stream, tty=tty)
    if start:
        log(f"resumed from {last_saved} (step {start})")
    if world.chief:
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump(cfg.to_dict(), f, indent=2)
    writer = ScalarWriter(out if cfg.output.tensorboard and world.chief else None)
    losses, evals = [], []
    step = failing = start
    eviction = EvictionTimer(cfg)
    began = time.perf_counter()
    # The next batch's keys go to their owners and are processed while this batch's step
    # runs, except before a step that checkpoints, evicts or evaluates: those see the tables
    # exactly as after their step (a save must not hold the next batch's counts).
    ahead = concurrent.futures.ThreadPoolExecutor(1, "sparseflow-keys")
    try:
        batches = iter(job.dataset("train", skip=start))
        upcoming = None
        while step < sched.max_steps:
            failing = step + 1   # the step an error now belongs to
            if upcoming is None:
                batch = next(batches)
                keys = job.process_keys(batch)
            else:
                batch, keys = upcoming[0], upcoming[1].result()
            upcoming = None
            evict_after = eviction.due(step + 1)   # decided before anything runs ahead
            if step + 1 < sched.max_steps and not evict_after and not _pauses_after(cfg,
                                                                                   step + 1):
                failing = step + 2
                following = next(batches)
                upcoming = (following, ahead.submit(job.process_keys, following))
                failing = step + 1
            losses.append(job.run_step(batch, keys))
            step += 1
            if step == start + 1:
                warm = time.perf_counter()   # after the first step's tracing
            status = None
            if step % sched.log_every == 0 or step == sched.max_steps:
                rate = (step - start) * sched.batch_size / (time.perf_counter() - began)
                status = f"loss {losses[-1]:.5f}  {rate:,.0f} samples/s"
                writer.scalars(step, {"train/loss": float(np.mean(losses[-sched.log_every:])),
                                      "train/samples_per_sec": rate})
            progress.update(step, status)
            if evict_after:
                removed = job.evict()
                eviction.evicted()
                log(f"step {step}: evicted {sum(removed.values())} keys from this shard")
            if sched.save_every and step % sched.save_every == 0:
                last_saved = job.save(ckpt_dir, step)
            if has_eval_split(cfg) and sched.eval_every and step % sched.eval_every == 0 \
                    and step < sched.max_steps:
                evals.append({"step": step, **job.evaluate()})
                log(eval_line(step, evals[-1]))
                writer.scalars(step, {f"eval/{k}": v for k, v in evals[-1].items()
                                      if k != "step"})
        seconds = time.perf_counter() - began
        progress.close()
        stage_seconds = dict(job.router.seconds)
        warm_seconds = time.perf_counter() - warm if step > start else 0.0
        if last_saved is None or os.path.basename(last_saved) != f"step-{step:09d}":
            last_saved = job.save(ckpt_dir, step)
        final_eval = job.evaluate() if has_eval_split(cfg) else None
        if final_eval:
            log(eval_line(step, final_eval))
            writer.scalars(step, {f"eval/{k}": v for k, v in final_eval.items()})
        tables = job.table_stats()
        writer.scalars(step, {f"tables/{name}/{k}": v for name, stats in tables.items()
                              for k, v in stats.items() if k != "keys_held_here"})
        writer.close()
    except tf.errors.OpError as err:
        if not isinstance(err, _PEER_ERRORS):
            ours = sparseflow_error(str(err))
            if ours is None:
                raise
            # A sparseflow error raised inside a numpy function reaches here wrapped in
            # TensorFlow's traceback: give the user its own message.
            raise ValueError(f"worker {world.index} of {world.size}, step {failing}: "
                             f"{ours}") from None
        where = (f"the last complete checkpoint is {last_saved}" if last_saved
                 else "no checkpoint was completed")
        first_line = _cause(str(err))
        raise WorkerLostError(
            f"worker {world.index} of {world.size}: step {failing} could not complete: "
            f"another worker stopped answering ({type(err).__name__}: {first_line[:300]}). "
            f"Training stopped; {where}. Restart all {world.size} workers (or any number) "
            f"with the same command to resume from it.") from None
    finally:
        progress.close()
        ahead.shutdown(wait=False, cancel_futures=True)
    trained = step - start
    summary = {
        "name": cfg.name, "workers": world.size, "steps": step, "steps_this_run": trained,
        "samples": trained * sched.batch_size, "seconds": seconds,
        "samples_per_second": trained * sched.batch_size / seconds if seconds else 0.0,
        # Without the first step (it traces the step functions and compiles kernels).
        "samples_per_second_warm": ((trained - 1) * sched.batch_size / warm_seconds
                                    if trained > 1 and warm_seconds else None),
        "losses": losses, "first_step": start + 1,
        "final_loss": losses[-1] if losses else None, "evaluations": evals,
        "eval": final_eval, "tables": tables, "checkpoint": last_saved,
        "bytes_sent_per_step": job.bytes_sent / trained if trained else 0.0,
        # Where a step's time goes outside TensorFlow's kernels: routing a batch's keys (in
        # tf.data, overlapping the step), the owner's lookups (key processing, new rows'
        # initial values, gathers; evaluation included) and updates (inside the step).
        "ms_per_step": {stage: 1000 * value / trained if trained else 0.0
                        for stage, value in stage_seconds.items()},
    }
    if world.chief:
        with open(os.path.join(out, SUMMARY_FILE), "w") as f:
            json.dump(summary, f, indent=2)
    log(f"trained {trained} steps ({step} in all) at {summary['samples_per_second']:,.0f} "
        f"samples/s; checkpoint {last_saved}")
    return summary


def _prune(ckpt_dir: str) -> None:
    """Deletes step directories older than the newest ``KEEP_CHECKPOINTS`` complete ones
    (unfinished saves among them too)."""
    complete = complete_checkpoints(ckpt_dir)
    if len(complete) <= KEEP_CHECKPOINTS:
        return
    oldest_kept = os.path.basename(complete[-KEEP_CHECKPOINTS])
    for name in sorted(os.listdir(ckpt_dir)):
        if name.startswith("step-") and name < oldest_kept:
            shutil.rmtree(os.path.join(ckpt_dir, name), ignore_errors=True)


def _pauses_after(cfg: JobConfig, step: int) -> bool:
    """Whether the loop checkpoints or evaluates after ``step`` (evictions: the timer)."""
    sched = cfg.schedule
    return bool((sched.save_every and step % sched.save_every == 0)
                or (has_eval_split(cfg) and sched.eval_every and step % sched.eval_every == 0))


def _cause(message: str) -> str:
    """The line of a TensorFlow error that says what happened (its first line is often
    only "Graph execution error:")."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    for line in lines:
        lowered = line.lower()
        if any(w in lowered for w in ("timed out", "unavailable", "cancel", "abort",
                                      "heartbeat", "connect", "failed")):
            return line
    return lines[0] if lines else ""
