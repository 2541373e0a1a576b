"""Admission over a table's life, eviction, the in-flight guard, EvictHook and statistics."""

import numpy as np
import pytest
import tensorflow as tf

import sparseflow as sf
from sparseflow.embed.initializers import init_rows
from sparseflow.optimizers import gradient_descent, lazy_adam
from sparseflow.pipeline.key_processor import KeyProcessor
from tests.pipeline_utils import run_all
from tests.thread_utils import returns_while_locked, started_thread


def _no_hidden_prefetch(ds):
    """These tests reason about which batches were processed when: no injected prefetch."""
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    return ds.with_options(options)


def _timestamped_iterator(keys, timestamps, specs, batch_size=1, is_training=True, **map_kwargs):
    ds = tf.data.Dataset.from_tensor_slices({"f": keys, "ts": timestamps}).batch(batch_size)
    ds = ds.map(sf.get_asc_insert_func(tgt_key_specs=specs, is_training=is_training),
                **map_kwargs)
    return _no_hidden_prefetch(ds)


def _specs(access=0, eviction=None):
    return [sf.FeatureSpec("f", table_name="t", access_threshold=access,
                           eviction_threshold=eviction),
            sf.FeatureSpec("ts", is_timestamp=True)]


def _initial_values(table, keys):
    out = np.zeros((len(keys), table.dim), np.float32)
    init_rows(out, np.arange(len(keys), dtype=np.int32), np.asarray(keys, np.int64),
              table.rows.init_spec, table.dim)
    return out


def test_set_threshold_changes_admission_at_run_time(sf_init):
    keys = np.array([[1], [1], [1], [2], [3], [3]], np.int64)
    spec = sf.FeatureSpec("f", table_name="t", access_threshold=5)
    table = sf.create_table(tf.int64, 2, "t", tf.compat.v1.ones_initializer(),
                            device_vocabulary_size=10)
    ds = tf.data.Dataset.from_tensor_slices({"f": keys}).batch(1)
    it = tf.compat.v1.data.make_initializable_iterator(
        _no_hidden_prefetch(ds.map(sf.get_asc_insert_func(tgt_key_specs=[spec]))))
    rows = sf.pipeline.insert_func.batch_rows(it.get_next(), "t")
    sf.start_asc_pipeline()
    with tf.compat.v1.Session() as sess:
        sess.run(it.initializer)
        got = [sess.run(rows)[0] for _ in range(2)]   # key 1: counts 1, 2 < 5
        sf.set_threshold("t", 3)
        got.append(sess.run(rows)[0])                 # key 1: count 3 >= 3, admitted
        sf.set_threshold(table, 0)                    # admit everything, stop counting
        got += [sess.run(rows)[0] for _ in range(3)]
    assert got[:2] == [-1, -1] and got[2] >= 0 and all(r >= 0 for r in got[3:])
    assert table.stats()["keys_held"] == 3
    counts = dict(zip(*table.processor.index.entries()[::2]))
    assert counts[3] == 0  # admitted under threshold 0: not counted
    with pytest.raises(ValueError, match=r"`value` must be an int in \[-1, 2147483647\]. "
                                         r"Received: -2"):
        sf.set_threshold("t", -2)
    with pytest.raises(ValueError, match=r"`table` must be a table or table name"):
        sf.set_threshold("nope", 1)


def test_evicted_key_comes_back_with_fresh_values_and_zeroed_slots(sf_init):
    # key 7 at t=0 and t=10 (trained twice), then only other keys until t=100; evict
    # (threshold 50): key 7 leaves; at t=200 it returns and must read its initial values.
    keys = np.array([[7], [7], [8], [9], [7]], np.int64)
    ts = np.array([0, 10, 60, 100, 200], np.int64)
    table = sf.create_table(tf.int64, 3, "t", tf.compat.v1.random_normal_initializer(seed=5),
                            device_vocabulary_size=10)
    it = tf.compat.v1.data.make_initializable_iterator(
        _timestamped_iterator(keys, ts, _specs(access=0, eviction=50)))
    batch = it.get_next()
    emb = sf.sparse_lookup(table, _find_spec("f"), batch=batch)
    loss = tf.reduce_sum(emb * emb)
    opt = lazy_adam.create_hash_optimizer(learning_rate=0.1)
    train = opt.apply_gradients([(tf.gradients(loss, table)[0], table)])
    sf.start_asc_pipeline()
    initial = _initial_values(table, [7])[0]
    with tf.compat.v1.Session() as sess:
        sess.run(it.initializer)
        e0, _ = sess.run([emb, train])
        e1, _ = sess.run([emb, train])
        row7 = int(table.processor.lookup(np.array([7]))[0])
        assert not np.allclose(table.rows.slots(np.array([row7]))["momentum"], 0)
        sess.run([emb, train])
        sess.run([emb, train])  # clock 100: key 7 last seen at 10
        result = sf.evict("t")["t"]
        assert result.keys_removed == 1 and table.processor.lookup(np.array([7]))[0] == -1
        e4 = sess.run(emb)      # key 7 again at t=200, possibly in its old row
    np.testing.assert_allclose(e0[0, 0], initial, rtol=1e-6)
    assert not np.allclose(e1[0, 0], initial)  # it had trained
    np.testing.assert_allclose(e4[0, 0], initial, rtol=1e-6)  # fresh initial values again
    row7 = int(table.processor.lookup(np.array([7]))[0])
    for slot in table.rows.slots(np.array([row7])).values():
        np.testing.assert_array_equal(slot, 0)
    assert table.processor.last_seen[row7] == 200
    stats = table.stats()
    assert stats["evictions"] == 1 and stats["keys_evicted"] == 1 and stats["clock"] == 200


def _find_spec(index_key):
    rt = sf.runtime.current()
    return [s for s in rt.feature_specs if s.index_key == index_key and not s.is_timestamp][-1]


def test_eviction_never_corrupts_batches_in_flight(sf_init):
    """Every batch read must see each key's own values while eviction runs after every step.

    Keys drift (each batch draws from a sliding window), eviction runs after every step with
    threshold 0 (every key goes; keys that come back take new rows), rows are recycled, and the
    pipeline runs ahead with a parallel map and prefetch(8). (Capacity covers twice the rows of
    the batches in flight: evicted rows of in-flight batches wait while those keys, back in
    newer batches, take new rows.) With lr=0 a key's embedding is
    always its initial value, so a row handed to another key while an older batch still
    referenced it would show up as a wrong value in that batch.
    """
    rng = np.random.default_rng(0)
    steps, batch_size, window = 120, 8, 40
    keys = np.stack([rng.integers(s, s + window, (batch_size, 2)) for s in range(steps)])
    keys = keys.reshape(steps * batch_size, 2).astype(np.int64)
    ts = np.repeat(np.arange(steps, dtype=np.int64), batch_size)
    table = sf.create_table(tf.int64, 4, "t", tf.compat.v1.random_uniform_initializer(seed=1),
                            device_vocabulary_size=1000)
    ds = _timestamped_iterator(keys, ts, _specs(access=0, eviction=0), batch_size,
                               num_parallel_calls=4).prefetch(8)
    it = tf.compat.v1.data.make_initializable_iterator(ds)
    batch = it.get_next()
    emb = sf.sparse_lookup(table, _find_spec("f"), batch=batch)
    train = gradient_descent.create_hash_optimizer(0.0).apply_gradients(
        [(tf.gradients(tf.reduce_sum(emb), table)[0], table)])
    sf.start_asc_pipeline()
    with tf.compat.v1.Session() as sess:
        out = []
        sess.run(it.initializer)
        while True:
            try:
                out.append(sess.run([batch["f"], emb, train])[:2])
            except tf.errors.OutOfRangeError:
                break
            sf.evict("t")
    stats = table.stats()
    assert len(out) == steps
    # Rows were recycled: more keys took rows (evicted + still held) than rows ever existed.
    assert stats["keys_evicted"] + stats["keys_held"] > table.processor.rows_ever_used + 200
    for f, e in out:
        np.testing.assert_array_equal(e.reshape(-1, 4), _initial_values(table, f.ravel()))


def test_evict_hook_runs_on_the_step_schedule(sf_init, caplog):
    keys = np.arange(12, dtype=np.int64).reshape(12, 1)
    ts = np.arange(12, dtype=np.int64) * 10
    table = sf.create_table(tf.int64, 2, "t", tf.compat.v1.ones_initializer(),
                            device_vocabulary_size=20)
    ds = _timestamped_iterator(keys, ts, _specs(access=0, eviction=15))
    batch = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
    emb = sf.sparse_lookup(table, _find_spec("f"), batch=batch)
    step = tf.compat.v1.train.get_or_create_global_step()
    train = gradient_descent.create_hash_optimizer(0.1).apply_gradients(
        [(tf.gradients(tf.reduce_sum(emb), table)[0], table)], global_step=step)
    sf.start_asc_pipeline()
    hook = sf.EvictHook(evict_enable=True, evict_step_interval=4)
    sizes = []
    caplog.set_level("INFO", logger="sparseflow")
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook]) as sess:
        while not sess.should_stop():
            sess.run(train)
            sizes.append(table.size())
    assert hook.evictions == 3  # after global steps 4, 8 and 12
    assert table.stats()["evictions"] == 3
    assert sizes[3] < sizes[2] + 1  # the eviction after step 4 removed the cold keys
    assert table.size() <= 2  # keys seen in the last 15 time units survive
    logged = [r.getMessage() for r in caplog.records if "sparseflow eviction" in r.getMessage()]
    assert len(logged) == 3
    assert all("table t removed" in m and "keys left" in m and "rows free" in m for m in logged)


def test_evict_hook_and_evict_validate_their_arguments(sf_init):
    with pytest.raises(TypeError, match=r"`evict_enable` must be a bool. Received: 1"):
        sf.EvictHook(evict_enable=1)
    with pytest.raises(ValueError, match=r"`evict_time_interval` must be an int >= 1. "
                                         r"Received: 0"):
        sf.EvictHook(evict_time_interval=0)
    with pytest.raises(ValueError, match=r"`evict_step_interval` must be an int >= 1"):
        sf.EvictHook(evict_step_interval=0)
    sf.create_table(tf.int64, 2, "t", tf.compat.v1.ones_initializer())
    with pytest.raises(RuntimeError, match=r"start_asc_pipeline\(\) first"):
        sf.evict()
    sf.start_asc_pipeline()
    with pytest.raises(ValueError, match=r"`table` must have eviction on: table `t`"):
        sf.evict("t")
    with pytest.raises(ValueError, match=r"`table` must be a table or table name"):
        sf.evict("nope")
    assert sf.evict() == {}  # no table has eviction on


def test_eviction_needs_a_timestamp_spec(sf_init):
    sf.create_table(tf.int64, 2, "t", tf.compat.v1.ones_initializer())
    spec = sf.FeatureSpec("f", table_name="t", access_threshold=1, eviction_threshold=5)
    tf.data.Dataset.from_tensors({"f": tf.zeros([2], tf.int64)}).map(
        sf.get_asc_insert_func(tgt_key_specs=[spec]))
    with pytest.raises(ValueError, match=r"eviction_threshold=5 for table `t`.*timestamp spec"):
        sf.start_asc_pipeline()


def test_stats_report_every_count(sf_init):
    keys = np.array([[1, 2], [1, 3]], np.int64)
    table = sf.create_table(tf.int64, 2, "t", tf.compat.v1.ones_initializer(),
                            device_vocabulary_size=5)
    ds = _timestamped_iterator(keys, np.array([5, 6], np.int64), _specs(access=2))
    rows = sf.pipeline.insert_func.batch_rows(
        tf.compat.v1.data.make_one_shot_iterator(ds).get_next(), "t")
    sf.start_asc_pipeline()
    with tf.compat.v1.Session() as sess:
        run_all(sess, rows)
    assert table.stats() == {"keys_held": 1, "rows_free": 4, "rows_waiting": 0,
                             "keys_counted_not_admitted": 2, "evictions": 0,
                             "keys_evicted": 0, "capacity": 5, "clock": 6}


def _processor(threshold=3, **kwargs):
    from sparseflow.pipeline.key_processor import KeyProcessor
    return KeyProcessor("t", 100_000, threshold, lambda rows, keys: None, **kwargs)


def _feed(processor, keys, timestamp=None):
    keys = np.asarray(keys, np.int64)
    return processor.process(keys, np.array([keys.shape[0]]), np.array([1], np.int32), True,
                             timestamp).rows


def test_sketch_admits_on_the_same_batch_as_exact_counting():
    from sparseflow.ops.count_min import CountMinSketch
    rng = np.random.default_rng(3)
    exact, sketch = _processor(), _processor(sketch=CountMinSketch(1 << 16, 4, seed=1))
    for _ in range(30):  # few distinct keys, a wide sketch: no collisions to blur counts
        batch = np.unique(rng.integers(0, 300, 64))
        np.testing.assert_array_equal(_feed(exact, batch) >= 0, _feed(sketch, batch) >= 0)
    assert exact.size == sketch.size > 0
    assert sketch.index.size == sketch.size  # counted keys never enter the index
    assert sketch.keys_counted is None and exact.keys_counted > 0


def test_sketch_memory_stays_flat_under_ten_million_one_off_keys():
    """Memory only: 10^7 one-off keys without a clear is ~10 counts per counter, far past the
    width rule of thumb (ops/count_min.py), so the threshold here is set out of the estimates'
    reach; the false-admission bound has its own tests in test_count_min.py."""
    from sparseflow.ops.count_min import CountMinSketch
    processor = _processor(threshold=1000, sketch=CountMinSketch(1 << 20, 4, seed=2))
    index_bytes, sketch_bytes = processor.index.nbytes, processor.sketch.nbytes
    for start in range(0, 10**7, 10**5):
        _feed(processor, np.arange(start, start + 10**5) * 7919 + 11)
    assert processor.index.nbytes == index_bytes and processor.sketch.nbytes == sketch_bytes
    assert processor.size == 0 and processor.index.size == 0
    assert processor.sketch.total == 10**7
    exact = _processor(threshold=1000)  # the same flood counted exactly grows the index
    for start in range(0, 4 * 10**5, 10**5):
        _feed(exact, np.arange(start, start + 10**5) * 7919 + 11)
    assert exact.index.size == 4 * 10**5 and exact.index.nbytes > 20 * index_bytes


def test_eviction_clears_the_sketch():
    from sparseflow.ops.count_min import CountMinSketch
    processor = _processor(sketch=CountMinSketch(1 << 12, 2, seed=3))
    _feed(processor, [1, 2], timestamp=0)
    _feed(processor, [1, 2], timestamp=5)     # counts 2 < 3
    processor.evict(100)
    assert processor.sketch.total == 0
    assert (_feed(processor, [1, 2], timestamp=6) == -1).all()  # counting restarted


def test_admission_counter_options_are_validated(sf_init):
    with pytest.raises(ValueError, match=r"`admission_counter` must be one of 'exact', "
                                         r"'sketch'. Received: 'approx'"):
        sf.create_table(tf.int64, 2, "t", tf.compat.v1.ones_initializer(),
                        admission_counter="approx")
    with pytest.raises(ValueError, match=r"`sketch_depth` must be an int in \[1, 16\]"):
        sf.create_table(tf.int64, 2, "t", tf.compat.v1.ones_initializer(),
                        admission_counter="sketch", sketch_depth=0)
    table = sf.create_table(tf.int64, 2, "t", tf.compat.v1.ones_initializer(),
                            admission_counter="sketch", sketch_width=1024, sketch_depth=2)
    assert table.processor.sketch.nbytes == 4 * 1024 * 2


def _tracked_processor():
    from sparseflow.pipeline.key_processor import KeyProcessor
    processor = KeyProcessor("t", 100, 0, lambda rows, keys: None)
    processor.track_in_flight = True
    return processor


def test_evicted_rows_wait_for_the_update_when_an_optimizer_applies_it():
    processor = _tracked_processor()
    seq = processor.process(np.array([1, 2], np.int64), np.array([2]), np.array([1], np.int32),
                            True, 0).seq
    processor.evict(0)  # both keys go; batch `seq` is still in flight
    processor.release(seq, drain=False)  # gathered, but its update has not run yet
    assert processor.rows_waiting == 2
    processor.drain()  # the optimizer ran the update
    assert processor.rows_waiting == 0 and processor.rows_free == 100


def test_an_abandoned_batch_does_not_hold_evicted_rows_forever():
    from sparseflow.pipeline.key_processor import ABANDONED_AFTER
    processor = _tracked_processor()
    processor.process(np.array([1], np.int64), np.array([1]), np.array([1], np.int32), True, 0)
    processor.evict(0)  # never released: e.g. left in a re-initialized iterator's buffer
    assert processor.rows_waiting == 1
    for _ in range(ABANDONED_AFTER + 2):
        seq = processor.process(np.array([5], np.int64), np.array([1]),
                                np.array([1], np.int32), True, 1).seq
        processor.release(seq)
    assert processor.rows_waiting == 0


# -- the eviction boundary: clock - last_seen >= eviction_threshold ---------------------------

def test_stale_keys_evicts_an_age_equal_to_the_threshold():
    from sparseflow.ops.key_kernels import stale_keys
    clock, threshold = np.int64(1_700_000_100), np.int64(30)
    # Index slots: keys and their rows; -1 is an empty slot or a counted, unadmitted key.
    idx_keys = np.array([10, 11, 12, 13, 14, 15, 0], np.int64)
    idx_rows = np.array([0, 1, 2, -1, 3, 4, -1], np.int32)
    ages = np.array([30, 29, 31, 0, 100], np.int64)  # per row: equal, below, above, 0, far
    got = stale_keys(idx_keys, idx_rows, clock - ages, clock, threshold)
    np.testing.assert_array_equal(got, [10, 12, 15])


def test_stale_keys_matches_numpy_around_the_threshold():
    from sparseflow.ops.key_kernels import stale_keys
    rng = np.random.default_rng(8)
    clock, threshold = np.int64(5000), np.int64(40)
    n_rows = 300
    idx_rows = rng.permutation(np.arange(-1, n_rows)).astype(np.int32)
    idx_rows[rng.random(idx_rows.shape[0]) < 0.2] = -1
    idx_keys = rng.integers(0, 2**62, idx_rows.shape[0]).astype(np.int64)
    last_seen = clock - rng.integers(threshold - 2, threshold + 3, n_rows).astype(np.int64)
    want = idx_keys[(idx_rows >= 0) & (clock - last_seen[np.maximum(idx_rows, 0)] >= threshold)]
    got = stale_keys(idx_keys, idx_rows, last_seen, clock, threshold)
    np.testing.assert_array_equal(got, want)
    assert 0 < got.shape[0] < (idx_rows >= 0).sum()


def test_key_processor_evicts_at_the_threshold_from_the_largest_timestamp():
    processor = _processor(threshold=0)
    for key, timestamp in ((3, 19), (1, 20), (2, 21), (4, 30), (5, 25)):
        _feed(processor, [key], timestamp=timestamp)
    # The clock is 30, the largest timestamp, not 25, the last one: ages 11, 10, 9, 0, 5.
    assert processor.clock == 30
    result = processor.evict(10)
    assert result.keys_removed == 2 and result.keys_left == 3
    rows = processor.lookup(np.array([3, 1, 2, 4, 5], np.int64))
    np.testing.assert_array_equal(rows >= 0, [False, False, True, True, True])
    assert processor.evict(0).keys_removed == 3  # age 0 >= 0: key 4, seen at the clock, too
    assert processor.size == 0


def test_a_table_evicts_at_the_threshold_through_the_pipeline(sf_init):
    # One key per batch; the table's clock becomes 130 (the last batch is older: 125).
    keys = np.array([[3], [1], [2], [4], [5]], np.int64)
    ts = np.array([119, 120, 121, 130, 125], np.int64)
    table = sf.create_table(tf.int64, 2, "t", tf.compat.v1.ones_initializer(),
                            device_vocabulary_size=10)
    it = tf.compat.v1.data.make_initializable_iterator(
        _timestamped_iterator(keys, ts, _specs(access=0, eviction=10)))
    rows = sf.pipeline.insert_func.batch_rows(it.get_next(), "t")
    sf.start_asc_pipeline()
    with tf.compat.v1.Session() as sess:
        sess.run(it.initializer)
        for _ in range(5):
            sess.run(rows)
    assert table.stats()["clock"] == 130 and table.size() == 5
    result = sf.evict("t")["t"]
    assert result.keys_removed == 2
    np.testing.assert_array_equal(table.export()[0], [2, 4, 5])  # ages 9, 0, 5 stay


def test_a_release_while_the_pipeline_holds_the_lock_does_not_wait_and_is_applied_next():
    """The step's gather releases a batch while the input pipeline's thread holds the table's
    lock: the release returns at once, and whoever takes the lock next sees it applied."""
    import threading

    processor = KeyProcessor("t", 100, None, lambda rows, keys: None)
    processor.track_in_flight = True
    for first in (0, 10):
        processor.process(np.arange(first, first + 5, dtype=np.int64), np.array([5]),
                          np.ones(1, np.int32), train=True)
    assert processor.batches_in_flight == 2
    held, done = threading.Event(), threading.Event()

    def hold():
        with processor.lock:
            held.set()
            done.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(10)
    returned = threading.Event()
    releaser = threading.Thread(target=lambda: (processor.release(0), returned.set()))
    releaser.start()
    assert returned.wait(5), "release waited for the lock"
    done.set()
    holder.join(10)
    releaser.join(10)
    assert processor.batches_in_flight == 1   # applied on taking the lock
    processor.release(1)
    assert processor.batches_in_flight == 0


def test_a_deferred_release_frees_evicted_rows_before_the_next_batch_takes_rows():
    """Rows an eviction freed wait for the batches in flight; a release deferred behind the
    lock must still free them for the next batch processed (its holder applies it first)."""
    import threading

    processor = KeyProcessor("t", 4, None, lambda rows, keys: None)
    processor.track_in_flight = True
    processor.process(np.arange(4, dtype=np.int64), np.array([4]), np.ones(1, np.int32),
                      train=True, timestamp=1)
    processor.evict(0)   # every key is stale: their rows wait for batch 0
    assert processor.rows_waiting == 4
    with processor.lock:   # as the pipeline's thread would, processing the next batch
        released = threading.Thread(target=processor.release, args=(0,))
        released.start()
        released.join(5)
        assert not released.is_alive()
        assert processor._released   # noqa: SLF001 -- deferred, not yet applied
    result = processor.process(np.arange(10, 14, dtype=np.int64), np.array([4]),
                               np.ones(1, np.int32), train=True, timestamp=2)
    assert sorted(result.rows.tolist()) == [0, 1, 2, 3]


def test_a_release_queued_during_a_locked_section_is_applied_after_it_not_inside():
    """Reads nested in a section that holds the lock (size, rows_free, rows_waiting) see the
    state the section started with: a release another thread queued meanwhile is applied on
    the next outermost entry, so the counts always add up to the table's rows."""
    import threading

    processor = KeyProcessor("t", 6, None, lambda rows, keys: None)
    processor.track_in_flight = True
    processor.process(np.arange(4, dtype=np.int64), np.array([4]), np.ones(1, np.int32),
                      train=True, timestamp=1)
    processor.evict(0)   # 4 rows wait for batch 0

    def total():
        return processor.size + processor.rows_free + processor.rows_waiting

    with processor.lock:
        released = threading.Thread(target=processor.release, args=(0,))
        released.start()
        released.join(5)
        assert processor._released   # noqa: SLF001 -- queued behind this section
        assert (processor.size, processor.rows_waiting, processor.rows_free) == (0, 4, 2)
        assert total() == 6
    assert (processor.size, processor.rows_waiting, processor.rows_free) == (0, 0, 6)
    assert total() == 6


def test_an_update_behind_the_lock_is_left_to_its_next_holder_in_order_with_releases():
    """The optimizer's bookkeeping does not wait while the pipeline's thread holds the lock
    (processing the next batch): its marks and drain are applied by the lock's next holder,
    in the order they came with the releases, so a drain never frees rows a batch released
    later still waits to update."""
    processor = KeyProcessor("t", 8, None, lambda rows, keys: None)
    processor.track_in_flight = True
    first = processor.process(np.arange(2, dtype=np.int64), np.array([2]), np.ones(1, np.int32),
                              train=True, timestamp=1)
    second = processor.process(np.arange(2, 4, dtype=np.int64), np.array([2]),
                               np.ones(1, np.int32), train=True, timestamp=1)
    processor.mark_saved()
    processor.evict(0)   # every key is stale: their rows wait for batches 0 and 1
    with processor.lock:   # as the pipeline's thread would, processing the next batch
        returns_while_locked(processor.release, first.seq, False)
        returns_while_locked(processor.updated, first.rows)
        returns_while_locked(processor.release, second.seq, False)
        assert not processor.dirty.any()   # queued, not applied inside the section
    # Batch 1's update has not run: its rows stay out of use although it was released.
    assert processor.rows_waiting == 4
    with processor.lock:
        returns_while_locked(processor.updated, second.rows)
    assert processor.rows_waiting == 0
    marks = processor.take_marks()
    assert np.flatnonzero(marks).tolist() == sorted(first.rows.tolist() + second.rows.tolist())


def test_an_update_after_a_compiled_gathers_release_frees_what_the_release_allows():
    """A table read by compiled gathers gets their releases through the registry's queue;
    its numpy-function update comes after them. Even when the pipeline's thread holds the
    lock, the update's drain must see the release (the rows the batch held are free once
    its update ran), as it does when the lock is free."""
    import numba

    from sparseflow.ops import table_registry as registry

    @numba.njit
    def push_released(slot, seq):
        registry.push_released(slot, seq)

    entry = registry.TableEntry("t")
    try:
        entry.publish(np.zeros((8, 1), np.float32))
        processor = KeyProcessor("t", 8, None, lambda rows, keys: None)
        processor.track_in_flight = True
        processor.take_kernel_events(entry, lambda: False)   # an optimizer is bound
        batch = processor.process(np.arange(4, dtype=np.int64), np.array([4]),
                                  np.ones(1, np.int32), train=True, timestamp=1)
        processor.evict(0)   # the 4 rows wait for the batch
        with processor.lock:   # the pipeline's thread, processing the next batch
            push_released(entry.slot, batch.seq)   # the compiled gather's release
            update = started_thread(processor.updated, batch.rows)   # may wait for the lock
        update.join(5)
        assert not update.is_alive()
        assert processor.rows_waiting == 0 and processor.rows_free == 8
    finally:
        entry.close()
