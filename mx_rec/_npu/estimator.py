"""Ascend's TF adapter Estimator names (``NPUEstimator``, ``NPURunConfig``,
``npu_hooks_append``, ``DumpConfig``, ``NPUEstimatorSpec``) on ``sparseflow.estimator``.

Rec SDK's ``little_demo_estimator`` imports them from ``tf_adapter`` / ``npu_bridge.npu_init``
(TF 1) or ``npu_device.compat.v1.npu_init`` (TF 2); this distribution ships those modules,
re-exporting the names below.
"""

from __future__ import annotations

from mx_rec.util.log import log_once
from sparseflow.estimator import Estimator, EstimatorSpec, RunConfig
from sparseflow.validation import fail

__all__ = ["DumpConfig", "NPUEstimator", "NPUEstimatorSpec", "NPURunConfig", "ProfilingConfig",
           "npu_hooks_append"]

# NPURunConfig options that would train another model than the one this process trains:
# several devices or processes under one Estimator. (Sharding across ranks is sparseflow's
# multi-worker layer: run the script on several ranks.)
_REFUSED = {
    "distribute": "None: one process trains one model here",
    "horovod_mode": "False: run the script on several ranks instead (sparseflow launch -n N)",
    "local_device_list": "None: one device per process",
}


class NPURunConfig(RunConfig):
    """``RunConfig`` accepting the NPU adapter's options.

    Options without a meaning off the NPU (``iterations_per_loop``, ``precision_mode``,
    ``enable_data_pre_proc``, ``op_compiler_cache_mode``, ``HCCL_algorithm``, ``deterministic``
    ...) are accepted and each named once in the ``mx_rec`` log at INFO. Options that would
    change what is trained (``distribute``, ``horovod_mode=True``, ``local_device_list``)
    raise naming them.

    Raises:
      ValueError: a refused option; and what ``RunConfig`` raises.
    """

    def __init__(self, model_dir=None, tf_random_seed=None, save_summary_steps=100,
                 save_checkpoints_steps=None, save_checkpoints_secs=None, session_config=None,
                 keep_checkpoint_max=5, keep_checkpoint_every_n_hours=10000,
                 log_step_count_steps=100, **npu_options):
        for name, allowed in _REFUSED.items():
            value = npu_options.pop(name, None)
            if value not in (None, False):
                fail(name, allowed, value)
        for name in sorted(npu_options):
            log_once(f"NPURunConfig.{name}", "NPURunConfig(%s=%r) accepted: no meaning off the "
                     "NPU, nothing changes.", name, npu_options[name])
        self.npu_options = dict(npu_options)
        if save_checkpoints_steps is None and save_checkpoints_secs is None:
            save_checkpoints_secs = 600   # tf.estimator's default
        super().__init__(model_dir=model_dir, tf_random_seed=tf_random_seed,
                         save_summary_steps=save_summary_steps,
                         save_checkpoints_steps=save_checkpoints_steps,
                         save_checkpoints_secs=save_checkpoints_secs,
                         session_config=session_config, keep_checkpoint_max=keep_checkpoint_max,
                         keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours,
                         log_step_count_steps=log_step_count_steps)

    def replace(self, **kwargs):
        """A copy with the given arguments changed; the NPU options are kept."""
        copy = super().replace(**kwargs)
        copy.npu_options = dict(self.npu_options)
        return copy


class NPUEstimator(Estimator):
    """``sparseflow.estimator.Estimator``; ``job_start_file`` is accepted (no meaning off the
    NPU)."""

    def __init__(self, model_fn=None, model_dir=None, config=None, params=None,
                 job_start_file="", warm_start_from=None):
        if job_start_file:
            log_once("NPUEstimator.job_start_file", "NPUEstimator(job_start_file=%r) accepted: "
                     "no meaning off the NPU.", job_start_file)
        super().__init__(model_fn, model_dir=model_dir, config=config, params=params,
                         warm_start_from=warm_start_from)


NPUEstimatorSpec = EstimatorSpec


def npu_hooks_append(hooks_list=()):
    """The hooks given, as a new list (the NPU adapter appends a rank-0 broadcast of the
    variables; one process needs none). Anything but a list or tuple gives []."""
    if not isinstance(hooks_list, (list, tuple)):
        return []
    return list(hooks_list)


class DumpConfig:
    """The NPU adapter's data-dump settings: accepted; nothing is dumped off the NPU (named
    once in the ``mx_rec`` log when ``enable_dump`` or ``enable_dump_debug`` is set)."""

    def __init__(self, enable_dump=False, dump_path=None, dump_step=None, dump_mode="output",
                 enable_dump_debug=False, dump_debug_mode="all", **kwargs):
        self.enable_dump = enable_dump
        self.dump_path = dump_path
        self.dump_step = dump_step
        self.dump_mode = dump_mode
        self.enable_dump_debug = enable_dump_debug
        self.dump_debug_mode = dump_debug_mode
        self.options = dict(kwargs)
        if enable_dump or enable_dump_debug:
            log_once("DumpConfig", "DumpConfig(enable_dump=%r) accepted: sparseflow writes no "
                     "NPU data dumps.", enable_dump or enable_dump_debug)


class ProfilingConfig:
    """The NPU adapter's profiling settings: accepted; use TensorFlow's profiler instead."""

    def __init__(self, enable_profiling=False, profiling_options=None, **kwargs):
        self.enable_profiling = enable_profiling
        self.profiling_options = profiling_options
        if enable_profiling:
            log_once("ProfilingConfig", "ProfilingConfig(enable_profiling=True) accepted: "
                     "sparseflow writes no NPU profiles.")
