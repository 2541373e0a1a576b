"""``Estimator``: tf.estimator's train / evaluate / predict / export on ``tf.compat.v1`` graphs
and ``MonitoredSession``, with sparseflow tables as first-class state.

Each call builds a graph of its own, as tf.estimator does: ``input_fn``, then ``model_fn``
(which creates the tables, lookups and optimizers), in a sparseflow runtime of its own
(``runtime.scope``) with the settings of the script's ``init(...)`` (or its defaults). The
call restores the latest checkpoint of ``model_dir`` (dense variables and every table, in
sparseflow's ``Saver`` format) and, when training, writes checkpoints there. Evaluation and
prediction runtimes are read-only: they never count, admit or add a key, whatever ``is_train``
a lookup passes. Scripts call ``create_table`` inside ``model_fn`` (once per graph), as Rec
SDK's ``little_demo_estimator`` does.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
import os
import shutil
import tempfile
import time

import numpy as np
import tensorflow as tf

from sparseflow import runtime as _runtime
from sparseflow.checkpoint import saver as _saver
from sparseflow.checkpoint.sparse_format import CheckpointError, read_manifest
from sparseflow.distributed import collectives
from sparseflow.estimator import hooks as _hooks
from sparseflow.estimator.export import PredictOutput, ServingInputReceiver
from sparseflow.estimator.run_config import RunConfig
from sparseflow.estimator.spec import EstimatorSpec, ModeKeys, check_hooks
from sparseflow.pipeline import graph_modifier
from sparseflow.validation import check_bool, fail

logger = logging.getLogger("sparseflow.estimator")

_MODEL_FN_ARGS = ("features", "labels", "mode", "params", "config")
_INPUT_FN_ARGS = ("mode", "params", "config", "input_context")
CHECKPOINT_BASENAME = "model.ckpt"
_TENSORS = (tf.Tensor, tf.SparseTensor, tf.RaggedTensor)


def _fn_args(fn) -> set:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):   # a builtin or C callable: assume the plain form
        return set()


def check_steps(argument: str, value):
    """``value`` as an int > 0, or None.

    Raises:
      ValueError: anything else (a bool, a float, 0 or less), naming ``argument``.
    """
    if value is None:
        return None
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value <= 0:
        fail(argument, "None or an int > 0", value)
    return int(value)


class Estimator:
    """Trains, evaluates, predicts with and exports a model given as a ``model_fn``.

    Args:
      model_fn: ``model_fn(features, labels, mode, params, config) -> EstimatorSpec``; it
        may take any subset of those arguments (``features`` required), as tf.estimator
        allowed.
      model_dir: checkpoints and summaries; default ``config.model_dir``, else a new
        temporary directory.
      config: a ``RunConfig`` (default ``RunConfig()``).
      params: passed to ``model_fn`` and ``input_fn`` (those that take ``params``); usually a
        dict (deep-copied).
      warm_start_from: a checkpoint prefix or a directory holding checkpoints: training with
        no checkpoint in ``model_dir`` starts from it (dense variables and tables).

    Over several ranks (``sparseflow launch``, ``TF_CONFIG``) every rank trains its shard of
    the tables (docs/multi-worker.md); all ranks are given the same ``model_dir``: rank 0
    writes ``model.ckpt-<step>`` (its checkpoint lists every rank's shard), rank r
    ``model.ckpt-rank<r>-<step>``, and every rank resumes from rank 0's latest checkpoint.

    Raises:
      TypeError, ValueError: ``model_fn`` is not callable or takes other arguments;
        ``model_dir`` disagrees with ``config.model_dir``.
    """

    def __init__(self, model_fn, model_dir=None, config=None, params=None,
                 warm_start_from=None):
        if not callable(model_fn):
            fail("model_fn", "a callable returning an EstimatorSpec", model_fn, TypeError)
        args = _fn_args(model_fn)
        if args and "features" not in args:
            fail("model_fn", f"a function taking `features` (and any of {list(_MODEL_FN_ARGS)})",
                 sorted(args))
        unknown = sorted(args - set(_MODEL_FN_ARGS) - {"self"})
        if unknown:
            fail("model_fn", f"a function whose arguments are among {list(_MODEL_FN_ARGS)}",
                 unknown)
        if config is None:
            config = RunConfig()
        elif not isinstance(config, RunConfig):
            fail("config", "a RunConfig or None", config, TypeError)
        if model_dir is not None:
            model_dir = os.fspath(model_dir)
            if config.model_dir is not None and os.path.abspath(
                    config.model_dir) != os.path.abspath(model_dir):
                raise ValueError(f"Arguments `model_dir` and `config.model_dir` differ: give "
                                 f"one. Received: {model_dir!r}, {config.model_dir!r}")
        model_dir = model_dir or config.model_dir
        if model_dir is None:
            model_dir = tempfile.mkdtemp(prefix="sparseflow-estimator-")
            logger.warning("Estimator: no model_dir given; using %s", model_dir)
        self._model_dir = model_dir
        self._config = config.replace(model_dir=model_dir)
        # Any object, as tf.estimator took it (Rec SDK passes an argparse.Namespace).
        self._params = {} if params is None else copy.deepcopy(params)
        if warm_start_from is not None and not isinstance(warm_start_from, (str, os.PathLike)):
            fail("warm_start_from", "a checkpoint prefix or directory (str) or None",
                 warm_start_from, TypeError)
        self._warm_start_from = None if warm_start_from is None else os.fspath(warm_start_from)
        self._model_fn = model_fn
        self._model_fn_args = args

    # -- properties -------------------------------------------------------------------------

    @property
    def model_dir(self) -> str:
        """Where checkpoints and summaries are written."""
        return self._model_dir

    @property
    def config(self) -> RunConfig:
        """The ``RunConfig`` (its ``model_dir`` set)."""
        return self._config

    @property
    def params(self):
        """A deep copy of ``params`` ({} when None was given)."""
        return copy.deepcopy(self._params)

    @property
    def model_fn(self):
        """The ``model_fn`` given."""
        return self._model_fn

    # -- checkpoints ------------------------------------------------------------------------

    def latest_checkpoint(self) -> str | None:
        """The newest complete checkpoint prefix in ``model_dir``, or None."""
        return _latest(self._model_dir)

    def get_variable_names(self) -> list:
        """Names of the dense variables in the latest checkpoint.

        Raises:
          ValueError: ``model_dir`` holds no checkpoint.
        """
        return [name for name, _ in tf.train.list_variables(self._require_checkpoint(None))]

    def get_variable_value(self, name: str) -> np.ndarray:
        """A dense variable's value in the latest checkpoint.

        Raises:
          ValueError: no checkpoint, or none of its variables is called ``name``.
        """
        checkpoint = self._require_checkpoint(None)
        names = [n for n, _ in tf.train.list_variables(checkpoint)]
        if name not in names:
            fail("name", f"a variable of checkpoint {checkpoint!r} (one of {names[:20]}"
                 f"{'...' if len(names) > 20 else ''})", name)
        return tf.train.load_variable(checkpoint, name)

    def _require_checkpoint(self, checkpoint_path) -> str:
        if checkpoint_path is not None:
            path = os.fspath(checkpoint_path)
            prefix = _latest(path) if os.path.isdir(path) else path
            if prefix is None or not tf.compat.v1.train.checkpoint_exists(prefix):
                fail("checkpoint_path", "a checkpoint prefix or a directory holding "
                     "checkpoints", checkpoint_path)
            return prefix
        prefix = self.latest_checkpoint()
        if prefix is None:
            raise ValueError(f"Could not find a trained model in model_dir "
                             f"{self._model_dir!r}: train first, or pass checkpoint_path.")
        return prefix

    # -- graph building ---------------------------------------------------------------------

    def _new_runtime(self, mode: str):
        """A runtime of its own for one call (read-only outside training).

        Raises:
          ValueError: the script's own runtime already holds tables (created outside
            ``model_fn``).
        """
        outer = _runtime.active()
        if outer is not None and not outer.scoped and outer.tables:
            raise ValueError(
                f"The Estimator builds a graph per call and creates the tables there: call "
                f"create_table inside model_fn, not before (tables already created: "
                f"{sorted(outer.tables)}).")
        return _runtime.scope(read_only=mode != ModeKeys.TRAIN)

    @contextlib.contextmanager
    def _building(self, rt):
        """``rt`` active and a new graph as the default, seeded by ``tf_random_seed``."""
        with _runtime.activated(rt), tf.Graph().as_default() as graph:
            if self._config.tf_random_seed is not None:
                tf.compat.v1.set_random_seed(self._config.tf_random_seed)
            yield graph

    @contextlib.contextmanager
    def _graph(self, mode: str):
        """A graph and a runtime of their own for one call; the runtime is closed at exit."""
        rt = self._new_runtime(mode)
        try:
            with self._building(rt) as graph:
                yield graph, rt
        finally:
            _runtime.close(rt)

    def _optional_args(self, args: set, mode: str) -> dict:
        """``mode``, ``params`` and ``config`` for an ``input_fn`` / ``model_fn`` that takes
        them."""
        values = {"mode": mode, "params": self.params, "config": self._config}
        return {name: value for name, value in values.items() if name in args}

    def _call_input_fn(self, input_fn, mode: str):
        """Returns (features, labels, hooks) from ``input_fn`` (a Dataset is iterated through
        an initializable iterator, as tf.estimator does)."""
        if not callable(input_fn):
            fail("input_fn", "a callable returning a tf.data.Dataset or (features, labels)",
                 input_fn, TypeError)
        args = _fn_args(input_fn)
        kwargs = self._optional_args(args, mode)
        if "input_context" in args:
            kwargs["input_context"] = None
        result = input_fn(**kwargs)
        hooks = []
        if isinstance(result, (tf.data.Dataset, tf.compat.v1.data.Dataset)):
            iterator = tf.compat.v1.data.make_initializable_iterator(result)
            graph = tf.compat.v1.get_default_graph()
            before = len(graph.get_operations())
            result = iterator.get_next()
            # The IteratorGetNext op itself (composite values such as ragged tensors are
            # rebuilt from its outputs by other ops).
            get_next = next(op for op in graph.get_operations()[before:]
                            if op.type.startswith("IteratorGetNext"))
            hooks.append(_hooks.DatasetInitializerHook(iterator, get_next))
        if isinstance(result, (tuple, list)):
            if len(result) != 2:
                fail("input_fn", "a function returning a Dataset of (features, labels) or "
                     "features, or such a tuple of tensors", f"a {len(result)}-tuple")
            features, labels = result
        else:
            features, labels = result, None
        for part, value in (("features", features), ("labels", labels)):
            if value is None and part == "labels":
                continue
            items = value.items() if isinstance(value, dict) else [(None, value)]
            if not items:
                fail("input_fn", f"a function whose {part} are a tensor or a non-empty dict",
                     value, TypeError)
            for key, item in items:
                if not all(isinstance(t, _TENSORS) for t in tf.nest.flatten(item)):
                    where = part if key is None else f"{part}[{key!r}]"
                    fail("input_fn", f"a function whose {part} are a tensor or a dict of "
                         f"tensors (dense, sparse or ragged)",
                         f"{where} of type {type(item).__name__}", TypeError)
        return features, labels, hooks

    def _call_model_fn(self, features, labels, mode: str) -> EstimatorSpec:
        args = self._model_fn_args
        if not args:
            spec = self._model_fn(features, labels, mode)
        else:
            kwargs = self._optional_args(args, mode)
            if "labels" in args:
                kwargs["labels"] = labels
            elif labels is not None:
                fail("model_fn", "a function taking `labels` when input_fn returns labels",
                     sorted(args))
            spec = self._model_fn(features=features, **kwargs)
        if not isinstance(spec, EstimatorSpec):
            fail("model_fn", "a function returning an EstimatorSpec", type(spec).__name__,
                 TypeError)
        if spec.mode != mode:
            fail("model_fn", f"a function returning an EstimatorSpec of the mode it was "
                 f"called in ({mode!r})", spec.mode)
        return spec

    def _saver(self, rt):
        """sparseflow's Saver when the graph has tables (dense variables and tables under one
        step), else TF's. Outside training the graph may hold fewer tables than the checkpoint
        (a serving tower): those are restored, the others skipped."""
        keep = self._config.keep_checkpoint_max
        if rt.tables:
            return _saver.Saver(max_to_keep=keep, sharded=False,
                                restore_fewer_tables=rt.read_only, rank_files=True,
                                keep_checkpoint_every_n_hours=self._config
                                .keep_checkpoint_every_n_hours)
        return _saver._TF_SAVER(max_to_keep=keep, keep_checkpoint_every_n_hours=self
                                        ._config.keep_checkpoint_every_n_hours)

    def _session_creator(self, scaffold, checkpoint):
        return tf.compat.v1.train.ChiefSessionCreator(
            scaffold=scaffold, checkpoint_filename_with_path=checkpoint,
            config=self._config.session_config)

    def _check_checkpoint(self, checkpoint: str, rt, argument: str) -> None:
        """Refuses a checkpoint of another model before any session restores it: each dense
        variable of the graph must be in it with its shape, and its tables must be the
        graph's, of the same dims.

        Raises:
          ValueError: naming ``argument``, the checkpoint and what differs.
        """
        saved = dict(tf.train.list_variables(checkpoint))
        problems = []
        for var in _dense_variables():
            name = var.op.name
            if name not in saved:
                problems.append(f"variable `{name}` is not in it")
            elif var.shape.is_fully_defined() and list(saved[name]) != var.shape.as_list():
                problems.append(f"variable `{name}` has shape {list(saved[name])} there, "
                                f"{var.shape.as_list()} here")
        if rt.tables:
            try:
                manifest = read_manifest(_saver.sparse_path(checkpoint))
            except CheckpointError as e:
                problems.append(f"its sparse part is unreadable ({e})")
                manifest = None
            if manifest is not None:
                held = manifest["tables"]
                saved_tables = {name for name, t in rt.tables.items() if t.config.is_save}
                if not rt.read_only:   # evaluation and serving may read a subset
                    for name in sorted(set(held) - set(rt.tables)):
                        problems.append(f"table `{name}` is in it but not in this model")
                for name in sorted(saved_tables - set(held)):
                    problems.append(f"table `{name}` is not in it")
        if problems:
            shown = "; ".join(problems[:5]) + ("; ..." if len(problems) > 5 else "")
            raise ValueError(f"Argument `{argument}` must hold a checkpoint of this model: "
                             f"{checkpoint!r} differs ({shown}). Use another model_dir, or "
                             f"the model_fn that wrote it. Received: {checkpoint!r}")

    # -- train ------------------------------------------------------------------------------

    def train(self, input_fn, hooks=None, steps=None, max_steps=None, saving_listeners=None):
        """Trains the model, resuming from the latest checkpoint of ``model_dir``.

        Args:
          input_fn: returns a ``tf.data.Dataset`` of ``(features, labels)`` or of features,
            or such tensors; called in the training graph. It may take ``mode``, ``params``,
            ``config``.
          hooks: ``SessionRunHook``s (``GraphModifierHook``, ``EvictHook``, ...).
          steps: train this many more steps (None: until ``input_fn``'s data ends or
            ``max_steps``).
          max_steps: stop at this global step; a run already there trains nothing. At most
            one of ``steps`` and ``max_steps``.
          saving_listeners: ``tf.compat.v1.train.CheckpointSaverListener``s.

        Returns:
          self.

        Raises:
          ValueError: ``steps`` or ``max_steps`` not None and not an int > 0, or both given;
            ``model_dir`` holds another model's checkpoint; ``model_fn`` returned no loss or
            train op; the train op does not increase the global step (RuntimeError).
          TypeError: ``hooks`` holds something other than hooks.
        """
        steps = check_steps("steps", steps)
        max_steps = check_steps("max_steps", max_steps)
        if steps is not None and max_steps is not None:
            raise ValueError(f"Arguments `steps` and `max_steps` cannot both be set: choose "
                             f"one. Received: {steps}, {max_steps}")
        hooks = check_hooks("hooks", hooks)
        listeners = list(saving_listeners or [])
        checkpoint = self.latest_checkpoint()
        if max_steps is not None and checkpoint is not None:
            done = int(tf.train.load_variable(checkpoint, "global_step"))
            if done >= max_steps:
                logger.info("Skipping training: the checkpoint is at step %d >= max_steps %d.",
                            done, max_steps)
                return self
        with self._graph(ModeKeys.TRAIN) as (graph, rt):
            global_step = tf.compat.v1.train.get_or_create_global_step()
            features, labels, input_hooks = self._call_input_fn(input_fn, ModeKeys.TRAIN)
            spec = self._call_model_fn(features, labels, ModeKeys.TRAIN)
            tf.compat.v1.summary.scalar("loss", spec.loss)
            saver = self._saver(rt)
            # Its own checkpoints (rank r > 0 of several writes a state file of its own).
            state = tf.train.get_checkpoint_state(
                self._model_dir, latest_filename=getattr(saver, "state_filename", None))
            if state is not None:   # so keep_checkpoint_max counts those of earlier calls
                saver.recover_last_checkpoints(list(state.all_model_checkpoint_paths))
            scaffold = self._scaffold(spec.scaffold, saver, checkpoint, global_step, rt)
            if checkpoint is not None:
                self._check_checkpoint(checkpoint, rt, "model_dir")
            cfg = self._config
            all_hooks = (input_hooks + hooks + list(spec.training_hooks)
                         + list(spec.training_chief_hooks)
                         + [_hooks.StartPipelineHook(),
                            _hooks.GlobalStepCheckHook(global_step),
                            tf.compat.v1.train.NanTensorHook(spec.loss)])
            if steps is not None or max_steps is not None:   # else: until the data ends
                all_hooks.append(tf.compat.v1.train.StopAtStepHook(num_steps=steps,
                                                                   last_step=max_steps))
            # Ranks after the first write their event files in a directory each: two
            # writers started in the same second on one host would share a file name.
            summary_dir = self._model_dir
            if rt.world is not None and rt.world.rank > 0:
                summary_dir = os.path.join(self._model_dir, f"rank{rt.world.rank}")
            if cfg.log_step_count_steps:
                all_hooks.append(_hooks.LogHook(spec.loss, global_step,
                                                cfg.log_step_count_steps))
                all_hooks.append(tf.compat.v1.train.StepCounterHook(
                    every_n_steps=cfg.log_step_count_steps, output_dir=summary_dir))
            if cfg.save_summary_steps:
                all_hooks.append(tf.compat.v1.train.SummarySaverHook(
                    save_steps=cfg.save_summary_steps, output_dir=summary_dir,
                    scaffold=scaffold))
            save_steps, save_secs = cfg.save_checkpoints_steps, cfg.save_checkpoints_secs
            # Every rank's save takes part in collectives: over ranks, a time interval is
            # agreed in the step (the hook), not read from each rank's clock.
            ranks_save_secs = save_secs if rt.world is not None else None
            if ranks_save_secs is not None:
                save_secs = None
            if save_steps is None and save_secs is None:
                # No interval of TF's hook: a checkpoint when the session starts and one at
                # the end (tf.estimator saved none without an interval, losing the training).
                save_steps = 2**62
            all_hooks.append(_hooks.CheckpointHook(
                self._model_dir, save_secs=save_secs, save_steps=save_steps,
                scaffold=scaffold, checkpoint_basename=CHECKPOINT_BASENAME,
                listeners=listeners, summary_dir=summary_dir,
                ranks_save_secs=ranks_save_secs))
            loss = None
            with tf.compat.v1.train.MonitoredSession(
                    session_creator=self._session_creator(scaffold, checkpoint),
                    hooks=all_hooks) as sess:
                while not sess.should_stop():
                    _, loss = sess.run([spec.train_op, spec.loss])
            if loss is not None:
                logger.info("Loss for final step: %s.", loss)
        return self

    def _scaffold(self, user, saver, checkpoint, global_step, rt):
        """The user's scaffold (if any) with the Estimator's saver, and the warm start as its
        init_fn when there is no checkpoint to resume from.

        Raises:
          ValueError: the user's scaffold has a saver and the model has tables (a TF saver
            would leave them out of every checkpoint).
        """
        if user is not None and user.saver is not None and rt.tables:
            fail("scaffold.saver", "None when the model has sparse tables (the Estimator's "
                 "saver writes them with the dense variables; another would leave them out of "
                 "every checkpoint)", user.saver)
        init_fn = user.init_fn if user is not None else None
        if checkpoint is None and self._warm_start_from is not None:
            warm = self._require_checkpoint(self._warm_start_from)
            # Built now: the graph is finalized before init_fn runs.
            restart = global_step.assign(0)

            def init_fn(scaffold, sess, user_init=init_fn):
                if user_init is not None:
                    user_init(scaffold, sess)
                logger.info("Warm-starting from %s (its variables, optimizer slots and "
                            "tables; the global step starts at 0)", warm)
                scaffold.saver.restore(sess, warm)
                sess.run(restart)

        return tf.compat.v1.train.Scaffold(
            saver=saver if user is None or user.saver is None else user.saver,
            init_fn=init_fn, copy_from_scaffold=user)

    # -- evaluate ---------------------------------------------------------------------------

    def evaluate(self, input_fn, steps=None, hooks=None, checkpoint_path=None, name=None):
        """Evaluates the latest (or given) checkpoint; keys unknown to it read as such, and no
        key is added to any table.

        Args:
          input_fn: as for :meth:`train`, called in ``ModeKeys.EVAL``.
          steps: evaluate this many batches (None: until the data ends).
          hooks: ``SessionRunHook``s.
          checkpoint_path: a checkpoint prefix or directory (default: the latest in
            ``model_dir``).
          name: evaluation name: summaries go to ``model_dir/eval_<name>`` (default
            ``model_dir/eval``).

        Returns:
          dict with ``loss`` (the mean of the batches' losses), ``global_step`` and every
          metric of ``eval_metric_ops``. Over several ranks, each evaluates its part of the
          data and every rank returns the metrics of all of it: a batch's loss is the sum
          of the ranks' losses (write it as the local sum over the global batch size), and
          the metric variables (``tf.compat.v1.metrics``' totals, counts, confusion
          counts) are summed over the ranks before the final values are read.

        Raises:
          ValueError: no checkpoint, ``steps`` not None and not an int > 0, a checkpoint of
            another model, ``eval_metric_ops`` holding "loss", no loss from ``model_fn``.
        """
        steps = check_steps("steps", steps)
        hooks = check_hooks("hooks", hooks)
        if name is not None and not isinstance(name, str):
            fail("name", "a str or None", name, TypeError)
        checkpoint = self._require_checkpoint(checkpoint_path)
        with self._graph(ModeKeys.EVAL) as (graph, rt):
            global_step = tf.compat.v1.train.get_or_create_global_step()
            features, labels, input_hooks = self._call_input_fn(input_fn, ModeKeys.EVAL)
            spec = self._call_model_fn(features, labels, ModeKeys.EVAL)
            taken = sorted({"loss", "global_step"} & set(spec.eval_metric_ops))
            if taken:
                fail("eval_metric_ops", "a dict without the keys 'loss' and 'global_step' (the "
                     "Estimator's own: the mean loss, the checkpoint's step)", taken)
            loss = spec.loss
            if rt.world is not None:   # each batch's loss over the ranks' parts of it
                loss = collectives.all_reduce(loss, "sum")
            with tf.name_scope("sparseflow_eval_loss") as loss_scope:
                metrics = {"loss": tf.compat.v1.metrics.mean(loss)}
            metrics.update(spec.eval_metric_ops)
            update = tf.group(*[update_op for _, update_op in metrics.values()])
            finals = {key: value for key, (value, _) in metrics.items()}
            finals["global_step"] = global_step
            final_hook = tf.compat.v1.train.FinalOpsHook(finals)
            ranks_hooks = []
            if rt.world is not None:
                ranks_hooks.append(_hooks.SumMetricsHook(loss_scope))
            saver = self._saver(rt)
            scaffold = tf.compat.v1.train.Scaffold(saver=saver, copy_from_scaffold=spec.scaffold)
            self._check_checkpoint(checkpoint, rt, "checkpoint_path")
            all_hooks = (input_hooks + hooks + list(spec.evaluation_hooks)
                         + [_hooks.StartPipelineHook(), _hooks.StopAfterNHook(steps)]
                         + ranks_hooks + [final_hook])
            with tf.compat.v1.train.MonitoredSession(
                    session_creator=self._session_creator(scaffold, checkpoint),
                    hooks=all_hooks) as sess:
                while not sess.should_stop():
                    sess.run(update)
        results = {key: (value.item() if isinstance(value, np.ndarray) and value.ndim == 0
                         else value) for key, value in final_hook.final_ops_values.items()}
        results["global_step"] = int(results["global_step"])
        self._write_eval_summary(results, name)
        logger.info("Evaluation at step %d: %s", results["global_step"],
                    ", ".join(f"{k} = {v}" for k, v in sorted(results.items())
                              if k != "global_step"))
        return results

    def _write_eval_summary(self, results: dict, name) -> None:
        directory = os.path.join(self._model_dir, "eval" if name is None else f"eval_{name}")
        values = [tf.compat.v1.Summary.Value(tag=key, simple_value=float(value))
                  for key, value in sorted(results.items())
                  if key != "global_step" and np.ndim(value) == 0]
        with tf.Graph().as_default():   # TF's v1 writer refuses eager mode
            writer = tf.compat.v1.summary.FileWriterCache.get(directory)
            writer.add_summary(tf.compat.v1.Summary(value=values), results["global_step"])
            writer.flush()

    # -- predict ----------------------------------------------------------------------------

    def predict(self, input_fn, predict_keys=None, hooks=None, checkpoint_path=None,
                yield_single_examples=True):
        """Yields predictions of the latest (or given) checkpoint; no key is added to any
        table.

        Args:
          input_fn: as for :meth:`train`, called in ``ModeKeys.PREDICT`` (labels ignored).
          predict_keys: None (every prediction) or a list of keys of the predictions dict.
          hooks: ``SessionRunHook``s.
          checkpoint_path: a checkpoint prefix or directory (default: the latest).
          yield_single_examples: one example at a time (each prediction's first dimension
            is the batch), or each batch as ``sess.run`` returns it.

        Yields:
          dict key -> numpy value (or the value itself when predictions is a tensor).

        Raises:
          ValueError: no checkpoint; ``predict_keys`` names a key that predictions lacks, or
            is given for a predictions tensor; predictions of different batch sizes with
            ``yield_single_examples``.
        """
        hooks = check_hooks("hooks", hooks)
        check_bool("yield_single_examples", yield_single_examples)
        if predict_keys is not None:
            if isinstance(predict_keys, str):
                predict_keys = [predict_keys]
            if not isinstance(predict_keys, (list, tuple)) or not all(
                    isinstance(k, str) for k in predict_keys):
                fail("predict_keys", "None or a list of str", predict_keys, TypeError)
        checkpoint = self._require_checkpoint(checkpoint_path)
        rt = self._new_runtime(ModeKeys.PREDICT)
        try:
            # The runtime is active while the graph is built, the session created and each
            # run made (the hooks see it), not between the examples yielded: the caller's
            # code runs there.
            with self._building(rt):
                tf.compat.v1.train.get_or_create_global_step()
                features, _, input_hooks = self._call_input_fn(input_fn, ModeKeys.PREDICT)
                spec = self._call_model_fn(features, None, ModeKeys.PREDICT)
                predictions = _select(spec.predictions, predict_keys)
                saver = self._saver(rt)
                scaffold = tf.compat.v1.train.Scaffold(saver=saver,
                                                       copy_from_scaffold=spec.scaffold)
                self._check_checkpoint(checkpoint, rt, "checkpoint_path")
                all_hooks = (input_hooks + hooks + list(spec.prediction_hooks)
                             + [_hooks.StartPipelineHook()])
                sess = tf.compat.v1.train.MonitoredSession(
                    session_creator=self._session_creator(scaffold, checkpoint),
                    hooks=all_hooks)
                # A prediction that is an input itself (a label, an id) reads the iterator
                # graph modification put in place of the original.
                predictions = tf.nest.map_structure(graph_modifier.rewritten, predictions)
            try:
                while not sess.should_stop():
                    try:
                        with _runtime.activated(rt):   # for the hooks around the run
                            out = sess.run(predictions)
                    except tf.errors.OutOfRangeError:
                        break
                    if not yield_single_examples:
                        yield out
                        continue
                    yield from _examples(out)
            finally:
                with _runtime.activated(rt):
                    sess.close()
        finally:
            _runtime.close(rt)

    # -- export -----------------------------------------------------------------------------

    def export_saved_model(self, export_dir_base, serving_input_receiver_fn,
                           assets_extra=None, as_text=False, checkpoint_path=None,
                           experimental_mode=ModeKeys.PREDICT):
        """Writes a SavedModel that plain TensorFlow serves, with no sparseflow installed.

        ``model_fn`` is called in ``ModeKeys.PREDICT`` on the receiver's features; each sparse
        lookup reads the checkpoint's rows through a ``tf.lookup.StaticHashTable`` and an
        embedding variable (``serving_graph.py``): keys the checkpoint does not hold read the
        lookup's ``serving_default_value`` (default zeros), as in evaluation.

        Args:
          export_dir_base: the SavedModel goes to ``<export_dir_base>/<unix time>``.
          serving_input_receiver_fn: returns an ``export.ServingInputReceiver``.
          assets_extra: None or dict of destination (relative to ``assets.extra``) -> source
            file, copied in.
          as_text: write ``saved_model.pbtxt``.
          checkpoint_path: a checkpoint prefix or directory (default: the latest).
          experimental_mode: only ``ModeKeys.PREDICT``.

        Returns:
          The export directory, as bytes (tf.estimator's type).

        Raises:
          ValueError: no checkpoint, a checkpoint of another model, a mode other than
            PREDICT, or a receiver of the wrong type.
        """
        if experimental_mode != ModeKeys.PREDICT:
            fail("experimental_mode", "ModeKeys.PREDICT", experimental_mode)
        if not callable(serving_input_receiver_fn):
            fail("serving_input_receiver_fn", "a callable returning a ServingInputReceiver",
                 serving_input_receiver_fn, TypeError)
        check_bool("as_text", as_text)
        checkpoint = self._require_checkpoint(checkpoint_path)
        from sparseflow.serving_graph import ServingRows
        base = os.fspath(export_dir_base)
        os.makedirs(base, exist_ok=True)
        vocab_dir = tempfile.mkdtemp(prefix="sparseflow-export-vocab-")
        tmp = tempfile.mkdtemp(prefix=".export-tmp-", dir=base)
        os.rmdir(tmp)   # the Builder creates it
        try:
            with self._graph(ModeKeys.PREDICT) as (graph, rt):
                states = (_saver.read_sparse_states(checkpoint)
                          if os.path.isdir(_saver.sparse_path(checkpoint)) else {})
                rt.serving = ServingRows(states, vocab_dir, checkpoint)
                tf.compat.v1.train.get_or_create_global_step()
                receiver = serving_input_receiver_fn()
                if not isinstance(receiver, ServingInputReceiver):
                    fail("serving_input_receiver_fn", "a function returning an "
                         "export.ServingInputReceiver", type(receiver).__name__, TypeError)
                spec = self._call_model_fn(receiver.features, None, ModeKeys.PREDICT)
                outputs = spec.export_outputs or {
                    tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY:
                        PredictOutput(spec.predictions)}
                signatures = {
                    key: tf.compat.v1.saved_model.signature_def_utils.predict_signature_def(
                        receiver.receiver_tensors, output.outputs)
                    for key, output in outputs.items()}
                dense = _dense_variables()
                self._check_checkpoint(checkpoint, rt, "checkpoint_path")
                dense_saver = _saver._TF_SAVER(var_list=dense) if dense else None
                # Built before the session runs anything: TF refuses ops changed after a run.
                main_op = tf.group(tf.compat.v1.local_variables_initializer(),
                                   tf.compat.v1.tables_initializer())
                with tf.compat.v1.Session(graph=graph,
                                          config=self._config.session_config) as sess:
                    sess.run(tf.compat.v1.global_variables_initializer())
                    if dense_saver is not None:
                        dense_saver.restore(sess, checkpoint)
                    rt.serving.load(sess)
                    builder = tf.compat.v1.saved_model.Builder(tmp)
                    builder.add_meta_graph_and_variables(
                        sess, [tf.saved_model.SERVING], signature_def_map=signatures,
                        assets_collection=tf.compat.v1.get_collection(
                            tf.compat.v1.GraphKeys.ASSET_FILEPATHS),
                        main_op=main_op,
                        strip_default_attrs=True)
                    builder.save(as_text=as_text)
            for dest, source in (assets_extra or {}).items():
                target = os.path.join(tmp, "assets.extra", dest)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                shutil.copyfile(source, target)
            export_dir = _versioned_dir(base)
            os.rename(tmp, export_dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            shutil.rmtree(vocab_dir, ignore_errors=True)
        logger.info("SavedModel written to %s", export_dir)
        return export_dir.encode("utf-8")

    # tf.estimator 1.x's name.
    export_savedmodel = export_saved_model


def _dense_variables() -> list:
    """The current graph's variables a dense checkpoint holds: every global variable but the
    rows of device tables and of an export graph's lookups (in the sparse part)."""
    from sparseflow.embed.device_rows import DEVICE_ROWS_COLLECTION
    from sparseflow.serving_graph import SERVING_ROWS_COLLECTION
    sparse = {v.name for c in (DEVICE_ROWS_COLLECTION, SERVING_ROWS_COLLECTION)
              for v in tf.compat.v1.get_collection(c)}
    return [v for v in tf.compat.v1.global_variables() if v.name not in sparse]


def _latest(model_dir: str) -> str | None:
    """The newest checkpoint whose dense (and, if it has one, sparse) part is complete."""
    prefix = _saver.latest_checkpoint(model_dir)
    if prefix is not None:
        return prefix
    tf_prefix = tf.train.latest_checkpoint(model_dir)
    if tf_prefix is not None and not os.path.exists(_saver.sparse_path(tf_prefix)):
        return tf_prefix   # a model without tables
    return None


def _versioned_dir(base: str) -> str:
    stamp = int(time.time())
    while os.path.exists(os.path.join(base, str(stamp))):
        stamp += 1
    return os.path.join(base, str(stamp))


def _select(predictions, keys):
    if keys is None:
        return predictions
    if not isinstance(predictions, dict):
        fail("predict_keys", "None when model_fn's predictions is a single tensor", keys)
    unknown = [k for k in keys if k not in predictions]
    if unknown:
        fail("predict_keys", f"keys of the predictions, among {sorted(predictions)}", unknown)
    return {k: predictions[k] for k in keys}


def _examples(out):
    """Splits a batch of predictions into examples along the first dimension."""
    if not isinstance(out, dict):
        for row in out:
            yield row
        return
    sizes = {k: np.shape(v)[0] if np.ndim(v) else None for k, v in out.items()}
    batch = {s for s in sizes.values() if s is not None}
    if len(batch) != 1 or None in sizes.values():
        raise ValueError(f"predict(yield_single_examples=True) needs every prediction to have "
                         f"the same batch (first) dimension; their shapes: "
                         f"{ {k: np.shape(v) for k, v in out.items()} }. Pass "
                         f"yield_single_examples=False.")
    for i in range(batch.pop()):
        yield {k: v[i] for k, v in out.items()}
