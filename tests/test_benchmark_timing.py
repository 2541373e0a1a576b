"""Benchmarks' timed Session loops (benchmarks/report.py, ``timed_steps``): every run in the
warm-up and the timed window asks for the same fetches, so the timed window holds no one-time
executor build. A Session builds executors (grappler over the whole graph) for each new set of
fetches; bench_tiers once asked for the loss only in its last timed step, and that build, with
the stream embedded as a constant, was a third of its timed window."""

import os
import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))

import report  # noqa: E402


class RecordingSession:
    """Records each ``run``'s fetches; returns the call count as the value."""

    def __init__(self):
        self.fetches = []

    def run(self, fetches):
        self.fetches.append(fetches)
        return len(self.fetches)


def test_every_run_asks_for_the_same_fetches_and_only_the_timed_ones_are_counted():
    sess = RecordingSession()
    fetch = ["step", "loss"]
    timed = report.timed_steps(sess, fetch, warmup=3, steps=5)
    assert sess.fetches == [fetch] * 8
    assert timed.steps == 5
    assert timed.last == 8                       # the last timed run's value
    assert timed.seconds >= 0.0 and timed.cpu_seconds >= 0.0


def test_the_steps_run_in_a_real_session_and_the_last_value_is_the_last_runs():
    with tf.Graph().as_default():
        counter = tf.compat.v1.get_variable("counter", initializer=np.int64(0))
        step = tf.compat.v1.assign_add(counter, 1)
        with tf.compat.v1.Session() as sess:
            sess.run(counter.initializer)
            timed = report.timed_steps(sess, [step, counter], warmup=2, steps=4)
            assert int(timed.last[0]) == 6
            assert int(sess.run(counter)) == 6


def test_no_timed_steps_is_an_error_naming_the_argument():
    import pytest
    with pytest.raises(ValueError, match="steps"):
        report.timed_steps(RecordingSession(), "step", warmup=1, steps=0)
