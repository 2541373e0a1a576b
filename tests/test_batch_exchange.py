"""A routed batch's rows read back (``BatchExchange.forward`` with keys) and its gradients on
their way to the owners (``BatchExchange.to_owners``), in one process: the all-to-alls are
the identity, so what would be sent is what comes back. Rows and flags are checked against
the tables' own lookups; the gradients against numpy: each entry of the ``[N, m, max_dim]``
layout gets the sum of the gradients of the keys (or unique rows) read from it, zeros where
none."""

import numpy as np
import pytest
import tensorflow as tf

from sparseflow.distributed.batch_exchange import BatchExchange
from sparseflow.distributed.exchange import Exchange


class _LoopbackExchange:
    """What ``to_owners`` needs of an ``Exchange``: the world size and an all-to-all, here
    the identity."""

    def __init__(self, world_size: int):
        self.world_size = world_size

    def all_to_all(self, x, rung=None):
        del rung
        return tf.identity(x)

    # No collective watchdog here: Exchange's span reports nothing.
    watched_as_one = Exchange.watched_as_one


class _Router:
    def __init__(self, max_dim: int):
        self.max_dim = max_dim


def _exchange(n: int, m: int, max_dim: int, where: np.ndarray) -> BatchExchange:
    router, loopback = _Router(max_dim), _LoopbackExchange(n)
    # BatchExchange holds its router weakly; in the faces its owner (the runtime, a TF2
    # Embedding) keeps it alive: here the exchange it runs on does.
    loopback.router_owner = router
    ex = BatchExchange(router, loopback, None, None, None, None, train=True, stamped=False)
    ex.m = tf.constant(m, tf.int32)
    ex.where = tf.constant(where, tf.int32)
    return ex


@pytest.mark.parametrize("n,m,keys", [(2, 5, 37), (3, 4, 12), (1, 7, 1), (2, 3, 0)])
def test_each_entry_gets_the_sum_of_its_keys_gradients(n, m, keys):
    rng = np.random.default_rng(n * 100 + keys)
    where = rng.integers(0, n * m, keys).astype(np.int32)   # several keys per entry
    dy = rng.normal(size=(keys, 4)).astype(np.float32)
    sent = _exchange(n, m, 4, where).to_owners(tf.constant(dy)).numpy()
    want = np.zeros((n * m, 4), np.float32)
    np.add.at(want, where, dy)
    assert sent.shape == (n, m, 4)
    np.testing.assert_allclose(sent.reshape(n * m, 4), want, rtol=1e-6, atol=1e-6)


def test_an_entry_index_outside_the_layout_is_an_error_not_a_lost_gradient():
    ex = _exchange(2, 3, 2, np.array([0, 6], np.int32))
    with pytest.raises(tf.errors.InvalidArgumentError):
        ex.to_owners(tf.ones([2, 2], tf.float32))


class _LoopbackDynamic(_LoopbackExchange):
    """One worker: the dynamic all-to-all hands the buffer back with its counts."""

    def all_to_all_dynamic(self, x, counts, pad_value=0, also_max=None, with_rung=False):
        del pad_value
        out = tf.identity(x), tf.identity(counts), tf.identity(also_max)
        return out + (None,) if with_rung else out


@pytest.mark.parametrize("train", [True, False])
def test_keyed_forward_reads_each_keys_row_and_flag_in_feature_order(train):
    """Every feature's keys' rows, one feature after another, as ``route``'s ``gather``
    orders them: against each key's row read from its table (zeros past a narrower table's
    dim and where the key owns no row), and the flags against the tables' own lookups."""
    from tests.test_routing import DIMS, TABLE_OF, make_router

    router = make_router(1, threshold=2)
    if not train:   # evaluation reads keys admitted before; 12 never was
        warm = [np.array([5, 5], np.int64), np.array([7, 7, 9], np.int64),
                np.array([9], np.int64)]
        send, counts, _, _, _ = router.route(warm)
        token = router.process(send, counts, None, True)
        router.gather(token, keep=False)
    batch = [np.array([5, 12, 5], np.int64), np.array([7, 9, 12, 7], np.int64),
             np.array([9, 3], np.int64)]
    send, counts, place, gather, sizes = router.route(batch)
    ex = BatchExchange(router, _LoopbackDynamic(1), tf.constant(send), tf.constant(counts),
                       tf.constant(place), tf.constant(0, tf.int64), train=train,
                       stamped=False)
    rows, flags = ex.forward(flags=True, keys=tf.constant(gather))
    rows, flags = rows.numpy(), flags.numpy()
    keys = np.concatenate(batch)
    assert rows.shape == (keys.shape[0], router.max_dim) and flags.shape == keys.shape
    feature_of = np.repeat(np.arange(len(batch)), [len(b) for b in batch])
    for i, key in enumerate(keys):
        table = router.tables[TABLE_OF[feature_of[i]]]
        row = table.processor.lookup(np.array([key], np.int64))[0]
        assert flags[i] == (row >= 0)
        want = np.zeros(router.max_dim, np.float32)
        if row >= 0:
            want[:table.dim] = table.rows.gather(np.array([row], np.int32))[0]
        np.testing.assert_array_equal(rows[i], want)
        assert not rows[i, DIMS[feature_of[i]]:].any()
    assert flags.any() and not flags.all()       # some keys own rows, some do not


def test_a_training_lookup_that_fails_before_its_hand_over_drops_its_token(monkeypatch):
    """The TF2 faces' owner lookup hands its token over to the update's TF ops; if it fails
    after processing the keys, nothing else would ever drop the token: the lookup does, and
    releases the batch."""
    from tests.test_routing import make_router

    router = make_router(1)
    for table in router.tables:
        table.processor.track_in_flight = True   # as a table that trains tracks its batches
    batch = [np.array([5, 12, 5], np.int64), np.array([7, 9], np.int64),
             np.array([9, 3], np.int64)]
    send, counts, place, gather, _ = router.route(batch)
    ex = BatchExchange(router, _LoopbackDynamic(1), tf.constant(send), tf.constant(counts),
                       tf.constant(place), tf.constant(0, tf.int64), train=True,
                       stamped=False, keep=True)
    assert ex.in_graph
    seen = []

    def failing_hand_over(token):
        seen.append([set(t.processor._outstanding) for t in router.tables])   # noqa: SLF001
        raise RuntimeError("boom: the hand-over failed")

    monkeypatch.setattr(router, "hand_over", failing_hand_over)
    with pytest.raises(Exception, match="boom"):
        ex.forward(flags=False, keys=tf.constant(gather))
    assert seen and all(seen[0])             # the batch was in flight when it failed
    assert not router._pending               # noqa: SLF001 -- the token is dropped
    for table in router.tables:
        assert not table.processor._outstanding   # noqa: SLF001 -- its batch released


def test_rows_evicted_between_a_lookup_and_its_update_wait_for_the_update():
    """A TF2 step's batch is read (its lookup hands the update to TF ops) before its update
    runs: a key evicted in between keeps its row out of reuse until that update has run,
    so the update never lands on a row another key was given meanwhile; once the update
    ran, the next lookup frees the row. What the batch changed is consumed for checkpoints
    at once."""
    from sparseflow.distributed.routing import KeyRouter
    from sparseflow.embed.table_config import make_table_config
    from sparseflow.optimizers.hparams import lazy_adam_hparams
    from sparseflow.optimizers.lazy_adam import LazyAdam
    from sparseflow.table import SparseTable, _default_seed

    cfg = make_table_config(tf.int64, 2, "t", tf.zeros_initializer(), device_vocabulary_size=4)
    table = SparseTable(cfg, _default_seed("t"), rows_on="host")
    table.processor.track_in_flight = True   # as a table that trains tracks its batches
    table.rows.bind_optimizer(LazyAdam(lazy_adam_hparams(0.1), runtime=False))
    router = KeyRouter([table], [0], [1], world_size=1)

    def lookup(keys, time):
        send, counts, place, gather, _ = router.route([np.array(keys, np.int64)])
        ex = BatchExchange(router, _LoopbackDynamic(1), tf.constant(send),
                           tf.constant(counts), tf.constant(place), tf.constant(time, tf.int64),
                           train=True, stamped=True, keep=True)
        assert ex.in_graph
        rows, _ = ex.forward(flags=False, keys=tf.constant(gather))
        return ex, rows

    step, rows = lookup([1], 0)
    (row_of_1,) = table.processor.lookup(np.array([1], np.int64))
    assert not len(table.processor.journal)   # consumed: a checkpoint keeps key 1
    table.processor.clock = np.int64(100)
    assert table.processor.evict(10).rows_waiting == 1   # key 1's row waits for the update
    lookup([2], 100)                                     # another batch admits key 2
    (row_of_2,) = table.processor.lookup(np.array([2], np.int64))
    assert row_of_2 != row_of_1
    step.apply_at_owners(tf.ones_like(rows))
    lookup([3], 100)   # after the update: the row is free again
    assert table.processor.rows_waiting == 0


# A batch of the routing tests' three features; in the second, feature 0 (the only one of
# table 1, "narrow") has no keys, so that table has no unique keys.
_BATCHES = {
    "full": [np.array([5, 12, 5, 40], np.int64), np.array([7, 9, 12, 7, 7], np.int64),
             np.array([9, 3, 3], np.int64)],
    "empty_table": [np.array([], np.int64), np.array([7, 9, 12, 7, 7], np.int64),
                    np.array([9, 3, 3], np.int64)],
}


def _twins_with_a_routed_batch(threshold: int, world_size: int = 1, batch: str = "full"):
    """Two identical routers of ``world_size`` workers, the same batch routed by each: one
    for the exchange under test, one for the key router's own calls as the reference. (The
    loopback hands the send buffer back as what was received: every worker's row comes to
    this owner.)"""
    from tests.test_routing import make_router

    twins = [make_router(world_size, threshold=threshold) for _ in range(2)]
    routes = [router.route(_BATCHES[batch]) for router in twins]
    return twins, routes


@pytest.mark.parametrize("threshold,world_size,batch", [
    (-1, 1, "full"), (2, 1, "full"), (2, 3, "full"), (-1, 3, "empty_table")])
def test_owner_gradients_cut_per_table_as_sum_gradients_gives_them(threshold, world_size,
                                                                    batch):
    """The Session faces' owner gradients come back from their numpy function as one int32
    and one float32 array and are cut per table by TF ops: each table's IndexedSlices
    against ``KeyRouter.sum_gradients`` on a twin router given the same step and the same
    gradients (tables of different widths, keys without a row at threshold 2, several
    workers' rows, a table without keys)."""
    twins, routes = _twins_with_a_routed_batch(threshold, world_size, batch)
    send, counts, place, gather, _ = routes[0]
    # A graph, as the Session faces build it: the gradient is built before the step runs,
    # so the lookup keeps its keys pending for it.
    with tf.Graph().as_default():
        ex = BatchExchange(twins[0], _LoopbackDynamic(world_size), tf.constant(send),
                           tf.constant(counts), tf.constant(place), tf.constant(0, tf.int64),
                           train=True, stamped=False)
        ex.forward(flags=True)
        dy = tf.constant(np.random.default_rng(threshold + 9).normal(
            size=(place.shape[0], twins[0].max_dim)).astype(np.float32))
        received = ex.to_owners(dy)   # the loopback's all-to-all: the identity
        slices = ex.owner_gradients(dy)
        assert all(t.indices.shape.rank == 1 and t.values.shape.as_list() == [None, table.dim]
                   for t, table in zip(slices, twins[0].tables))
        with tf.compat.v1.Session() as sess:
            received, slices = sess.run(
                [received, [(s.indices, s.values) for s in slices]])

    send, counts, *_ = routes[1]
    token = twins[1].process(send, counts, None, True)
    twins[1].gather(token)
    reference = twins[1].sum_gradients(token, received)
    assert len(slices) == len(reference) == len(twins[0].tables)
    for table, (indices, values), (want_rows, want) in zip(twins[0].tables, slices,
                                                          reference):
        assert values.shape == (want_rows.shape[0], table.dim)
        np.testing.assert_array_equal(indices, want_rows)
        np.testing.assert_allclose(values, want, rtol=1e-6, atol=1e-6)
    assert (np.concatenate([r for r, _ in reference]) < 0).any() == (threshold > 0)
    assert reference[1][0].shape[0] == (0 if batch == "empty_table" else 3)


@pytest.mark.parametrize("world_size,batch", [(1, "full"), (3, "full"), (3, "empty_table")])
def test_a_handed_over_lookup_cuts_slots_rows_and_sizes_as_hand_over_lays_them_out(
        world_size, batch):
    """The TF2 faces' owner lookup hands its update over in one int32 array: the slots,
    rows and sizes the exchange cuts out of it (rank-1 tensors in a graph) against
    ``KeyRouter.hand_over`` on a twin router given the same step."""
    from sparseflow.distributed.routing import split_hand_over

    twins, routes = _twins_with_a_routed_batch(-1, world_size, batch)
    assert twins[0].updates_in_graph
    send, counts, place, gather, _ = routes[0]
    with tf.Graph().as_default():
        ex = BatchExchange(twins[0], _LoopbackDynamic(world_size), tf.constant(send),
                           tf.constant(counts), tf.constant(place), tf.constant(0, tf.int64),
                           train=True, stamped=False, keep=True)
        assert ex.in_graph
        ex.forward(flags=False)
        assert ex.slots.shape.rank == ex.owner_rows.shape.rank == 1
        assert ex.owner_sizes.shape.as_list() == [len(twins[0].tables)]
        with tf.compat.v1.Session() as sess:
            got_sizes, got_slots, got_rows = sess.run([ex.owner_sizes, ex.slots,
                                                       ex.owner_rows])

    send, counts, *_ = routes[1]
    token = twins[1].process(send, counts, None, True)
    twins[1].gather(token)
    slots, rows, sizes = split_hand_over(twins[1].hand_over(token), len(twins[1].tables),
                                         send.shape[0] * send.shape[1])
    np.testing.assert_array_equal(got_sizes, sizes)
    np.testing.assert_array_equal(got_slots, slots)
    np.testing.assert_array_equal(got_rows, rows)
    # Admission off: every key owns a row; the sizes add up to the rows.
    assert sizes.sum() == rows.shape[0] and (rows >= 0).all()
    assert sizes[1] == (0 if batch == "empty_table" else 3)
