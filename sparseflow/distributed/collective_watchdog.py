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

The reports are counts: started and finished, added to atomically. Python reports (eager
collectives, a numpy function's) add to them and mark the time; a graph's reports are
compiled ops (:meth:`CollectiveWatchdog.report_op`, ``ops/progress_ops.py``) adding to the
process's counters without entering Python, and the watching thread takes a change of the
counts since its last look as progress.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import tensorflow as tf

from sparseflow.ops import progress_ops
from sparseflow.validation import check_float


class CollectiveWatchdog:
    """Aborts the process's collectives once one waited ``timeout_seconds`` with no progress.

    Args:
      timeout_seconds: how long a collective may wait (> 0).
      clock: a monotonic clock in seconds (tests pass their own).
      abort: called once with the message when the deadline passes; by default
        TensorFlow's ``abort_collective_ops`` with ``DEADLINE_EXCEEDED``.
      watching: start the watching thread on the first report, or when the first
        :meth:`report_op` is built; False: none, the caller calls :meth:`check`.
      counts: the int64 ``[2]`` array of started and finished reports; the process's
        watchdog (:func:`process_watchdog`) counts in ``progress_ops.PROCESS_COUNTS``, where
        the compiled reports of :meth:`report_op` add. Default: an array of its own.

    Raises:
      ValueError: ``timeout_seconds`` out of range.
    """

    def __init__(self, timeout_seconds: float, clock=time.monotonic, abort=None,
                 watching: bool = True, counts: np.ndarray | None = None):
        self.timeout_seconds = check_float("timeout_seconds", timeout_seconds, 0.0, 86_400.0,
                                           low_open=True)
        self._clock = clock
        self._abort = abort or _abort_collectives
        self._lock = threading.Lock()
        self._counts = np.zeros(2, np.int64) if counts is None else counts
        self._seen = self._read()
        self._progress = clock()
        self._aborted = False
        self._watching = watching
        self._thread: threading.Thread | None = None

    def started(self) -> None:
        """A collective is about to run (starts the watching thread on the first)."""
        self._report(progress_ops.STARTED)
        self._watch_from_now()

    def finished(self) -> None:
        """A collective that :meth:`started` has completed."""
        self._report(progress_ops.FINISHED)

    @property
    def pending(self) -> int:
        """Collectives reported started and not yet finished."""
        started, finished = self._read()
        return started - finished

    def report_op(self, which: int, name: str):
        """A graph op that reports a start (``progress_ops.STARTED``) or an end
        (``FINISHED``) each time it runs, without entering Python: a compiled op for the
        process's watchdog, a numpy function for any other. The watching thread starts
        now, as the op may be the process's first report. Build it in a graph (eagerly,
        call :meth:`started` / :meth:`finished`)."""
        self._watch_from_now()
        if self._counts is progress_ops.PROCESS_COUNTS:
            return progress_ops.count_progress(which, name=name)
        report = self.started if which == progress_ops.STARTED else self.finished

        @tf.autograph.experimental.do_not_convert
        def call():
            report()
            return []

        return tf.numpy_function(call, [], [], stateful=True, name=name)

    def _report(self, which: int) -> None:
        with self._lock:
            progress_ops.add(self._counts, which)
            self._seen = self._read()
            self._progress = self._clock()

    def _read(self) -> tuple:
        return int(self._counts[0]), int(self._counts[1])

    def _watch_from_now(self) -> None:
        with self._lock:
            if self._watching and self._thread is None:
                self._thread = threading.Thread(target=self._watch, daemon=True,
                                                name="sparseflow_collective_watchdog")
                self._thread.start()

    def check(self) -> bool:
        """Aborts the collectives if one has waited past the deadline; True once aborted.
        Counts that changed since the last look are progress, made now."""
        with self._lock:
            if self._aborted:
                return True
            counts = self._read()
            if counts != self._seen:
                self._seen = counts
                self._progress = self._clock()
            started, finished = counts
            waited = self._clock() - self._progress
            if started <= finished or waited < self.timeout_seconds:
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
            _WATCHDOG = CollectiveWatchdog(timeout_seconds,
                                           counts=progress_ops.PROCESS_COUNTS)
        else:
            _WATCHDOG.timeout_seconds = min(
                _WATCHDOG.timeout_seconds,
                check_float("timeout_seconds", timeout_seconds, 0.0, 86_400.0, low_open=True))
        return _WATCHDOG
