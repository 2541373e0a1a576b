"""Key pipeline semantics through tf.data and a Session: admission, eval channel, shared
tables, key dtypes, static shapes, full tables, serving defaults."""

import numpy as np
import pytest
import tensorflow as tf

import sparseflow as sf
from sparseflow.optimizers import gradient_descent
from sparseflow.pipeline.insert_func import batch_rows
from tests.pipeline_utils import int_keys, make_batch_iterator, run_all


def _lookup_graph(table, spec, data, batch_size, is_training=True, lr=None, **lookup_kwargs):
    it = make_batch_iterator(data, batch_size, [spec], is_training=is_training)
    batch = it.get_next()
    emb = sf.sparse_lookup(table, spec, batch=batch, is_train=is_training, **lookup_kwargs)
    train = None
    if lr is not None:
        loss = tf.reduce_sum(emb)
        train = gradient_descent.create_hash_optimizer(lr).apply_gradients(
            [(tf.gradients(loss, table)[0], table)])
    return it, batch, emb, train


def test_admission_zeros_no_row_no_update_then_admitted_at_threshold(sf_init):
    # Key 7 appears once per batch; with access_threshold=3 it is admitted on batch 3.
    keys = np.array([[7, 100 + i] for i in range(5)], np.int64)
    spec = sf.FeatureSpec("f", table_name="t", access_threshold=3)
    table = sf.create_table(tf.int64, 4, "t", tf.compat.v1.constant_initializer(1.0),
                            device_vocabulary_size=50)
    it, batch, emb, train = _lookup_graph(table, spec, {"f": keys}, 1, lr=0.5)
    sf.start_asc_pipeline()
    with tf.compat.v1.Session() as sess:
        sess.run(it.initializer)
        seen = []
        for step in range(5):
            e, rows, _ = sess.run([emb, batch_rows(batch, "t"), train])
            seen.append((e[0], rows, table.size()))
    for step in range(2):  # count 1, 2: below the threshold
        e, rows, _ = seen[step]
        np.testing.assert_array_equal(e, np.zeros((2, 4)))
        assert rows[0] == -1
    assert table.size() == 1  # only key 7 ever reached 3 occurrences
    e, rows, size = seen[2]
    assert rows[0] >= 0 and size == 1
    np.testing.assert_array_equal(e[0], np.ones(4))  # freshly initialised, read before update
    e, _, _ = seen[3]
    np.testing.assert_allclose(e[0], np.full(4, 0.5))  # one SGD step of lr 0.5, grad 1
    keys_out, values = table.export()
    assert keys_out.tolist() == [7]
    np.testing.assert_allclose(values, np.full((1, 4), -0.5))  # three updates: 1 - 3 * 0.5


def test_faae_coefficient_weights_the_count(sf_init):
    keys = np.array([[5], [5]], np.int64)
    spec = sf.FeatureSpec("f", table_name="t", access_threshold=4, faae_coefficient=2)
    table = sf.create_table(tf.int64, 2, "t", tf.compat.v1.ones_initializer(),
                            device_vocabulary_size=10)
    it, batch, _, _ = _lookup_graph(table, spec, {"f": keys}, 1)
    sf.start_asc_pipeline()
    with tf.compat.v1.Session() as sess:
        rows = [r for r in run_all(sess, batch_rows(batch, "t"), it)]
    assert rows[0][0] == -1 and rows[1][0] >= 0


def test_eval_channel_never_counts_nor_allocates(sf_init):
    train_keys = np.array([[1, 2, 3]], np.int64)
    eval_keys = np.array([[1, 9, 9], [2, 3, 10]], np.int64)
    train_spec = sf.FeatureSpec("f", table_name="t")
    eval_spec = sf.FeatureSpec("f", table_name="t")
    table = sf.create_table(tf.int64, 3, "t", tf.compat.v1.random_normal_initializer(seed=1),
                            device_vocabulary_size=10)
    tr_it, tr_batch, tr_emb, _ = _lookup_graph(table, train_spec, {"f": train_keys}, 1)
    ev_it, ev_batch, ev_emb, _ = _lookup_graph(table, eval_spec, {"f": eval_keys}, 1,
                                               is_training=False)
    sf.start_asc_pipeline()
    with tf.compat.v1.Session() as sess:
        trained = run_all(sess, tr_emb, tr_it)[0][0]
        index_before = (table.processor.index.keys.copy(), table.processor.index.rows.copy(),
                        table.processor.index.counts.copy())
        evals = run_all(sess, ev_emb, ev_it)
    for before, after in zip(index_before, (table.processor.index.keys,
                                            table.processor.index.rows,
                                            table.processor.index.counts)):
        np.testing.assert_array_equal(before, after)
    assert table.size() == 3
    np.testing.assert_array_equal(evals[0][0][0], trained[0])   # key 1 known
    np.testing.assert_array_equal(evals[0][0][1:], np.zeros((2, 3)))  # key 9 unknown
    np.testing.assert_array_equal(evals[1][0][:2], trained[1:])  # keys 2, 3
    np.testing.assert_array_equal(evals[1][0][2], np.zeros(3))   # key 10 unknown


@pytest.mark.parametrize("key_dtype,np_dtype", [(tf.int32, np.int32), (tf.int64, np.int64)])
def test_int32_and_int64_keys(sf_init, key_dtype, np_dtype):
    keys = np.array([[np.iinfo(np_dtype).max, -5, 0], [np.iinfo(np_dtype).min, -5, 3]], np_dtype)
    spec = sf.FeatureSpec("f", table_name="t")
    table = sf.create_table(key_dtype, 2, "t", tf.compat.v1.random_uniform_initializer(seed=2),
                            device_vocabulary_size=10)
    it, batch, emb, _ = _lookup_graph(table, spec, {"f": keys}, 2)
    sf.start_asc_pipeline()
    with tf.compat.v1.Session() as sess:
        (e,) = run_all(sess, emb, it)
    assert e.shape == (2, 3, 2)
    np.testing.assert_array_equal(e[0, 1], e[1, 1])  # the same key reads the same row
    exported_keys, values = table.export()
    assert exported_keys.dtype == np_dtype
    assert sorted(exported_keys.tolist()) == sorted(set(keys.ravel().tolist()))
    by_key = dict(zip(exported_keys.tolist(), values))
    for (i, j), k in np.ndenumerate(keys):
        np.testing.assert_array_equal(e[i, j], by_key[int(k)])


def test_specs_sharing_a_table_share_rows_and_one_call(sf_init):
    data = {"a": np.array([[1, 2], [3, 1]], np.int64), "b": np.array([[2], [4]], np.int64)}
    specs = [sf.FeatureSpec("a", table_name="t"), sf.FeatureSpec("b", table_name="t")]
    table = sf.create_table(tf.int64, 3, "t", tf.compat.v1.random_normal_initializer(seed=4),
                            device_vocabulary_size=10)
    it = make_batch_iterator(data, 2, specs)
    batch = it.get_next()
    ea = sf.sparse_lookup(table, specs[0], batch=batch)
    eb = sf.sparse_lookup(table, specs[1], batch=batch)
    graph = tf.compat.v1.get_default_graph()
    sf.start_asc_pipeline()
    with tf.compat.v1.Session() as sess:
        (out,) = run_all(sess, [ea, eb, batch_rows(batch, "t")], it)
    a, b, rows = out
    assert a.shape == (2, 2, 3) and b.shape == (2, 1, 3)
    assert len(rows) == 4  # keys 1, 2, 3, 4 deduplicated across both specs
    np.testing.assert_array_equal(a[0, 1], b[0, 0])  # key 2 in both features
    np.testing.assert_array_equal(a[0, 0], a[1, 1])  # key 1 twice
    gathers = [op for op in graph.get_operations()
               if op.type in ("PyFunc", "SparseflowGatherTables") and "gather" in op.name]
    assert len(gathers) == 1  # one gather per table, shared by both lookups


def test_serving_default_value_for_unadmitted_keys(sf_init):
    keys = np.array([[1, 2]], np.int64)
    spec = sf.FeatureSpec("f", table_name="t", access_threshold=5)
    table = sf.create_table(tf.int64, 2, "t", tf.compat.v1.ones_initializer(),
                            device_vocabulary_size=10)
    it, _, emb, _ = _lookup_graph(table, spec, {"f": keys}, 1,
                                  serving_default_value=tf.constant([0.25, -1.0]))
    sf.start_asc_pipeline()
    with tf.compat.v1.Session() as sess:
        (e,) = run_all(sess, emb, it)
    np.testing.assert_array_equal(e[0], [[0.25, -1.0], [0.25, -1.0]])


def test_full_table_raises_naming_table_and_size_and_keeps_rows(sf_init):
    data = {"f": np.array([[1, 2, 3], [4, 5, 6]], np.int64)}
    spec = sf.FeatureSpec("f", table_name="small")
    table = sf.create_table(tf.int64, 2, "small", tf.compat.v1.ones_initializer(),
                            device_vocabulary_size=4)
    it, _, emb, _ = _lookup_graph(table, spec, data, 1)
    sf.start_asc_pipeline()
    with tf.compat.v1.Session() as sess:
        sess.run(it.initializer)
        sess.run(emb)
        before = table.export()
        with pytest.raises(tf.errors.OpError, match=r"Table `small` is full.*"
                           r"device_vocabulary_size` to at least 6"):
            sess.run(emb)
    after = table.export()
    np.testing.assert_array_equal(before[0], after[0])
    np.testing.assert_array_equal(before[1], after[1])
    assert table.size() == 3


def test_static_shapes_pad_rows_to_send_count_and_report_overflow(graph):
    sf.init(use_dynamic=False)
    data = {"f": np.array([[1, 1, 2], [3, 4, 5]], np.int64)}
    spec = sf.FeatureSpec("f", table_name="t")
    table = sf.create_table(tf.int64, 2, "t", tf.compat.v1.ones_initializer(),
                            device_vocabulary_size=10)
    it, batch, emb, _ = _lookup_graph(table, spec, data, 1, send_count=2)
    sf.start_asc_pipeline()
    with tf.compat.v1.Session() as sess:
        sess.run(it.initializer)
        e, rows = sess.run([emb, batch_rows(batch, "t")])
        assert rows.shape == (2,) and e.shape == (1, 3, 2)
        with pytest.raises(tf.errors.OpError, match=r"3 unique keys.*send_count.*>= 3"):
            sess.run(emb)


def test_static_shapes_require_send_count(graph):
    sf.init(use_dynamic=False)
    spec = sf.FeatureSpec("f", table_name="t")
    table = sf.create_table(tf.int64, 2, "t", tf.compat.v1.ones_initializer())
    it = make_batch_iterator({"f": np.zeros((2, 2), np.int64)}, 1, [spec])
    with pytest.raises(ValueError, match="`send_count`.*use_dynamic=False.*None"):
        sf.sparse_lookup(table, spec, batch=it.get_next())


def test_parallel_map_and_prefetch_give_consistent_rows(sf_init):
    rng = np.random.default_rng(11)
    data = {"f": int_keys(rng, 5000, (64 * 40, 8))}
    spec = sf.FeatureSpec("f", table_name="t")
    table = sf.create_table(tf.int64, 4, "t", tf.compat.v1.random_normal_initializer(seed=3),
                            device_vocabulary_size=6000)
    ds = tf.data.Dataset.from_tensor_slices(data).batch(64)
    ds = ds.map(sf.get_asc_insert_func(tgt_key_specs=[spec]), num_parallel_calls=4)
    it = tf.compat.v1.data.make_initializable_iterator(ds.prefetch(8))
    batch = it.get_next()
    emb = sf.sparse_lookup(table, spec, batch=batch)
    sf.start_asc_pipeline()
    with tf.compat.v1.Session() as sess:
        results = run_all(sess, [batch["f"], emb], it)
    keys, values = table.export()
    by_key = dict(zip(keys.tolist(), values))
    assert len(by_key) == table.size() == len(np.unique(data["f"]))
    for f, e in results:  # every key read the one row it owns (no row handed out twice)
        for (i, j), k in np.ndenumerate(f):
            np.testing.assert_array_equal(e[i, j], by_key[int(k)])


def test_reserve_memory_keeps_trained_rows_and_needs_a_started_pipeline(sf_init):
    data = {"f": np.array([[1, 2], [3, 1]], np.int64)}
    spec = sf.FeatureSpec("f", table_name="t")
    table = sf.create_table(tf.int64, 2, "t", tf.compat.v1.ones_initializer(),
                            device_vocabulary_size=10)
    it, _, emb, train = _lookup_graph(table, spec, data, 1, lr=0.25)
    with pytest.raises(RuntimeError, match=r"Table `t`: call reserve_memory\(\) after "
                                           r"start_asc_pipeline"):
        table.reserve_memory()
    sf.start_asc_pipeline()
    with tf.compat.v1.Session() as sess:
        sess.run(it.initializer)
        sess.run(train)
        before = table.export()
        table.reserve_memory()
        after = dict(zip(*(x.tolist() for x in table.export())))
        # The prefetching pipeline may admit key 3 meanwhile: compare the keys held before.
        for key, value in zip(before[0].tolist(), before[1].tolist()):
            assert after[key] == value
        assert (before[1] != 1.0).any()  # rows were trained, and kept
        e, _ = sess.run([emb, train])  # key 3 takes a fresh row after the reservation
    np.testing.assert_array_equal(e[0, 0], [1.0, 1.0])


def test_timestamp_spec_refreshes_last_seen_and_clock_on_training_only(sf_init):
    data = {"f": np.array([[1, 2], [2, 3], [4, 4]], np.int64),
            "ts": np.array([100, 250, 50], np.int64)}
    specs = [sf.FeatureSpec("f", table_name="t"), sf.FeatureSpec("ts", is_timestamp=True)]
    eval_specs = [sf.FeatureSpec("f", table_name="t"), sf.FeatureSpec("ts", is_timestamp=True)]
    table = sf.create_table(tf.int64, 2, "t", tf.compat.v1.ones_initializer(),
                            device_vocabulary_size=6, host_vocabulary_size=4)
    assert table.capacity() == 10  # device + host vocabulary size
    it = make_batch_iterator(data, 1, specs)
    batch = it.get_next()
    rows_t = batch_rows(batch, "t")
    eval_it = make_batch_iterator({"f": np.array([[1, 9]], np.int64),
                                   "ts": np.array([10_000], np.int64)}, 1, eval_specs,
                                  is_training=False)
    eval_rows = batch_rows(eval_it.get_next(), "t")
    sf.start_asc_pipeline()
    processor = table.processor
    with tf.compat.v1.Session() as sess:
        run_all(sess, rows_t, it)
        run_all(sess, eval_rows, eval_it)  # the eval channel must not move the clock
    by_key = dict(zip([1, 2, 3, 4], processor.lookup(np.array([1, 2, 3, 4])).tolist()))
    assert min(by_key.values()) >= 0
    assert processor.clock == 250  # the largest training timestamp, not the eval one
    assert processor.last_seen[by_key[1]] == 100
    assert processor.last_seen[by_key[2]] == 250  # seen at 100, then refreshed at 250
    assert processor.last_seen[by_key[3]] == 250
    assert processor.last_seen[by_key[4]] == 50
    assert table.size() == 4


def test_dump_graph_writes_the_insert_function_graph(sf_init, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = sf.FeatureSpec("f", table_name="t")
    _ = sf.create_table(tf.int64, 2, "t", tf.compat.v1.ones_initializer())
    ds = tf.data.Dataset.from_tensors({"f": tf.zeros([2, 3], tf.int64)})
    ds.map(sf.get_asc_insert_func(tgt_key_specs=[spec], dump_graph=True))
    dumped = list((tmp_path / "sparseflow_dump").glob("insert_func_*.pbtxt"))
    assert len(dumped) == 1
    text = dumped[0].read_text()
    assert "sparseflow_keys" in text and "PyFunc" in text
