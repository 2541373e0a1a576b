"""Tables whose rows live in TF variables (``create_table(..., rows_on="device")``).

The reference throughout is the same script with host rows (numba kernels, themselves tested
against plain TF in test_session_training.py): device rows must train, checkpoint, evict and
export to the same numbers.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

import sparseflow as sf
from sparseflow.embed.initializers import init_rows
from sparseflow.optimizers import adagrad, ftrl, gradient_descent, lazy_adam
from sparseflow.optimizers.base import SparseOptimizer
from sparseflow.optimizers.hparams import sgd_hparams
# The placement rule itself, imported before conftest's autouse fixture pins it to "host".
from sparseflow.table import default_rows_on as placement_rule
from tests.modify_graph_job import modify_graph_training
from tests.pipeline_utils import (assert_same_training, linear_tower, make_batch_iterator,
                                  run_all, sgd_and_sparse_train_op, sorted_state)

B, STEPS = 32, 30
V1, V2 = 200, 60
D1, D2 = 8, 4
OPTIMIZERS = {
    "lazy_adam": lambda: lazy_adam.create_hash_optimizer(learning_rate=0.05),
    "sgd_decay": lambda: gradient_descent.create_hash_optimizer(0.2, weight_decay=1e-3),
    "adagrad": lambda: adagrad.create_hash_optimizer(0.1),
    "ftrl": lambda: ftrl.create_hash_optimizer(0.1, l1=1e-3, l2=1e-3),
}


def _placement(kind, capacity, tmp_path=None, fast=None):
    """create_table arguments for ``capacity`` rows placed as ``kind``: "host", "device", or
    a tiered table with a fast tier of ``fast`` rows (default ~40%): "device_over_host"
    (device slots over host homes) or "host_over_disk" (host slots over disk homes in
    ``tmp_path``)."""
    fast = fast or max(1, capacity * 2 // 5)
    if kind in ("host", "device"):
        return dict(device_vocabulary_size=capacity, rows_on=kind)
    if kind == "device_over_host":
        return dict(device_vocabulary_size=fast, host_vocabulary_size=capacity - fast,
                    rows_on="device")
    assert kind == "host_over_disk"
    return dict(device_vocabulary_size=fast // 2, host_vocabulary_size=fast - fast // 2,
                ssd_vocabulary_size=capacity - fast, ssd_data_path=str(tmp_path / "ssd"),
                rows_on="host")


def _data(seed=0, steps=STEPS):
    rng = np.random.default_rng(seed)
    n = B * steps
    data = {"f1": rng.integers(0, V1, (n, 3)), "f2": rng.integers(0, V1, (n, 2)),
            "f3": rng.integers(0, V2, (n, 2))}
    data["label"] = ((data["f1"][:, 0] % 3 == 0) | (data["f3"][:, 0] % 2 == 0)).astype(
        np.float32)
    return data


def _train(data, rows_on, optimizer="lazy_adam", threshold=2, num_parallel_calls=None):
    """Two tables (t1: dim 8, shared by f1 and f2; t2: dim 4), a logistic tower, prefetch;
    returns (losses, {table: (keys, embeddings)})."""
    if isinstance(rows_on, str):
        rows_on = {"t1": rows_on, "t2": rows_on}
    with tf.Graph().as_default():
        sf.init()
        specs = [sf.FeatureSpec(f, table_name=t, access_threshold=threshold)
                 for f, t in (("f1", "t1"), ("f2", "t1"), ("f3", "t2"))]
        init = tf.compat.v1.truncated_normal_initializer(stddev=0.1, seed=3)
        tables = {name: sf.create_table(tf.int64, dim, name, init,
                                        device_vocabulary_size=2 * vocab,
                                        rows_on=rows_on[name])
                  for name, dim, vocab in (("t1", D1, V1), ("t2", D2, V2))}
        ds = tf.data.Dataset.from_tensor_slices(data).batch(B, drop_remainder=True)
        ds = ds.map(sf.get_asc_insert_func(tgt_key_specs=specs),
                    num_parallel_calls=num_parallel_calls).prefetch(4)
        it = tf.compat.v1.data.make_initializable_iterator(ds)
        batch = it.get_next()
        pooled = [tf.reduce_sum(sf.sparse_lookup(tables[s.table_name], s, batch=batch), 1)
                  for s in specs]
        loss = linear_tower(pooled, batch["label"])
        train = sgd_and_sparse_train_op(loss, OPTIMIZERS[optimizer]())
        sf.start_asc_pipeline()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            losses = [l for _, l in run_all(sess, [train, loss], it)]
            exported = {name: t.export() for name, t in tables.items()}  # default session
        assert {n: t.rows_on for n, t in tables.items()} == rows_on
        sf.terminate_config_initializer()
    return np.array(losses), exported


def _assert_same(run, reference):
    assert_same_training(run, reference, STEPS)


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_all_rows_on_device_train_as_host_rows(optimizer):
    # Admission threshold 2 with a sequential map (reproducible: keys are counted in dataset
    # order) and a prefetch that pops the rows of batches still in the buffer.
    data = _data()
    host = _train(data, "host", optimizer)
    device = _train(data, "device", optimizer)
    _assert_same(device, host)
    assert host[0][-10:].mean() < host[0][:10].mean()  # it trained


def test_device_rows_under_a_parallel_map_train_as_host_rows():
    # Threshold 1: a key gets its row at its first occurrence whatever order the parallel map
    # processes batches in, so the run is reproducible (README "Parallel map").
    data = _data(seed=1)
    host = _train(data, "host", threshold=1, num_parallel_calls=4)
    device = _train(data, "device", threshold=1, num_parallel_calls=4)
    _assert_same(device, host)


def test_a_mixed_model_trains_as_the_all_host_one():
    data = _data(seed=2)
    _assert_same(_train(data, {"t1": "host", "t2": "device"}), _train(data, "host"))


# -- checkpoints ------------------------------------------------------------------------------

def _checkpointed_training(placement, data, skip=0):
    """Lazy Adam on one table (``placement``: create_table arguments) with admission and
    timestamps, no read-ahead (the key state at a save is that of the batches trained on)."""
    specs = [sf.FeatureSpec("f", table_name="t", access_threshold=2, eviction_threshold=1000),
             sf.FeatureSpec("ts", is_timestamp=True)]
    table = sf.create_table(tf.int64, 4, "t", tf.compat.v1.random_normal_initializer(seed=2),
                            **placement)
    ds = tf.data.Dataset.from_tensor_slices(data).batch(8).skip(skip)
    ds = ds.map(sf.get_asc_insert_func(tgt_key_specs=specs))
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    it = tf.compat.v1.data.make_initializable_iterator(ds.with_options(options))
    batch = it.get_next()
    emb = tf.reduce_sum(sf.sparse_lookup(table, specs[0], batch=batch), 1)
    w = tf.compat.v1.get_variable("w", initializer=tf.ones([4, 1]) * 0.3)
    loss = tf.reduce_mean(tf.square(tf.squeeze(tf.matmul(emb, w), 1) - batch["label"]))
    dense, sparse = sf.get_dense_and_sparse_variable()
    grads = tf.gradients(loss, dense + sparse)
    train = tf.group(
        tf.compat.v1.train.GradientDescentOptimizer(0.05).apply_gradients(zip(grads[:1], dense)),
        lazy_adam.create_hash_optimizer(0.05).apply_gradients(zip(grads[1:], sparse)))
    saver = sf.Saver(max_to_keep=5)
    sf.start_asc_pipeline()
    return table, it, train, loss, saver


@pytest.mark.parametrize("saved_on, restored_on", [
    ("device", "host"), ("host", "device"), ("device_over_host", "host"),
    ("host", "device_over_host"), ("host_over_disk", "host"), ("host", "host_over_disk"),
    ("device_over_host", "host_over_disk")])
def test_a_checkpoint_moves_between_host_and_device_rows(saved_on, restored_on, tmp_path):
    rng = np.random.default_rng(3)
    data = {"f": rng.integers(0, 60, (80, 2)), "ts": np.repeat(np.arange(10), 8),
            "label": rng.normal(size=80).astype(np.float32)}
    prefix = str(tmp_path / "model")
    with tf.Graph().as_default():
        sf.init()
        table, it, train, loss, saver = _checkpointed_training(
            _placement(saved_on, 300, tmp_path), data)
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), it.initializer])
            for _ in range(5):
                sess.run(train)
            saver.save(sess, prefix, global_step=5)
            saved = sorted_state(table, sess)
            after = [l for _, l in run_all(sess, [train, loss])]
        sf.terminate_config_initializer()
    with tf.Graph().as_default():
        sf.init()
        table, it, train, loss, saver = _checkpointed_training(
            _placement(restored_on, 300, tmp_path), data, skip=5)
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), it.initializer])
            saver.restore(sess, sf.latest_checkpoint(str(tmp_path)))
            restored = sorted_state(table, sess)
            resumed = [l for _, l in run_all(sess, [train, loss])]
        sf.terminate_config_initializer()
    assert saved["keys"].shape[0] > 20 and saved["steps"] == 5
    for name, value in saved.items():
        np.testing.assert_array_equal(restored[name], value, err_msg=name)
    assert len(after) == len(resumed) == 5
    np.testing.assert_allclose(resumed, after, rtol=1e-5)


def test_incremental_checkpoints_of_a_device_table(graph, tmp_path):
    rng = np.random.default_rng(7)
    data = {"f": rng.integers(0, 150, (96, 2)), "ts": np.repeat(np.arange(12) * 10, 8)}

    def build(capacity):
        specs = [sf.FeatureSpec("f", table_name="t", access_threshold=1, eviction_threshold=35),
                 sf.FeatureSpec("ts", is_timestamp=True)]
        table = sf.create_table(tf.int64, 4, "t", tf.compat.v1.random_normal_initializer(seed=3),
                                device_vocabulary_size=capacity, rows_on="device")
        it = make_batch_iterator(data, 8, specs, read_ahead=False)
        emb = sf.sparse_lookup(table, specs[0], batch=it.get_next())
        train = lazy_adam.create_hash_optimizer(0.1).apply_gradients(
            [(tf.gradients(tf.reduce_sum(emb * emb), table)[0], table)])
        tf.compat.v1.get_variable("dense", initializer=tf.ones([2]))
        saver = sf.Saver(max_to_keep=2)
        sf.start_asc_pipeline()
        return table, it, train, saver

    sf.init()
    table, it, train, saver = build(400)
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
        expected = sorted_state(table, sess)
    delta = sf.checkpoint.sparse_format.read_manifest(str(tmp_path / "sparse-model-9"))
    assert delta["base"] == "sparse-model-6"
    sf.terminate_config_initializer()
    with tf.Graph().as_default():
        sf.init()
        table, it, train, saver = build(300)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            saver.restore(sess, sf.latest_checkpoint(str(tmp_path)))
            got = sorted_state(table, sess)
        sf.terminate_config_initializer()
    assert expected["steps"] == 9
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


@pytest.mark.parametrize("kind", ["device", "device_over_host"])
def test_a_monitored_session_saves_and_restores_device_tables(kind, tmp_path):
    # MonitoredTrainingSession finalizes the graph and, when restoring, runs no initializer:
    # the device variables are read and written (and a tiered table's swaps built) by ops
    # built in start_asc_pipeline().
    def build():
        sf.init()
        specs = [sf.FeatureSpec("f", table_name="t", access_threshold=0)]
        table = sf.create_table(tf.int64, 2, "t", tf.compat.v1.random_uniform_initializer(seed=4),
                                **_placement(kind, 60))
        ds = tf.data.Dataset.from_tensor_slices({"f": np.arange(40).reshape(40, 1)}).batch(2)
        batch = tf.compat.v1.data.make_one_shot_iterator(
            ds.map(sf.get_asc_insert_func(tgt_key_specs=specs))).get_next()
        emb = sf.sparse_lookup(table, specs[0], batch=batch)
        step = tf.compat.v1.train.get_or_create_global_step()
        train = lazy_adam.create_hash_optimizer(0.1).apply_gradients(
            [(tf.gradients(tf.reduce_sum(emb), table)[0], table)], global_step=step)
        sf.start_asc_pipeline()
        return table, train, step

    def session():
        return tf.compat.v1.train.MonitoredTrainingSession(
            checkpoint_dir=str(tmp_path), save_checkpoint_steps=5, save_summaries_steps=None,
            log_step_count_steps=None, scaffold=tf.compat.v1.train.Scaffold(saver=sf.Saver()))

    with tf.Graph().as_default():
        table, train, step = build()
        with session() as sess:
            for _ in range(5):
                sess.run(train)
            saved = table.export()  # through the session the checkpoint hook saved with
        sf.terminate_config_initializer()
    with tf.Graph().as_default():
        table, train, step = build()
        with session() as sess:
            assert sess.run(step) == 5
            restored = table.export()
        sf.terminate_config_initializer()
    # The hook saved after the 5th step: the checkpoint holds the keys of the 5 batches
    # trained (0..9), with their trained values. export() also lists the keys that batches
    # read ahead had admitted by the time it ran (10, 11, ... with their initial values):
    # how many depends on the pipeline's threads, and the checkpoint leaves them out.
    trained = np.arange(10)
    assert saved[0][:10].tolist() == trained.tolist() and saved[0].shape[0] >= 10
    np.testing.assert_array_equal(restored[0], trained)
    np.testing.assert_array_equal(restored[1], saved[1][:10])


# -- eviction ---------------------------------------------------------------------------------

def _timestamped(keys, ts, specs, batch_size=1, **map_kwargs):
    ds = tf.data.Dataset.from_tensor_slices({"f": keys, "ts": ts}).batch(batch_size)
    ds = ds.map(sf.get_asc_insert_func(tgt_key_specs=specs), **map_kwargs)
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    return ds.with_options(options)


def _initial_values(table, keys):
    out = np.zeros((len(keys), table.dim), np.float32)
    init_rows(out, np.arange(len(keys), dtype=np.int32), np.asarray(keys, np.int64),
              table.rows.init_spec, table.dim)
    return out


def test_an_evicted_row_is_reused_with_its_new_keys_initial_values_and_zero_slots(sf_init):
    # Three rows for keys 7, 8, 9; at clock 100 key 7 (last seen at 10) is evicted; key 10
    # arrives at 200 and can only take 7's row.
    keys = np.array([[7], [7], [8], [9], [10]], np.int64)
    ts = np.array([0, 10, 60, 100, 200], np.int64)
    specs = [sf.FeatureSpec("f", table_name="t", access_threshold=0, eviction_threshold=50),
             sf.FeatureSpec("ts", is_timestamp=True)]
    table = sf.create_table(tf.int64, 3, "t", tf.compat.v1.random_normal_initializer(seed=5),
                            device_vocabulary_size=3, rows_on="device")
    it = tf.compat.v1.data.make_initializable_iterator(_timestamped(keys, ts, specs))
    emb = sf.sparse_lookup(table, specs[0], batch=it.get_next())
    train = lazy_adam.create_hash_optimizer(learning_rate=0.1).apply_gradients(
        [(tf.gradients(tf.reduce_sum(emb * emb), table)[0], table)])
    sf.start_asc_pipeline()
    with tf.compat.v1.Session() as sess:
        sess.run([tf.compat.v1.global_variables_initializer(), it.initializer])
        for _ in range(4):
            sess.run([emb, train])
        row7 = int(table.processor.lookup(np.array([7]))[0])
        trained = table.rows.read(sess, np.array([row7]))
        assert np.all(trained[:, 3:6] != 0)   # momentum
        result = sf.evict("t")["t"]
        assert result.keys_removed == 1 and result.rows_free == 1
        e10 = sess.run(emb)                    # key 10, no update yet
        row10 = int(table.processor.lookup(np.array([10]))[0])
        reused = table.rows.read(sess, np.array([row10]))
    assert row10 == row7
    np.testing.assert_allclose(e10[0, 0], _initial_values(table, [10])[0], rtol=1e-6)
    np.testing.assert_allclose(reused[0, :3], _initial_values(table, [10])[0], rtol=1e-6)
    np.testing.assert_array_equal(reused[0, 3:], 0)  # momentum and velocity reset
    assert table.processor.last_seen[row10] == 200


@pytest.mark.parametrize("kind", ["device", "device_over_host", "host_over_disk"])
def test_eviction_under_a_parallel_prefetching_pipeline_never_corrupts_batches(kind, sf_init,
                                                                               tmp_path):
    """As test_eviction.py's in-flight test, on device rows and tiered tables: evict after
    every step (every key goes), rows recycled while batches wait in a prefetch buffer (and,
    in a tiered table, while their old contents still sit in the fast tier); with lr=0 every
    batch must read each key's own initial values."""
    rng = np.random.default_rng(0)
    steps, batch_size, window = 60, 8, 40
    keys = np.stack([rng.integers(s, s + window, (batch_size, 2)) for s in range(steps)])
    keys = keys.reshape(steps * batch_size, 2).astype(np.int64)
    ts = np.repeat(np.arange(steps, dtype=np.int64), batch_size)
    specs = [sf.FeatureSpec("f", table_name="t", access_threshold=0, eviction_threshold=0),
             sf.FeatureSpec("ts", is_timestamp=True)]
    table = sf.create_table(tf.int64, 4, "t", tf.compat.v1.random_uniform_initializer(seed=1),
                            **_placement(kind, 600, tmp_path))
    ds = _timestamped(keys, ts, specs, batch_size, num_parallel_calls=4).prefetch(8)
    it = tf.compat.v1.data.make_initializable_iterator(ds)
    batch = it.get_next()
    emb = sf.sparse_lookup(table, specs[0], batch=batch)
    train = gradient_descent.create_hash_optimizer(0.0).apply_gradients(
        [(tf.gradients(tf.reduce_sum(emb), table)[0], table)])
    sf.start_asc_pipeline()
    out = []
    with tf.compat.v1.Session() as sess:
        sess.run([tf.compat.v1.global_variables_initializer(), it.initializer])
        while True:
            try:
                out.append(sess.run([batch["f"], emb, train])[:2])
            except tf.errors.OutOfRangeError:
                break
            sf.evict("t")
    stats = table.stats()
    assert len(out) == steps
    assert stats["keys_evicted"] + stats["keys_held"] > table.processor.rows_ever_used + 100
    for f, e in out:
        np.testing.assert_array_equal(e.reshape(-1, 4), _initial_values(table, f.ravel()))


# -- serving ----------------------------------------------------------------------------------

def _small_training(rows_on):
    sf.init()
    rng = np.random.default_rng(9)
    specs = [sf.FeatureSpec("f", table_name="t")]
    table = sf.create_table(tf.int64, 3, "t", tf.compat.v1.random_normal_initializer(seed=8),
                            device_vocabulary_size=100, rows_on=rows_on)
    it = make_batch_iterator({"f": rng.integers(0, 30, (40, 2))}, 8, specs)
    emb = sf.sparse_lookup(table, specs[0], batch=it.get_next())
    train = adagrad.create_hash_optimizer(0.1).apply_gradients(
        [(tf.gradients(tf.reduce_sum(emb * emb), table)[0], table)])
    sf.start_asc_pipeline()
    return table, it, train


def test_export_and_saved_model_of_a_device_table(tmp_path):
    with tf.Graph().as_default():
        table, it, train = _small_training("host")
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            run_all(sess, train, it)
        expected = table.export()
        sf.terminate_config_initializer()
    with tf.Graph().as_default():
        table, it, train = _small_training("device")
        sess = tf.compat.v1.Session()
        sess.run(tf.compat.v1.global_variables_initializer())
        run_all(sess, train, it)
        # Not the default session, no Saver: the session must be named.
        with pytest.raises(RuntimeError, match=r"Table `t` keeps its rows in TF variables "
                                               r"\(rows_on=\"device\"\).*Pass sess="):
            sf.export(path=str(tmp_path / "none"))
        paths = sf.export(path=str(tmp_path / "export"), sess=sess)
        sf.export_saved_model(str(tmp_path / "served"), sess=sess)
        sess.close()
        with pytest.raises(RuntimeError, match=r"needs the session that trains it"):
            table.export()
        sf.terminate_config_initializer()
    keys = np.load(os.path.join(paths["t"], "keys.npy"))
    np.testing.assert_array_equal(keys, expected[0])
    np.testing.assert_allclose(np.load(os.path.join(paths["t"], "embeddings.npy")), expected[1],
                               rtol=1e-5, atol=1e-6)
    served = tf.saved_model.load(str(tmp_path / "served"))
    np.testing.assert_allclose(served.lookup_t(tf.constant(keys)).numpy(), expected[1],
                               rtol=1e-5, atol=1e-6)


# -- choosing where rows live, and what device rows refuse ------------------------------------

def test_the_default_placement_rule(sf_init, monkeypatch):
    monkeypatch.setattr(sf.table, "default_rows_on", placement_rule)  # the real rule
    init = tf.compat.v1.zeros_initializer()
    expected = "device" if tf.config.list_physical_devices("GPU") else "host"
    assert sf.create_table(tf.int64, 2, "a", init).rows_on == expected
    if not tf.config.list_physical_devices("GPU"):
        assert expected == "host"   # this CPU-only machine: host rows are faster here
    real = tf.config.list_physical_devices
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: ["GPU:0"] if kind == "GPU" else real(kind))
    assert sf.create_table(tf.int64, 2, "b", init).rows_on == "device"
    assert sf.create_table(tf.int64, 2, "c", init, rows_on="host").rows_on == "host"


@pytest.mark.parametrize("value", ["gpu", "HOST", 1])
def test_rows_on_is_validated(sf_init, value):
    with pytest.raises(ValueError, match=r"Argument `rows_on` must be one of 'host', 'device' "
                                         r"or None .* Received: " + repr(value)):
        sf.create_table(tf.int64, 2, "t", tf.compat.v1.zeros_initializer(), rows_on=value)


def test_device_rows_refuse_dynamic_expansion(graph):
    sf.init(use_dynamic_expansion=True)
    with pytest.raises(ValueError, match=r"`rows_on` must be 'host' or None under "
                                         r"init\(use_dynamic_expansion=True\)"):
        sf.create_table(tf.int64, 2, "t", tf.compat.v1.zeros_initializer(), rows_on="device")
    assert sf.create_table(tf.int64, 2, "t", tf.compat.v1.zeros_initializer()).rows_on == "host"


def test_an_optimizer_without_a_device_update_names_the_device_table(sf_init):
    class HostOnly(gradient_descent.GradientDescent):
        _device_update = SparseOptimizer._device_update

    spec = sf.FeatureSpec("f", table_name="t")
    table = sf.create_table(tf.int64, 2, "t", tf.compat.v1.zeros_initializer(),
                            device_vocabulary_size=10, rows_on="device")
    it = make_batch_iterator({"f": np.arange(8).reshape(4, 2)}, 2, [spec])
    emb = sf.sparse_lookup(table, spec, batch=it.get_next())
    grad = tf.gradients(tf.reduce_sum(emb), table)[0]
    optimizer = HostOnly(sgd_hparams(learning_rate=0.1, name="HostOnly"))
    assert not optimizer.supports_device_rows
    assert gradient_descent.create_hash_optimizer(0.1).supports_device_rows
    with pytest.raises(ValueError, match=r"Optimizer `HostOnly` \(HostOnly\) has no update for "
                                         r"device rows, and table `t` was created with "
                                         r"rows_on=\"device\""):
        optimizer.apply_gradients([(grad, table)])


@pytest.mark.parametrize("rows_on", ["device", "device_over_host"])
def test_modify_graph_lookups_of_device_tables_train_as_host_feature_spec_mode(rows_on):
    host_losses, host_table = modify_graph_training("spec", rows_on="host")
    losses, table = modify_graph_training("modify", rows_on=rows_on)
    np.testing.assert_allclose(losses, host_losses, rtol=1e-5)
    np.testing.assert_array_equal(table[0], host_table[0])
    np.testing.assert_allclose(table[1], host_table[1], rtol=1e-5, atol=1e-6)


def test_one_device_table_read_by_three_batches_in_one_run(tmp_path):
    """Two training iterators and an evaluation iterator over one table, fetched by the same
    run: the gradient holds rows of two batches (summed per row before the update), and three
    lookups pop the table's pending rows in one run (in its critical section) — or, in a
    tiered table whose fast tier is too small to keep every key, run their swaps (in the
    critical section, or under the disk tier's swap lock)."""
    rng = np.random.default_rng(6)
    data = [{"f": rng.integers(0, 150, (64, 2))}, {"f": rng.integers(0, 150, (64, 3))},
            {"f": rng.integers(0, 150, (64, 2))}]

    def run(kind):
        with tf.Graph().as_default():
            sf.init()
            table = sf.create_table(tf.int64, 4, "t",
                                    tf.compat.v1.random_normal_initializer(seed=6),
                                    **_placement(kind, 200, tmp_path, fast=64))
            specs = [sf.FeatureSpec("f", table_name="t") for _ in data]
            its = [make_batch_iterator(d, 8, [s], is_training=i < 2, read_ahead=False)
                   for i, (d, s) in enumerate(zip(data, specs))]
            embs = [sf.sparse_lookup(table, s, batch=it.get_next(), is_train=i < 2)
                    for i, (s, it) in enumerate(zip(specs, its))]
            loss = tf.reduce_sum(embs[0] * embs[0]) + 0.3 * tf.reduce_sum(embs[1])
            train = lazy_adam.create_hash_optimizer(0.05).apply_gradients(
                [(tf.gradients(loss, table)[0], table)])
            sf.start_asc_pipeline()
            with tf.compat.v1.Session() as sess:
                sess.run([tf.compat.v1.global_variables_initializer()]
                         + [it.initializer for it in its])
                losses = [sess.run([loss, embs[2], train])[0] for _ in range(8)]
                exported = table.export()
                if table.tiers is not None:  # the fast tier holds a run's batches, not
                    assert table.stats()["rows_swapped_out"] > 20   # every key: rows moved
            sf.terminate_config_initializer()
        return np.array(losses), exported

    host_losses, host_table = run("host")
    for kind in ("device", "device_over_host", "host_over_disk"):
        losses, device_table = run(kind)
        np.testing.assert_allclose(losses, host_losses, rtol=1e-5)
        np.testing.assert_array_equal(device_table[0], host_table[0])
        np.testing.assert_allclose(device_table[1], host_table[1], rtol=1e-5, atol=1e-6)
