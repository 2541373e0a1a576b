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
