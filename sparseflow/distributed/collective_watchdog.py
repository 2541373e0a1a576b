"""The deadline of the TF2 faces' collectives: one watching thread per process.

A ``timeout_seconds`` on a collective op makes TensorFlow start a thread for every run of
the op that sleeps out the whole timeout (``Env::SchedClosureAfter``): a 2-rank job running
~300 collectives a second under a 300 s timeout holds ~90,000 threads, and runs a machine out
of pids within minutes. The graph faces put one deadline on a step's ``Session.run``
instead (``RunOptions.timeout_in_ms``); eager code and ``tf.function``s have no such option,
so their collectives carry no timeout and this watchdog gives them one: each collective
reports its start and its end (an exchange's chained collectives report as one,
``CountedExchange.watched_as_one``), and when one has been waiting for ``timeout_seconds`` with
no collective of the process starting or ending meanwhile, the watchdog aborts the
process's collectives with ``DeadlineExceededError`` (TensorFlow's own way out of a
collective whose peer is gone, the one ``MultiWorkerMirroredStrategy``'s health check
uses; the process's collectives stay aborted: its rank is lost).
"""

from __future__ import annotations

import threading
import time

import tensorflow as tf

from sparseflow.validation import check_float


class CollectiveWatchdog:
    """Aborts the process's collectives once one waited ``timeout_seconds`` with no progress.

    Args:
      timeout_seconds: how long a collective may wait (> 0).
      clock: a monotonic clock in seconds (tests pass their own).
      abort: called once with the message when the deadline passes; by default
        TensorFlow's ``abort_collective_ops`` with ``DEADLINE_EXCEEDED``.
      watching: start the watching thread on the first collective; False: none, the caller
        calls :meth:`check`.

    Raises:
      ValueError: ``timeout_seconds`` out of range.
    """

    def __init__(self, timeout_seconds: float, clock=time.monotonic, abort=None,
                 watching: bool = True):
        self.timeout_seconds = check_float("timeout_seconds", timeout_seconds, 0.0, 86_400.0,
                                           low_open=True)
        self._clock = clock
        self._abort = abort or _abort_collectives
        self._lock = threading.Lock()
        self._pending = 0
        self._progress = clock()
        self._aborted = False
        self._watching = watching
        self._thread: threading.Thread | None = None

    def started(self) -> None:
        """A collective is about to run (starts the watching thread on the first)."""
        with self._lock:
            self._pending += 1
            self._progress = self._clock()
            if self._watching and self._thread is None:
                self._thread = threading.Thread(target=self._watch, daemon=True,
                                                name="sparseflow_collective_watchdog")
                self._thread.start()

    def finished(self) -> None:
        """A collective that :meth:`started` has completed."""
        with self._lock:
            self._pending = max(0, self._pending - 1)
            self._progress = self._clock()

    def check(self) -> bool:
        """Aborts the collectives if one has waited past the deadline; True once aborted."""
        with self._lock:
            if self._aborted:
                return True
            waited = self._clock() - self._progress
            if not self._pending or waited < self.timeout_seconds:
                return False
            self._aborted = True
        self._abort(f"sparseflow: a collective among the ranks waited {waited:.1f} s, past "
                    f"the collective timeout of {self.timeout_seconds:g} s")
        return True

    def _watch(self) -> None:
        # Checking a few times per timeout keeps the overshoot small at no measurable cost.
        while not self.check():
            time.sleep(min(1.0, self.timeout_seconds / 4))


def _abort_collectives(message: str) -> None:
    from tensorflow.python.eager import context

    context.context().abort_collective_ops(tf.errors.DEADLINE_EXCEEDED, message)


_LOCK = threading.Lock()
_WATCHDOG: CollectiveWatchdog | None = None


def process_watchdog(timeout_seconds: float) -> CollectiveWatchdog:
    """The process's watchdog (made on the first call; the shortest timeout any caller
    asked for wins, so no collective waits longer than its caller allowed).

    Raises:
      ValueError: ``timeout_seconds`` out of range.
    """
    global _WATCHDOG
    with _LOCK:
        if _WATCHDOG is None:
            _WATCHDOG = CollectiveWatchdog(timeout_seconds)
        else:
            _WATCHDOG.timeout_seconds = min(
                _WATCHDOG.timeout_seconds,
                check_float("timeout_seconds", timeout_seconds, 0.0, 86_400.0, low_open=True))
        return _WATCHDOG
