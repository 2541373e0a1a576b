"""Eviction on demand (``sparseflow.evict``) and on a schedule (``EvictHook``).

A key is evicted when ``clock - last_seen >= eviction_threshold`` (the table's training feature
specs set the threshold; the clock is the largest training timestamp seen). Rows of evicted keys
are reused only after every batch processed before the eviction has been read by the model.
"""

from __future__ import annotations

import logging
import time

import tensorflow as tf

from sparseflow import runtime as _runtime
from sparseflow.validation import check_bool, check_optional_int, fail

logger = logging.getLogger("sparseflow")


def evict(table=None) -> dict:
    """Evicts stale keys now, from one table or from every table with eviction on.

    The clock is the largest timestamp among the batches *processed* so far, which in a
    prefetching pipeline runs ahead of the batch the model is training on.

    Args:
      table: a table object, a table name, or None for every table whose training feature specs
        set an ``eviction_threshold`` (>= 0).

    Returns:
      dict table name -> ``EvictionResult`` (keys_removed, keys_left, rows_free, rows_waiting).
      Each eviction is also logged at INFO on the ``sparseflow`` logger.

    Raises:
      NotInitializedError: ``init`` was not called.
      RuntimeError: the pipeline has not started.
      ValueError: ``table`` names no table, or that table has eviction off.
    """
    rt = _runtime.current("evict")
    if not rt.pipeline_started:
        raise RuntimeError("evict() needs a started pipeline: call start_asc_pipeline() first.")
    if table is None:
        targets = [t for t in rt.tables.values() if t.eviction_threshold >= 0]
    else:
        name = table if isinstance(table, str) else getattr(table, "table_name", None)
        if name not in rt.tables:
            fail("table", f"a table or table name, one of {sorted(rt.tables)}", table)
        targets = [rt.tables[name]]
        if targets[0].eviction_threshold < 0:
            raise ValueError(f"Argument `table` must have eviction on: table `{name}` has "
                             f"eviction_threshold=-1 (set it on its training FeatureSpecs). "
                             f"Received: {name!r}")
    results = {}
    for t in targets:
        result = t.processor.evict(t.eviction_threshold)
        results[t.table_name] = result
        logger.info("sparseflow eviction: table %s removed %d keys, %d keys left, %d rows free, "
                    "%d rows waiting for batches in flight", t.table_name, result.keys_removed,
                    result.keys_left, result.rows_free, result.rows_waiting)
    return results


class EvictHook(tf.compat.v1.train.SessionRunHook):
    """Evicts stale keys after a training step, on a wall-time or a step schedule.

    Args:
      evict_enable: whether the hook evicts at all (Rec SDK's default is False).
      evict_time_interval: seconds between evictions, int >= 1 (default one day).
      evict_step_interval: also evict when ``global_step % evict_step_interval == 0``; None or
        an int >= 1. Needs a global step (``tf.compat.v1.train.get_or_create_global_step``).

    Raises:
      TypeError, ValueError: an argument of the wrong type or range.
    """

    def __init__(self, evict_enable=False, evict_time_interval=86400, evict_step_interval=None):
        self.evict_enable = check_bool("evict_enable", evict_enable)
        self.evict_time_interval = check_optional_int("evict_time_interval",
                                                      evict_time_interval, 1)
        if self.evict_time_interval is None:
            fail("evict_time_interval", "an int >= 1", evict_time_interval, TypeError)
        self.evict_step_interval = check_optional_int("evict_step_interval",
                                                      evict_step_interval, 1)
        self._last_evict = time.monotonic()
        self._global_step = None
        self.evictions = 0

    def begin(self):
        self._global_step = tf.compat.v1.train.get_global_step()
        if self.evict_step_interval is not None and self._global_step is None:
            raise ValueError("EvictHook(evict_step_interval=...) needs a global step: create it "
                             "with tf.compat.v1.train.get_or_create_global_step() before the "
                             "session.")
        self._last_evict = time.monotonic()

    def before_run(self, run_context):
        if self._global_step is None or self.evict_step_interval is None:
            return None
        return tf.compat.v1.train.SessionRunArgs(self._global_step)

    def after_run(self, run_context, run_values):
        if not self.evict_enable:
            return
        due = time.monotonic() - self._last_evict >= self.evict_time_interval
        if self.evict_step_interval is not None and not due:
            # The value fetched inside the step may predate its increment (as TF's
            # CheckpointSaverHook notes): only when it is within one step of the schedule is the
            # exact value read, so most steps cost no extra session.run.
            stale = int(run_values.results)
            if (stale + 1) % self.evict_step_interval in (0, 1):
                step = int(run_context.session.run(self._global_step))
                due = step % self.evict_step_interval == 0
        if due:
            evict()
            self.evictions += 1
            self._last_evict = time.monotonic()
