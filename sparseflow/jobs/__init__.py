"""YAML training jobs: one file describes the data, columns, tables, features, optimizers,
model, schedule and output of a run (docs/yaml-pipelines.md).

``load_config(path, overrides=(), environ=None)`` validates a job file into a frozen
:class:`JobConfig`, or raises :class:`ConfigError` (``file:line key.path: reason``).
"""

from sparseflow.jobs.schema import ConfigError, JobConfig, load_config

__all__ = ["ConfigError", "JobConfig", "load_config"]
