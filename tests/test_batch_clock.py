"""The batch clock with rows of different timestamps, in every face, against numpy.

Rec SDK's semantics (shared/REC_SDK.md, Eviction): a batch's timestamp is the latest of its
rows' timestamps; the table clock is the largest batch timestamp seen; every key of a training
batch has its last-seen time refreshed to the batch's timestamp (not to its own row's time).
The rows of each batch here carry shuffled, distinct times, so a reduction other than the max
(the min, the first or the last row, one worker's share alone) gives other last-seen times.
"""

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

import sparseflow as sf
from sparseflow import tf2
from sparseflow.pipeline.batch_clock import batch_timestamp
from tests.pipeline_utils import make_batch_iterator, run_all, sorted_state

BATCH, N_BATCHES, VOCAB = 16, 6, 40


def _mixed_times(rng, n_batches: int, batch: int) -> np.ndarray:
    """Batch i's rows: times from ``100 * i`` to ``100 * i + 90``, shuffled inside the batch,
    so every batch is later than the one before and its rows all differ."""
    base = np.arange(n_batches, dtype=np.int64)[:, None] * 100
    offsets = np.stack([rng.permutation(batch) * 90 // (batch - 1) for _ in range(n_batches)])
    return (base + offsets).reshape(-1).astype(np.int64)


def _reference(keys: np.ndarray, times: np.ndarray, batch: int):
    """numpy: per key, the timestamp of the latest batch holding it; the clock."""
    last_seen, clock = {}, None
    for start in range(0, len(times), batch):
        stamp = int(times[start:start + batch].max())
        clock = stamp if clock is None else max(clock, stamp)
        for key in np.unique(keys[start:start + batch]):
            last_seen[int(key)] = max(last_seen.get(int(key), stamp), stamp)
    return last_seen, clock


def _data(seed: int):
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, VOCAB, (BATCH * N_BATCHES, 2)).astype(np.int64)
    return keys, _mixed_times(rng, N_BATCHES, BATCH)


def _assert_times(state_keys, state_last_seen, clock, reference, ref_clock):
    assert int(clock) == ref_clock
    assert sorted(int(k) for k in state_keys) == sorted(reference)
    got = dict(zip((int(k) for k in state_keys), (int(t) for t in state_last_seen)))
    assert got == reference


def test_batch_timestamp_is_the_latest_row_time():
    times = np.array([[7], [3], [12], [5]], np.int64)
    assert int(batch_timestamp(times)) == 12
    assert int(batch_timestamp(tf.constant(4, tf.int32))) == 4
    assert int(batch_timestamp(np.zeros(0, np.int64))) == np.iinfo(np.int64).min
    with pytest.raises(TypeError, match="`timestamps`.*string"):
        batch_timestamp(tf.constant(["a"]))


def test_session_path_refreshes_keys_to_the_batch_time(sf_init):
    keys, times = _data(1)
    specs = [sf.FeatureSpec("f", table_name="t", access_threshold=0, eviction_threshold=10**6),
             sf.FeatureSpec("ts", is_timestamp=True)]
    table = sf.create_table(tf.int64, 4, "t", tf.compat.v1.zeros_initializer(),
                            device_vocabulary_size=VOCAB)
    it = make_batch_iterator({"f": keys, "ts": times}, BATCH, specs)
    # The lookup consumes each batch: a table's saved state holds the batches the model read.
    emb = sf.sparse_lookup(table, specs[0], batch=it.get_next())
    sf.start_asc_pipeline()
    with tf.compat.v1.Session() as sess:
        assert len(run_all(sess, emb, it)) == N_BATCHES
    state = sorted_state(table)
    _assert_times(state["keys"], state["last_seen"], state["clock"], *_reference(keys, times,
                                                                                  BATCH))


def test_tf2_path_takes_every_example_time_and_uses_the_latest():
    keys, times = _data(2)
    config = tf2.TableConfig(VOCAB, 4, name="t", eviction_threshold=10**6)
    embedding = tf2.Embedding({"f": tf2.FeatureConfig(config)}, tf2.SGD(0.1))
    ds = tf.data.Dataset.from_tensor_slices(({"f": keys}, times)).batch(BATCH).map(
        lambda f, ts: embedding.preprocess(f, timestamp=ts))
    for batch in ds:
        embedding.enqueue(batch)
        embedding.dequeue()
    processor = embedding.tables[config].processor
    held, _ = embedding.tables[config].export()
    last_seen = processor.last_seen[processor.lookup(np.asarray(held, np.int64))]
    _assert_times(held, last_seen, processor.clock, *_reference(keys, times, BATCH))


def test_two_workers_stamp_every_key_with_the_global_batch_time(tmp_path):
    """Each worker reads half of a global batch; the step's time is the latest over both
    halves, so a key seen only in worker 0's half gets the time of a row worker 1 read."""
    from tests.test_multiworker import BATCH as JOB_BATCH, shard_states, sparseflow, write_config

    out = str(tmp_path / "out")
    config = write_config(str(tmp_path), out)
    path = os.path.join(str(tmp_path), "train.parquet")
    data = pq.read_table(path)
    rng = np.random.default_rng(3)
    n_batches = data.num_rows // JOB_BATCH
    times = _mixed_times(rng, n_batches, JOB_BATCH)
    # Worker 1's half of every batch holds its latest row: only the all-worker max finds it.
    for b in range(n_batches):
        lo, half = b * JOB_BATCH, JOB_BATCH // 2
        batch = times[lo:lo + JOB_BATCH]
        top = int(np.argmax(batch))
        if top < half:
            swap = half + int(rng.integers(half))
            batch[top], batch[swap] = batch[swap], batch[top]
    pq.write_table(data.set_column(data.schema.get_field_index("ts"), "ts", pa.array(times)),
                   path)
    steps = 6
    overrides = ["schedule.eviction.every_steps=0", f"schedule.max_steps={steps}",
                 "schedule.save_every=6", "schedule.eval_steps=0"]
    done = sparseflow("train", config, "--workers", "2",
                      *[a for o in overrides for a in ("--set", o)])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    used = data.slice(0, steps * JOB_BATCH)
    states = shard_states(out, steps)
    for table, columns in {"t2": ["C2"], "t3": ["C3", "C4"]}.items():
        keys = np.concatenate([_column_keys(used, c) for c in columns], 1)
        reference, clock = _reference(keys, times[:steps * JOB_BATCH], JOB_BATCH)
        held = np.concatenate([s[table].keys for s in states])
        seen = np.concatenate([s[table].last_seen for s in states])
        for s in states:           # each owner's clock: the steps' (global) times
            assert int(s[table].clock) == clock
        _assert_times(held, seen, clock, reference, clock)


def _column_keys(table, column: str) -> np.ndarray:
    """int64 [rows, ids per row] of a Parquet column of scalars or fixed-length lists."""
    return np.asarray(table.column(column).to_pylist(), np.int64).reshape(table.num_rows, -1)
