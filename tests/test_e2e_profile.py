"""The end-to-end benchmark's profile instruments the kernels that (d) really calls
(benchmarks/e2e_profile.py), so its per-part times are not silently zero or a crash."""

import os
import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "benchmarks"))

import e2e_profile  # noqa: E402
import e2e_variants as ev  # noqa: E402

from sparseflow.pipeline import key_processor  # noqa: E402


def test_the_profile_times_the_batch_dedup_and_the_key_processors_of_a_real_step():
    data = ev.make_data(4)
    timers = e2e_profile.Timers()
    build = e2e_profile.instrumented_sparseflow(timers)
    original = key_processor.dedup_batch
    graph = tf.Graph()
    built = None
    try:
        with graph.as_default():
            built = build(data, 20_000)   # rows enough for the 4 batches' new keys
            with tf.compat.v1.Session(graph=graph) as sess:
                sess.run(built.init_ops)
                sess.run(built.iterator_init, feed_dict=built.feed)
                for _ in range(2):
                    sess.run(built.train_op)
    finally:
        if built is not None:
            built.close()
        build.restore()
    assert key_processor.dedup_batch is original   # restored
    # One dedup per batch processed (the prefetch may have read ahead), 26 tables each.
    assert timers.calls[e2e_profile.DEDUP] >= 2
    assert timers.calls[e2e_profile.PROCESS] == 26 * timers.calls[e2e_profile.DEDUP]
    assert timers.calls[e2e_profile.EXPAND] == 2 and timers.calls[e2e_profile.UPDATE] == 2
    assert np.isfinite(timers.total[e2e_profile.DEDUP]) and timers.total[e2e_profile.DEDUP] > 0
