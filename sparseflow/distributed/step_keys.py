"""The collective graph key of each ``Session.run`` of a rank: a fresh one after a step fails.

TensorFlow's master gives every step that runs collective ops a step id from a sequence that
all ranks share (one sequence per *collective graph key*), and moves the sequence on only
when the step succeeds. A step that fails (the end of the data, an ``OutOfRangeError``, as
Rec SDK's one-shot evaluation ends) leaves its id to the next collective step, while the
failed step is still being cleaned up, asynchronously, on every rank. When one rank's next
step reaches a peer whose failed step is not yet cleaned up, the peer's cleanup deletes the
buffers of the new step: "Delete called on non-empty BufRendezvous", on every rank.

So each rank sends its collective steps with a graph key of its own choosing (every rank the
same): ``BASE + n``, where ``n`` counts the failed collective steps of this process. Every rank
fails the same steps (each runs the same script on its part of the data), so after a failure
all ranks move to a new key, whose new step sequence shares no id with the failed step.
Runs without collectives keep TensorFlow's default (no key): a rank may run those alone.
"""

from __future__ import annotations

import threading
import time

import tensorflow as tf

from sparseflow.pipeline.graph_cache import graph_cache

# A rank cleans a failed collective step up after the step has returned its error
# (asynchronously); a peer's next collective step reaching it meanwhile found the failed step's
# buffers deleted under it ("Delete called on non-empty BufRendezvous", which aborts every
# later collective of the process). The next collective step after a failure waits this long.
SETTLE_SECONDS = 0.5

# Any int64 but 0 (no key); far from TensorFlow's hashes of V1 instance keys by chance only.
BASE_GRAPH_KEY = 0x5F5F_0000_0000


class StepKeys:
    """Chooses the collective graph key of a rank's ``Session.run`` calls."""

    def __init__(self):
        self._failed = 0
        self._failed_at = None
        self._lock = threading.Lock()

    def key(self) -> int:
        """The key of this rank's collective steps now."""
        with self._lock:
            return BASE_GRAPH_KEY + self._failed

    def failed(self) -> None:
        """A collective step failed: the next ones use a new key (a new step sequence)."""
        with self._lock:
            self._failed += 1
            self._failed_at = time.monotonic()

    def settle(self) -> None:
        """Before a collective step: if one failed less than :data:`SETTLE_SECONDS` ago, waits
        out the rest, so that every rank has cleaned the failed step up."""
        with self._lock:
            failed_at = self._failed_at
        if failed_at is not None:
            left = SETTLE_SECONDS - (time.monotonic() - failed_at)
            if left > 0:
                time.sleep(left)

    def run_options(self, graph: tf.Graph, fetches, options, timeout_seconds: float = 0.0):
        """``options`` (a ``RunOptions`` or None) for a run of ``fetches`` in ``graph``: with
        this rank's collective graph key when the run executes collective ops and the caller
        set no key, and then, unless the caller set one, a deadline of ``timeout_seconds``
        (> 0) for the whole run (one wait per step: a timeout on each collective op costs a
        thread per op run that lives as long as the timeout); else ``options`` unchanged.
        Returns (options, whether keyed)."""
        if options is not None and options.experimental.collective_graph_key:
            return options, False
        if not runs_collectives(graph, fetches):
            return options, False
        self.settle()
        keyed = tf.compat.v1.RunOptions()
        if options is not None:
            keyed.CopyFrom(options)
        keyed.experimental.collective_graph_key = self.key()
        if timeout_seconds > 0 and not keyed.timeout_in_ms:
            keyed.timeout_in_ms = max(1, int(timeout_seconds * 1000))
        return keyed, True


def runs_collectives(graph: tf.Graph, fetches) -> bool:
    """Whether running ``fetches`` (anything ``Session.run`` takes) in ``graph`` executes a
    collective op: one among the ops they depend on, through data or control inputs.
    Cached per graph version and fetched names. Fetches it cannot resolve: False (the
    run keeps TensorFlow's default)."""
    try:
        leaves = tf.nest.flatten(fetches, expand_composites=True)
        ops = []
        for leaf in leaves:
            element = graph.as_graph_element(leaf, allow_tensor=True, allow_operation=True)
            ops.append(element if isinstance(element, tf.Operation) else element.op)
    except (TypeError, ValueError, KeyError):
        return False
    cache = graph_cache(graph, "collective_runs")
    key = (graph.version, tuple(sorted({op.name for op in ops})))
    if key not in cache:
        cache[key] = _reaches_collective(ops)
    return cache[key]


def _reaches_collective(ops: list) -> bool:
    seen, stack = set(), list(ops)
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        if op.type.startswith("Collective"):
            return True
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return False
