"""The key pipeline's scratch memory is reused from batch to batch, also on TensorFlow's own
threads, and nothing a batch leaves behind (the read-ahead journal) aliases it."""

import numpy as np
import pytest
import tensorflow as tf

import sparseflow as sf
from sparseflow.ops import key_kernels
from sparseflow.pipeline import key_processor as kpmod

BATCH, FEATURES, BATCHES = 256, 3, 12


def _generated_batches(seed: int):
    """Batches through ``Dataset.from_generator`` and ``unbatch``, as YAML jobs read files."""
    rng = np.random.default_rng(seed)
    runs = [{f"f{i}": rng.integers(0, 5000, (4, BATCH)) for i in range(FEATURES)}
            for _ in range(BATCHES // 4)]
    signature = {f"f{i}": tf.TensorSpec([None, BATCH], tf.int64) for i in range(FEATURES)}
    return tf.data.Dataset.from_generator(lambda: iter(runs),
                                          output_signature=signature).unbatch()


def test_dedup_scratch_and_key_buffers_are_reused_across_batches_on_tf_threads(sf_init,
                                                                              monkeypatch):
    """TensorFlow runs a numpy function on its own threads and may drop their Python thread
    state after each call: scratch kept per Python thread was allocated afresh (and paid its
    page faults) every batch. Every batch must run in the same scratch and key buffers."""
    seen = []
    dedup_tables = key_kernels.dedup_tables

    def recording(keys, seg_ends, seg_coefs, table_segs, scratch_keys, scratch_tags, *rest):
        uniq, restore, weight = rest[1:4]
        seen.append((scratch_tags.ctypes.data, keys.ctypes.data, uniq.ctypes.data,
                     restore.ctypes.data, weight.ctypes.data))
        return dedup_tables(keys, seg_ends, seg_coefs, table_segs, scratch_keys, scratch_tags,
                            *rest)

    monkeypatch.setattr(key_kernels, "dedup_tables", recording)
    specs = [sf.FeatureSpec(f"f{i}", table_name=f"t{i}", access_threshold=1)
             for i in range(FEATURES)]
    for i in range(FEATURES):
        sf.create_table(tf.int64, 4, f"t{i}", tf.compat.v1.zeros_initializer(),
                        device_vocabulary_size=20_000)
    ds = _generated_batches(0).map(sf.get_asc_insert_func(tgt_key_specs=specs))
    it = tf.compat.v1.data.make_initializable_iterator(ds)
    nxt = it.get_next()
    sf.start_asc_pipeline()
    with tf.compat.v1.Session() as sess:
        sess.run(it.initializer)
        for _ in range(BATCHES):
            sess.run(nxt)
    assert len(seen) == BATCHES
    # Each buffer (dedup scratch; the batch's keys, unique keys, restore and weight) sits at
    # one address through every batch.
    for part, name in enumerate(("dedup scratch", "keys", "uniq", "restore", "weight")):
        assert len({s[part] for s in seen}) == 1, (name, [s[part] for s in seen])


def test_read_ahead_journal_keeps_its_own_copy_of_a_batch_s_keys(sf_init):
    """A batch processed ahead of the model is kept in the read-ahead journal (a checkpoint
    leaves it out); the next batch, processed in the same reused scratch, must not change
    what the journal holds of the first."""
    table = sf.create_table(tf.int64, 4, "t", tf.compat.v1.zeros_initializer(),
                            device_vocabulary_size=100)
    sf.start_asc_pipeline()
    processor = table.processor
    processor.threshold = 2
    processor.track_in_flight = True   # as a training spec's lookup turns it on
    first = np.array([5, 6, 5, 7], np.int64)
    second = np.array([9, 10, 11, 12], np.int64)
    addresses = []
    for keys in (first, second):
        with kpmod.borrow_scratch() as scratch:
            batch, _ = kpmod.process_tables(
                [processor], scratch.joined_keys([keys]), np.array([keys.shape[0]], np.int64),
                np.ones(1, np.int32), np.array([1], np.int64), True, None, scratch=scratch)
            addresses.append(batch.uniq.ctypes.data)
    assert addresses[0] == addresses[1]   # the second batch ran in the first one's arrays
    records = processor.journal._batches   # white-box: the journal has no public reader
    assert [r.keys.tolist() for r in records] == [[5, 6, 7], [9, 10, 11, 12]]
    assert [r.counted.tolist() for r in records] == [[2, 1, 1], [1, 1, 1, 1]]


@pytest.mark.parametrize("key_dtype", [np.int32, np.int64])
def test_batch_scratch_dedups_exactly_as_it_grows_and_shrinks(key_dtype):
    """Batches of changing sizes (empty, growing past the buffers, smaller again) and key
    dtypes through one reused scratch give what fresh arrays give."""
    rng = np.random.default_rng(3)
    with kpmod.borrow_scratch() as scratch:
        for n in (0, 5, 3000, 40, 70_000, 1, 900):
            parts = [rng.integers(0, max(2, n // 3), size).astype(key_dtype)
                     for size in (n // 2, n - n // 2)]
            joined = scratch.joined_keys(parts)
            assert joined.dtype == np.int64 and joined.shape == (n,)
            np.testing.assert_array_equal(joined, np.concatenate(parts).astype(np.int64))
            ends = np.array([n // 2, n], np.int64)
            coefs = np.array([1, 2], np.int32)
            table_segs = np.array([1, 2], np.int64)
            got = kpmod.dedup_batch(joined, ends, coefs, table_segs, scratch)
            fresh = kpmod.dedup_batch(joined.copy(), ends, coefs, table_segs)
            np.testing.assert_array_equal(joined, np.concatenate(parts))   # not overwritten
            np.testing.assert_array_equal(got.n_unique, fresh.n_unique)
            np.testing.assert_array_equal(got.restore, fresh.restore)
            for t in range(2):
                u_got, r_got, w_got, count = got.table(t)
                u_ref, r_ref, w_ref, _ = fresh.table(t)
                np.testing.assert_array_equal(u_got[:count], u_ref[:count])
                np.testing.assert_array_equal(w_got[:count], w_ref[:count])
                np.testing.assert_array_equal(r_got, r_ref)
