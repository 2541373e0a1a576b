"""TensorBoard scalars written from Python values, and how long a step waited for input.

The trainer computes its metrics (loss, AUC, table statistics) in Python between session runs,
so the summaries are plain ``Summary`` protos added to a ``FileWriter``: nothing is added to the
training graph.
"""

from __future__ import annotations

import tensorflow as tf

# The op a step blocks on while its batch is not ready.
_INPUT_OPS = ("IteratorGetNext",)


class ScalarWriter:
    """Writes scalars under ``log_dir`` for TensorBoard; a no-op when ``log_dir`` is None.

    Args:
      log_dir: the event-file directory, or None to write nothing.
    """

    def __init__(self, log_dir: str | None):
        self._writer = None
        if log_dir is not None:
            # The v1 writer refuses to be built eagerly; it needs no graph once built.
            with tf.Graph().as_default():
                self._writer = tf.compat.v1.summary.FileWriter(log_dir)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """Adds one event at ``step`` holding ``tag -> value`` for every entry of ``values``."""
        if self._writer is None or not values:
            return
        summary = tf.compat.v1.Summary(value=[
            tf.compat.v1.Summary.Value(tag=tag, simple_value=float(value))
            for tag, value in values.items()])
        self._writer.add_summary(summary, int(step))

    def close(self) -> None:
        """Flushes and closes the event file."""
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None


def traced_run_options() -> tf.compat.v1.RunOptions:
    """RunOptions that record per-op step statistics (used on a sample of steps only)."""
    return tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)


def input_wait_seconds(run_metadata: tf.compat.v1.RunMetadata) -> float:
    """Seconds the traced step spent in ``IteratorGetNext``: waiting for its batch.

    Args:
      run_metadata: filled by a ``Session.run`` with :func:`traced_run_options`.

    Returns:
      The longest ``IteratorGetNext`` wall time of the step (0.0 if none was recorded).
    """
    longest = 0
    for device in run_metadata.step_stats.dev_stats:
        for node in device.node_stats:
            if node.node_name.split(":")[0].rsplit("/", 1)[-1].startswith(_INPUT_OPS):
                longest = max(longest, node.all_end_rel_micros)
    return longest / 1e6
