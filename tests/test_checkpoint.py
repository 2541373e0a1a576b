"""Sparse checkpoints: exact resumption in a fresh process, a real kill mid-save, corrupt
files, capacity changes, max_to_keep."""

import glob
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import sparseflow as sf
from tests.pipeline_utils import lookup_training, sorted_state

JOB = os.path.join(os.path.dirname(__file__), "checkpoint_job.py")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _job(*args, **kwargs):
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, JOB, *map(str, args)], env=env, check=True,
                          capture_output=True, text=True, timeout=300, **kwargs)


def test_restore_in_a_fresh_process_is_exact(tmp_path):
    _job("save", tmp_path, tmp_path / "saved.npz")
    _job("restore", tmp_path, tmp_path / "restored.npz")
    saved, restored = np.load(tmp_path / "saved.npz"), np.load(tmp_path / "restored.npz")
    assert saved["keys"].shape[0] > 100 and saved["counted"].shape[0] > 0
    for name in saved.files:  # keys, weights, Adam slots, counts, last-seen, clock, steps
        np.testing.assert_array_equal(saved[name], restored[name], err_msg=name)
    assert saved["losses"].shape == (20,)  # the next 20 steps' losses match too (above)


def test_a_process_killed_mid_save_leaves_the_previous_checkpoint_loadable(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.Popen([sys.executable, JOB, "big", str(tmp_path), str(tmp_path / "a.npz")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "saving-big"
        deadline = time.monotonic() + 60
        while not glob.glob(str(tmp_path / "sparse-model-2.tmp-*")):
            assert time.monotonic() < deadline, "the big save never started"
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    assert not os.path.exists(tmp_path / "sparse-model-2")  # killed before it completed
    assert sf.latest_checkpoint(str(tmp_path)) == str(tmp_path / "model-1")
    _job("restore", tmp_path, tmp_path / "b.npz")  # a fresh process loads step 1, whole
    before, after = np.load(tmp_path / "a.npz"), np.load(tmp_path / "b.npz")
    for name in ("keys", "weights", "m", "v", "counts"):
        np.testing.assert_array_equal(before[name], after[name], err_msg=name)


def _trained_table(tmp_path, capacity=100, steps=4):
    rng = np.random.default_rng(1)
    spec = sf.FeatureSpec("f", table_name="t")
    table = sf.create_table(tf.int64, 4, "t", tf.compat.v1.random_normal_initializer(seed=2),
                            device_vocabulary_size=capacity)
    it, train, saver = lookup_training(  # no read-ahead: compared states = batches trained on
        table, [spec], {"f": rng.integers(0, 40, (8 * steps, 2)).astype(np.int64)}, 8,
        read_ahead=False)
    return table, it, train, saver


def test_corrupt_or_truncated_files_are_named_and_nothing_is_loaded(sf_init, tmp_path):
    table, it, train, saver = _trained_table(tmp_path)
    with tf.compat.v1.Session() as sess:
        sess.run([tf.compat.v1.global_variables_initializer(), it.initializer])
        sess.run(train)
        prefix = saver.save(sess, str(tmp_path / "model"), global_step=1)
        sess.run(train)
        before = table.export()
        path = tmp_path / "sparse-model-1" / "t" / "admitted.arrow"
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
        with pytest.raises(sf.CheckpointError, match=r"admitted.arrow' is corrupt"):
            saver.restore(sess, prefix)
        path.write_bytes(bytes(data[:100]))
        with pytest.raises(sf.CheckpointError, match=r"admitted.arrow' is truncated"):
            saver.restore(sess, prefix)
        os.remove(tmp_path / "sparse-model-1" / "manifest.json")
        with pytest.raises(sf.CheckpointError, match=r"manifest.json is missing"):
            saver.restore(sess, prefix)
        after = table.export()
    np.testing.assert_array_equal(before[0], after[0])
    np.testing.assert_array_equal(before[1], after[1])


def test_restore_into_another_capacity(graph, tmp_path):
    sf.init()
    table, it, train, saver = _trained_table(tmp_path, capacity=100)
    with tf.compat.v1.Session() as sess:
        sess.run([tf.compat.v1.global_variables_initializer(), it.initializer])
        for _ in range(4):
            sess.run(train)
        prefix = saver.save(sess, str(tmp_path / "model"), global_step=4)
    saved = table.export()
    n = saved[0].shape[0]
    for capacity, fits in ((5000, True), (n, True), (n - 1, False)):
        sf.terminate_config_initializer()
        with tf.Graph().as_default():
            sf.init()
            table, it, train, saver = _trained_table(tmp_path, capacity=capacity)
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                if fits:
                    saver.restore(sess, prefix)
                    got = table.export()
                    np.testing.assert_array_equal(got[0], saved[0])
                    np.testing.assert_array_equal(got[1], saved[1])
                else:
                    with pytest.raises(ValueError, match=rf"holds {n} keys but the table has "
                                                         rf"{n - 1} rows.*at least {n}"):
                        saver.restore(sess, prefix)


def test_max_to_keep_and_latest_checkpoint(sf_init, tmp_path):
    table, it, train, saver = _trained_table(tmp_path)
    with pytest.raises(ValueError, match=r"`incremental` must be False"):
        saver.save(None, str(tmp_path / "model"), incremental=True)
    with tf.compat.v1.Session() as sess:
        sess.run([tf.compat.v1.global_variables_initializer(), it.initializer])
        for step in range(3):
            sess.run(train)
            saver.save(sess, str(tmp_path / "model"), global_step=step)
    kept = sorted(os.path.basename(p) for p in glob.glob(str(tmp_path / "sparse-model-*")))
    assert kept == ["sparse-model-1", "sparse-model-2"]
    assert sf.latest_checkpoint(str(tmp_path)) == str(tmp_path / "model-2")
    assert sf.latest_checkpoint(str(tmp_path / "nothing-here")) is None


def test_max_to_keep_prunes_only_its_own_checkpoints(sf_init, tmp_path):
    """Another saver's sparse part whose dense part is not written yet (another rank's,
    mid-save) or that keeps other steps is not this saver's to delete."""
    table, it, train, saver = _trained_table(tmp_path)
    others = ["sparse-model-1-7", "sparse-model-10-2", "sparse-other"]
    for name in others:
        (tmp_path / name).mkdir()
    with tf.compat.v1.Session() as sess:
        sess.run([tf.compat.v1.global_variables_initializer(), it.initializer])
        for step in range(3):
            sess.run(train)
            saver.save(sess, str(tmp_path / "model-0"), global_step=step)
    kept = sorted(os.path.basename(p) for p in glob.glob(str(tmp_path / "sparse-*")))
    assert kept == sorted(others + ["sparse-model-0-1", "sparse-model-0-2"])


def test_max_to_keep_prunes_a_save_path_that_changes_with_every_save(sf_init, tmp_path):
    """Saved as model-<i> with no global_step (a path of its own per save), the sparse part
    of a checkpoint TF's Saver deleted goes with it."""
    table, it, train, saver = _trained_table(tmp_path)
    with tf.compat.v1.Session() as sess:
        sess.run([tf.compat.v1.global_variables_initializer(), it.initializer])
        for step in range(4):
            sess.run(train)
            saver.save(sess, str(tmp_path / f"model-{step}"))
    kept = sorted(os.path.basename(p) for p in glob.glob(str(tmp_path / "sparse-*")))
    assert kept == ["sparse-model-2", "sparse-model-3"]


def test_saver_validates_and_needs_the_pipeline(sf_init):
    with pytest.raises(ValueError, match=r"`max_to_keep` must be an int >= 0. Received: -1"):
        sf.Saver(max_to_keep=-1)
    sf.create_table(tf.int64, 2, "t", tf.compat.v1.ones_initializer())
    tf.compat.v1.get_variable("v", initializer=tf.ones([1]))
    saver = sf.Saver()
    with pytest.raises(RuntimeError, match=r"start_asc_pipeline\(\) first"):
        saver.save(None, "/tmp/x")


def test_incremental_chain_restores_what_a_full_save_would(graph, tmp_path):
    def build(capacity=400):
        rng = np.random.default_rng(7)
        n = 8 * 12
        data = {"f": rng.integers(0, 150, (n, 2)).astype(np.int64),
                "ts": np.repeat(np.arange(12, dtype=np.int64) * 10, 8)}
        specs = [sf.FeatureSpec("f", table_name="t", access_threshold=1, eviction_threshold=35),
                 sf.FeatureSpec("ts", is_timestamp=True)]
        table = sf.create_table(tf.int64, 4, "t", tf.compat.v1.random_normal_initializer(seed=3),
                                device_vocabulary_size=capacity)
        # No read-ahead: the state compared below is that of the batches trained on.
        it, train, saver = lookup_training(table, specs, data, 8, read_ahead=False)
        return table, it, train, saver

    def state(table):
        s = sorted_state(table)
        return tuple(s[k] for k in ("keys", "weights", "momentum", "counts", "last_seen",
                                    "clock", "steps"))

    sf.init()
    table, it, train, saver = build()
    prefix = str(tmp_path / "model")
    with tf.compat.v1.Session() as sess:
        sess.run([tf.compat.v1.global_variables_initializer(), it.initializer])
        for step in range(1, 10):
            sess.run(train)
            if step == 3:
                saver.save(sess, prefix, global_step=step)
            elif step in (6, 9):
                if step == 6:
                    assert sf.evict("t")["t"].keys_removed > 0  # tombstones in the delta
                saver.save(sess, prefix, global_step=step, incremental=True)
        expected = state(table)
        full_bytes = sum(os.path.getsize(p) for p in glob.glob(
            str(tmp_path / "sparse-model-3" / "t" / "*.arrow")))
        delta_bytes = sum(os.path.getsize(p) for p in glob.glob(
            str(tmp_path / "sparse-model-9" / "t" / "admitted.arrow")))
    assert delta_bytes < full_bytes
    # max_to_keep=2 keeps 6 and 9, and 3 because they are built on it.
    kept = sorted(os.path.basename(p) for p in glob.glob(str(tmp_path / "sparse-model-*")))
    assert kept == ["sparse-model-3", "sparse-model-6", "sparse-model-9"]
    sf.terminate_config_initializer()
    with tf.Graph().as_default():
        sf.init()
        table, it, train, saver = build(capacity=300)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            saver.restore(sess, sf.latest_checkpoint(str(tmp_path)))
        got = state(table)
    for a, b in zip(expected, got):
        np.testing.assert_array_equal(a, b)


def test_rec_sdk_demo_save_restore_pattern_works_unchanged(graph, tmp_path, monkeypatch):
    """The Rec SDK demo: save at step 0 unless sparse-model-<rank>-0 exists, then restore it;
    save every N steps and at the end."""
    monkeypatch.chdir(tmp_path)
    rank_id, steps = 0, []
    for run in range(2):
        sf.terminate_config_initializer()
        with tf.Graph().as_default():
            sf.init()
            table, it, train, _ = _trained_table(tmp_path, steps=6)
            saver = sf.Saver()
            with tf.compat.v1.Session() as sess:
                sess.run([tf.compat.v1.global_variables_initializer(), it.initializer])
                if os.path.exists(f"./saved-model/sparse-model-{rank_id}-%d" % 0):
                    saver.restore(sess, f"./saved-model/model-{rank_id}-%d" % 0)
                    steps.append(("restored", table.size()))
                else:
                    saver.save(sess, f"./saved-model/model-{rank_id}", global_step=0)
                    steps.append(("saved", table.size()))
                for i in range(1, 5):
                    sess.run(train)
                    if i % 2 == 0:
                        saver.save(sess, f"./saved-model/model-{rank_id}", global_step=i)
                saver.save(sess, f"./saved-model/model-{rank_id}", global_step=i)
    assert steps == [("saved", 0), ("restored", 0)]
    assert sf.latest_checkpoint("./saved-model").endswith("model-0-4")


def test_monitored_session_saves_and_restores_sparse_tables_on_schedule(tmp_path):
    from sparseflow.optimizers import gradient_descent

    def build():
        sf.init()
        keys = np.arange(40, dtype=np.int64).reshape(40, 1)
        specs = [sf.FeatureSpec("f", table_name="t", access_threshold=0, eviction_threshold=5),
                 sf.FeatureSpec("ts", is_timestamp=True)]
        table = sf.create_table(tf.int64, 2, "t", tf.compat.v1.ones_initializer(),
                                device_vocabulary_size=100)
        ds = tf.data.Dataset.from_tensor_slices({"f": keys, "ts": np.arange(40)}).batch(2)
        options = tf.data.Options()
        options.experimental_optimization.inject_prefetch = False
        ds = ds.map(sf.get_asc_insert_func(tgt_key_specs=specs)).with_options(options)
        batch = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
        emb = sf.sparse_lookup(table, specs[0], batch=batch)
        step = tf.compat.v1.train.get_or_create_global_step()
        train = gradient_descent.create_hash_optimizer(0.1).apply_gradients(
            [(tf.gradients(tf.reduce_sum(emb), table)[0], table)], global_step=step)
        sf.start_asc_pipeline()
        return table, train, step

    def session(hooks):
        return tf.compat.v1.train.MonitoredTrainingSession(
            checkpoint_dir=str(tmp_path), hooks=hooks, save_checkpoint_steps=5,
            save_summaries_steps=None, log_step_count_steps=None,
            scaffold=tf.compat.v1.train.Scaffold(saver=sf.Saver(max_to_keep=5)))

    with tf.Graph().as_default():
        table, train, step = build()
        hook = sf.EvictHook(evict_enable=True, evict_step_interval=5)
        with session([hook]) as sess:
            for _ in range(8):
                sess.run(train)
        saved = table.export()
        sf.terminate_config_initializer()
    assert hook.evictions == 1  # after global step 5
    assert os.path.isdir(tmp_path / "sparse-model.ckpt-5")  # saved on the 5-step schedule
    assert sf.latest_checkpoint(str(tmp_path)).endswith("model.ckpt-8")
    with tf.Graph().as_default():
        table, train, step = build()
        with session([]) as sess:  # restores the latest checkpoint, sparse tables included
            assert sess.run(step) == 8
            restored = table.export()
        sf.terminate_config_initializer()
    np.testing.assert_array_equal(saved[0], restored[0])
    np.testing.assert_array_equal(saved[1], restored[1])


def test_an_incremental_save_after_a_restore_builds_on_the_restored_checkpoint(sf_init, tmp_path):
    table, it, train, saver = _trained_table(tmp_path, steps=6)
    prefix = str(tmp_path / "model")
    with tf.compat.v1.Session() as sess:
        sess.run([tf.compat.v1.global_variables_initializer(), it.initializer])
        sess.run(train)
        saver.save(sess, prefix, global_step=1)
        for _ in range(3):
            sess.run(train)
        saver.save(sess, prefix, global_step=2, incremental=True)
        saver.restore(sess, f"{prefix}-1")  # roll back
        rolled_back = table.export()
        saver.save(sess, prefix, global_step=3, incremental=True)
        for _ in range(2):
            sess.run(train)
        saver.restore(sess, f"{prefix}-3")
        got = table.export()
    np.testing.assert_array_equal(got[0], rolled_back[0])
    np.testing.assert_array_equal(got[1], rolled_back[1])


def test_saving_a_meta_graph_does_not_warn_about_the_tables_collection(graph, tmp_path, caplog):
    """The tables' collection (Rec SDK's ASCEND_GLOBAL_HASHTABLE_COLLECTION) holds Python
    objects: every checkpoint's meta graph warned it could not serialize them."""
    import logging
    sf.init()
    try:
        sf.create_table(tf.int64, 4, "t", tf.compat.v1.zeros_initializer(),
                        device_vocabulary_size=10)
        tf.compat.v1.Variable(1.0)
        with caplog.at_level(logging.WARNING):
            meta = tf.compat.v1.train.export_meta_graph(str(tmp_path / "m.meta"))
        assert not [r for r in caplog.records if "Issue encountered" in r.getMessage()]
        assert "ASCEND_GLOBAL_HASHTABLE_COLLECTION" not in meta.collection_def or not (
            meta.collection_def["ASCEND_GLOBAL_HASHTABLE_COLLECTION"].bytes_list.value)
    finally:
        sf.terminate_config_initializer()
