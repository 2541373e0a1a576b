"""Admission state survives a checkpoint exactly, with the pipeline reading ahead (issue 17,
item 6).

At a save the pipeline has processed batches the model has not consumed yet (prefetch). A run
restored from the checkpoint reads those batches again: the checkpoint must hold the key
state of the consumed batches only — counts, admissions, last-seen times, clock and the
admission sketch — so that the restored run admits exactly the keys the uninterrupted run
admits. The reference throughout is the uninterrupted run, compared with a run saved at step
k and restored into fresh tables that read on from batch k+1.
"""

import contextlib
import logging

import numpy as np
import pytest
import tensorflow as tf

import sparseflow as sf
from sparseflow.checkpoint import sparse_format as fmt
from sparseflow.checkpoint.table_state import apply, capture
from sparseflow.optimizers import lazy_adam
from sparseflow.table import host_table
from tests.pipeline_utils import sorted_state

THRESHOLD = 3
N_BATCHES, SAVE_AT, AHEAD = 24, 9, 3


def _batches(seed=11):
    """Batches of zipf-like keys (a few hot, many seen once or twice), each with a
    timestamp; new keys keep arriving."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(N_BATCHES):
        hot = rng.integers(0, 30, 12)
        tail = rng.integers(30 + 10 * i, 90 + 10 * i, 20)
        out.append((np.concatenate([hot, tail]).astype(np.int64), 100 + 7 * i))
    return out


# -- the key processor, read-ahead made explicit ------------------------------------------

def _table(counter):
    return host_table("t", 4, tf.compat.v1.random_normal_initializer(seed=4), 2000,
                      access_threshold=THRESHOLD, eviction_threshold=None, optimizer=None,
                      size_hint="vocabulary_size", admission_counter=counter)


def _feed(table, batches, start, stop, ahead):
    """Consumes batches ``[start, stop)``, each processed ``ahead`` batches before the model
    reads it (as a prefetch buffer of that depth does); leaves the next ``ahead`` batches
    processed and unread. Returns the seqs of those."""
    processor, pending = table.processor, []

    def process(i):
        keys, ts = batches[i]
        result = processor.process(keys, np.array([keys.shape[0]]), np.array([1], np.int32),
                                   True, ts)
        pending.append(result.seq)

    following = start
    for i in range(start, stop):
        while following <= min(i + ahead, len(batches) - 1):
            process(following)
            following += 1
        table.release_batch(pending.pop(0), drain=True)   # the model reads batch i
    return pending


def _key_state(table):
    state = capture(table)
    order, counted = np.argsort(state.keys), np.argsort(state.counted_keys)
    out = {"keys": state.keys[order], "counts": state.counts[order],
           "last_seen": state.last_seen[order], "weights": state.weights[order],
           "counted": state.counted_keys[counted],
           "counted_counts": state.counted_counts[counted], "clock": np.int64(state.clock)}
    if state.sketch is not None:
        out["sketch"] = state.sketch.counters
        out["sketch_total"] = np.int64(state.sketch.total)
    return out


def _assert_same(got, expected):
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


@pytest.mark.parametrize("counter", ["exact", "sketch"])
def test_a_state_saved_with_batches_in_flight_resumes_as_the_uninterrupted_run(counter):
    batches = _batches()
    whole = _table(counter)
    _feed(whole, batches, 0, N_BATCHES, AHEAD)
    expected = _key_state(whole)

    first = _table(counter)
    in_flight = _feed(first, batches, 0, SAVE_AT, AHEAD)
    assert len(in_flight) == AHEAD and first.processor.batches_in_flight == AHEAD
    saved = capture(first)
    # The save holds batches 0..SAVE_AT-1 only: as a table that never read ahead.
    alone = _table(counter)
    _feed(alone, batches, 0, SAVE_AT, 0)
    _assert_same(_key_state(alone), {k: v for k, v in _key_state(first).items()})

    resumed = _table(counter)
    apply(resumed, saved, "the test")
    _feed(resumed, batches, SAVE_AT, N_BATCHES, AHEAD)
    got = _key_state(resumed)
    _assert_same(got, expected)
    assert expected["keys"].shape[0] > 20
    # Admission waited for some keys, and read-ahead admitted some at the save.
    assert (expected["counted"].shape[0] > 0) == (counter == "exact")
    assert np.setdiff1d(capture(first).keys, _key_state(alone)["keys"]).shape[0] == 0


def test_read_ahead_admissions_are_left_out_of_the_save():
    """A key that reaches the threshold in a batch still in flight is saved as counted (with
    its count before that batch), not admitted; its row is not saved."""
    table = _table("exact")
    key = np.array([7], np.int64)
    for ts in (1, 2):   # consumed: count 2
        result = table.processor.process(key, np.array([1]), np.array([1], np.int32), True,
                                         ts)
        table.release_batch(result.seq, drain=True)
    ahead = table.processor.process(key, np.array([1]), np.array([1], np.int32), True, 3)
    assert table.size() == 1 and ahead.rows[0] >= 0   # admitted live, by a batch in flight
    state = capture(table)
    assert state.keys.tolist() == [] and state.counted_keys.tolist() == [7]
    assert state.counted_counts.tolist() == [2] and state.clock == 2
    # The evaluation channel reads the key as the checkpoint holds it: not admitted yet.
    def evaluate():
        return table.processor.process(key, np.array([1]), np.array([1], np.int32), False)

    assert evaluate().rows.tolist() == [-1]
    table.release_batch(ahead.seq, drain=True)   # the model reads it: now it is admitted
    assert evaluate().rows.tolist() == ahead.rows.tolist()
    assert capture(table).keys.tolist() == [7]


# -- the Session flow with a prefetching pipeline: host and tiered tables ------------------

B = 16


def _data():
    rng = np.random.default_rng(3)
    n = B * N_BATCHES
    hot = rng.integers(0, 40, (n, 1))
    tail = rng.integers(0, 6 * n, (n, 2))
    return {"f": np.concatenate([hot, tail], 1).astype(np.int64),
            "ts": np.repeat(np.arange(N_BATCHES, dtype=np.int64) * 10, B)}


@contextlib.contextmanager
def _fresh_graph():
    """A new graph and sparseflow init, terminated however the block ends."""
    sf.terminate_config_initializer()
    try:
        with tf.Graph().as_default():
            yield
    finally:
        sf.terminate_config_initializer()


def _session_job(kind, counter, skip=0):
    sf.init()
    specs = [sf.FeatureSpec("f", table_name="t", access_threshold=THRESHOLD),
             sf.FeatureSpec("ts", is_timestamp=True)]
    placement = (dict(device_vocabulary_size=2000) if kind == "host" else
                 dict(device_vocabulary_size=120, host_vocabulary_size=1880, rows_on="device"))
    table = sf.create_table(tf.int64, 4, "t", tf.compat.v1.random_normal_initializer(seed=2),
                            admission_counter=counter, **placement)
    ds = tf.data.Dataset.from_tensor_slices(_data()).batch(B).skip(skip)
    ds = ds.map(sf.get_asc_insert_func(tgt_key_specs=specs)).prefetch(AHEAD)   # read-ahead
    it = tf.compat.v1.data.make_initializable_iterator(ds)
    emb = sf.sparse_lookup(table, specs[0], batch=it.get_next())
    loss = tf.reduce_sum(tf.square(emb - 1.0))
    train = lazy_adam.create_hash_optimizer(0.05).apply_gradients(
        [(tf.gradients(loss, table)[0], table)])
    tf.compat.v1.get_variable("dense", initializer=tf.ones([2]))
    saver = sf.Saver()
    sf.start_asc_pipeline()
    return table, it, train, loss, saver


def _final_state(table, sess):
    state = sorted_state(table, sess)
    sketch = capture(table, sess=sess).sketch
    if sketch is not None:
        state["sketch"] = sketch.counters
    return state


@pytest.mark.parametrize("kind", ["host", "tiered"])
@pytest.mark.parametrize("counter", ["exact", "sketch"])
def test_save_with_prefetch_then_restore_admits_what_the_uninterrupted_run_admits(
        kind, counter, tmp_path):
    with _fresh_graph():
        table, it, train, loss, _ = _session_job(kind, counter)
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), it.initializer])
            losses = [sess.run([train, loss])[1] for _ in range(N_BATCHES)]
            expected = _final_state(table, sess)   # every batch read: none in flight
    prefix = str(tmp_path / "model")
    with _fresh_graph():
        table, it, train, loss, saver = _session_job(kind, counter)
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), it.initializer])
            for _ in range(SAVE_AT):
                sess.run(train)
            saver.save(sess, prefix, global_step=SAVE_AT)
    with _fresh_graph():
        table, it, train, loss, saver = _session_job(kind, counter, skip=SAVE_AT)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            saver.restore(sess, f"{prefix}-{SAVE_AT}")
            sess.run(it.initializer)   # after the restore: no batch read against the old state
            resumed = [sess.run([train, loss])[1] for _ in range(N_BATCHES - SAVE_AT)]
            got = _final_state(table, sess)
    assert expected["keys"].shape[0] > 50 and (expected["counted"].shape[0] > 0) == (
        counter == "exact")
    assert set(got) == set(expected)
    for name, value in expected.items():   # keys, counts, counted, times, rows, slots, steps
        np.testing.assert_array_equal(got[name], value, err_msg=name)
    np.testing.assert_allclose(resumed, losses[SAVE_AT:], rtol=1e-6)


# -- the sketch in the checkpoint files ----------------------------------------------------

def _sketch_checkpoint(tmp_path):
    """A Saver checkpoint of a sketch table with keys counted, not admitted (its own graph
    and init)."""
    with _fresh_graph():
        table, it, train, _, saver = _session_job("host", "sketch")
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), it.initializer])
            for _ in range(3):
                sess.run(train)
            prefix = saver.save(sess, str(tmp_path / "model"), global_step=3)
        saved = capture(table).sketch
    return prefix, saved


def test_a_checkpoint_without_a_sketch_loads_with_an_empty_sketch_and_a_warning(
        graph, tmp_path, caplog):
    import json
    import os

    prefix, saved = _sketch_checkpoint(tmp_path)
    assert saved.total > 0
    # As written before sketches were saved: no sketch file, no manifest entry.
    directory = tmp_path / "sparse-model-3"
    manifest = json.loads((directory / fmt.MANIFEST).read_text())
    entry = manifest["tables"]["t"]
    assert entry["sketch"]["version"] == fmt.SKETCH_VERSION
    del entry["sketch"], entry["files"]["sketch.arrow"]
    os.remove(directory / "t" / "sketch.arrow")
    (directory / fmt.MANIFEST).write_text(json.dumps(manifest))
    table, _, _, _, saver = _session_job("host", "sketch")
    table.processor.sketch.add(np.array([1], np.int64), np.array([2], np.int64))
    with tf.compat.v1.Session() as sess, caplog.at_level(logging.WARNING, "sparseflow"):
        sess.run(tf.compat.v1.global_variables_initializer())
        saver.restore(sess, prefix)
    assert "holds no admission sketch" in caplog.text and "`t`" in caplog.text
    assert table.processor.sketch.total == 0 and not table.processor.sketch.counters.any()
    assert table.size() > 0   # the rest of the checkpoint loaded


def test_a_sketch_of_another_geometry_or_version_is_refused(graph, tmp_path):
    import json

    prefix, _ = _sketch_checkpoint(tmp_path)
    sf.init()
    spec = sf.FeatureSpec("f", table_name="t", access_threshold=THRESHOLD)
    table = sf.create_table(tf.int64, 4, "t", tf.compat.v1.random_normal_initializer(seed=2),
                            device_vocabulary_size=2000, admission_counter="sketch",
                            sketch_width=1024)
    it = tf.compat.v1.data.make_initializable_iterator(tf.data.Dataset.from_tensor_slices(
        {"f": np.zeros((4, 1), np.int64)}).batch(2).map(
        sf.get_asc_insert_func(tgt_key_specs=[spec])))
    emb = sf.sparse_lookup(table, spec, batch=it.get_next())
    lazy_adam.create_hash_optimizer(0.05).apply_gradients(
        [(tf.gradients(tf.reduce_sum(emb), table)[0], table)])
    tf.compat.v1.get_variable("dense", initializer=tf.ones([2]))
    saver = sf.Saver()
    sf.start_asc_pipeline()
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        with pytest.raises(ValueError, match=r"table `t` .* admission sketch has \(width, "
                                             r"depth, seed\) \(1048576, 4, \d+\) but the "
                                             r"table's has \(1024, 4, \d+\)"):
            saver.restore(sess, prefix)
        assert table.size() == 0
        path = tmp_path / "sparse-model-3" / fmt.MANIFEST
        manifest = json.loads(path.read_text())
        manifest["tables"]["t"]["sketch"]["version"] = 99
        path.write_text(json.dumps(manifest))
        with pytest.raises(sf.CheckpointError, match=r"sketch version 99; this sparseflow "
                                                     r"reads 1"):
            saver.restore(sess, prefix)
