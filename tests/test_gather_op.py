"""The compiled gather (``SparseflowGatherTables``, ``ops/batch_ops.py``) and the registry it
reads tables through (``ops/table_registry.py``), against numpy references."""

import numba
import numpy as np
import pytest
import tensorflow as tf

import sparseflow as sf
from sparseflow.ops import batch_ops
from sparseflow.ops import table_registry as registry
from tests.test_batch_kernels import random_batch

TABLES = [(50, 1), (80, 3), (7, 2), (60, 1)]
DIM = 4


@pytest.fixture
def entries():
    """Registry entries over random storages, one per table of TABLES (rows wider than DIM,
    as [weights | slots]); closed after the test."""
    rng = np.random.default_rng(7)
    made = []
    for capacity, _ in TABLES:
        entry = registry.TableEntry(f"t{len(made)}")
        storage = rng.normal(size=(capacity, 3 * DIM)).astype(np.float32)
        entry.publish(storage)
        made.append((entry, storage))
    yield made
    for entry, _ in made:
        entry.close()


def _reference(parts, members, storages):
    """Each member's embeddings: its table's unique rows (zeros for -1) by its restore."""
    out = []
    for t, w, r in members:
        rows = parts[w]
        unique = np.where(rows[:, None] >= 0, storages[t][np.maximum(rows, 0), :DIM], 0.0)
        out.append(unique[parts[r]])
    return np.concatenate(out).astype(np.float32).reshape(-1, DIM)


def _batch(seed, entries, seqs=None):
    rng = np.random.default_rng(seed)
    parts, flat, sizes, members, layout = random_batch(rng, TABLES, DIM)
    # The batch's seq for the table whose rows are part w sits at n_parts + w.
    seqs = np.arange(100, 100 + len(parts)) if seqs is None else np.asarray(seqs)
    sizes = np.concatenate([sizes, seqs]).astype(np.int64)
    tokens = np.array([entries[t][0].token for t, _, _ in members], np.int64)
    return parts, flat, sizes, members, layout, tokens


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gather_op_vs_numpy_eager_and_function(seed, entries):
    parts, flat, sizes, members, layout, tokens = _batch(seed, entries)
    expected = _reference(parts, members, [s for _, s in entries])
    eager = batch_ops.gather_tables(flat, sizes, tokens, layout[1], layout[2], len(parts), DIM)
    np.testing.assert_array_equal(eager.numpy(), expected)

    @tf.function
    def traced(f):
        return batch_ops.gather_tables(f, sizes, tokens, layout[1], layout[2], len(parts), DIM)
    np.testing.assert_array_equal(traced(flat).numpy(), expected)


def test_gather_op_releases_each_tables_batch_once_per_run(entries):
    parts, flat, sizes, members, layout, tokens = _batch(0, entries)
    for entry, _ in entries:
        entry.take_events()
    graph = tf.Graph()
    with graph.as_default():
        out = batch_ops.gather_tables(flat, sizes, tokens, layout[1], layout[2], len(parts),
                                      DIM, name="gathered")
        assert out.op.type == batch_ops.GATHER_TABLES and out.op.name == "gathered"
        # Stateful: two runs of one graph gather (and release) twice, nothing is folded.
        assert out.op.op_def.is_stateful
        with tf.compat.v1.Session(graph=graph) as session:
            for _ in range(2):
                session.run(out)
    for t, (entry, _) in enumerate(entries):
        rows_part = next(w for tt, w, _ in members if tt == t)
        released, overflow, drain_lost = entry.take_events()
        assert released.tolist() == [100 + rows_part] * 2 and overflow == -1 and not drain_lost
        assert not entry.has_events()


def test_gather_op_releases_nothing_for_an_untracked_batch(entries):
    parts, flat, sizes, members, layout, tokens = _batch(1, entries, seqs=[-1] * 30)
    for entry, _ in entries:
        entry.take_events()
    batch_ops.gather_tables(flat, sizes, tokens, layout[1], layout[2], len(parts), DIM)
    assert not any(entry.has_events() for entry, _ in entries)


def test_gather_op_reads_the_storage_published_last(entries):
    entry, storage = entries[0]
    flat = np.array([3, 0, 0], np.int32)   # rows part [3], restore part [0, 0]
    sizes = np.array([1, 2, 5], np.int64)
    read = lambda: batch_ops.gather_tables(flat, sizes, [entry.token], [0], [1], 2,  # noqa: E731
                                           DIM).numpy()
    np.testing.assert_array_equal(read(), storage[[3, 3], :DIM])
    replaced = storage + 1.0
    entry.publish(replaced)
    np.testing.assert_array_equal(read(), replaced[[3, 3], :DIM])


def test_gather_op_refuses_a_released_or_foreign_table(entries):
    parts, flat, sizes, members, layout, tokens = _batch(2, entries)
    args = (flat, sizes)
    closed = registry.TableEntry("closed")
    closed.publish(np.zeros((80, 3 * DIM), np.float32))
    stale = closed.token
    closed.close()
    for bad in (stale, tokens[0] + registry.MAX_TABLES, -5):
        wrong = np.where(layout[0] == layout[0][0], bad, tokens)
        with pytest.raises(tf.errors.FailedPreconditionError, match="names no table alive"):
            batch_ops.gather_tables(*args, wrong, layout[1], layout[2], len(parts), DIM)


def test_gather_op_refuses_rows_outside_the_table_and_restores_outside_the_rows(entries):
    entry, _ = entries[2]   # 7 rows
    sizes = np.array([2, 2, 0], np.int64)
    for rows, restore, match in (([1, 7], [0, 1], "row index is outside its table"),
                                 ([1, -2], [0, 1], "row index is outside its table"),
                                 ([1, 2], [0, 2], "restore vector indexes past"),
                                 ([1, 2], [-1, 0], "restore vector indexes past")):
        flat = np.array(rows + restore, np.int32)
        with pytest.raises(tf.errors.InvalidArgumentError, match=match):
            batch_ops.gather_tables(flat, sizes, [entry.token], [0], [1], 2, DIM)


def test_gather_op_refuses_layouts_that_would_misread_and_reads_members_apart(entries):
    parts, flat, sizes, members, layout, tokens = _batch(0, entries)
    n = len(parts)
    ok = dict(flat=flat, part_sizes=sizes, member_tables=tokens, member_rows=layout[1],
              member_restore=layout[2], n_parts=n, dim=DIM)
    # Member 0 (table 0) between table 1's first and second members.
    split = np.array([1, 0, 2, 3, 4, 5, 6])
    assert layout[1][split].tolist()[:3] == [1, 0, 1]
    swapped = tokens.copy()
    swapped[[1, 2]] = tokens[[0, 0]]   # one rows part named with two different tables
    swapped[0] = entries[3][0].token
    cases = [
        dict(n_parts=n + 31),                                   # past part_sizes
        dict(part_sizes=sizes[:n]),                             # no seq after the parts
        dict(flat=flat[:-1]),                                   # parts run past flat
        dict(member_tables=swapped),
        dict(member_tables=tokens[:-1]),                        # lengths differ
        dict(dim=0),
    ]
    for change in cases:
        with pytest.raises(tf.errors.InvalidArgumentError, match="SparseflowGatherTables"):
            batch_ops.gather_tables(**{**ok, **change})
    with pytest.raises(tf.errors.InvalidArgumentError, match="narrower than dim"):
        batch_ops.gather_tables(**{**ok, "dim": 3 * DIM + 1})
    # A table's members apart (the TF2 face's feature order) are read correctly: the
    # table's rows once per run of its members.
    expected = _reference(parts, [members[i] for i in split], [s for _, s in entries])
    apart = batch_ops.gather_tables(**{**ok, "member_rows": layout[1][split],
                                       "member_restore": layout[2][split],
                                       "member_tables": tokens[split]})
    np.testing.assert_array_equal(apart.numpy(), expected)


def test_gather_op_refuses_inputs_of_the_wrong_rank(entries):
    from sparseflow.ops import tf_capi

    batch_ops.gather_tables(np.zeros(0, np.int32), np.zeros(3, np.int64),
                            [entries[0][0].token], [0], [1], 2, DIM)   # registers the op
    good = [np.array([0, 0], np.int32), np.array([1, 1, 9], np.int64),
            np.array([entries[0][0].token]), np.array([0]), np.array([1]), np.int64(2),
            np.int64(DIM)]
    for k in range(len(good)):
        bad = list(good)
        bad[k] = np.expand_dims(good[k], 0)
        with pytest.raises(tf.errors.InvalidArgumentError, match="SparseflowGatherTables"):
            tf_capi.apply_op(batch_ops.GATHER_TABLES, [tf.constant(a) for a in bad], 1)


def test_gather_op_of_an_empty_batch(entries):
    out = batch_ops.gather_tables(np.zeros(0, np.int32), np.array([0, 0, 4], np.int64),
                                  [entries[0][0].token], [0], [1], 2, DIM)
    assert out.shape == (0, DIM)


@numba.njit
def push_events(slot, events):
    """Pushes ``events`` (seqs, or registry.DRAIN) onto entry ``slot``'s queue, as the
    compiled ops do."""
    for event in events:
        if event == registry.DRAIN:
            registry.push_drain(slot)
        else:
            registry.push_released(slot, event)


def test_event_queue_keeps_order_and_overflows_to_the_newest_seq_and_a_lost_drain():
    entry = registry.TableEntry("queue")
    try:
        entry.publish(np.zeros((1, 1), np.float32))
        push_events(entry.slot, np.array([5, registry.DRAIN, 3, 4, registry.DRAIN]))
        assert entry.has_events()
        events, overflow, drain_lost = entry.take_events()
        assert events.tolist() == [5, registry.DRAIN, 3, 4, registry.DRAIN]
        assert overflow == -1 and not drain_lost and not entry.has_events()
        n = registry.QUEUE_SIZE + 10
        push_events(entry.slot, np.append(np.arange(n), registry.DRAIN))
        events, overflow, drain_lost = entry.take_events()
        # Nothing is lost: what the queue could not hold is covered by the newest seq and
        # the lost drain's flag.
        assert events.tolist() == list(range(events.shape[0]))
        assert overflow == n - 1 and events.shape[0] < n and drain_lost
        assert entry.take_events()[1:] == (-1, False) and not entry.has_events()
    finally:
        entry.close()


def test_step_count_and_marks_through_the_entry():
    entry = registry.TableEntry("steps")
    try:
        entry.steps = 41
        assert entry.count_step() == 42 and entry.steps == 42
        marks = np.zeros(5, np.bool_)
        entry.publish_marks(marks)
        with pytest.raises(ValueError, match="C-contiguous bool vector"):
            entry.publish_marks(np.zeros(5, np.int8))
    finally:
        entry.close()
    assert entry.steps == 42   # readable after close (a checkpoint after terminate)
    with pytest.raises(RuntimeError, match="released"):
        entry.count_step()


def test_registry_entries_are_reused_with_new_tokens():
    first = registry.TableEntry("a")
    slot, token = first.slot, first.token
    first.close()
    again = [registry.TableEntry(f"b{i}") for i in range(3)]
    try:
        assert token not in {e.token for e in again}
        assert all(e.token % registry.MAX_TABLES == e.slot for e in again)
    finally:
        for e in again:
            e.close()
    del slot


def test_publish_refuses_a_storage_kernels_cannot_read():
    entry = registry.TableEntry("bad")
    try:
        for storage in (np.zeros((3, 2), np.float64), np.zeros(3, np.float32),
                        np.zeros((3, 4), np.float32)[:, ::2]):
            with pytest.raises(ValueError, match="C-contiguous float32 matrix"):
                entry.publish(storage)
    finally:
        entry.close()


def test_a_table_gathered_by_the_op_releases_its_batches_and_reads_trained_rows(sf_init):
    """Through the public API: binding the optimizer widens the storage after the lookup made
    the registry entry (the entry follows it), the op reads initial then trained rows, and
    the key processor applies the op's releases: nothing stays in flight."""
    from sparseflow.optimizers import lazy_adam
    from tests.pipeline_utils import make_batch_iterator, run_all

    data = {"a": np.arange(40, dtype=np.int64).reshape(20, 2) % 9}
    spec = sf.FeatureSpec("a", table_name="t")
    table = sf.create_table(tf.int64, 3, "t", tf.compat.v1.constant_initializer(0.5),
                            device_vocabulary_size=16)
    it = make_batch_iterator(data, 4, [spec])
    emb = sf.sparse_lookup(table, spec, batch=it.get_next())
    train = lazy_adam.create_hash_optimizer(0.1).apply_gradients(
        [(tf.gradients(tf.reduce_sum(emb), table)[0], table)])
    graph = tf.compat.v1.get_default_graph()
    assert len([op for op in graph.get_operations()
                if op.type == batch_ops.GATHER_TABLES]) == 1
    assert not [op for op in graph.get_operations()
                if op.type == "PyFunc" and "sparseflow_gather" in op.name]
    sf.start_asc_pipeline()
    with tf.compat.v1.Session() as sess:
        outs = run_all(sess, [emb, train], it)
    assert len(outs) == 5
    np.testing.assert_allclose(outs[0][0], 0.5)       # initial values, read by the op
    assert (outs[-1][0] < 0.5 - 1e-3).all()           # trained rows (gradient 1, Adam)
    with table.processor.lock:   # entering applies the queued releases
        pass
    assert table.processor.batches_in_flight == 0


@numba.njit
def _hold(token):
    return registry.acquire(token)


@numba.njit
def _let_go(slot):
    registry.release(slot)


def test_closing_or_replacing_waits_for_the_ops_that_hold_the_entry():
    """An op holds an entry from acquire to release: a close (terminate) or a replacement
    of the rows waits for it, so no kernel reads freed rows or writes a freed queue."""
    import threading

    entry = registry.TableEntry("held")
    entry.publish(np.zeros((4, 2), np.float32))
    slot = _hold(entry.token)
    assert slot == entry.slot
    done = threading.Event()
    closer = threading.Thread(target=lambda: (entry.close(), done.set()))
    closer.start()
    assert not done.wait(0.2)          # still held: the close waits
    assert _hold(entry.token) == registry.UNKNOWN   # but no new op gets in
    _let_go(slot)
    assert done.wait(5)
    closer.join()
    # No storage yet is told apart from no table.
    fresh = registry.TableEntry("fresh")
    try:
        assert _hold(fresh.token) == registry.NO_STORAGE
    finally:
        fresh.close()


def test_a_closed_entry_takes_no_events_from_the_table_that_reuses_its_slot():
    first = registry.TableEntry("first")
    first.publish(np.zeros((1, 1), np.float32))
    first.close()
    second = registry.TableEntry("second")   # the freed slot is handed out again
    try:
        second.publish(np.zeros((1, 1), np.float32))
        push_events(second.slot, np.array([7]))
        assert not first.has_events() and first.take_events()[0].shape == (0,)
        assert second.take_events()[0].tolist() == [7]
    finally:
        second.close()
