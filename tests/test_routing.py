"""Multi-worker key routing (``distributed/routing.py``) and the worker's place from
``TF_CONFIG`` (``distributed/cluster.py``), in one process.

N workers are simulated with N ``KeyRouter``s, each with its own table shards; the
all-to-alls of a step are numpy stacking (worker r receives row r of every send buffer).
Results are checked against plain numpy/Python references: per-key weighted counts, owners
``key mod N``, admission at a weighted count >= threshold, and SGD's
``w - lr * (sum of every worker's gradients)``.
"""

import json

import numpy as np
import pytest
import tensorflow as tf

import sparseflow as sf
from sparseflow.distributed.cluster import World, local_tf_config, world_from_env
from sparseflow.distributed.routing import KeyRouter, split_hand_over
from sparseflow.ops import shard_kernels
from sparseflow.distributed.sharding import PAD_KEY, owner_of
from sparseflow.embed.table_config import make_table_config
from sparseflow.optimizers.gradient_descent import GradientDescent
from sparseflow.optimizers.hparams import sgd_hparams
from sparseflow.table import SparseTable, _default_seed

LR = 0.5
CAPACITY = 1000
TABLES = (("wide", 4), ("narrow", 2))            # (name, dim): different dims
FEATURES = ((1, 1), (0, 1), (0, 3))              # (table, faae coefficient), batch order:
#                                                  features 1 and 2 share "wide"
TABLE_OF = [t for t, _ in FEATURES]
COEFS = [c for _, c in FEATURES]
DIMS = [TABLES[t][1] for t in TABLE_OF]          # each feature's embedding width
GARBAGE = np.float32(1e6)                        # in gradient slots that must be ignored
HUGE = np.array([2**63 - 1, -(2**63), 2**62 + 3, -(2**62) - 5, 2**40 + 7], np.int64)


# -- tables, routers and a simulated all-to-all ------------------------------------------


def make_table(name, dim, threshold):
    init = tf.compat.v1.truncated_normal_initializer(stddev=0.1, seed=3)
    cfg = make_table_config(tf.int64, dim, name, init, device_vocabulary_size=CAPACITY)
    table = SparseTable(cfg, _default_seed(name), rows_on="host")
    table.access_threshold = table.processor.threshold = threshold
    table.rows.bind_optimizer(GradientDescent(sgd_hparams(learning_rate=LR), runtime=False))
    return table


def make_router(n, threshold=-1, hash="mod", send_count=None):
    shards = [make_table(name, dim, threshold) for name, dim in TABLES]
    return KeyRouter(shards, TABLE_OF, COEFS, world_size=n, hash=hash, send_count=send_count)


def ref_owner(key, n, hash="mod"):
    if hash == "mod":
        return int(key) % n                       # Python's % is non-negative
    return int(owner_of(np.array([key], np.int64), n, "mix")[0])


def pad_to(send, m):
    n, width, _ = send.shape
    out = np.empty((n, m, 2), np.int64)
    out[..., 0] = PAD_KEY
    out[..., 1] = 0
    out[:, :width] = send
    return out


def run_step(routers, batches, timestamp, train=True, grads=None):
    """One step of ``len(routers)`` workers: route, all-to-all, owners' lookups, replies
    back, and (``grads`` given) gradients to the owners and their updates.

    Args:
      batches: ``batches[s][f]`` worker s's int64 keys of feature f.
      grads: ``grads[s][f]`` float ``[len, dim_f]``: each occurrence's gradient.

    Returns:
      ``(embeddings, tokens, routes)``: ``embeddings[s][f]`` float32 ``[len, dim_f]`` what
      worker s reads for its keys of feature f; each owner's token; each worker's route.
    """
    n = len(routers)
    t_count = len(TABLES)
    d = routers[0].max_dim
    routes = [router.route(batch) for router, batch in zip(routers, batches)]
    m = max(route[0].shape[1] for route in routes)     # the agreed width (a Max reduce)
    sends = [pad_to(route[0], m) for route in routes]
    replies, tokens = [], []
    for r, router in enumerate(routers):
        received = np.stack([sends[s][r] for s in range(n)])
        counts = np.stack([routes[s][1][r] for s in range(n)])
        reply, token = router.lookup(received, counts, timestamp, train)
        assert reply.shape == (n, m, d) and reply.dtype == np.float32
        for s in range(n):                         # padding reads zeros
            assert not reply[s, counts[s].sum():].any()
        replies.append(reply)
        tokens.append(int(token))
    embeddings, where_of, unique_of = [], [], []
    for s in range(n):
        _, _, place, gather, sizes = routes[s]
        back = np.stack([replies[r][s] for r in range(n)])
        where = place[:, 0].astype(np.int64) * m + place[:, 1]
        unique = back.reshape(-1, d)[where]
        segments = np.split(gather, np.cumsum(sizes[t_count:])[:-1])
        embeddings.append([unique[g][:, :dim] for g, dim in zip(segments, DIMS)])
        where_of.append(where)
        unique_of.append((segments, sizes[:t_count]))
    if grads is not None:
        table_dims = np.array([dim for _, dim in TABLES])
        to_owners = []
        for s in range(n):
            segments, per_table = unique_of[s]
            unique_grads = np.zeros((int(per_table.sum()), d), np.float32)
            # Columns past a unique key's table dim: never read by the update.
            unique_dims = np.repeat(table_dims, per_table)
            unique_grads[np.arange(d)[None, :] >= unique_dims[:, None]] = GARBAGE
            for g, dim, occurrence in zip(segments, DIMS, grads[s]):
                np.add.at(unique_grads[:, :dim], g, np.asarray(occurrence, np.float32))
            buffer = np.full((n * m, d), GARBAGE, np.float32)     # padding slots too
            buffer[where_of[s]] = unique_grads
            to_owners.append(buffer.reshape(n, m, d))
        for r, router in enumerate(routers):
            updated = router.update(tokens[r], np.stack([to_owners[s][r] for s in range(n)]))
            assert int(updated) == t_count
    return embeddings, tokens, routes


class Reference:
    """One table's admission counts and rows in plain Python: what any number of workers
    must agree with. Initial values come from a fresh unsharded table (they depend only on
    the initializer and the key)."""

    def __init__(self, name, dim, threshold):
        self.dim, self.threshold = dim, threshold
        self.oracle = make_table(name, dim, -1)
        self.counts, self.values = {}, {}

    def initial(self, key):
        keys = np.array([key], np.int64)
        result = self.oracle.processor.process(keys, np.array([1], np.int64),
                                               np.array([1], np.int32), True)
        return self.oracle.rows.gather(result.rows)[0].astype(np.float64)

    def train(self, keys, weights):
        """Counts a step's keys (every worker's); returns what each key reads."""
        for key, w in zip(keys.tolist(), weights.tolist()):
            self.counts[key] = self.counts.get(key, 0) + w
        for key in set(keys.tolist()):
            if key not in self.values and (self.threshold < 0
                                           or self.counts[key] >= self.threshold):
                self.values[key] = self.initial(key)
        return self.read(keys)

    def read(self, keys):
        zero = np.zeros(self.dim)
        return np.array([self.values.get(k, zero) for k in keys.tolist()]).reshape(-1,
                                                                                   self.dim)

    def apply(self, keys, grads):
        summed = {}
        for key, g in zip(keys.tolist(), np.asarray(grads, np.float64)):
            summed[key] = summed.get(key, 0) + g
        for key, g in summed.items():
            if key in self.values:
                self.values[key] = self.values[key] - LR * g


def check_layout(router, feature_keys, out, hash="mod"):
    """``route``'s output against a plain-Python dedup, owner rule and layout."""
    send, counts, place, gather, sizes = out
    n, t_count = router.world_size, len(TABLES)
    assert send.dtype == np.int64 and send.ndim == 3 and send.shape[::2] == (n, 2)
    assert counts.dtype == np.int32 and counts.shape == (n, t_count)
    assert place.dtype == np.int32 and gather.dtype == np.int32 and sizes.dtype == np.int64
    tables, coefs = TABLE_OF, COEFS
    weights = [{} for _ in range(t_count)]      # per table: unique key -> weighted count
    for f, keys in enumerate(feature_keys):
        for key in np.asarray(keys).reshape(-1).tolist():
            weights[tables[f]][key] = weights[tables[f]].get(key, 0) + coefs[f]
    lengths = [np.asarray(k).size for k in feature_keys]
    np.testing.assert_array_equal(sizes, [len(w) for w in weights] + lengths)
    if router.send_count is None:
        assert send.shape[1] == max(int(counts.sum(1).max()), 1)
    else:
        assert send.shape[1] == router.send_count * t_count
    segment = np.zeros((n, t_count, 2), np.int64)     # [start, end) of table t in row r
    for r in range(n):
        start = 0
        for t in range(t_count):
            mine = {k: w for k, w in weights[t].items() if ref_owner(k, n, hash) == r}
            assert counts[r, t] == len(mine)
            seg = send[r, start:start + counts[r, t]]
            assert len(set(seg[:, 0].tolist())) == len(mine)          # each key once
            assert dict(zip(seg[:, 0].tolist(), seg[:, 1].tolist())) == mine
            segment[r, t] = start, start + counts[r, t]
            start += counts[r, t]
        assert (send[r, start:, 0] == PAD_KEY).all() and (send[r, start:, 1] == 0).all()
    # place: every table's unique keys, table after table, at their entries.
    block_starts = np.concatenate([[0], np.cumsum(sizes[:t_count])])
    assert place.shape == (block_starts[-1], 2)
    assert len({tuple(p) for p in place.tolist()}) == place.shape[0]
    for t in range(t_count):
        block = place[block_starts[t]:block_starts[t + 1]]
        keys_at = send[block[:, 0], block[:, 1], 0]
        assert sorted(keys_at.tolist()) == sorted(weights[t])
        lo, hi = segment[block[:, 0], t, 0], segment[block[:, 0], t, 1]
        assert ((lo <= block[:, 1]) & (block[:, 1] < hi)).all()     # in table t's segment
    # gather: every feature's keys, feature after feature, through place to their entries.
    assert gather.shape == (sum(lengths),)
    offset = 0
    for f, keys in enumerate(feature_keys):
        g = gather[offset:offset + lengths[f]]
        offset += lengths[f]
        t = tables[f]
        assert ((block_starts[t] <= g) & (g < block_starts[t + 1])).all()
        np.testing.assert_array_equal(send[place[g, 0], place[g, 1], 0],
                                      np.asarray(keys).reshape(-1))


def random_batch(rng, sizes=(9, 12, 7)):
    pool = np.concatenate([np.arange(-6, 18), HUGE, [-1]]).astype(np.int64)
    return [rng.choice(pool, size) for size in sizes]


# -- 1. route's layout -------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 3, 4])
def test_route_lays_out_each_tables_unique_keys_by_owner_with_their_weighted_counts(n):
    rng = np.random.default_rng(n)
    router = make_router(n)
    for _ in range(3):
        batch = random_batch(rng)
        batch[0] = np.concatenate([batch[0], batch[1][:3]])   # keys in both tables
        check_layout(router, batch, router.route(batch))
    # Duplicates over the two features of one table add their coefficients (1 and 3).
    out = router.route([np.array([5, 5]), np.array([7, 8, 7]), np.array([7, -1, -1])])
    check_layout(router, [np.array([5, 5]), np.array([7, 8, 7]), np.array([7, -1, -1])], out)
    entries = {(t, k): w for r in range(n) for t, (k, w) in _row_entries(out, r)}
    assert entries == {(1, 5): 2, (0, 7): 2 + 3, (0, 8): 1, (0, -1): 6}


def _row_entries(out, r):
    send, counts = out[0], out[1]
    start = 0
    for t, c in enumerate(counts[r]):
        for k, w in send[r, start:start + c].tolist():
            yield t, (k, w)
        start += c


def test_route_of_empty_features_and_an_empty_batch():
    router = make_router(3)
    batch = [np.zeros(0, np.int64), np.array([4, 4, 9]), np.zeros(0, np.int64)]
    check_layout(router, batch, router.route(batch))
    empty = [np.zeros(0, np.int64)] * 3
    out = router.route(empty)
    check_layout(router, empty, out)
    assert out[0].shape == (3, 1, 2) and out[2].shape == (0, 2) and out[3].shape == (0,)


# -- 2. N workers train like one ---------------------------------------------------------


def _step_batches(rng, step, n):
    """Random keys for ``n`` workers plus keys that pin down admission at threshold 2
    (feature 0: table "narrow", coefficient 1)."""
    batches = [random_batch(rng) for _ in range(n)]
    designed = {0: {0: [10**12 + 1, 10**12 + 2], 1: [10**12 + 1], 2: [10**12 + 3]},
                1: {0: [10**12 + 3], 1: [-(10**12) - 4], 2: []}}[step]
    for s in range(n):
        batches[s][0] = np.concatenate([batches[s][0], np.array(designed[s], np.int64)])
    return batches


@pytest.mark.parametrize("threshold, hash", [(-1, "mod"), (2, "mod"), (2, "mix"), (1, "mod")])
def test_three_workers_read_admit_and_train_like_one(threshold, hash):
    n = 3
    rng = np.random.default_rng(11 + threshold)
    workers = [make_router(n, threshold, hash) for _ in range(n)]
    single = make_router(1, threshold, hash)
    refs = [Reference(name, dim, threshold) for name, dim in TABLES]
    tables, coefs = TABLE_OF, COEFS
    for step, timestamp in enumerate([100, 250]):
        batches = _step_batches(rng, step, n)
        grads = [[rng.normal(0, 0.05, (k.shape[0], DIMS[f])) for f, k in enumerate(b)]
                 for b in batches]
        emb, tokens, _ = run_step(workers, batches, timestamp, grads=grads)
        assert all(t > 0 for t in tokens)
        joined = [np.concatenate([b[f] for b in batches]) for f in range(len(FEATURES))]
        joined_grads = [np.concatenate([g[f] for g in grads]) for f in range(len(FEATURES))]
        emb1, _, _ = run_step([single], [joined], timestamp, grads=[joined_grads])
        # What every worker reads is what one worker reads on the whole global batch.
        for f in range(len(FEATURES)):
            np.testing.assert_allclose(np.concatenate([e[f] for e in emb]), emb1[0][f],
                                       rtol=0, atol=1e-6)
        # ... and what the reference admits and holds (before this step's update).
        expected = []
        for t, ref in enumerate(refs):
            members = [f for f in range(len(FEATURES)) if tables[f] == t]
            keys = np.concatenate([joined[f] for f in members])
            weights = np.concatenate([np.full(joined[f].shape[0], coefs[f]) for f in members])
            read = ref.train(keys, weights)
            expected.append(dict(zip(keys.tolist(), read)))
        for f in range(len(FEATURES)):
            t = tables[f]
            want = np.array([expected[t][k] for k in joined[f].tolist()]).reshape(-1,
                                                                                  refs[t].dim)
            got = np.concatenate([e[f] for e in emb])
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
        for t, ref in enumerate(refs):
            members = [f for f in range(len(FEATURES)) if tables[f] == t]
            ref.apply(np.concatenate([joined[f] for f in members]),
                      np.concatenate([joined_grads[f] for f in members]))
        if threshold == 2:    # "narrow" admits at 2 occurrences, over all workers
            read = _narrow_reads(emb, batches)
            if step == 0:
                assert read(0, 10**12 + 1).any() and read(1, 10**12 + 1).any()  # 1 + 1
                np.testing.assert_array_equal(read(0, 10**12 + 1), read(1, 10**12 + 1))
                assert not read(0, 10**12 + 2).any() and not read(2, 10**12 + 3).any()
            else:
                assert read(0, 10**12 + 3).any()          # its 2nd occurrence, a step later
                assert not read(1, -(10**12) - 4).any()
    _check_final_state(workers, single, refs, hash, timestamp=250)


def _narrow_reads(emb, batches):
    """What worker s read for ``key`` of feature 0 (table "narrow")."""
    return lambda s, key: emb[s][0][batches[s][0].tolist().index(key)]


def _check_final_state(workers, single, refs, hash, timestamp):
    n = len(workers)
    for t, ref in enumerate(refs):
        seen = np.array(sorted(ref.counts), np.int64)
        admitted = np.isin(seen, np.array(sorted(ref.values), np.int64))
        owners = np.array([ref_owner(k, n, hash) for k in seen.tolist()])
        want = ref.read(seen)
        for r, router in enumerate(workers):
            table = router.tables[t]
            rows = table.processor.lookup(seen)
            # A key lives in exactly one shard: its owner's, once admitted.
            np.testing.assert_array_equal(rows >= 0, admitted & (owners == r))
            held = rows >= 0
            np.testing.assert_allclose(table.rows.gather(rows[held]), want[held],
                                       rtol=0, atol=1e-6)
            assert table.stats()["clock"] == timestamp
        one = single.tables[t]
        np.testing.assert_allclose(one.rows.gather(one.processor.lookup(seen)), want,
                                   rtol=0, atol=1e-6)
        for field, value in [("keys_held", int(admitted.sum())),
                             ("keys_counted_not_admitted", int((~admitted).sum()))]:
            assert sum(w.tables[t].stats()[field] for w in workers) == value
            assert one.stats()[field] == value
    # An evaluation step reads the trained rows (zeros for keys without one) on every
    # worker, for keys it sends and keys it never saw.
    rng = np.random.default_rng(5)
    tables = TABLE_OF
    all_keys = [np.array(sorted(ref.counts) + [10**15, -(10**15)], np.int64) for ref in refs]
    batches = [[rng.permutation(all_keys[tables[f]]) for f in range(len(FEATURES))]
               for _ in range(n)]
    emb, tokens, _ = run_step(workers, batches, timestamp + 1, train=False)
    assert tokens == [0] * n
    for s in range(n):
        for f in range(len(FEATURES)):
            np.testing.assert_allclose(emb[s][f], refs[tables[f]].read(batches[s][f]),
                                       rtol=0, atol=1e-6)


# -- 3. send_count -----------------------------------------------------------------------


def test_a_table_sending_an_owner_more_than_send_count_keys_names_table_count_and_setting():
    router = make_router(2, send_count=2)
    batch = [np.array([1, 3, 5, 1, 3, 2]), np.array([0, 1]), np.array([4])]
    with pytest.raises(sf.SendCountOverflowError,
                       match=r"Table `narrow`: a batch sends 3 unique keys to worker 1 of 2, "
                             r"more than distributed\.send_count=2\. Set "
                             r"`distributed\.send_count` to at least 3"):
        router.route(batch)
    # Occurrences do not count, unique keys do: 2 per owner and table fit exactly.
    ok = [np.array([1, 3, 1, 3, 3, 2]), np.array([0, 1, 0, 0]), np.array([2, 5])]
    out = router.route(ok)
    assert out[0].shape == (2, 2 * 2, 2)      # send_count x tables
    check_layout(router, ok, out)
    # A wider setting: still every table after another, padded to send_count x tables.
    wide = make_router(2, send_count=3)
    out = wide.route(batch)
    assert out[0].shape == (2, 3 * 2, 2)
    check_layout(wide, batch, out)


def test_send_count_buffers_exchange_and_read_back_like_dynamic_ones():
    rng = np.random.default_rng(3)
    batches = [random_batch(rng, (5, 6, 4)) for _ in range(2)]
    fixed = [make_router(2, send_count=20) for _ in range(2)]
    dynamic = [make_router(2) for _ in range(2)]
    a, _, routes = run_step(fixed, batches, 7)
    b, _, _ = run_step(dynamic, batches, 7)
    assert all(r[0].shape[1] == 20 * len(TABLES) for r in routes)
    refs = [Reference(name, dim, -1) for name, dim in TABLES]
    for s in range(2):
        for f in range(len(FEATURES)):
            want = refs[TABLE_OF[f]].train(batches[s][f], np.ones(batches[s][f].shape[0]))
            np.testing.assert_array_equal(a[s][f], want.astype(np.float32))
            np.testing.assert_array_equal(b[s][f], want.astype(np.float32))


# -- 4. evaluation lookups ---------------------------------------------------------------


def test_evaluation_lookups_read_without_counting_admitting_or_touching_anything():
    n = 2
    workers = [make_router(n, threshold=2) for _ in range(n)]
    train = [[np.array([1, 2, 2]), np.array([10, 11]), np.array([12])],
             [np.array([1, 4]), np.array([10]), np.array([11, 20])]]
    zero = [[np.zeros((k.shape[0], dim)) for k, dim in zip(b, DIMS)] for b in train]
    emb, _, _ = run_step(workers, train, 100, grads=zero)
    read_1 = emb[0][0][0]
    assert read_1.any() and not emb[1][0][1].any()   # 1 admitted (1 + 1), 4 counted only

    def state():
        out = []
        for router in workers:
            for table in router.tables:
                keys, rows = table.processor.admitted()
                order = np.argsort(keys)
                out.append((table.stats(), keys[order].tolist(),
                            table.rows.read(rows[order]).tolist()))
        return out

    before = state()
    unknown = np.array([99, -5, 99, 99, 2**63 - 1], np.int64)
    evaluate = [[np.concatenate([[1, 2, 4], unknown]), np.array([10, 99]), np.array([99])],
                [np.concatenate([unknown, [4, 1]]), np.array([11, 12, 20]), np.array([-5])]]
    emb, tokens, _ = run_step(workers, evaluate, 10**6, train=False)
    assert tokens == [0, 0]
    assert state() == before           # no count, admission, row, timestamp or clock
    np.testing.assert_array_equal(emb[0][0][0], read_1)
    assert emb[0][0][1].any()                                        # 2: weight 2
    assert not emb[0][0][2:].any() and not emb[1][0][:-1].any()     # 4 and unknown keys
    np.testing.assert_array_equal(emb[1][0][-1], read_1)
    assert emb[0][1].any(axis=1).tolist() == [True, False]           # "wide": 10 (1 + 1), 99
    # The 4 evaluation occurrences of 99 were not counted: one training one admits nothing.
    nothing = np.zeros(0, np.int64)
    emb, _, _ = run_step(workers, [[np.array([99, 4]), nothing, nothing], [nothing] * 3], 200)
    assert not emb[0][0][0].any() and emb[0][0][1].any()   # 99: 1 < 2; 4: 1 + 1


# -- 5. the mixed owner rule -------------------------------------------------------------


def test_mix_hash_routes_keys_to_their_mixed_owners():
    router = make_router(4, hash="mix")
    skewed = np.arange(0, 400, 4, dtype=np.int64)            # all owned by 0 under mod
    batch = [skewed, np.concatenate([skewed[:30], HUGE]), skewed[::3] * -1]
    out = router.route(batch)
    check_layout(router, batch, out, hash="mix")
    assert (out[1][:, 1] > 0).all()     # "narrow" (skewed keys only) reaches every worker


# -- 6. helpers --------------------------------------------------------------------------


@pytest.mark.parametrize("padding", [0, 2])
@pytest.mark.parametrize("counts", [[[0]], [[3, 0, 2]], [[0, 5], [2, 0]],
                                    [[4, 1, 0], [0, 0, 2], [1, 1, 1]], np.zeros((2, 0))])
def test_take_received_concatenates_each_tables_entries_sender_after_sender(counts, padding):
    counts = np.array(counts, np.int32)
    n, n_tables = counts.shape
    m = max(int(counts.sum(1).max(initial=0)) + padding, 1)   # the widest row full or not
    rng = np.random.default_rng(counts.size)
    received = rng.integers(-(2**62), 2**62, (n * m, 2)).astype(np.int64)
    received[:, 1] = rng.integers(1, 9, n * m)
    want, ends = [], []
    for t in range(n_tables):                       # table t's range in sender s's row
        for s in range(n):
            first = s * m + int(counts[s, :t].sum())
            want.extend(range(first, first + int(counts[s, t])))
        ends.append(len(want))
    entries, keys, weights, got_ends, ok = shard_kernels.take_received(received, counts, m)
    assert ok and entries.tolist() == want and got_ends.tolist() == ends
    assert keys.tolist() == [int(received[i, 0]) for i in want]
    assert weights.dtype == np.int32
    assert weights.tolist() == [int(received[i, 1]) for i in want]


@pytest.mark.parametrize("counts", [[[2, -1]], [[3, 2]], [[1, 1], [0, 5]]])
def test_counts_that_do_not_fit_the_received_buffer_are_refused_before_anything_is_read(
        counts):
    counts = np.array(counts, np.int32)              # m = 4 below
    received = np.zeros((counts.shape[0] * 4, 2), np.int64)
    assert not shard_kernels.take_received(received, counts, 4)[-1]
    router = make_router(counts.shape[0])
    with pytest.raises(ValueError, match=r"counts received .* (1|2) x 4 entries"):
        router.process(received.reshape(counts.shape[0], 4, 2), counts, None, True)
    assert not router._pending                       # noqa: SLF001 -- nothing was taken


@pytest.mark.parametrize("mixed", [False, True])
@pytest.mark.parametrize("n, size", [(1, 0), (1, 5), (3, 0), (3, 1), (4, 40), (7, 9)])
def test_owned_unique_keys_joins_the_tables_keys_with_their_owners_and_counts(n, size, mixed):
    """Each table's unique keys (at its start in dedup_batch's layout, gaps between) joined
    one table after another, each key's owner by the rule, and keys per owner and table."""
    rng = np.random.default_rng(size + n)
    n_unique = np.array([size // 3, 0, size - size // 3], np.int64)   # an empty table too
    starts = np.array([0, size // 3 + 2, size // 3 + 5], np.int64)
    uniq = rng.integers(-(2**62), 2**62, size + 5).astype(np.int64)
    weight = rng.integers(1, 5, size + 5).astype(np.int64)
    joined = np.concatenate([uniq[a:a + u] for a, u in zip(starts, n_unique)])
    weights = np.concatenate([weight[a:a + u] for a, u in zip(starts, n_unique)])
    total = int(n_unique.sum())
    uniq_all, weight_all = np.empty(total, np.int64), np.empty(total, np.int64)
    owner_all, table_ends = np.empty(total, np.int32), np.empty(3, np.int64)
    counts = np.full((n, 3), 99, np.int32)
    shard_kernels.owned_unique_keys(uniq, weight, starts, n_unique, n, mixed, uniq_all,
                                    weight_all, owner_all, table_ends, counts)
    np.testing.assert_array_equal(uniq_all, joined)
    np.testing.assert_array_equal(weight_all, weights)
    np.testing.assert_array_equal(table_ends, np.cumsum(n_unique))
    want_owner = (owner_of(joined, n, "mix") if mixed
                  else np.array([k % n for k in joined.tolist()], np.int32))
    np.testing.assert_array_equal(owner_all, want_owner)
    tables = np.repeat(np.arange(3), n_unique)
    for o in range(n):
        for t in range(3):
            assert counts[o, t] == int(((want_owner == o) & (tables == t)).sum())


def test_place_restores_offsets_each_features_restore_by_its_tables_first_key():
    """Segments in table order (feature 2 then 0 of table 0, feature 1 of table 1) come out
    feature after feature, each restore index shifted by its table's first unique key."""
    restore = np.array([0, 1, 0, 2, 2, 1, 0, 0, 1], np.int32)
    lengths = np.array([4, 2, 3], np.int64)   # per feature: 0 has 4 keys, 1 has 2, 2 has 3
    features = np.array([2, 0, 1], np.int64)
    segment_tables = np.array([0, 0, 1], np.int64)
    table_firsts = np.array([0, 3], np.int64)
    out = np.full(9, -7, np.int32)
    shard_kernels.place_restores(restore, lengths, features, segment_tables, table_firsts,
                                 out)
    # feature 0 (restore[3:7], table 0), feature 1 (restore[7:9] + 3), feature 2 (restore[0:3])
    assert out.tolist() == [2, 2, 1, 0] + [3, 4] + [0, 1, 0]


@pytest.mark.parametrize("n, size", [(1, 0), (1, 5), (3, 0), (3, 1), (4, 40), (7, 9)])
def test_lay_out_keys_puts_each_table_after_the_previous_in_its_owners_row(n, size):
    rng = np.random.default_rng(size + n)
    owner = rng.integers(0, n, size).astype(np.int32)
    uniq = rng.integers(-(2**62), 2**62, size).astype(np.int64)
    weight = rng.integers(1, 5, size).astype(np.int64)
    table_ends = np.array([size // 3, size // 3, size], np.int64)   # an empty table too
    tables = np.searchsorted(table_ends, np.arange(size), side="right")
    counts = np.array([[int(((owner == o) & (tables == t)).sum()) for t in range(3)]
                       for o in range(n)], np.int32).reshape(n, 3)
    width = max(int(counts.sum(1).max()) if size else 0, 1)
    starts = (np.cumsum(counts, axis=1) - counts).astype(np.int64)
    send = np.full((n * width, 2), -1, np.int64)
    place = np.empty((size, 2), np.int32)
    shard_kernels.lay_out_keys(uniq, weight, owner, table_ends, starts.copy(), width, send,
                               place)
    seen = [0] * n   # plain-Python reference: each owner's row filled in key order
    for u in range(size):
        o = int(owner[u])
        assert place[u].tolist() == [o, seen[o]]
        assert send[o * width + seen[o]].tolist() == [int(uniq[u]), int(weight[u])]
        seen[o] += 1


def test_scatter_rows_mark_owned_and_sum_entries_against_numpy():
    rng = np.random.default_rng(3)
    storage = rng.normal(size=(10, 6)).astype(np.float32)          # weights | a slot
    rows = np.array([4, -1, 7], np.int32)
    restore = np.array([2, 0, 0, 1, 2], np.int32)
    entries = np.array([9, 0, 5, 3, 1], np.int64)
    reply = np.full((12, 5), 7.0, np.float32)
    shard_kernels.scatter_rows(storage, rows, restore, entries, 3, reply)
    for i, e in enumerate(entries):
        r = rows[restore[i]]
        want = np.zeros(3, np.float32) if r < 0 else storage[r, :3]
        np.testing.assert_array_equal(reply[e, :3], want)
        np.testing.assert_array_equal(reply[e, 3:], 7.0)   # past dim: untouched
    shard_kernels.mark_owned(rows, restore, entries, 4, reply)
    want_flags = np.full(12, 7.0, np.float32)
    want_flags[entries] = rows[restore] >= 0
    np.testing.assert_array_equal(reply[:, 4], want_flags)
    np.testing.assert_array_equal(reply[entries, 3], 7.0)   # other columns: untouched
    grads = rng.normal(size=(12, 5)).astype(np.float32)
    out = np.zeros((3, 3), np.float32)
    shard_kernels.sum_entries(grads, entries, restore, 3, out)
    want = np.zeros((3, 3), np.float32)
    np.add.at(want, restore, grads[entries, :3])
    np.testing.assert_allclose(out, want, rtol=1e-6)


# -- 7. the world from TF_CONFIG ---------------------------------------------------------


def _config(workers=("a:1", "b:2"), index=0, type="worker", **cluster):
    return json.dumps({"cluster": {"worker": list(workers), **cluster},
                       "task": {"type": type, "index": index}})


def test_world_from_env_without_tf_config_is_none(monkeypatch):
    assert world_from_env({}) is None
    assert world_from_env({"TF_CONFIG": ""}) is None
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert world_from_env() is None
    monkeypatch.setenv("TF_CONFIG", _config(index=1))
    assert world_from_env() == World(1, 2)


def test_world_from_env_reads_index_and_size():
    world = world_from_env({"TF_CONFIG": _config(("h:1", "h:2", "h:3"), 2)})
    assert world == World(2, 3) and not world.chief
    assert world_from_env({"TF_CONFIG": _config(("h:1",), 0)}).chief


@pytest.mark.parametrize("raw, match", [
    ("not json", r"TF_CONFIG must be JSON like .*received 'not json' \(JSONDecodeError"),
    (json.dumps({"cluster": {"worker": ["a:1"]}}), r"must be JSON like .*KeyError: 'task'"),
    (json.dumps({"task": {"type": "worker", "index": 0}}), r"KeyError: 'cluster'"),
    (json.dumps([1, 2]), r"must be JSON like .*TypeError"),
    (_config(index=2), (r"task must be .* with i in \[0, 1\]; received \{'type': 'worker', "
                        r"'index': 2\}")),
    (_config(index=-1), r"with i in \[0, 1\]"),
    (_config(index=True), r"with i in \[0, 1\]"),
    (_config(index="0"), r"with i in \[0, 1\]"),
    (_config(type="chief"), r"task must be"),
    (_config(chief=["c:1"]), r"cluster must list workers only .*jobs \['chief', 'worker'\]"),
    (_config(ps=["p:1"]), r"workers only \(no chief, ps or evaluator"),
    (_config(workers=()), (r"cluster\.worker must be a non-empty list of 'host:port' "
                           r"strings; received \[\]")),
    (_config(workers=("a:1", 2)), r"non-empty list of 'host:port' strings"),
])
def test_world_from_env_rejects_what_is_not_a_worker_cluster(raw, match):
    with pytest.raises(ValueError, match=match):
        world_from_env({"TF_CONFIG": raw})


@pytest.mark.parametrize("n", [1, 2, 8])
def test_local_tf_config_round_trips(n):
    ports = [20000 + 7 * i for i in range(n)]
    for i in range(n):
        raw = local_tf_config(ports, i)
        assert world_from_env({"TF_CONFIG": raw}) == World(i, n)
        assert json.loads(raw)["cluster"]["worker"] == [f"localhost:{p}" for p in ports]


@pytest.mark.parametrize("op,factor", [("sum_gradients", 2.0),
                                       ("sum_gradients_and_div_by_ranksize", 1.0)])
def test_an_owner_sums_a_keys_gradients_from_the_ranks_or_averages_them(op, factor):
    """Key 4 arrives from both workers with gradient 1 each: summed (2) by default, divided
    by the number of workers under Rec SDK's all2all_gradients_op
    "sum_gradients_and_div_by_ranksize" (1)."""
    import dataclasses

    table = make_table("t", 2, -1)
    table.config = dataclasses.replace(table.config, all2all_gradients_op=op)
    router = KeyRouter([table], [0], [1], world_size=2)
    received = np.array([[[4, 1]], [[4, 1]]], np.int64)
    token = router.process(received, np.array([[1], [1]], np.int32), None, True)
    router.gather(token)
    ((rows, summed),) = router.sum_gradients(token, np.ones((2, 1, 2), np.float32))
    assert rows.shape == (1,) and rows[0] >= 0
    np.testing.assert_array_equal(summed, np.full((1, 2), factor, np.float32))
    assert not router._pending   # noqa: SLF001 -- the step is released


def test_a_steps_gradients_release_the_steps_before_it_and_a_second_update_is_named():
    """A training step whose gradients never came (a forward-only run) is released by the
    next step's; applying a step's gradients twice names the token."""
    table = make_table("t", 2, -1)
    router = KeyRouter([table], [0], [1], world_size=1)
    received = np.array([[[4, 1]]], np.int64)
    first = router.process(received, np.array([[1]], np.int32), None, True)
    router.gather(first)
    second = router.process(received, np.array([[1]], np.int32), None, True)
    router.gather(second)
    router.sum_gradients(second, np.ones((1, 1, 2), np.float32))
    assert not router._pending   # noqa: SLF001 -- the first step went with the second
    assert not table.processor._outstanding   # noqa: SLF001 -- and so did its batch
    with pytest.raises(RuntimeError, match=rf"Keys of step token {int(second)} are not "
                                           rf"pending: their gradients were applied already"):
        router.sum_gradients(second, np.ones((1, 1, 2), np.float32))


@pytest.mark.parametrize("threshold", [-1, 2])
def test_a_handed_over_step_sums_by_its_slots_as_sum_gradients_does(threshold):
    """``hand_over``'s slots, rows and sizes (the TF2 faces' update as TF ops) against
    ``sum_gradients`` on a twin router given the same step: a numpy sum of every entry's
    gradient by its slot gives each table's keys' rows and summed gradients (padding and
    a narrower table's extra columns, filled with garbage, never reach a key); the token
    is done and its batch released."""
    batch = [np.array([5, 12, 5, 40], np.int64), np.array([7, 9, 12, 7, 7], np.int64),
             np.array([9, 3, 3], np.int64)]
    twins = [make_router(2, threshold=threshold) for _ in range(2)]
    for table in twins[0].tables:
        table.processor.track_in_flight = True   # as a table that trains tracks its batches
    steps = []
    for router in twins:
        send, counts, *_ = router.route(batch)
        received = pad_to(send, send.shape[1] + 3)   # padding entries too
        token = router.process(received, counts, None, True)
        router.gather(token)
        steps.append((token, received))
    n, m = steps[0][1].shape[:2]
    grads = np.random.default_rng(threshold + 5).normal(size=(n, m, 4)).astype(np.float32)
    assert all(table.processor._outstanding for table in twins[0].tables)   # noqa: SLF001
    packed = twins[0].hand_over(steps[0][0])
    slots, rows, sizes = split_hand_over(packed, len(twins[0].tables), n * m)
    assert packed.shape == (len(twins[0].tables) + n * m + rows.shape[0],)
    reference = twins[1].sum_gradients(steps[1][0], grads)
    assert slots.dtype == rows.dtype == sizes.dtype == np.int32
    assert slots.shape == (n * m,) and sizes.tolist() == [r.shape[0] for r, _ in reference]
    summed = np.zeros((rows.shape[0] + 1, 4), np.float32)
    np.add.at(summed, slots, grads.reshape(-1, 4))
    starts = np.concatenate([[0], np.cumsum(sizes)])
    for t, (want_rows, want) in enumerate(reference):
        dim = TABLES[t][1]
        np.testing.assert_array_equal(rows[starts[t]:starts[t + 1]], want_rows)
        np.testing.assert_allclose(summed[starts[t]:starts[t + 1], :dim], want, rtol=1e-6,
                                   atol=1e-6)
    assert (want_rows < 0).any() == (threshold > 0)   # keys without a row stay -1
    assert not twins[0]._pending   # noqa: SLF001 -- the token is done
    for table in twins[0].tables:
        # Consumed for checkpoints; in flight for eviction until its update has run.
        assert not len(table.processor.journal) and table.processor._outstanding  # noqa: SLF001
    with pytest.raises(RuntimeError, match="not pending"):
        twins[0].hand_over(steps[0][0])
    evaluation = twins[0].process(steps[0][1], counts, None, False)
    with pytest.raises(RuntimeError, match="an evaluation's"):
        twins[0].hand_over(evaluation)
    twins[0].gather(evaluation)   # an evaluation's batch is released when read
    assert all(table.processor._outstanding for table in twins[0].tables)  # noqa: SLF001
    for table in twins[0].tables:   # the update, as the optimizers count it
        table.rows.optimizer.next_step(table.table_name)
    twins[0].gather(twins[0].process(steps[0][1], counts, None, False))
    for table in twins[0].tables:   # released by the lookup after the update
        assert not table.processor._outstanding   # noqa: SLF001



def test_handed_over_batches_whose_update_never_comes_cost_a_lookup_nothing_more(monkeypatch):
    """Training lookups whose update never comes (a training-mode call without a gradient)
    leave their batches waiting: beyond the cap the oldest are released, and a lookup
    checks each table's waiting batches from the oldest, stopping at the first still
    waiting: its work does not grow with how many wait."""
    from sparseflow.distributed import routing

    monkeypatch.setattr(routing, "_UPDATES_AWAITED", 8)
    router = make_router(1)
    for table in router.tables:
        table.processor.track_in_flight = True   # as a table that trains tracks its batches
    batch = [np.array([5, 12, 5], np.int64), np.array([7, 9], np.int64),
             np.array([9, 3], np.int64)]
    send, counts, *_ = router.route(batch)
    for _ in range(40):
        token = router.process(send, counts, None, True)
        router.gather(token)
        router.hand_over(token)
    for table in router.tables:   # the cap's newest and the last one wait; older released
        assert len(table.processor._outstanding) == 8 + 1   # noqa: SLF001
    checked = []
    count = routing._update_count   # noqa: SLF001
    monkeypatch.setattr(routing, "_update_count", lambda table: checked.append(table) or
                        count(table))
    router.process(send, counts, None, True)   # not handed over: it stays in flight
    assert len(checked) == len(router.tables)   # one look per table, not per batch waiting
    for table in router.tables:   # the cap's newest wait, and the batch just processed
        assert len(table.processor._outstanding) == 8 + 1   # noqa: SLF001
        table.rows.optimizer.set_steps(table.table_name, 1000)   # their updates have run
    checked.clear()
    router.process(send, counts, None, True)
    assert len(checked) == len(router.tables)
    for table in router.tables:   # every waiting batch released; the two processed remain
        assert len(table.processor._outstanding) == 2   # noqa: SLF001

def test_the_tf2_faces_update_at_the_owners_with_compiled_ops():
    """On several ranks a TF2 training step's owner-side update is TF ops (the gradient's
    sum, lazy Adam's compiled op): the step's one numpy function is the owner's lookup.
    Tables a compiled op cannot update (tiers, device rows) keep the numpy function."""
    from sparseflow.ops import optimizer_ops
    from sparseflow.optimizers.hparams import lazy_adam_hparams
    from sparseflow.optimizers.lazy_adam import LazyAdam
    from sparseflow.tf2.sharding import Tf2Sharding

    adam = LazyAdam(lazy_adam_hparams(0.1), runtime=False)
    tables = []
    for name, dim in TABLES:
        cfg = make_table_config(tf.int64, dim, name, tf.zeros_initializer(),
                                device_vocabulary_size=CAPACITY)
        tables.append(SparseTable(cfg, _default_seed(name), rows_on="host"))
        tables[-1].rows.bind_optimizer(adam)
    bound = Tf2Sharding(0, 2).bind(tables, [1, 0, 0])
    router = bound.router
    assert router.updates_in_graph

    @tf.function
    def step(a, b, c):
        batch = bound.route(tf.constant(7, tf.int64), [a, b, c], stamped=False)
        rows = bound.embeddings(batch, True, DIMS)
        return bound.update(batch, [tf.ones_like(r) for r in rows])

    spec = tf.TensorSpec([None], tf.int64)
    ops = step.get_concrete_function(spec, spec, spec).graph.get_operations()
    python = [op.name for op in ops if op.type in ("PyFunc", "PyFuncStateless", "EagerPyFunc")]
    assert len(python) == 1 and "sparseflow_owner_lookup" in python[0]
    assert optimizer_ops.LAZY_ADAM_TABLES in {op.type for op in ops}
    router.tables[0].tiers = object()   # as a tiered table: not read by compiled ops
    assert not router.updates_in_graph


def test_create_table_keeps_all2all_gradients_op_and_checks_it():
    cfg = make_table_config(tf.int64, 4, "t", tf.zeros_initializer(),
                            all2all_gradients_op="sum_gradients_and_div_by_ranksize")
    assert cfg.all2all_gradients_op == "sum_gradients_and_div_by_ranksize"
    assert make_table_config(tf.int64, 4, "t", tf.zeros_initializer()
                             ).all2all_gradients_op == "sum_gradients"
    with pytest.raises(ValueError, match="all2all_gradients_op"):
        make_table_config(tf.int64, 4, "t", tf.zeros_initializer(), all2all_gradients_op="mean")


def test_gathers_has_row_flag_column_marks_the_entries_whose_key_owns_a_row():
    """With ``flags`` the reply's last column is 1.0 at every entry whose key owns a row and
    0.0 elsewhere (keys not admitted, padding), next to the entry's embedding (numpy
    reference: the processor's rows of the received keys)."""
    router = make_router(2, threshold=2)
    # Worker 0 sends keys 10 (weight 1) and 12 (weight 2) of the wide table and 7 (weight
    # 2) of the narrow one; worker 1 sends 10 again (now weight 2 in all: admitted), 11
    # (weight 1: not admitted) and padding.
    received = np.array([[[10, 1], [12, 2], [7, 2]],
                         [[10, 1], [11, 1], [PAD_KEY, 0]]], np.int64)
    counts = np.array([[2, 1], [2, 0]], np.int32)   # [sender, table]
    token = router.process(received, counts, None, True)
    reply = router.gather(token, flags=True)
    assert reply.shape == (2, 3, max(d for _, d in TABLES) + 1)
    flags = reply[..., -1]
    np.testing.assert_array_equal(flags, [[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert router.tables[0].processor.lookup(np.array([11], np.int64))[0] == -1
    np.testing.assert_array_equal(reply[1, 1:, :-1], 0.0)
    for (s, j), key, table in (((0, 0), 10, 0), ((0, 1), 12, 0), ((0, 2), 7, 1),
                               ((1, 0), 10, 0)):
        shard = router.tables[table]
        row = shard.processor.lookup(np.array([key], np.int64))[0]
        assert row >= 0
        np.testing.assert_array_equal(reply[s, j, :shard.dim], shard.rows.gather([row])[0])


def test_a_router_refuses_an_unknown_owner_rule_or_world_size_when_made():
    shards = [make_table(name, dim, -1) for name, dim in TABLES]
    with pytest.raises(ValueError, match="hash"):
        KeyRouter(shards, TABLE_OF, COEFS, world_size=2, hash="crc")
    with pytest.raises(ValueError, match="world_size"):
        KeyRouter(shards, TABLE_OF, COEFS, world_size=0)
