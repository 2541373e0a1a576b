"""The TF2 faces' collective deadline (sparseflow.distributed.collective_watchdog): their
collective ops carry no timeout (a thread per op run otherwise), and the process's watchdog
aborts them once one has waited past SPARSEFLOW_COLLECTIVE_TIMEOUT."""

import subprocess
import sys
import textwrap

import pytest

from sparseflow.distributed.collective_watchdog import CollectiveWatchdog


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _watchdog(timeout):
    clock, aborted = _Clock(), []
    return CollectiveWatchdog(timeout, clock=clock, abort=aborted.append, watching=False), clock, aborted


def test_a_pending_collective_is_aborted_once_it_waited_the_timeout():
    dog, clock, aborted = _watchdog(5.0)
    dog.started()
    clock.now += 4.9
    assert not dog.check() and aborted == []
    clock.now += 0.2
    assert dog.check()
    assert aborted == ["sparseflow: a collective among the ranks waited 5.1 s, past the "
                       "collective timeout of 5 s"]
    clock.now += 10
    assert dog.check() and len(aborted) == 1   # aborted once


def test_no_collective_waiting_means_no_deadline():
    dog, clock, aborted = _watchdog(5.0)
    assert not dog.check()
    dog.started()
    clock.now += 3
    dog.finished()
    clock.now += 1000   # idle between steps, however long
    assert not dog.check() and aborted == []


def test_progress_of_any_collective_restarts_the_wait():
    dog, clock, aborted = _watchdog(5.0)
    dog.started()
    for _ in range(4):   # a long step of several collectives, each quick
        clock.now += 4
        dog.finished()
        dog.started()
    assert not dog.check()
    clock.now += 5
    assert dog.check() and len(aborted) == 1


@pytest.mark.parametrize("bad", [0, -1, float("nan"), 1e9, "5"])
def test_the_timeout_is_checked(bad):
    with pytest.raises((ValueError, TypeError), match="timeout_seconds"):
        CollectiveWatchdog(bad)


def test_a_collective_with_no_peer_fails_with_the_deadline_in_a_tf_function():
    """A real collective of a group of 2 in a process alone waits for its peer forever; the
    watchdog ends it with DeadlineExceededError after the timeout, and it started no thread
    per collective run."""
    program = textwrap.dedent("""
        import os, time
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
        import tensorflow as tf
        from sparseflow.distributed.exchange import CountedExchange

        exchange = CountedExchange(2, 1.5, 1010)

        @tf.function
        def step(x):
            return exchange.reduce(x, "Add")

        begin = time.monotonic()
        try:
            step(tf.constant([1.0]))
        except tf.errors.DeadlineExceededError as error:
            print("waited", time.monotonic() - begin)
            print(error.message.splitlines()[-3])
    """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=120)
    lines = done.stdout.splitlines()
    assert len(lines) == 2, done.stdout + done.stderr[-3000:]
    assert 1.5 <= float(lines[0].split()[1]) < 10
    assert lines[1].startswith("Collective ops is aborted by: sparseflow: a collective among "
                               "the ranks waited ")
    assert lines[1].endswith("s, past the collective timeout of 1.5 s")


def test_compiled_reports_count_each_run_and_the_watchdog_takes_a_change_as_progress():
    """The process's watchdog reports from a graph through the compiled op (no Python on
    the step's path): each run adds one to the process's started or finished count, and
    the watchdog's check takes counts that changed since its last look as progress made
    then; a start with no end after it is aborted once the timeout passed with no change."""
    import tensorflow as tf

    from sparseflow.ops import progress_ops

    counts = progress_ops.PROCESS_COUNTS
    clock, aborted = _Clock(), []
    dog = CollectiveWatchdog(5.0, clock=clock, abort=aborted.append, watching=False,
                             counts=counts)

    @tf.function
    def step(x):
        dog.report_op(progress_ops.STARTED, "sparseflow_collective_started")
        return x + 1

    ops = step.get_concrete_function(tf.constant(1)).graph.get_operations()
    assert "SparseflowCountProgress" in {op.type for op in ops}
    assert not {"PyFunc", "EagerPyFunc"} & {op.type for op in ops}
    before = (int(counts[0]), int(counts[1]))
    try:
        step(tf.constant(1))
        step(tf.constant(2))
        assert (int(counts[0]), int(counts[1])) == (before[0] + 2, before[1])
        clock.now += 100   # the change is seen at this look: progress made now
        assert not dog.check()
        clock.now += 4.9
        assert not dog.check() and aborted == []
        clock.now += 0.2
        assert dog.check() and len(aborted) == 1
    finally:
        for _ in range(2):   # the process's counts balanced again for the other tests
            progress_ops.add(counts, progress_ops.FINISHED)
    assert (int(counts[0]) - int(counts[1])) == before[0] - before[1]


def test_a_watchdog_of_its_own_reports_from_a_graph_through_python():
    """A watchdog with counts of its own (not the process's) is told by a numpy function:
    the compiled op only adds to the process's counts."""
    import tensorflow as tf

    from sparseflow.ops import progress_ops

    dog, clock, aborted = _watchdog(5.0)

    @tf.function
    def step():
        dog.report_op(progress_ops.STARTED, "started")
        dog.report_op(progress_ops.FINISHED, "finished")
        return tf.constant(0)

    step()
    step()
    clock.now += 1000
    assert not dog.check() and aborted == []   # balanced: nothing pending
    assert (int(dog._counts[0]), int(dog._counts[1])) == (2, 2)   # noqa: SLF001


def test_the_progress_op_refuses_an_unknown_report():
    from sparseflow.ops import progress_ops

    with pytest.raises(ValueError, match="which must be STARTED"):
        progress_ops.count_progress(2)
