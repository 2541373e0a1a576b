"""``TrainSpec``, ``EvalSpec`` and ``train_and_evaluate`` (tf.estimator's local mode): training
runs once, and each checkpoint it saves (at most every ``throttle_secs``) is evaluated while
training waits, then again at its end."""

from __future__ import annotations

import collections
import logging
import time

import tensorflow as tf

from sparseflow.estimator.estimator import Estimator, check_steps
from sparseflow.estimator.spec import check_hooks
from sparseflow.validation import check_int, fail

logger = logging.getLogger("sparseflow.estimator")


class TrainSpec(collections.namedtuple("TrainSpec", ["input_fn", "max_steps", "hooks",
                                                     "saving_listeners"])):
    """What ``train_and_evaluate`` trains.

    Args:
      input_fn: as for ``Estimator.train``.
      max_steps: stop at this global step (None: when the data ends).
      hooks: ``SessionRunHook``s for training.
      saving_listeners: ``CheckpointSaverListener``s.

    Raises:
      TypeError, ValueError: ``input_fn`` not callable, ``max_steps`` not None or an int > 0.
    """

    def __new__(cls, input_fn, max_steps=None, hooks=None, saving_listeners=None):
        if not callable(input_fn):
            fail("input_fn", "a callable", input_fn, TypeError)
        return super().__new__(cls, input_fn, check_steps("max_steps", max_steps),
                               tuple(check_hooks("hooks", hooks)),
                               tuple(saving_listeners or ()))


class EvalSpec(collections.namedtuple("EvalSpec", ["input_fn", "steps", "name", "hooks",
                                                   "exporters", "start_delay_secs",
                                                   "throttle_secs"])):
    """What ``train_and_evaluate`` evaluates, and how often.

    Args:
      input_fn: as for ``Estimator.evaluate``.
      steps: batches per evaluation (None: until the data ends); default 100.
      name: the evaluation's name (its summaries go to ``model_dir/eval_<name>``).
      hooks: ``SessionRunHook``s for evaluation.
      exporters: accepted only as None or empty (export with ``Estimator.export_saved_model``).
      start_delay_secs: accepted (in one process, evaluation follows checkpoints).
      throttle_secs: the least seconds between two evaluations (int >= 0); a checkpoint saved
        sooner is not evaluated, except the last.

    Raises:
      TypeError, ValueError: an argument of the wrong type or range.
    """

    def __new__(cls, input_fn, steps=100, name=None, hooks=None, exporters=None,
                start_delay_secs=120, throttle_secs=600):
        if not callable(input_fn):
            fail("input_fn", "a callable", input_fn, TypeError)
        if exporters:
            fail("exporters", "None or empty: call Estimator.export_saved_model after "
                 "training", exporters)
        if name is not None and not isinstance(name, str):
            fail("name", "a str or None", name, TypeError)
        return super().__new__(cls, input_fn, check_steps("steps", steps), name,
                               tuple(check_hooks("hooks", hooks)), (),
                               check_int("start_delay_secs", start_delay_secs, 0),
                               check_int("throttle_secs", throttle_secs, 0))


class _EvaluateOnSave(tf.compat.v1.train.CheckpointSaverListener):
    """Evaluates each checkpoint training saves, at most every ``throttle_secs``, and the last
    one; never the first (the model as restored or initialised, before any step)."""

    def __init__(self, estimator: Estimator, eval_spec: EvalSpec):
        self._estimator = estimator
        self._spec = eval_spec
        self._first = True
        self._last_time = None
        self._last_step = None
        self.result = None

    def _evaluate(self, step: int) -> None:
        logger.info("Evaluating the checkpoint of step %d", step)
        self.result = self._estimator.evaluate(
            self._spec.input_fn, steps=self._spec.steps, hooks=list(self._spec.hooks),
            name=self._spec.name)
        self._last_time = time.monotonic()
        self._last_step = step

    def after_save(self, session, global_step_value):
        if self._first:
            self._first = False
            return
        if (self._last_time is not None
                and time.monotonic() - self._last_time < self._spec.throttle_secs):
            return
        self._evaluate(global_step_value)

    def end(self, session, global_step_value):
        if self._last_step != global_step_value:
            self._evaluate(global_step_value)


def train_and_evaluate(estimator, train_spec, eval_spec):
    """Trains ``estimator`` per ``train_spec``, evaluating its checkpoints per ``eval_spec``.

    Args:
      estimator: an ``Estimator``.
      train_spec: a ``TrainSpec``.
      eval_spec: an ``EvalSpec``.

    Returns:
      (the last evaluation's results dict, []) as tf.estimator returns (metrics, export
      results).

    Raises:
      TypeError: an argument of the wrong type; and what ``Estimator.train`` and
        ``Estimator.evaluate`` raise.
    """
    if not isinstance(estimator, Estimator):
        fail("estimator", "an Estimator", estimator, TypeError)
    if not isinstance(train_spec, TrainSpec):
        fail("train_spec", "a TrainSpec", train_spec, TypeError)
    if not isinstance(eval_spec, EvalSpec):
        fail("eval_spec", "an EvalSpec", eval_spec, TypeError)
    listener = _EvaluateOnSave(estimator, eval_spec)
    estimator.train(train_spec.input_fn, hooks=list(train_spec.hooks),
                    max_steps=train_spec.max_steps,
                    saving_listeners=list(train_spec.saving_listeners) + [listener])
    if listener.result is None:   # trained nothing (already at max_steps): evaluate once
        listener.result = estimator.evaluate(eval_spec.input_fn, steps=eval_spec.steps,
                                             hooks=list(eval_spec.hooks), name=eval_spec.name)
    return listener.result, []
