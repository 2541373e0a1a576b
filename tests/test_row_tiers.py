"""Tiered tables: a small fast tier caching rows whose homes are in a slower one.

- device rows over a host tier: ``rows_on="device"``, ``host_vocabulary_size > 0``;
- host rows over a disk tier: ``ssd_vocabulary_size > 0``.

The reference is the same training with every row in host memory: the tiers only move rows,
so losses, trained rows, checkpoints and exports must match it (1e-5) while the fast tier,
much smaller than the keys trained, swaps rows in and out every step.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

import sparseflow as sf
from sparseflow.optimizers import adagrad, lazy_adam
from sparseflow.pipeline.tier_cache import CacheFullError
from tests.pipeline_utils import (assert_same_training, linear_tower, make_batch_iterator,
                                  sgd_and_sparse_train_op)

B, STEPS, V = 32, 40, 3000
D1, D2 = 8, 4
EVICT_EVERY = 12


def _data(seed=0, steps=STEPS):
    """Zipf keys (a few hot, a long tail), one timestamp per batch."""
    rng = np.random.default_rng(seed)
    n = B * steps

    def zipf(shape):
        return (rng.zipf(1.15, shape) * 7919 % V).astype(np.int64)

    data = {"f1": zipf((n, 3)), "f2": zipf((n, 2)), "f3": zipf((n, 2)) % 500,
            "ts": np.repeat(np.arange(steps, dtype=np.int64) * 10, B)}
    data["label"] = ((data["f1"][:, 0] % 3 == 0) | (data["f3"][:, 0] % 2 == 0)).astype(
        np.float32)
    return data


def _tiers(kind, tmp_path):
    """create_table arguments per table for a tiering ``kind``."""
    if kind == "host":
        return {"t1": dict(device_vocabulary_size=V), "t2": dict(device_vocabulary_size=500)}
    if kind == "device":
        return {"t1": dict(device_vocabulary_size=V, rows_on="device"),
                "t2": dict(device_vocabulary_size=500, rows_on="device")}
    if kind == "device_over_host":
        return {"t1": dict(device_vocabulary_size=300, host_vocabulary_size=V - 300,
                           rows_on="device"),
                "t2": dict(device_vocabulary_size=150, host_vocabulary_size=350,
                           rows_on="device")}
    assert kind == "host_over_disk"
    disk = str(tmp_path / "ssd")
    return {"t1": dict(device_vocabulary_size=100, host_vocabulary_size=200,
                       ssd_vocabulary_size=V - 300, ssd_data_path=disk, rows_on="host"),
            "t2": dict(device_vocabulary_size=50, host_vocabulary_size=100,
                       ssd_vocabulary_size=350, ssd_data_path=[disk], rows_on="host")}


def _train(data, tiers, optimizer=lazy_adam.create_hash_optimizer, evict=False):
    """Two tables (t1: dim 8, shared by f1 and f2; t2: dim 4), admission threshold 2, a
    logistic tower; returns (losses, {table: (keys, embeddings)}, {table: stats}).

    Without ``evict``, two batches are prefetched (batches in flight pin their slots). With
    it, keys unseen for 50 time units are evicted every EVICT_EVERY steps and nothing is read
    ahead: which keys an eviction removes depends on the batches the pipeline has processed,
    so a read-ahead would make the runs differ by timing."""
    with tf.Graph().as_default():
        sf.init()
        specs = [sf.FeatureSpec(f, table_name=t, access_threshold=2, eviction_threshold=50)
                 for f, t in (("f1", "t1"), ("f2", "t1"), ("f3", "t2"))]
        specs.append(sf.FeatureSpec("ts", is_timestamp=True))
        init = tf.compat.v1.truncated_normal_initializer(stddev=0.1, seed=3)
        tables = {name: sf.create_table(tf.int64, dim, name, init, **tiers[name])
                  for name, dim in (("t1", D1), ("t2", D2))}
        ds = tf.data.Dataset.from_tensor_slices(data).batch(B, drop_remainder=True)
        ds = ds.map(sf.get_asc_insert_func(tgt_key_specs=specs))
        if evict:
            options = tf.data.Options()
            options.experimental_optimization.inject_prefetch = False
            ds = ds.with_options(options)
        else:
            ds = ds.prefetch(2)
        it = tf.compat.v1.data.make_initializable_iterator(ds)
        batch = it.get_next()
        pooled = [tf.reduce_sum(sf.sparse_lookup(tables[s.table_name], s, batch=batch), 1)
                  for s in specs[:3]]
        loss = linear_tower(pooled, batch["label"])
        train = sgd_and_sparse_train_op(loss, optimizer(0.05))
        sf.start_asc_pipeline()
        losses = []
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), it.initializer])
            while True:
                try:
                    losses.append(sess.run([train, loss])[1])
                except tf.errors.OutOfRangeError:
                    break
                if evict and len(losses) % EVICT_EVERY == 0:
                    sf.evict()
            exported = {name: t.export(sess) for name, t in tables.items()}
            stats = {name: t.stats() for name, t in tables.items()}
        sf.terminate_config_initializer()
    return np.array(losses), exported, stats


@pytest.fixture(scope="module")
def reference():
    return {evict: _train(_data(), _tiers("host", None), evict=evict) for evict in (False, True)}


@pytest.mark.parametrize("evict", [False, True], ids=["prefetch", "evict"])
@pytest.mark.parametrize("kind", ["device_over_host", "host_over_disk"])
def test_a_small_fast_tier_trains_as_all_rows_in_memory(kind, evict, reference, tmp_path):
    run = _train(_data(), _tiers(kind, tmp_path), evict=evict)
    assert_same_training(run, reference[evict])
    stats = run[2]["t1"]
    # The fast tier churned: far more keys than slots went through it.
    assert stats["rows_swapped_out"] > 300 and 0.3 < stats["hit_rate"] < 0.95
    assert (stats["keys_evicted"] > 100) == evict
    assert reference[evict][0][-10:].mean() < reference[evict][0][:10].mean()  # it trained
    if kind == "host_over_disk":
        assert not os.listdir(tmp_path / "ssd")  # the scratch files are gone at terminate


def test_all_rows_on_device_train_as_host_rows_with_eviction(reference):
    assert_same_training(_train(_data(), _tiers("device", None), evict=True), reference[True])


@pytest.mark.parametrize("kind", ["device_over_host", "host_over_disk"])
def test_adagrad_through_a_tier(kind, tmp_path):
    data = _data(seed=1, steps=20)
    reference = _train(data, _tiers("host", None), adagrad.create_hash_optimizer)
    assert_same_training(_train(data, _tiers(kind, tmp_path), adagrad.create_hash_optimizer),
                 reference)


def test_a_fast_tier_smaller_than_a_batch_names_both_sizes(sf_init):
    spec = sf.FeatureSpec("f", table_name="t")
    table = sf.create_table(tf.int64, 2, "t", tf.compat.v1.zeros_initializer(),
                            device_vocabulary_size=4, host_vocabulary_size=96,
                            rows_on="device")
    # The second batch's 6 distinct keys: 4 of them already in the fast tier, 2 not.
    it = make_batch_iterator({"f": np.array([[0, 1, 2, 3, 0, 1], [0, 1, 2, 3, 4, 5]])}, 1,
                             [spec])
    emb = sf.sparse_lookup(table, spec, batch=it.get_next())
    sf.start_asc_pipeline()
    with tf.compat.v1.Session() as sess:
        sess.run([tf.compat.v1.global_variables_initializer(), it.initializer])
        sess.run(emb)
        with pytest.raises(tf.errors.OpError, match=r"Table `t`: a batch has 6 distinct rows "
                                                    r"\(2 of them not in the fast tier\), more "
                                                    r"than its 4 slots \(device_vocabulary_size"
                                                    r"=4, host_vocabulary_size=96\)"):
            sess.run(emb)
    assert issubclass(CacheFullError, RuntimeError)


def test_the_disk_tier_sits_behind_host_rows(sf_init, tmp_path):
    init = tf.compat.v1.zeros_initializer()
    with pytest.raises(ValueError, match=r"Argument `rows_on` must be 'host' or None with "
                                         r"ssd_vocabulary_size > 0.*table `a`.*Received: "
                                         r"'device'"):
        sf.create_table(tf.int64, 2, "a", init, host_vocabulary_size=5, ssd_vocabulary_size=5,
                        ssd_data_path=str(tmp_path), rows_on="device")
    table = sf.create_table(tf.int64, 2, "b", init, device_vocabulary_size=3,
                            host_vocabulary_size=5, ssd_vocabulary_size=7,
                            ssd_data_path=str(tmp_path))
    assert table.rows_on == "host" and table.capacity() == 15
    assert table.rows.capacity == 8            # device + host rows in memory, over 15 homes
    stats = table.stats()
    assert (stats["resident_rows"], stats["rows_swapped_in"], stats["hit_rate"]) == (0, 0, 1.0)
    assert sf.create_table(tf.int64, 2, "c", init, host_vocabulary_size=5).tiers is None


def test_a_row_handed_to_a_new_key_is_not_overwritten_by_its_old_contents(tmp_path):
    """Row 0 is chosen to leave the fast tier (a queued plan will write it home), then its key
    is evicted and the row handed to a new key before the plan runs: the new key's initial
    values at home must survive the plan."""
    from sparseflow.embed.disk_rows import DiskRows
    from sparseflow.embed.initializers import init_rows, init_spec_from_tf
    from sparseflow.embed.row_tiers import RowTiers

    spec = init_spec_from_tf(tf.compat.v1.random_uniform_initializer(seed=1), (10, 2), 0, 1.0)
    tiers = RowTiers("t", 2, 10, 2, spec, "lru", "2 slots",
                     make_homes=lambda: (DiskRows("t", 10, 2, [str(tmp_path)]), ()))
    fast = np.zeros((2, 2), np.float32)

    def initial(key):
        out = np.zeros((1, 2), np.float32)
        init_rows(out, np.zeros(1, np.int32), np.array([key], np.int64), spec, 2)
        return out[0]

    tiers.initialize(np.array([0, 1], np.int32), np.array([100, 101], np.int64))
    slots = tiers.place(np.array([0, 1], np.int32), seq=0)
    tiers.swap_host(fast)
    np.testing.assert_array_equal(fast[slots[0]], initial(100))
    fast += 100.0                                            # trained
    tiers.release(0)
    tiers.settle()
    tiers.place(np.array([2], np.int32), seq=1)             # row 0 is queued to leave
    tiers.initialize(np.array([0], np.int32), np.array([555], np.int64))   # reused
    tiers.swap_host(fast)
    np.testing.assert_array_equal(tiers.homes.read(np.array([0]))[0], initial(555))
    np.testing.assert_array_equal(tiers.homes.read(np.array([1]))[0], initial(101))  # untouched
    row0_slot = tiers.place(np.array([0], np.int32), seq=2)[0]
    tiers.swap_host(fast)
    np.testing.assert_array_equal(fast[row0_slot], initial(555))
    tiers.close()


@pytest.mark.parametrize("kind", ["device_over_host", "host_over_disk"])
def test_reserve_memory_of_a_tiered_table_keeps_the_rows(kind, tmp_path):
    """reserve_memory() commits a tiered table's homes (device over host) or free host slots
    (host over disk) and leaves trained rows as they are."""
    data = _data(seed=2, steps=6)
    with tf.Graph().as_default():
        sf.init()
        spec = sf.FeatureSpec("f1", table_name="t1")
        table = sf.create_table(tf.int64, 4, "t1", tf.compat.v1.random_normal_initializer(seed=1),
                                **_tiers(kind, tmp_path)["t1"])
        it = make_batch_iterator({"f1": data["f1"]}, B, [spec], read_ahead=False)
        emb = sf.sparse_lookup(table, spec, batch=it.get_next())
        train = adagrad.create_hash_optimizer(0.1).apply_gradients(
            [(tf.gradients(tf.reduce_sum(emb * emb), table)[0], table)])
        sf.start_asc_pipeline()
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), it.initializer])
            for _ in range(3):
                sess.run(train)
            before = table.export(sess)
            table.reserve_memory()
            after = table.export(sess)
            sess.run(train)   # still trains
        sf.terminate_config_initializer()
    assert before[0].shape[0] > 50
    np.testing.assert_array_equal(after[0], before[0])
    np.testing.assert_array_equal(after[1], before[1])


def _two_tiered_tables():
    """t1 (dim 8) and t2 (dim 4), device rows over a host tier, small fast tiers."""
    init = tf.compat.v1.truncated_normal_initializer(stddev=0.1, seed=3)
    tiers = _tiers("device_over_host", None)
    return {name: sf.create_table(tf.int64, dim, name, init, **tiers[name])
            for name, dim in (("t1", D1), ("t2", D2))}


def _two_table_batch(data):
    """f1 on t1 and f3 on t2 (:func:`_two_tiered_tables`) through one insert function:
    (tables, iterator, each spec's loss: the sum of its squared embeddings)."""
    specs = [sf.FeatureSpec("f1", table_name="t1"), sf.FeatureSpec("f3", table_name="t2")]
    tables = _two_tiered_tables()
    it = make_batch_iterator({f: data[f] for f in ("f1", "f3")}, B, specs)
    batch = it.get_next()
    losses = [tf.reduce_sum(sf.sparse_lookup(tables[s.table_name], s, batch=batch) ** 2)
              for s in specs]
    return tables, it, losses


def _tier_functions_run(sess, fetch) -> dict:
    """Runs ``fetch`` once, traced; per tier step boundary, how many numpy functions ran."""
    meta = tf.compat.v1.RunMetadata()
    sess.run(fetch, options=tf.compat.v1.RunOptions(
        trace_level=tf.compat.v1.RunOptions.FULL_TRACE), run_metadata=meta)
    ran = [node.node_name.split("/")[-1] for dev in meta.step_stats.dev_stats
           for node in dev.node_stats]
    return {name: sum(r.startswith(name) for r in ran)
            for name in ("sparseflow_claim", "take_swaps", "swap_homes", "sparseflow_release")}


def test_a_batchs_tiered_device_tables_trained_together_share_one_claim_swap_and_release():
    """Two tiered device tables, three lookups, one sparse optimizer: each step boundary into
    Python (the claim, the take of the queued moves, the homes' write-back and read, the
    release) runs once a step, not once per table. (Their training is checked against host
    rows above, with these same two tables.)"""
    data = _data(seed=3, steps=6)
    with tf.Graph().as_default():
        sf.init()
        specs = [sf.FeatureSpec(f, table_name=t) for f, t in (("f1", "t1"), ("f2", "t1"),
                                                                ("f3", "t2"))]
        tables = _two_tiered_tables()
        it = make_batch_iterator({f: data[f] for f in ("f1", "f2", "f3")}, B, specs)
        batch = it.get_next()
        embs = [sf.sparse_lookup(tables[s.table_name], s, batch=batch) for s in specs]
        loss = sum(tf.reduce_sum(e * e) for e in embs)
        train = lazy_adam.create_hash_optimizer(0.05).apply_gradients(
            list(zip(tf.gradients(loss, list(tables.values())), tables.values())))
        sf.start_asc_pipeline()
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), it.initializer])
            for _ in range(4):
                sess.run(train)
            ran = _tier_functions_run(sess, train)
            stats = {name: t.stats() for name, t in tables.items()}
        sf.terminate_config_initializer()
    assert ran == {"sparseflow_claim": 1, "take_swaps": 1, "swap_homes": 1,
                   "sparseflow_release": 1}
    assert all(s["rows_swapped_in"] > 0 for s in stats.values())   # both tables went through


def test_tiered_device_tables_trained_apart_keep_their_own_claims():
    """t1 and t2 are looked up on one batch but trained by two train ops, and the program
    runs t1's alone for many steps. A shared claim would claim t2's rows in every run and
    keep them pinned until t2's update, which never runs: its 150 fast slots would fill
    within a few steps (CacheFullError). Each table keeps its own claim, and a run of both
    train ops still trains both."""
    data = _data(seed=5, steps=30)
    with tf.Graph().as_default():
        sf.init()
        tables, it, (loss_1, loss_2) = _two_table_batch(data)
        train_1, train_2 = (lazy_adam.create_hash_optimizer(0.05).apply_gradients(
            [(tf.gradients(loss, t)[0], t)]) for loss, t in ((loss_1, tables["t1"]),
                                                            (loss_2, tables["t2"])))
        sf.start_asc_pipeline()
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), it.initializer])
            losses = [sess.run([train_1, loss_1])[1] for _ in range(24)]
            t2_claimed = dict(tables["t2"].tiers.cache._pinned)
            both = _tier_functions_run(sess, [train_1, train_2])
        sf.terminate_config_initializer()
    assert losses[-1] < losses[0]
    assert t2_claimed == {}
    assert both == {"sparseflow_claim": 2, "take_swaps": 2, "swap_homes": 2,
                    "sparseflow_release": 2}


@pytest.mark.parametrize("apart", [True, False], ids=["trained_apart", "trained_together"])
def test_tiered_lookups_whose_update_is_built_after_the_start_keep_their_own_claims(apart):
    """little_demo's order: the optimizers are bound through create_table(optimizer_list=...)
    and their updates built after start_asc_pipeline, which cannot see them: each table
    keeps its own claim (one run of a merged claim would claim both; a gradient built after
    a merge would have run the lookup's own claim beside it). Trained apart, running t1's
    train op alone leaves t2 unclaimed; trained together, a step runs one claim per table."""
    data = _data(seed=7, steps=30)
    with tf.Graph().as_default():
        sf.init()
        specs = [sf.FeatureSpec("f1", table_name="t1"), sf.FeatureSpec("f3", table_name="t2")]
        init = tf.compat.v1.truncated_normal_initializer(stddev=0.1, seed=3)
        optimizers = ([lazy_adam.create_hash_optimizer(0.05) for _ in range(2)] if apart
                      else [lazy_adam.create_hash_optimizer(0.05)] * 2)
        tiers = _tiers("device_over_host", None)
        tables = {name: sf.create_table(tf.int64, dim, name, init, optimizer_list=[opt],
                                        **tiers[name])
                  for (name, dim), opt in zip((("t1", D1), ("t2", D2)), optimizers)}
        it = make_batch_iterator({f: data[f] for f in ("f1", "f3")}, B, specs)
        batch = it.get_next()
        losses = [tf.reduce_sum(sf.sparse_lookup(tables[s.table_name], s, batch=batch) ** 2)
                  for s in specs]
        sf.start_asc_pipeline()
        if apart:
            trains = [opt.apply_gradients([(tf.gradients(loss, t)[0], t)])
                      for opt, loss, t in zip(optimizers, losses, tables.values())]
        else:
            trains = [optimizers[0].apply_gradients(list(zip(
                tf.gradients(losses[0] + losses[1], list(tables.values())),
                tables.values())))]
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), it.initializer])
            first = [sess.run([trains[0], losses[0]])[1] for _ in range(24)]
            t2_claimed = dict(tables["t2"].tiers.cache._pinned)
            ran = _tier_functions_run(sess, trains)
        sf.terminate_config_initializer()
    assert first[-1] < first[0]
    assert ran == {"sparseflow_claim": 2, "take_swaps": 2, "swap_homes": 2,
                   "sparseflow_release": 2}
    if apart:
        assert t2_claimed == {}


def test_a_full_fast_tier_in_a_shared_claim_leaves_no_other_table_claimed():
    """t2's fast tier cannot hold a batch: the shared claim fails on it after placing t1's
    rows. t1's batch is released as a gathered one (its slots unpinned at its table's next
    update), not left claimed for good."""
    data = _data(seed=6, steps=4)
    with tf.Graph().as_default():
        sf.init()
        specs = [sf.FeatureSpec("f1", table_name="t1"), sf.FeatureSpec("f3", table_name="t2")]
        init = tf.compat.v1.truncated_normal_initializer(stddev=0.1, seed=3)
        tables = {"t1": sf.create_table(tf.int64, D1, "t1", init, device_vocabulary_size=300,
                                        host_vocabulary_size=V - 300, rows_on="device"),
                  "t2": sf.create_table(tf.int64, D2, "t2", init, device_vocabulary_size=4,
                                        host_vocabulary_size=496, rows_on="device")}
        it = make_batch_iterator({f: data[f] for f in ("f1", "f3")}, B, specs,
                                 read_ahead=False)
        batch = it.get_next()
        loss = sum(tf.reduce_sum(sf.sparse_lookup(tables[s.table_name], s, batch=batch) ** 2)
                   for s in specs)
        train = lazy_adam.create_hash_optimizer(0.05).apply_gradients(
            list(zip(tf.gradients(loss, list(tables.values())), tables.values())))
        sf.start_asc_pipeline()
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), it.initializer])
            with pytest.raises(tf.errors.OpError,
                               match=r"Table `t2`: a batch has \d+ distinct rows .*more than "
                                     r"its 4 slots"):
                sess.run(train)
            t1 = tables["t1"].tiers.cache
            claimed, released = set(t1._pinned), set(t1._released)
        sf.terminate_config_initializer()
    assert claimed and claimed <= released


def test_a_tiered_device_table_no_lookup_reads_pins_nothing():
    """t2's keys are in the batches (its spec is in the insert function) but no lookup reads
    it, so no update ever settles its batches: claiming them would pin its 150 fast slots
    for good after a few batches (a CacheFullError). Only the tables looked up are claimed."""
    data = _data(seed=4, steps=20)
    with tf.Graph().as_default():
        sf.init()
        specs = [sf.FeatureSpec("f1", table_name="t1"), sf.FeatureSpec("f3", table_name="t2")]
        init = tf.compat.v1.truncated_normal_initializer(stddev=0.1, seed=3)
        tiers = _tiers("device_over_host", None)
        tables = {name: sf.create_table(tf.int64, dim, name, init, **tiers[name])
                  for name, dim in (("t1", D1), ("t2", D2))}
        it = make_batch_iterator({f: data[f] for f in ("f1", "f3")}, B, specs)
        emb = sf.sparse_lookup(tables["t1"], specs[0], batch=it.get_next())
        loss = tf.reduce_sum(emb * emb)
        train = lazy_adam.create_hash_optimizer(0.05).apply_gradients(
            [(tf.gradients(loss, tables["t1"])[0], tables["t1"])])
        sf.start_asc_pipeline()
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), it.initializer])
            losses = [sess.run([train, loss])[1] for _ in range(20)]
            t2 = tables["t2"].tiers.cache
            claimed, released = dict(t2._pinned), list(t2._released)
        sf.terminate_config_initializer()
    assert losses[-1] < losses[0]
    assert claimed == {} and released == []


def test_lookups_of_a_terminated_runtime_are_not_merged_by_the_next():
    """A setup built, terminated before its start (say after a failed check) and built again
    in the same graph under a new init(): the first runtime's tiered lookups stay in the
    graph, but start_asc_pipeline merges only its own runtime's (the old tables are closed:
    building on them raised)."""
    def build():
        data = {f: np.arange(64, dtype=np.int64).reshape(32, 2) for f in ("f1", "f3")}
        specs = [sf.FeatureSpec("f1", table_name="t1"), sf.FeatureSpec("f3", table_name="t2")]
        tables = _two_tiered_tables()
        it = make_batch_iterator(data, 8, specs)
        batch = it.get_next()
        loss = sum(tf.reduce_sum(sf.sparse_lookup(tables[s.table_name], s, batch=batch) ** 2)
                   for s in specs)
        train = lazy_adam.create_hash_optimizer(0.05).apply_gradients(
            list(zip(tf.gradients(loss, list(tables.values())), tables.values())))
        return it, train

    with tf.Graph().as_default():
        sf.init()
        build()
        sf.terminate_config_initializer()
        sf.init()
        it, train = build()
        sf.start_asc_pipeline()
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), it.initializer])
            ran = _tier_functions_run(sess, train)
        sf.terminate_config_initializer()
    assert ran == {"sparseflow_claim": 1, "take_swaps": 1, "swap_homes": 1,
                   "sparseflow_release": 1}


def test_an_update_built_after_the_start_that_splits_a_merged_claim_is_logged(caplog):
    """t1 and t2 were merged at the start (one update trains both); an update built after
    it trains t1 alone: a run of it alone would claim t2 too and keep its slots pinned
    until t2's next update, so the build says so, naming both sides."""
    data = _data(seed=8, steps=4)
    with tf.Graph().as_default():
        sf.init()
        tables, it, losses = _two_table_batch(data)
        optimizer = lazy_adam.create_hash_optimizer(0.05)
        optimizer.apply_gradients(list(zip(tf.gradients(losses[0] + losses[1],
                                                        list(tables.values())),
                                           tables.values())))
        sf.start_asc_pipeline()
        with caplog.at_level("WARNING"):
            optimizer.apply_gradients([(tf.gradients(losses[0], tables["t1"])[0],
                                        tables["t1"])])
        sf.terminate_config_initializer()
    warned = [r.getMessage() for r in caplog.records if "start_asc_pipeline" in r.getMessage()]
    assert len(warned) == 1 and "['t1'] but not ['t2']" in warned[0]


@pytest.mark.parametrize("kind", ["device_over_host", "host_over_disk"])
def test_a_frozen_tiered_table_pins_no_batch(kind, tmp_path):
    """t2 is looked up in training with is_grad=False and no update trains it: nothing would
    ever settle its batches' pins, and its 150 fast slots filled within two steps
    (CacheFullError, before this was mended). Its batches are claimed as evaluation ones,
    unpinned at their gather, and its rows do not change."""
    rng = np.random.default_rng(9)
    data = {"f1": rng.integers(0, V, (B * 30, 3)).astype(np.int64),
            "f3": rng.integers(0, 500, (B * 30, 2)).astype(np.int64)}
    with tf.Graph().as_default():
        sf.init()
        specs = [sf.FeatureSpec("f1", table_name="t1"), sf.FeatureSpec("f3", table_name="t2")]
        init = tf.compat.v1.truncated_normal_initializer(stddev=0.1, seed=3)
        tiers = _tiers(kind, tmp_path)
        tables = {name: sf.create_table(tf.int64, dim, name, init, **tiers[name])
                  for name, dim in (("t1", D1), ("t2", D2))}
        it = make_batch_iterator(data, B, specs)
        batch = it.get_next()
        e1 = sf.sparse_lookup(tables["t1"], specs[0], batch=batch)
        e2 = sf.sparse_lookup(tables["t2"], specs[1], batch=batch, is_grad=False)
        loss = tf.reduce_sum(e1 ** 2) + tf.reduce_sum(e2 ** 2)
        train = lazy_adam.create_hash_optimizer(0.05).apply_gradients(
            [(tf.gradients(loss, tables["t1"])[0], tables["t1"])])
        sf.start_asc_pipeline()
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), it.initializer])
            first = sess.run(e2)[0]
            key = data["f3"][0, 0]
            for _ in range(26):
                sess.run([train, loss])
            t2 = tables["t2"].tiers.cache
            claimed, swapped_out = dict(t2._pinned), t2.swapped_out
            keys, rows = tables["t2"].export(sess)
        sf.terminate_config_initializer()
    assert claimed == {} and swapped_out > 0            # it churned, and holds nothing
    np.testing.assert_array_equal(rows[list(keys).index(key)], first[0])   # untrained


def test_an_update_built_inside_a_function_graph_counts_for_the_lookups_outside_it():
    """An update's tables are recorded on the outermost graph: an update built in a function
    graph (a tf.function traced inside the Session graph, a v2 control-flow branch) and a
    lookup in the graph around it read one record. Otherwise the trained table would look
    frozen, and its batches' slots be unpinned before its update."""
    from sparseflow.tiered_lookup import is_trained, record_update

    table, other = object(), object()
    with tf.Graph().as_default() as graph:
        inner = tf.function(lambda: tf.constant(1)).get_concrete_function().graph
        assert inner.outer_graph is graph
        record_update(inner, [table])
        assert is_trained(graph, table) and is_trained(inner, table)
        assert not is_trained(graph, other)
