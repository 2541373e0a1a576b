"""Builds a YAML job's tf.compat.v1 graph with sparseflow's public API only.

``JobGraph.build(cfg)`` does what a user's Rec SDK script does: ``init``, one ``FeatureSpec``
per feature and channel, ``create_table``, the datasets mapped through
``get_asc_insert_func``, ``sparse_lookup`` + pooling, the built-in model, a sparse and a dense
optimizer, ``start_asc_pipeline`` and a ``Saver``. The trainer (``runner.py``) drives it;
:func:`job_graph` builds one in a fresh graph for every command that needs one (train, eval,
export, the sharded checkpoint's conversion).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Iterator

import tensorflow as tf

import sparseflow as sf
from sparseflow.jobs.data import make_dataset
from sparseflow.jobs.schema import JobConfig
from sparseflow.models import build_model, pool
from sparseflow.optimizers import adagrad, ftrl, gradient_descent, lazy_adam

_SPARSE_OPTIMIZERS = {"lazy_adam": lazy_adam, "sgd": gradient_descent, "adagrad": adagrad,
                      "ftrl": ftrl}
_INITIALIZERS = {
    "truncated_normal": tf.compat.v1.truncated_normal_initializer,
    "random_normal": tf.compat.v1.random_normal_initializer,
    "random_uniform": tf.compat.v1.random_uniform_initializer,
    "zeros": tf.compat.v1.zeros_initializer,
    "constant": tf.compat.v1.constant_initializer,
    "glorot_uniform": tf.compat.v1.glorot_uniform_initializer,
    "glorot_normal": tf.compat.v1.glorot_normal_initializer,
}
_SEEDED = {"truncated_normal", "random_normal", "random_uniform", "glorot_uniform",
           "glorot_normal"}


@dataclass
class Tower:
    """One channel's tensors: the batch, the loss, predicted probabilities and labels.

    Over N ranks (workers) each rank reads its part of every global batch: ``loss`` is the
    global batch's mean (the same on every rank), ``objective`` this rank's part of it (the
    local rows' summed loss over the global batch's size, what the rank differentiates: its
    dense gradients summed over the ranks are the global mean's), and an evaluation tower's
    ``probabilities`` and ``labels`` are every rank's rows, gathered.
    """

    batch: dict
    loss: tf.Tensor
    probabilities: tf.Tensor   # float32 [batch, n_labels]
    labels: tf.Tensor          # float32 [batch, n_labels]
    objective: tf.Tensor | None = None


@dataclass
class JobGraph:
    """The graph of one job; build it inside ``sparseflow.init()`` with :meth:`build`."""

    cfg: JobConfig
    graph: tf.Graph
    tables: dict                       # table name -> SparseTable
    model: tf.Module
    global_step: tf.Variable
    train_iterator: object = None      # initializable iterator, or None (eval/export only)
    train_skip: tf.Tensor | None = None  # int64 scalar fed to the train iterator's initializer:
                                         # the batches a resumed run has already trained on
    train: Tower | None = None
    train_op: tf.Operation | None = None
    eval_iterator: object = None
    eval: Tower | None = None
    saver: object = None
    specs: dict = field(default_factory=dict)   # channel -> list of FeatureSpec
    world: object = None               # graph_world.GraphWorld over the workers, or None
    # Over workers, fed and fetched with every training step: "this worker's eviction is
    # due" summed over the workers (every worker evicts after the same steps).
    evict_due: tf.Tensor | None = None
    evict_due_anywhere: tf.Tensor | None = None
    # Over workers: table statistics [n_tables, k] fed, summed over the workers.
    table_stats: tf.Tensor | None = None
    table_stats_summed: tf.Tensor | None = None
    # Over workers: [step, -step] of the checkpoint each resumed from, the max over them.
    start_steps: tf.Tensor | None = None
    start_steps_max: tf.Tensor | None = None

    @classmethod
    def build(cls, cfg: JobConfig, *, training: bool = True, evaluation: bool = True,
              eval_batch_size: int | None = None) -> "JobGraph":
        """Builds the job into the current default graph and starts the sparseflow pipeline.

        Args:
          cfg: the validated job config.
          training: build the training input, tower and optimizers.
          evaluation: build the eval input and tower (needs ``data.eval``).
          eval_batch_size: eval batch size; default ``schedule.batch_size``.

        Returns:
          The :class:`JobGraph`.

        Raises:
          NotInitializedError: ``sparseflow.init()`` is not active.
          ValueError: the data cannot be read as configured (see ``make_dataset``), or over
            several workers the batch size is not a multiple of their number.
        """
        from sparseflow.distributed import collectives, graph_world

        tf.compat.v1.set_random_seed(cfg.schedule.seed)
        world = sf.runtime.current("JobGraph.build").world
        if world is not None:
            graph_world.configure(hash=cfg.distributed.hash,
                                  send_count=cfg.distributed.send_count,
                                  timeout_seconds=cfg.distributed.timeout_seconds)
            for what, size in (("schedule.batch_size", cfg.schedule.batch_size),
                               ("the eval batch size", eval_batch_size or 0)):
                if size % world.size:
                    raise ValueError(
                        f"{what} ({size}) must be a multiple of the number of workers "
                        f"({world.size}): each worker trains on an equal part of every "
                        f"global batch.")
        tables = {t.name: _create_table(t, cfg.schedule.seed + i)
                  for i, t in enumerate(cfg.tables)}
        n_labels = len(cfg.columns.labels)
        model = build_model(cfg.model.name, cfg.model.params, n_outputs=n_labels,
                            seed=cfg.schedule.seed)
        global_step = tf.compat.v1.train.get_or_create_global_step()
        job = cls(cfg=cfg, graph=tf.compat.v1.get_default_graph(), tables=tables, model=model,
                  global_step=global_step, world=world)
        if training:
            specs = _feature_specs(cfg, with_timestamp=True)
            job.specs["train"] = specs
            job.train_skip = tf.compat.v1.placeholder_with_default(
                tf.constant(0, tf.int64), [], name="train_batches_to_skip")
            job.train_iterator = _iterator(cfg, "train", specs, True, cfg.schedule.batch_size,
                                           skip=job.train_skip, world=world)
            job.train = job._tower(job.train_iterator.get_next(), specs, is_train=True)
            job.train_op = job._optimize(job.train.objective)
        if evaluation:
            specs = _feature_specs(cfg, with_timestamp=False)
            job.specs["eval"] = specs
            job.eval_iterator = _iterator(cfg, "eval", specs, False,
                                          eval_batch_size or cfg.schedule.batch_size,
                                          world=world)
            job.eval = job._tower(job.eval_iterator.get_next(), specs, is_train=False)
        if not model.variables:  # no tower: create the variables for the Saver to restore
            call_on_zeros(model, cfg)
        if world is not None:
            job.evict_due = tf.compat.v1.placeholder_with_default(
                tf.constant(0, tf.int32), [], name="evict_due")
            job.evict_due_anywhere = collectives.all_reduce(job.evict_due, "sum")
            job.table_stats = tf.compat.v1.placeholder(tf.float64, [len(tables), None],
                                                       name="table_stats")
            job.table_stats_summed = collectives.all_reduce(job.table_stats, "sum")
            job.start_steps = tf.compat.v1.placeholder(tf.int64, [2], name="start_steps")
            job.start_steps_max = collectives.all_reduce(job.start_steps, "max")
        sf.start_asc_pipeline()
        # Over workers each writes its shard; workers other than 0 under <prefix>-rank<r>,
        # so that all are given one checkpoint directory.
        job.saver = sf.Saver(max_to_keep=3, rank_files=world is not None)
        return job

    def _tower(self, batch: dict, specs: list, *, is_train: bool) -> Tower:
        pooled = []
        for spec, feature in zip(specs, self.cfg.features):
            emb = sf.sparse_lookup(self.tables[feature.table], spec, is_train=is_train,
                                   batch=batch, name=f"lookup_{feature.name}")
            pooled.append(pool(emb, batch[feature.index_key], feature.combiner))
        logits = apply_model(self.model, self.cfg, batch.get("dense"), pooled)
        labels = batch["labels"]
        per_example = tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
        probabilities = tf.sigmoid(logits)
        if self.world is None:
            loss = tf.reduce_mean(per_example)
            return Tower(batch=batch, loss=loss, probabilities=probabilities, labels=labels,
                         objective=loss)
        from sparseflow.distributed import collectives

        # Every global batch is whole (make_dataset drops a partial last one): its size is
        # the local one times the workers.
        local_sum = tf.reduce_sum(per_example)
        global_size = tf.cast(tf.size(per_example) * self.world.size, tf.float32)
        loss = collectives.all_reduce(local_sum, "sum") / global_size
        if not is_train:
            probabilities = collectives.all_gather(probabilities)
            labels = collectives.all_gather(labels)
        return Tower(batch=batch, loss=loss, probabilities=probabilities, labels=labels,
                     objective=local_sum / global_size)

    def _optimize(self, objective: tf.Tensor) -> tf.Operation:
        dense_vars, sparse_vars = sf.get_dense_and_sparse_variable()
        grads = tf.gradients(objective, dense_vars + sparse_vars)
        dense_grads, sparse_grads = grads[:len(dense_vars)], grads[len(dense_vars):]
        if self.world is not None:   # the dense model stays one: gradients summed
            from sparseflow.distributed import collectives
            dense_grads = [None if g is None else collectives.all_reduce(g, "sum")
                           for g in dense_grads]
        used = [(g, t) for g, t in zip(sparse_grads, sparse_vars) if g is not None]
        sparse_op = _sparse_optimizer(self.cfg).apply_gradients(used)
        dense_op = dense_optimizer(self.cfg).apply_gradients(
            [(g, v) for g, v in zip(dense_grads, dense_vars) if g is not None],
            global_step=self.global_step)
        return tf.group(dense_op, sparse_op, name="train_op")


@contextlib.contextmanager
def job_graph(cfg: JobConfig, **build_args) -> Iterator[JobGraph]:
    """A fresh graph with sparseflow initialized and the job built; torn down on exit.

    Args:
      cfg: the validated job config.
      **build_args: :meth:`JobGraph.build`'s keyword arguments.

    Yields:
      The :class:`JobGraph`, its graph the default graph inside the ``with`` block.
    """
    sf.terminate_config_initializer()
    with tf.Graph().as_default():
        sf.init()
        try:
            yield JobGraph.build(cfg, **build_args)
        finally:
            sf.terminate_config_initializer()


def call_on_zeros(model: tf.Module, cfg: JobConfig) -> tf.Tensor:
    """Calls ``model`` once on a batch of zeros shaped as ``cfg`` feeds it, which creates its
    variables; returns the logits."""
    pooled = [tf.zeros([1, cfg.table(feature.table).dim]) for feature in cfg.features]
    dense = tf.zeros([1, len(cfg.columns.dense)]) if cfg.columns.dense else None
    return apply_model(model, cfg, dense, pooled)


def apply_model(model: tf.Module, cfg: JobConfig, dense, pooled: list) -> tf.Tensor:
    """The model's logits from ``dense`` (or None) and the pooled embeddings of
    ``cfg.features`` (same order): features named in the model's ``wide_features`` form the
    linear part, the others its deep inputs."""
    wide_names = set(cfg.model.params.get("wide_features", ()))
    deep = [p for f, p in zip(cfg.features, pooled) if f.name not in wide_names]
    wide = [p for f, p in zip(cfg.features, pooled) if f.name in wide_names]
    return model(dense, deep, wide)


def table_initializer(entry, seed: int):
    """The TF initializer a table entry names, seeded with ``seed`` where it draws."""
    params = dict(entry.initializer.params)
    if entry.initializer.name in _SEEDED:
        params["seed"] = seed
    return _INITIALIZERS[entry.initializer.name](**params)


def _create_table(entry, seed: int):
    kwargs = {"admission_counter": entry.admission_counter,
              "rows_on": None if entry.rows_on == "auto" else entry.rows_on}  # None: the rule
    ssd_data_path = None if entry.ssd_data_path is None else list(entry.ssd_data_path)
    return sf.create_table(tf.int64, tf.TensorShape([entry.dim]), entry.name,
                           table_initializer(entry, seed),
                           device_vocabulary_size=entry.vocabulary_size,
                           host_vocabulary_size=entry.host_vocabulary_size,
                           ssd_vocabulary_size=entry.ssd_vocabulary_size,
                           ssd_data_path=ssd_data_path, **kwargs)


def _feature_specs(cfg: JobConfig, *, with_timestamp: bool) -> list:
    """One FeatureSpec per feature (same order as ``cfg.features``), then the timestamp."""
    specs = []
    for feature in cfg.features:
        table = cfg.table(feature.table)
        specs.append(sf.FeatureSpec(
            feature.name, table_name=feature.table, index_key=feature.index_key,
            access_threshold=table.access_threshold,
            eviction_threshold=table.eviction_threshold,
            faae_coefficient=feature.faae_coefficient))
    if with_timestamp and cfg.columns.timestamp:
        specs.append(sf.FeatureSpec(f"{cfg.columns.timestamp}__timestamp",
                                    index_key=cfg.columns.timestamp, is_timestamp=True))
    return specs


def _iterator(cfg: JobConfig, split: str, specs: list, is_training: bool, batch_size: int,
              skip: tf.Tensor | None = None, world=None):
    dataset = make_dataset(cfg.data, cfg.columns, split, batch_size=batch_size,
                           seed=cfg.schedule.seed, repeat=is_training)
    if skip is not None:   # before the key processing: skipped batches count no key
        dataset = dataset.skip(skip)
    if world is not None and world.size > 1:
        # Worker r trains rows [r B/N, (r+1) B/N) of every global batch of B rows: N workers
        # train on the global batches one process would.
        rank, part = world.rank, batch_size // world.size
        dataset = dataset.map(lambda batch: {k: v[rank * part:(rank + 1) * part]
                                             for k, v in batch.items()})
    dataset = dataset.map(sf.get_asc_insert_func(tgt_key_specs=specs, is_training=is_training),
                          num_parallel_calls=map_parallelism(cfg))
    return tf.compat.v1.data.make_initializable_iterator(dataset.prefetch(2))


def map_parallelism(cfg: JobConfig):
    """``num_parallel_calls`` for the insert-function map: sequential unless the job asks for
    ``data.parallel_map`` (allowed only with every ``access_threshold`` <= 1, where a parallel
    map trains exactly as a sequential one: every key gets its row at its first occurrence
    whatever the order batches finish in, and a new row's initial values depend only on the
    key).

    Sequential by default because a batch's key processing (~5 ms for 26 tables of 4096 keys)
    is far shorter than its step: the map keeps up alone, and a parallel map spends more CPU
    beside the step (7.2 against 5.9 ms per batch) on cores the step needs. On 2 cores the
    Criteo-shaped e2e YAML job ran at 0.92x of the Session path with it and 0.99-1.05x
    without (docs/design-notes.md). It pays only where key processing, not the model, bounds
    the step.

    Raises:
      ValueError: ``data.parallel_map`` with a table whose ``access_threshold`` is > 1.
    """
    if not cfg.data.parallel_map:
        return None
    counted = [t for t in cfg.tables if t.access_threshold > 1]
    if counted:   # the schema refuses this; a config built in code must not slip past
        raise ValueError(f"data.parallel_map=True needs every table's access_threshold <= 1 "
                         f"(a key's admitting batch would follow processing order); table "
                         f"{counted[0].name} has {counted[0].access_threshold}")
    return tf.data.AUTOTUNE


def _sparse_optimizer(cfg: JobConfig):
    opt = cfg.sparse_optimizer
    return _SPARSE_OPTIMIZERS[opt.name].create_hash_optimizer(
        learning_rate=opt.learning_rate, **opt.params)


def dense_optimizer(cfg: JobConfig):
    """The job's ``tf.compat.v1.train`` optimizer of the dense variables."""
    opt = cfg.dense_optimizer
    train = tf.compat.v1.train
    builders = {"adam": train.AdamOptimizer, "sgd": train.GradientDescentOptimizer,
                "adagrad": train.AdagradOptimizer, "ftrl": train.FtrlOptimizer}
    return builders[opt.name](learning_rate=opt.learning_rate, **opt.params)
