"""``RunConfig``: where and how often an Estimator saves, logs and summarises."""

from __future__ import annotations

import os

import tensorflow as tf

from sparseflow.validation import check_int, fail, is_int

_DEFAULT_SECS = 600   # tf.estimator's checkpoint interval when neither steps nor secs is given
_UNSET = object()
# tf.estimator's RunConfig arguments for distribution: one sharded model over several
# processes is sparseflow's multi-worker layer, not a distribution strategy here.
_DISTRIBUTION = ("train_distribute", "eval_distribute", "experimental_distribute", "device_fn")


def _optional_count(argument: str, value, low: int):
    if value is None:
        return None
    return check_int(argument, value, low)


class RunConfig:
    """An Estimator's run settings (tf.estimator's ``RunConfig``).

    Args:
      model_dir: where checkpoints and summaries go (None: the Estimator's own, or a
        temporary directory).
      tf_random_seed: the graph seed of every graph the Estimator builds (None: unseeded).
      save_summary_steps: TensorBoard scalars every N training steps (None or 0: never).
      save_checkpoints_steps, save_checkpoints_secs: a checkpoint every N steps or seconds; at
        most one of them (default: every 600 seconds). Training also saves at its end.
      session_config: a ``tf.compat.v1.ConfigProto`` for the sessions.
      keep_checkpoint_max: checkpoints kept (older ones deleted; 0 or None keeps all).
      keep_checkpoint_every_n_hours: as for ``tf.compat.v1.train.Saver``.
      log_step_count_steps: a log line (loss, global step/s) every N steps (None: never).
      **kwargs: tf.estimator's distribution arguments (``train_distribute``, ...): only None
        is accepted (several processes train one model through ``sparseflow launch``);
        ``session_creation_timeout_secs``, ``protocol``, ``experimental_max_worker_delay_secs``,
        ``checkpoint_save_graph_def`` are accepted.

    Raises:
      TypeError, ValueError: an argument of the wrong type or range, both checkpoint
        intervals set, a distribution strategy, or an unknown argument.
    """

    _ACCEPTED = frozenset({"session_creation_timeout_secs", "protocol",
                           "experimental_max_worker_delay_secs", "checkpoint_save_graph_def"})

    def __init__(self, model_dir=None, tf_random_seed=None, save_summary_steps=100,
                 save_checkpoints_steps=_UNSET, save_checkpoints_secs=_UNSET,
                 session_config=None, keep_checkpoint_max=5,
                 keep_checkpoint_every_n_hours=10000, log_step_count_steps=100, **kwargs):
        for name in _DISTRIBUTION:
            if kwargs.pop(name, None) is not None:
                fail(name, "None: an Estimator trains one model in this process; run the "
                     "script on several ranks (sparseflow launch -n N) to shard it",
                     "a strategy")
        unknown = sorted(set(kwargs) - self._ACCEPTED)
        if unknown:
            raise TypeError(f"RunConfig() got an unexpected keyword argument `{unknown[0]}`. "
                            f"Received: {unknown[0]}={kwargs[unknown[0]]!r}")
        if model_dir is not None and not isinstance(model_dir, (str, os.PathLike)):
            fail("model_dir", "a path (str or path-like) or None", model_dir, TypeError)
        self.model_dir = None if model_dir is None else os.fspath(model_dir)
        if tf_random_seed is not None and not is_int(tf_random_seed):
            fail("tf_random_seed", "an int or None", tf_random_seed, TypeError)
        self.tf_random_seed = tf_random_seed
        self.save_summary_steps = _optional_count("save_summary_steps", save_summary_steps, 0)
        steps_set = save_checkpoints_steps is not _UNSET and save_checkpoints_steps is not None
        secs_set = save_checkpoints_secs is not _UNSET and save_checkpoints_secs is not None
        if steps_set and secs_set:
            raise ValueError(f"Arguments `save_checkpoints_steps` and `save_checkpoints_secs` "
                             f"cannot both be set: choose one. Received: "
                             f"{save_checkpoints_steps!r}, {save_checkpoints_secs!r}")
        self.save_checkpoints_steps = (_optional_count(
            "save_checkpoints_steps", save_checkpoints_steps, 1) if steps_set else None)
        if secs_set:
            self.save_checkpoints_secs = _optional_count("save_checkpoints_secs",
                                                         save_checkpoints_secs, 1)
        elif steps_set or save_checkpoints_secs is None:
            self.save_checkpoints_secs = None
        else:
            self.save_checkpoints_secs = _DEFAULT_SECS
        if session_config is not None and not isinstance(session_config,
                                                         tf.compat.v1.ConfigProto):
            fail("session_config", "a tf.compat.v1.ConfigProto or None", session_config,
                 TypeError)
        self.session_config = session_config
        self.keep_checkpoint_max = _optional_count("keep_checkpoint_max", keep_checkpoint_max,
                                                   0) or 0
        self.keep_checkpoint_every_n_hours = keep_checkpoint_every_n_hours
        self.log_step_count_steps = _optional_count("log_step_count_steps",
                                                    log_step_count_steps, 1)
        self._extra = dict(kwargs)

    def replace(self, **kwargs) -> "RunConfig":
        """A copy with the given arguments changed (tf.estimator's ``RunConfig.replace``)."""
        args = dict(model_dir=self.model_dir, tf_random_seed=self.tf_random_seed,
                    save_summary_steps=self.save_summary_steps,
                    save_checkpoints_steps=self.save_checkpoints_steps,
                    save_checkpoints_secs=self.save_checkpoints_secs,
                    session_config=self.session_config,
                    keep_checkpoint_max=self.keep_checkpoint_max,
                    keep_checkpoint_every_n_hours=self.keep_checkpoint_every_n_hours,
                    log_step_count_steps=self.log_step_count_steps, **self._extra)
        if "save_checkpoints_steps" in kwargs and kwargs["save_checkpoints_steps"] is not None:
            args["save_checkpoints_secs"] = None
        if "save_checkpoints_secs" in kwargs and kwargs["save_checkpoints_secs"] is not None:
            args["save_checkpoints_steps"] = None
        args.update(kwargs)
        return type(self)(**args)

    def __repr__(self):
        return (f"RunConfig(model_dir={self.model_dir!r}, tf_random_seed={self.tf_random_seed}, "
                f"save_checkpoints_steps={self.save_checkpoints_steps}, "
                f"save_checkpoints_secs={self.save_checkpoints_secs}, "
                f"keep_checkpoint_max={self.keep_checkpoint_max}, "
                f"log_step_count_steps={self.log_step_count_steps})")
