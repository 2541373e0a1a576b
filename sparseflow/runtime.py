"""``init`` / ``terminate_config_initializer``: the process-wide sparseflow session.

Rec SDK scripts call ``init(...)`` once before building anything and
``terminate_config_initializer()`` at the end. Between the two, :func:`current` holds every
table, feature spec, optimizer and key processor the script created. Terminating stops the
pipeline and forgets all of them, so a later ``init`` starts from a clean slate (tests rely on it).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from sparseflow.validation import INT32_MAX, check_bool, check_int


class NotInitializedError(RuntimeError):
    """sparseflow API used before ``init(...)`` or after ``terminate_config_initializer()``."""


class AlreadyInitializedError(RuntimeError):
    """``init(...)`` called while a previous ``init`` is still active."""


@dataclass(frozen=True)
class InitConfig:
    """The validated arguments of :func:`init`. Step counts of -1 mean "until the data ends"."""

    max_steps: int = -1
    train_steps: int = -1
    eval_steps: int = -1
    save_steps: int = -1
    use_dynamic: bool = True
    use_dynamic_expansion: bool = False
    if_load: bool = False


@dataclass
class Runtime:
    """Everything one ``init`` ... ``terminate_config_initializer`` span owns."""

    config: InitConfig
    tables: dict = field(default_factory=dict)          # table name -> HostTable
    feature_specs: list = field(default_factory=list)   # every FeatureSpec, creation order
    optimizers: list = field(default_factory=list)      # every sparse optimizer
    insert_plans: list = field(default_factory=list)    # one per get_asc_insert_func call
    modify: object = None   # graph_modifier.ModifyState once a modify-graph lookup exists
    pipeline_started: bool = False
    # Evaluation and prediction runtimes (the Estimator's): every channel is read-only, so
    # no key is counted, admitted or given a row whatever ``is_train`` a lookup passes.
    read_only: bool = False
    # Export: the checkpoint's tables (name -> TableState) that sparse_lookup reads through
    # plain TF lookups instead of the key pipeline (serving_graph.py).
    serving: object = None
    scoped: bool = False   # made by scope() for one graph, not by init()
    # One of several ranks (distributed/graph_world.GraphWorld), None in one process; and the
    # key routers of its insert plans (plan id -> distributed/routing.KeyRouter).
    world: object = None
    routers: dict = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)


_RUNTIME: Runtime | None = None
logger = logging.getLogger("sparseflow")
_IGNORED_LOGGED: set = set()  # the ignored init kwargs already named in the log
_STEP_ARGS = ("max_steps", "train_steps", "eval_steps", "save_steps")
_BOOL_ARGS = ("use_dynamic", "use_dynamic_expansion", "if_load")


def init(max_steps: int = -1, train_steps: int = -1, eval_steps: int = -1, save_steps: int = -1,
         use_dynamic: bool = True, use_dynamic_expansion: bool = False, if_load: bool = False,
         **ignored: Any) -> InitConfig:
    """Starts a sparseflow session with Rec SDK's ``init`` parameters.

    Args:
      max_steps, train_steps, eval_steps, save_steps: ints in [-1, 2^31-1]; -1 runs until the
        data ends. ``max_steps``, ``train_steps`` and ``eval_steps`` must not all be 0.
      use_dynamic: dynamic shapes (default). False pads each table's unique keys to the
        lookup's ``send_count`` and needs ``drop_remainder=True`` batches.
      use_dynamic_expansion: tables grow instead of being allocated at full size.
      if_load: whether the script restores a checkpoint.
      **ignored: Rec SDK hardware options (``bind_cpu``, ``use_lccl``, ...), accepted and
        ignored so that ported scripts run unchanged; each is named once in the
        ``sparseflow`` log at INFO.

    Returns:
      The validated :class:`InitConfig`.

    Raises:
      AlreadyInitializedError: ``init`` was already called and not terminated.
      RuntimeError: this process is one of several ranks (``distributed/ranks.py``) but
        no ``TF_CONFIG`` gives the ranks' addresses (``distributed/graph_world.join``).
      RankLostError: over several ranks, the first ``init`` waits for every rank to call it
        (as Rec SDK's does); one did not within ``SPARSEFLOW_COLLECTIVE_TIMEOUT``.
      TypeError, ValueError: an argument is of the wrong type or out of range.
    """
    global _RUNTIME
    values = dict(max_steps=max_steps, train_steps=train_steps, eval_steps=eval_steps,
                  save_steps=save_steps, use_dynamic=use_dynamic,
                  use_dynamic_expansion=use_dynamic_expansion, if_load=if_load)
    for name in _STEP_ARGS:
        values[name] = check_int(name, values[name], -1, INT32_MAX)
    for name in _BOOL_ARGS:
        check_bool(name, values[name])
    if max_steps == 0 and train_steps == 0 and eval_steps == 0:
        raise ValueError("Arguments `max_steps`, `train_steps` and `eval_steps` must not all be 0. "
                         "Received: 0, 0, 0")
    if _RUNTIME is not None:
        raise AlreadyInitializedError(
            "sparseflow is already initialized: call terminate_config_initializer() before "
            "calling init() again.")
    world = _join_ranks()
    config = InitConfig(**values)
    _RUNTIME = Runtime(config=config, world=world)
    new = sorted(set(ignored) - _IGNORED_LOGGED)
    if new:
        _IGNORED_LOGGED.update(new)
        logger.info("init(): %s accepted and ignored (Rec SDK hardware or multi-rank options, "
                    "without a meaning in one sparseflow process).", ", ".join(new))
    return config


def terminate_config_initializer() -> None:
    """Stops the key pipeline and forgets every table, spec and optimizer. Safe to call twice."""
    global _RUNTIME
    rt, _RUNTIME = _RUNTIME, None
    if rt is not None:
        close(rt)


def scope(config: InitConfig | None = None, *, read_only: bool = False) -> Runtime:
    """A runtime of its own for one graph (an Estimator call), not active yet: see
    :func:`activated` and :func:`close`.

    Args:
      config: the :class:`InitConfig` to run with; default that of the active runtime, or
        ``init()``'s defaults.
      read_only: evaluation / prediction: no channel counts, admits or allocates keys.

    Returns:
      The new :class:`Runtime`, marked ``scoped``.
    """
    if config is None:
        config = _RUNTIME.config if _RUNTIME is not None else InitConfig()
    return Runtime(config=config, read_only=read_only, scoped=True,   # InitConfig is frozen
                   world=_join_ranks())


def _join_ranks():
    """The ranks this process is one of (``graph_world.GraphWorld``, joined now if need be),
    or None when it runs alone.

    Raises:
      RuntimeError: several ranks without the addresses their collectives need.
    """
    from sparseflow.distributed import graph_world, ranks
    if graph_world.current() is not None:
        return graph_world.current()
    found = ranks.detect()
    return graph_world.join(found) if found.size > 1 else None


@contextlib.contextmanager
def activated(rt: Runtime):
    """Makes ``rt`` the active runtime inside the block; the one active before (if any) is set
    aside, not terminated, and comes back at exit. Pipelines already built keep the runtime
    they were built in, so a training pipeline reading ahead is not disturbed while an
    evaluation builds its graph in a runtime of its own."""
    global _RUNTIME
    outer, _RUNTIME = _RUNTIME, rt
    try:
        yield rt
    finally:
        _RUNTIME = outer


def close(rt: Runtime) -> None:
    """Stops the pipeline of a runtime made by :func:`scope` and releases its tables."""
    for table in rt.tables.values():
        table.close()


def active() -> Runtime | None:
    """The active runtime, or None."""
    return _RUNTIME


def is_initialized() -> bool:
    """Whether :func:`init` is active."""
    return _RUNTIME is not None


def current(api: str = "this API") -> Runtime:
    """Returns the active :class:`Runtime`.

    Args:
      api: the name of the calling API, for the error message.

    Raises:
      NotInitializedError: :func:`init` has not been called.
    """
    if _RUNTIME is None:
        raise NotInitializedError(
            f"sparseflow is not initialized: call sparseflow.init(...) before using {api}.")
    return _RUNTIME


def get_use_dynamic_expansion() -> bool:
    """Rec SDK's ``mx_rec.util.initialize.get_use_dynamic_expansion``."""
    return current("get_use_dynamic_expansion").config.use_dynamic_expansion


atexit.register(terminate_config_initializer)
