"""Key-side kernels (``dedup``, ``assign_rows``, ``touch_rows``) and
``KeyProcessor.process`` against independent numpy / pure Python references.

The admission reference (:class:`RefProcessor`) is a dict ``key -> [count, row]`` updated one
unique key at a time in first-occurrence order, written from the documented semantics only:
training counts += weighted occurrences (saturating at 2^31 - 1); a key with no row takes the
next row when its count reaches the threshold (threshold < 0: at first sight); keys below the
threshold stay as counted entries and read -1; the eval channel reads only; a batch that would
admit more keys than there are free rows raises and changes nothing.
"""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest

import sparseflow as sf
from sparseflow.ops import key_kernels as kk
from sparseflow.ops.hash_index import COUNT_MAX, EMPTY, HashIndex
from sparseflow.pipeline import key_processor as kpmod
from sparseflow.pipeline.key_processor import (KeyProcessor, SendCountOverflowError,
                                               TableFullError)

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
EXTREME_KEYS = [0, -1, -2, 1, INT64_MIN, INT64_MAX]


# --- helpers ---------------------------------------------------------------------------------

def segments(*parts):
    """(keys, seg_ends, seg_coefs) from (keys, coefficient) pairs."""
    keys = np.concatenate([np.asarray(k, np.int64) for k, _ in parts]) if parts else \
        np.zeros(0, np.int64)
    ends = np.cumsum([len(k) for k, _ in parts]).astype(np.int64) if parts else \
        np.zeros(1, np.int64)
    coefs = np.array([c for _, c in parts] or [1], np.int32)
    return keys, ends, coefs


def occurrence_coefs(keys, seg_ends, seg_coefs):
    lens = np.diff(np.concatenate([[0], seg_ends]))
    return np.repeat(seg_coefs.astype(np.int64), lens)[: keys.shape[0]]


def new_scratch(n):
    p = kk.scratch_slots(n)
    return np.zeros(p, np.int64), np.zeros(p, np.int64)   # keys, tags (all generation 0)


def run_dedup(keys, seg_ends, seg_coefs, scratch=None, generation=1):
    n = keys.shape[0]
    if scratch is None:
        scratch = new_scratch(n)
    uniq = np.full(n, 777, np.int64)
    restore = np.full(n, -5, np.int32)
    weight = np.full(n, -9, np.int64)
    u = kk.dedup(keys, seg_ends, seg_coefs, scratch[0], scratch[1], generation, uniq, restore,
                 weight)
    return u, uniq[:u], restore, weight[:u], scratch


def check_tags(scratch, generation, uniq):
    """The documented scratch contract: exactly U slots carry this generation's stamp, their
    low 32 bits are the unique positions 0..U-1 and the slot holds that unique key."""
    skeys, tags = scratch
    live = np.flatnonzero((tags >> 32) == generation)
    assert live.shape[0] == uniq.shape[0]
    pos = tags[live] & 0xFFFFFFFF
    assert sorted(pos.tolist()) == list(range(uniq.shape[0]))
    np.testing.assert_array_equal(skeys[live], uniq[pos])


def scratch_home(key, p):
    """The scratch slot dedup puts ``key`` in when it is alone (found through the tags)."""
    scratch = (np.zeros(p, np.int64), np.zeros(p, np.int64))
    kk.dedup(np.array([key], np.int64), np.array([1], np.int64), np.ones(1, np.int32),
             scratch[0], scratch[1], 1, np.empty(1, np.int64), np.empty(1, np.int32),
             np.empty(1, np.int64))
    (slot,) = np.flatnonzero(scratch[1] >> 32 == 1)
    return int(slot)


def np_dedup_reference(keys, seg_ends, seg_coefs):
    """First-occurrence-ordered unique keys, restore and weights via np.unique / np.add.at."""
    if keys.shape[0] == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    sorted_uniq, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")           # sorted position -> first-occurrence rank
    rank = np.empty_like(order)
    rank[order] = np.arange(order.shape[0])
    uniq = sorted_uniq[order]
    restore = rank[inverse.reshape(-1)]
    weight = np.zeros(uniq.shape[0], np.int64)
    np.add.at(weight, restore, occurrence_coefs(keys, seg_ends, seg_coefs))
    return uniq, restore, weight


class InitRecorder:
    def __init__(self):
        self.calls = []

    def __call__(self, rows, keys):
        assert rows.dtype == np.int32 and keys.dtype == np.int64
        assert rows.shape == keys.shape and rows.shape[0] > 0
        self.calls.append((rows.copy(), keys.copy()))

    def pairs(self, start=0):
        return sorted((int(r), int(k)) for rows, keys in self.calls[start:]
                      for r, k in zip(rows, keys))


def snapshot(kp: KeyProcessor):
    return dict(keys=kp.index.keys.copy(), rows=kp.index.rows.copy(),
                counts=kp.index.counts.copy(), state=kp.state.copy(),
                free_rows=kp.free_rows.copy(), last_seen=kp.last_seen.copy(),
                clock=int(kp.clock), size=kp.index.size, capacity=kp.index.capacity)


def assert_same(a, b):
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def index_dict(kp: KeyProcessor):
    k, r, c = kp.index.entries()
    return {int(a): (int(cc), int(rr)) for a, rr, cc in zip(k, r, c)}


class RefTableFull(Exception):
    pass


class RefProcessor:
    """Pure Python model of admission and row assignment for one table."""

    def __init__(self, row_limit, threshold):
        self.row_limit = row_limit
        self.threshold = -1 if threshold is None else threshold
        self.entries = {}          # key -> (count, row); row -1: counted, not admitted
        self.next_row = 0
        self.last_seen = np.zeros(row_limit, np.int64)
        self.clock = INT64_MIN

    def admits(self, count):
        return self.threshold < 0 or count >= self.threshold

    def process(self, keys, seg_ends, seg_coefs, train, timestamp=None):
        """Returns (row per occurrence, unique keys in first-occurrence order, new (row, key))."""
        weight, order = {}, []
        for k, c in zip(keys.tolist(), occurrence_coefs(keys, seg_ends, seg_coefs).tolist()):
            if k not in weight:
                weight[k] = 0
                order.append(k)
            weight[k] += c
        if train:
            plan, admit = {}, set()
            for k in order:
                count, row = self.entries.get(k, (0, -1))
                if self.threshold != 0:  # threshold 0 admits everything and stops counting
                    count = min(count + weight[k], COUNT_MAX)
                if row < 0 and self.admits(count):
                    admit.add(k)
                plan[k] = (count, row)
            free = self.row_limit - self.next_row
            if len(admit) > free:
                raise RefTableFull(self.next_row + len(admit))
            new = []
            for k in order:
                count, row = plan[k]
                if k in admit:
                    row = self.next_row
                    self.next_row += 1
                    new.append((row, k))
                self.entries[k] = (count, row)
            if timestamp is not None:
                for k in order:
                    row = self.entries[k][1]
                    if row >= 0:
                        self.last_seen[row] = max(self.last_seen[row], timestamp)
                self.clock = max(self.clock, timestamp)
        else:
            new = []
        row_of = {k: max(self.entries.get(k, (0, -1))[1], -1) for k in order}
        return np.array([row_of[k] for k in keys.tolist()], np.int64), order, sorted(new)


def check_batch(kp, ref, rec, keys, seg_ends, seg_coefs, train, timestamp=None, pad_to=None):
    """Runs one batch through both and compares everything observable."""
    n_calls = len(rec.calls)
    try:
        exp_occ, order, exp_new = ref.process(keys, seg_ends, seg_coefs, train, timestamp)
    except RefTableFull as e:
        before = snapshot(kp)
        with pytest.raises(TableFullError, match=rf"at least {e.args[0]}\b"):
            kp.process(keys, seg_ends, seg_coefs, train, timestamp, pad_to)
        assert_same(before, snapshot(kp))
        assert len(rec.calls) == n_calls
        return None
    res = kp.process(keys, seg_ends, seg_coefs, train, timestamp, pad_to)
    u = len(order)
    assert res.rows.dtype == np.int32 and res.restore.dtype == np.int32
    assert res.rows.shape == ((u,) if pad_to is None else (pad_to,))
    assert (res.rows[u:] == -1).all()
    np.testing.assert_array_equal(res.restore, [order.index(k) for k in keys.tolist()]
                                  if keys.shape[0] < 200 else
                                  np_dedup_reference(keys, seg_ends, seg_coefs)[1])
    np.testing.assert_array_equal(res.rows[res.restore], exp_occ)
    assert res.n_new == len(exp_new)
    assert rec.pairs(n_calls) == exp_new
    assert len(rec.calls) == n_calls + (1 if exp_new else 0)
    # Index contents, row bookkeeping and timestamps.
    assert index_dict(kp) == ref.entries
    assert kp.index.size == len(ref.entries)
    assert kp.size == ref.next_row
    assert kp.rows_free == ref.row_limit - ref.next_row
    np.testing.assert_array_equal(kp.last_seen, ref.last_seen)
    assert int(kp.clock) == ref.clock
    live = [r for _, r in ref.entries.values() if r >= 0]
    assert len(live) == len(set(live)) and all(0 <= r < ref.row_limit for r in live)
    return res


def make(row_limit=1000, threshold=None, capacity_hint=4, **kw):
    rec = InitRecorder()
    kp = KeyProcessor("my_table", row_limit, threshold, rec, capacity_hint=capacity_hint, **kw)
    return kp, RefProcessor(row_limit, threshold), rec


# --- dedup -----------------------------------------------------------------------------------

def test_scratch_slots():
    assert kk.scratch_slots(0) == 16
    for n in list(range(0, 70)) + [1000, 4096, 4097, 10**6]:
        p = kk.scratch_slots(n)
        assert p >= 16 and p >= 2 * n and p & (p - 1) == 0
        assert p == 16 or p // 2 < 2 * n   # the smallest such power of two


@pytest.mark.parametrize("seed", range(6))
def test_dedup_matches_np_unique(seed):
    rng = np.random.default_rng(seed)
    n_seg = int(rng.integers(1, 5))
    parts = []
    for _ in range(n_seg):
        n = int(rng.integers(0, 300))
        if seed % 2:
            k = rng.integers(-20, 20, n)   # heavy duplication
        else:
            k = rng.choice(np.concatenate([rng.integers(INT64_MIN, INT64_MAX, 50, np.int64,
                                                        endpoint=True), EXTREME_KEYS]), n)
        parts.append((k, int(rng.integers(1, 5))))
    keys, ends, coefs = segments(*parts)
    u, uniq, restore, weight, scratch = run_dedup(keys, ends, coefs)
    ref_uniq, ref_restore, ref_weight = np_dedup_reference(keys, ends, coefs)
    assert u == np.unique(keys).shape[0]
    np.testing.assert_array_equal(uniq, ref_uniq)
    np.testing.assert_array_equal(restore, ref_restore)
    np.testing.assert_array_equal(weight, ref_weight)
    np.testing.assert_array_equal(uniq[restore], keys)
    check_tags(scratch, 1, uniq)


def test_dedup_first_occurrence_order_and_segment_weights_by_hand():
    keys, ends, coefs = segments(([5, -2, 5, 0], 1), ([], 7), ([0, 9, -2], 3), ([9], 2))
    u, uniq, restore, weight, scratch = run_dedup(keys, ends, coefs)
    assert u == 4
    assert uniq.tolist() == [5, -2, 0, 9]
    assert restore.tolist() == [0, 1, 0, 2, 2, 3, 1, 3]
    assert weight.tolist() == [2, 1 + 3, 1 + 3, 3 + 2]
    check_tags(scratch, 1, uniq)


def test_dedup_empty_keys():
    for ends in (np.zeros(1, np.int64), np.zeros(3, np.int64)):
        keys = np.zeros(0, np.int64)
        coefs = np.ones(ends.shape[0], np.int32)
        u, uniq, restore, weight, scratch = run_dedup(keys, ends, coefs)
        assert u == 0 and uniq.shape == restore.shape == weight.shape == (0,)
        check_tags(scratch, 1, uniq)


def test_dedup_all_duplicates():
    keys, ends, coefs = segments(([INT64_MIN] * 100, 1), ([INT64_MIN] * 50, 4))
    u, uniq, restore, weight, scratch = run_dedup(keys, ends, coefs)
    assert u == 1 and uniq.tolist() == [INT64_MIN]
    assert (restore == 0).all() and weight.tolist() == [100 + 200]
    check_tags(scratch, 1, uniq)


def test_dedup_reuses_one_scratch_across_generations():
    """As the key processor does: one scratch, a fresh generation per call. Slots stamped by an
    earlier generation (holding other keys) must read as free."""
    rng = np.random.default_rng(9)
    scratch = new_scratch(512)
    for gen in range(1, 61):
        n = int(rng.integers(0, 513))
        keys, ends, coefs = segments((rng.integers(-300, 300, n // 2), 1),
                                     (rng.integers(-300, 300, n - n // 2), 2))
        u, uniq, restore, weight, _ = run_dedup(keys, ends, coefs, scratch, generation=gen)
        ref_uniq, ref_restore, ref_weight = np_dedup_reference(keys, ends, coefs)
        np.testing.assert_array_equal(uniq, ref_uniq)
        np.testing.assert_array_equal(restore, ref_restore)
        np.testing.assert_array_equal(weight, ref_weight)
        check_tags(scratch, gen, uniq)


def test_dedup_large_generation_stamps():
    scratch = new_scratch(100)
    keys, ends, coefs = segments((np.array([3, 1, 3, 2, 1]), 1))
    for gen in (2**31 - 1, 2**31 - 2, 1):
        u, uniq, restore, weight, _ = run_dedup(keys, ends, coefs, scratch, generation=gen)
        assert uniq.tolist() == [3, 1, 2] and restore.tolist() == [0, 1, 0, 2, 1]
        assert weight.tolist() == [2, 2, 1]
        check_tags(scratch, gen, uniq)


def test_dedup_at_full_scratch_load_with_colliding_keys():
    """N = P/2 keys crowded onto the last scratch slots and slot 0 (long runs that wrap)."""
    p = kk.scratch_slots(8)  # 16 slots, load 0.5 at 8 unique keys
    homes = {p - 1: [], p - 2: [], 0: []}
    for k in range(-20000, 20000):
        h = scratch_home(k, p)
        if h in homes:
            homes[h].append(k)
        if len(homes[p - 1]) >= 4 and len(homes[p - 2]) >= 2 and len(homes[0]) >= 2:
            break
    crowd = homes[p - 1][:4] + homes[p - 2][:2] + homes[0][:2]
    assert len(crowd) == 8
    rng = np.random.default_rng(1)
    scratch = (np.zeros(p, np.int64), np.zeros(p, np.int64))
    for gen in range(1, 51):
        perm = rng.permutation(crowd)
        keys, ends, coefs = segments((np.concatenate([perm, perm[::-1], perm[:3]]), 1))
        u, uniq, restore, weight, _ = run_dedup(keys, ends, coefs, scratch, generation=gen)
        assert u == 8
        np.testing.assert_array_equal(uniq, perm)
        np.testing.assert_array_equal(uniq[restore], keys)
        np.testing.assert_array_equal(weight, [3, 3, 3, 2, 2, 2, 2, 2])
        check_tags(scratch, gen, uniq)


def _batch_tables(rng, n_tables):
    """(keys, seg_ends, seg_coefs, table_segs, per-table (keys, ends, coefs)) of a batch of
    ``n_tables`` tables with 0-3 segments each (empty tables and segments included)."""
    tables, all_keys, seg_ends, coefs, table_segs = [], [], [], [], []
    at = 0
    for t in range(n_tables):
        parts = []
        for _ in range(int(rng.integers(0, 4))):
            n = int(rng.integers(0, 400))
            pool = rng.integers(INT64_MIN, INT64_MAX, int(rng.integers(1, 300)), np.int64,
                                endpoint=True)
            parts.append((rng.choice(np.concatenate([pool, EXTREME_KEYS]), n),
                          int(rng.integers(1, 4))))
        keys, ends, c = segments(*parts) if parts else (np.zeros(0, np.int64),
                                                       np.zeros(0, np.int64),
                                                       np.zeros(0, np.int32))
        tables.append((keys, ends, c))
        all_keys.append(keys)
        seg_ends.extend(at + ends)
        coefs.extend(c)
        at += keys.shape[0]
        table_segs.append(len(seg_ends))
    return (np.concatenate(all_keys), np.asarray(seg_ends, np.int64),
            np.asarray(coefs, np.int32), np.asarray(table_segs, np.int64), tables)


@pytest.mark.parametrize("seed", range(6))
def test_dedup_batch_matches_np_unique_per_table(seed):
    """One kernel call over every table gives each table what np.unique gives it alone."""
    rng = np.random.default_rng(seed)
    keys, seg_ends, coefs, table_segs, tables = _batch_tables(rng, int(rng.integers(1, 9)))
    batch = kpmod.dedup_batch(keys, seg_ends, coefs, table_segs)
    for t, (table_keys, ends, c) in enumerate(tables):
        uniq, restore, weight, u = batch.table(t)
        assert restore.shape[0] == table_keys.shape[0]
        if table_keys.shape[0] == 0:
            assert u == 0
            continue
        ref_uniq, ref_restore, ref_weight = np_dedup_reference(table_keys, ends, c)
        assert u == ref_uniq.shape[0]
        np.testing.assert_array_equal(uniq[:u], ref_uniq)
        np.testing.assert_array_equal(restore, ref_restore)
        np.testing.assert_array_equal(weight[:u], ref_weight)
    # The batch's restore array is every table's restore vector in table order.
    np.testing.assert_array_equal(
        batch.restore, np.concatenate([batch.table(t)[1] for t in range(len(tables))]))


@pytest.mark.parametrize("seg_ends,table_segs", [
    ([3, 5, 9], [1, 3]),            # two tables
    ([3, 5, 9], [0, 0, 2, 2, 3]),   # tables without segments first and between
    ([4], [1]),                      # one table
    ([], []),                        # no tables
    ([0, 0, 6], [2, 3]),             # empty segments
])
def test_table_bounds_against_numpy(seg_ends, table_segs):
    """Where each table's keys lie and the most any table has, against the numpy formula
    the kernel replaced."""
    seg_ends, table_segs = np.array(seg_ends, np.int64), np.array(table_segs, np.int64)
    ends = np.zeros(table_segs.shape[0], np.int64)
    ends[table_segs > 0] = seg_ends[table_segs[table_segs > 0] - 1]
    starts = np.concatenate(([0], ends[:-1])).astype(np.int64) if ends.shape[0] else ends
    got_starts, got_ends, longest = kk.table_bounds(seg_ends, table_segs)
    np.testing.assert_array_equal(got_starts, starts)
    np.testing.assert_array_equal(got_ends, ends)
    assert longest == (int((ends - starts).max()) if ends.shape[0] else 0)


def _next_scratch(n_keys):
    """The scratch the next call on this thread borrows, fitted for ``n_keys`` keys.

    White-box: the pool lends the scratch returned last, so this holds while nothing else
    borrows in between (no other thread of this process processes keys meanwhile)."""
    with kpmod.borrow_scratch() as scratch:
        return scratch.fit(n_keys)


def test_dedup_batch_stamps_one_generation_per_table_and_wraps():
    """Each table stamps its own generation (a key in two tables is unique in each), and the
    stamps wrap past 2^31 - 1 with the scratch cleared."""
    keys, ends, coefs = segments(([3, 4, 3], 1), ([4, 3, 4, 5], 2), ([3], 1))
    table_segs = np.array([1, 2, 3], np.int64)
    scratch = _next_scratch(8)
    scratch.tags[:] = 0   # no tag of an earlier test may read as live at the stamps set here
    scratch.generation = 2**31 - 6
    gens = []
    for _ in range(3):
        batch = kpmod.dedup_batch(keys, ends, coefs, table_segs)
        gens.append(_next_scratch(8).generation)
        assert batch.n_unique.tolist() == [2, 3, 1]
        assert batch.table(1)[0][:3].tolist() == [4, 3, 5]
        assert batch.table(1)[2][:3].tolist() == [4, 2, 2]
        assert batch.restore.tolist() == [0, 1, 0, 0, 1, 0, 2, 0]
    assert gens == [2**31 - 3, 3, 6]   # the second batch's 3 stamps would pass 2^31 - 1


def test_process_unique_of_a_batch_dedup_equals_process():
    """Two processors fed by one batch dedup end as two fed by their own dedups."""
    rng = np.random.default_rng(7)
    pairs = [(make(threshold=2), make(threshold=2)), (make(threshold=None), make(threshold=None))]
    for step in range(12):
        keys, seg_ends, coefs, table_segs, tables = _batch_tables(rng, 2)
        batch = kpmod.dedup_batch(keys, seg_ends, coefs, table_segs)
        train = step % 4 > 0
        for t, ((a, _, _), (b, _, _)) in enumerate(pairs):
            table_keys, ends, c = tables[t]
            if not ends.shape[0]:
                ends, c = np.zeros(1, np.int64), np.ones(1, np.int32)
            expected = a.process(table_keys, ends, c, train, 100 + step)
            got = b.process_unique(*batch.table(t), train, 100 + step)
            np.testing.assert_array_equal(got.rows, expected.rows)
            np.testing.assert_array_equal(got.restore, expected.restore)
            assert got.n_new == expected.n_new
    for (a, _, _), (b, _, _) in pairs:
        np.testing.assert_array_equal(b.last_seen, a.last_seen)
        np.testing.assert_array_equal(b.index.keys[b.index.rows != EMPTY],
                                      a.index.keys[a.index.rows != EMPTY])


def test_key_processor_generation_wrap_keeps_dedup_exact():
    """After 2^31 - 1 generations the dedup scratch is cleared and stamps restart at 1: tags
    left by the first batch (generation 1) must not be taken for live slots afterwards.
    White-box: drives the processor's pooled scratch close to the wrap."""
    kp, ref, rec = make(threshold=2)
    rng = np.random.default_rng(12)
    check_batch(kp, ref, rec, *segments((rng.integers(0, 50, 60), 1)), True)
    scratch = _next_scratch(62)
    scratch.generation = 2**31 - 3
    gens = []
    for _ in range(6):
        check_batch(kp, ref, rec, *segments((rng.integers(0, 50, 60), 1), ([7, 7], 2)), True)
        gens.append(_next_scratch(62).generation)
    assert gens == [2**31 - 2, 2**31 - 1, 1, 2, 3, 4]


def test_tables_sharing_a_scratch_stay_separate():
    """Interleaved batches of two tables of very different sizes (the scratch regrows)."""
    rng = np.random.default_rng(21)
    a, ref_a, rec_a = make(threshold=2)
    b, ref_b, rec_b = make(threshold=None)
    for i in range(20):
        n = int(rng.integers(0, 3000)) if i % 3 == 0 else int(rng.integers(0, 40))
        check_batch(a, ref_a, rec_a, *segments((rng.integers(0, 200, n), 1)), True)
        check_batch(b, ref_b, rec_b, *segments((rng.integers(150, 400, 40 - n % 40), 2)), i % 4 > 0)


def test_concurrent_tables_on_separate_threads():
    """Tables processed at the same time on different threads (each call borrows its own
    scratch from the pool)."""
    def worker(seed, errors):
        try:
            rng = np.random.default_rng(seed)
            kp, ref, rec = make(threshold=int(seed % 3))
            for i in range(40):
                n = int(rng.integers(0, 2000))
                check_batch(kp, ref, rec, *segments((zipf_keys(rng, n), 1),
                                                    (zipf_keys(rng, n // 3), 2)), i % 5 > 0)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    errors = []
    threads = [threading.Thread(target=worker, args=(seed, errors)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_concurrent_large_dedups_on_separate_threads():
    """Big batches so that the kernels (which drop the GIL) really overlap across threads."""
    barrier = threading.Barrier(2)

    def worker(seed, errors):
        try:
            rng = np.random.default_rng(seed)
            kp, _, _ = make(threshold=None, row_limit=2_000_000, capacity_hint=1 << 16)
            for _ in range(12):
                keys, ends, coefs = segments(
                    (rng.integers(0, 60_000, int(rng.integers(50_000, 150_000))) + seed * 10**6,
                     1))
                barrier.wait()
                res = kp.process(keys, ends, coefs, True)
                _, ref_restore, _ = np_dedup_reference(keys, ends, coefs)
                np.testing.assert_array_equal(res.restore, ref_restore)
                np.testing.assert_array_equal(res.rows[res.restore], kp.lookup(keys))
                assert (res.rows >= 0).all()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)
            barrier.abort()

    errors = []
    threads = [threading.Thread(target=worker, args=(seed, errors)) for seed in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_concurrent_batches_on_one_table():
    """num_parallel_calls: threads process batches of one table at once (kernels drop the GIL).
    Counting commutes, so the end state is order-independent: counts are the totals, the
    admitted keys are those whose total reaches the threshold, rows are 0..size-1, each
    initialised once, and every row a batch was given is the key's final row."""
    threshold = 3
    kp, _, rec = make(threshold=threshold, row_limit=100_000, capacity_hint=8)
    rng = np.random.default_rng(33)
    batches = [segments((zipf_keys(rng, 500), 1), (zipf_keys(rng, 300), 2)) for _ in range(32)]
    results = [None] * len(batches)
    errors = []

    def worker(ids):
        try:
            for i in ids:
                results[i] = kp.process(*batches[i], True, timestamp=i)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(range(t, len(batches), 4),))
               for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    totals = {}
    for keys, ends, coefs in batches:
        for k, c in zip(keys.tolist(), occurrence_coefs(keys, ends, coefs).tolist()):
            totals[k] = totals.get(k, 0) + c
    final = index_dict(kp)
    assert {k: c for k, (c, _) in final.items()} == totals
    admitted = {k: r for k, (c, r) in final.items() if r >= 0}
    assert set(admitted) == {k for k, c in totals.items() if c >= threshold}
    assert sorted(admitted.values()) == list(range(len(admitted))) and kp.size == len(admitted)
    assert rec.pairs() == sorted((r, k) for k, r in admitted.items())
    for (keys, _, _), res in zip(batches, results):
        got = res.rows[res.restore]
        exp = np.array([admitted.get(k, -1) for k in keys.tolist()])
        assert ((got == exp) | (got == -1)).all()  # admitted later than this batch: -1
    assert int(kp.clock) == len(batches) - 1


# --- assign_rows / rows_needed, directly -----------------------------------------------------

def kernel_setup(capacity=64):
    idx = HashIndex(capacity)
    state = np.zeros(kk.STATE_LEN, np.int64)
    return idx, state


def call_assign(idx, state, uniq, weight, train, threshold, free_rows):
    uniq = np.asarray(uniq, np.int64)
    weight = np.asarray(weight, np.int64)
    n = uniq.shape[0]
    out = np.full(n, 99, np.int32)
    new_pos = np.full(n, -7, np.int32)
    state[kk.STATE_INDEX_SIZE] = idx.size
    n_new = kk.assign_rows(idx.keys, idx.rows, idx.counts, uniq, weight, n, train, threshold,
                           free_rows, state, out, new_pos)
    idx.size = int(state[kk.STATE_INDEX_SIZE])
    return out, new_pos[:n_new]


def test_assign_rows_takes_free_stack_top_first_then_next_row():
    idx, state = kernel_setup()
    state[kk.STATE_ROW_LIMIT] = 100
    state[kk.STATE_NEXT_ROW] = 10
    free = np.array([3, 7, 5, 0], np.int32)
    state[kk.STATE_FREE_TOP] = 3           # only 3, 7, 5 are valid; 5 is the top
    uniq = [40, 41, 42, 43, 44]
    needed = kk.rows_needed(idx.keys, idx.rows, idx.counts, np.array(uniq, np.int64),
                            np.ones(5, np.int64), 5, -1)
    assert needed == 5
    out, new_pos = call_assign(idx, state, uniq, [1] * 5, True, -1, free)
    assert out.tolist() == [5, 7, 3, 10, 11]
    assert new_pos.tolist() == [0, 1, 2, 3, 4]
    assert state.tolist() == [5, 12, 100, 0]
    assert free.tolist() == [3, 7, 5, 0]   # the stack itself is not rewritten
    np.testing.assert_array_equal(idx.lookup(np.array(uniq)), [5, 7, 3, 10, 11])


def test_assign_rows_counts_admits_at_threshold_and_saturates():
    idx, state = kernel_setup()
    state[kk.STATE_ROW_LIMIT] = 100
    free = np.zeros(0, np.int32)
    # threshold 3: weights 1, 2, 3 -> only the last is admitted on the first batch.
    out, new_pos = call_assign(idx, state, [1, 2, 3], [1, 2, 3], True, 3, free)
    assert out.tolist() == [-1, -1, 0] and new_pos.tolist() == [2]
    ent = {k: (c, r) for k, r, c in zip(*idx.entries())}
    assert ent == {1: (1, -1), 2: (2, -1), 3: (3, 0)}
    uniq, weight = np.array([1, 2, 3], np.int64), np.array([1, 1, 1], np.int64)
    assert kk.rows_needed(idx.keys, idx.rows, idx.counts, uniq, weight, 3, 3) == 1
    out, new_pos = call_assign(idx, state, uniq, weight, True, 3, free)
    assert out.tolist() == [-1, 1, 0] and new_pos.tolist() == [1]
    # Counts saturate at 2^31 - 1 instead of wrapping negative.
    idx.counts[idx.rows >= 0] = COUNT_MAX - 1
    call_assign(idx, state, [2, 3], [5, 2**40], True, 3, free)
    ent = {k: (c, r) for k, r, c in zip(*idx.entries())}
    assert ent == {1: (2, -1), 2: (COUNT_MAX, 1), 3: (COUNT_MAX, 0)}
    # A huge weight on a new key saturates too and admits it.
    out, _ = call_assign(idx, state, [4], [2**40], True, 3, free)
    assert out.tolist() == [2] and idx.counts[idx.rows == 2].tolist() == [COUNT_MAX]


def test_assign_rows_eval_channel_is_read_only():
    idx, state = kernel_setup()
    state[kk.STATE_ROW_LIMIT] = 100
    free = np.zeros(0, np.int32)
    call_assign(idx, state, [1, 2], [1, 5], True, 3, free)  # 1 unadmitted, 2 admitted at row 0
    arrays = (idx.keys.copy(), idx.rows.copy(), idx.counts.copy(), state.copy())
    out, new_pos = call_assign(idx, state, [2, 1, 3, EMPTY], [100, 100, 100, 100], False, 3,
                               free)
    assert out.tolist() == [0, -1, -1, -1] and new_pos.shape == (0,)
    for a, b in zip(arrays, (idx.keys, idx.rows, idx.counts, state)):
        np.testing.assert_array_equal(a, b)


# --- KeyProcessor: admission against the reference model -------------------------------------

@pytest.mark.parametrize("threshold", [None, -1, 0])
def test_admission_off_or_zero_admits_at_first_sight(threshold):
    kp, ref, rec = make(threshold=threshold)
    keys, ends, coefs = segments(([7, 8, 7, -2, 0], 1), ([INT64_MIN, 8], 2))
    res = check_batch(kp, ref, rec, keys, ends, coefs, True)
    assert res.rows.tolist() == [0, 1, 2, 3, 4]          # handed out 0, 1, 2, ...
    assert rec.pairs() == [(0, 7), (1, 8), (2, -2), (3, 0), (4, INT64_MIN)]
    res = check_batch(kp, ref, rec, *segments(([8, 99, 7], 1)), True)
    assert res.rows.tolist() == [1, 5, 0] and res.n_new == 1


def test_admitted_exactly_on_the_batch_the_count_reaches_the_threshold():
    kp, ref, rec = make(threshold=3)
    seen = []
    for batch in range(4):
        res = check_batch(kp, ref, rec, *segments(([11], 1), ([22, 22], 1), ([33], 3)), True)
        seen.append(res.rows.tolist())
    # 11: +1 per batch -> row on batch 3; 22: +2 -> batch 2; 33: +3 -> batch 1.
    assert seen == [[-1, -1, 0], [-1, 1, 0], [2, 1, 0], [2, 1, 0]]
    assert index_dict(kp) == {11: (4, 2), 22: (8, 1), 33: (12, 0)}


def test_unadmitted_keys_are_kept_counted_and_read_minus_one():
    kp, ref, rec = make(threshold=15)
    check_batch(kp, ref, rec, *segments(([1, 2, 1], 1), ([3], 4)), True)
    assert index_dict(kp) == {1: (2, -1), 2: (1, -1), 3: (4, -1)}
    assert kp.size == 0 and rec.calls == []
    np.testing.assert_array_equal(kp.lookup(np.array([1, 2, 3, 4])), [-1, -1, -1, -1])
    assert kp.admitted()[0].shape == (0,)


def test_eval_channel_reads_without_counting_or_allocating():
    kp, ref, rec = make(threshold=2, capacity_hint=1024)
    check_batch(kp, ref, rec, *segments(([1, 1, 2, 3, 3, 3], 1)), True, timestamp=50)
    before = snapshot(kp)
    calls = len(rec.calls)
    res = check_batch(kp, ref, rec, *segments(([3, 2, 1, 4, 5, 2], 1), ([2, 6], 3)), False,
                      timestamp=999)
    assert res.rows[res.restore].tolist() == [1, -1, 0, -1, -1, -1, -1, -1]
    assert res.n_new == 0 and len(rec.calls) == calls
    assert_same(before, snapshot(kp))


def test_eval_channel_leaves_index_arrays_untouched_even_when_full_of_unknown_keys():
    """Eval may not grow (reallocate and rehash) the index for keys it never inserts."""
    kp, ref, rec = make(threshold=None, capacity_hint=8)
    check_batch(kp, ref, rec, *segments((np.arange(5), 1)), True)
    before = snapshot(kp)
    res = check_batch(kp, ref, rec, *segments((np.arange(1000, 1200), 1), (np.arange(5), 1)),
                      False)
    assert (res.rows[:200] == -1).all() and res.rows[200:].tolist() == [0, 1, 2, 3, 4]
    assert_same(before, snapshot(kp))


def test_eval_with_unknown_keys_then_train_does_not_leak_state():
    kp, ref, rec = make(threshold=2)
    for _ in range(3):
        check_batch(kp, ref, rec, *segments(([5, 6], 1)), False)
    res = check_batch(kp, ref, rec, *segments(([5, 6], 1)), True)
    assert res.rows.tolist() == [-1, -1]           # eval did not count: count is 1, not 4
    res = check_batch(kp, ref, rec, *segments(([6], 1)), True)
    assert res.rows.tolist() == [0]


def test_init_callback_once_per_new_row_with_its_key():
    kp, ref, rec = make(threshold=2)
    check_batch(kp, ref, rec, *segments(([10, 20, 20, 30, 30, 30], 1)), True)
    assert rec.pairs() == [(0, 20), (1, 30)] and len(rec.calls) == 1
    check_batch(kp, ref, rec, *segments(([30, 20, 10], 1)), True)
    assert rec.pairs() == [(0, 20), (1, 30), (2, 10)] and len(rec.calls) == 2
    check_batch(kp, ref, rec, *segments(([30, 20, 10], 1)), True)
    assert len(rec.calls) == 2   # no new rows, no call


# --- table full: the no-silent-data-loss invariant -------------------------------------------

def test_table_full_raises_and_changes_nothing():
    kp, ref, rec = make(row_limit=10, threshold=None)
    check_batch(kp, ref, rec, *segments((np.arange(8), 1)), True, timestamp=5)
    before = snapshot(kp)
    keys, ends, coefs = segments((np.array([0, 1, 100, 101, 102, 1]), 1))
    with pytest.raises(TableFullError) as info:
        kp.process(keys, ends, coefs, True, timestamp=9)
    msg = str(info.value)
    assert "`my_table`" in msg and "`device_vocabulary_size`" in msg
    assert re.search(r"at least 11\b", msg)     # 8 used + 3 new
    assert "3 new keys" in msg and "2 rows are free" in msg
    assert_same(before, snapshot(kp))
    assert len(rec.calls) == 1
    # Two new keys still fit exactly: the exact-check path (U = 4 > 2 free rows).
    res = check_batch(kp, ref, rec, *segments(([0, 1, 100, 101], 1)), True, timestamp=9)
    assert res.rows.tolist() == [0, 1, 8, 9]
    assert kp.rows_free == 0
    # Known keys keep working at zero free rows; a single new key does not.
    check_batch(kp, ref, rec, *segments((np.arange(8), 1)), True, timestamp=10)
    check_batch(kp, ref, rec, *segments(([3, 555], 1)), True, timestamp=11)   # raises, checked
    assert 555 not in index_dict(kp)


def test_table_full_with_admission_does_not_count_the_rejected_batch():
    kp, ref, rec = make(row_limit=3, threshold=2, size_hint="host_vocabulary_size")
    check_batch(kp, ref, rec, *segments(([1, 1, 2, 2, 3, 4, 5], 1)), True)  # rows 0, 1 taken
    assert index_dict(kp) == {1: (2, 0), 2: (2, 1), 3: (1, -1), 4: (1, -1), 5: (1, -1)}
    before = snapshot(kp)
    keys, ends, coefs = segments(([3, 4, 5, 6, 1], 1))   # 3, 4, 5 reach 2: 3 rows, 1 free
    with pytest.raises(TableFullError, match=r"`host_vocabulary_size` to at least 5\b"):
        kp.process(keys, ends, coefs, True)
    assert_same(before, snapshot(kp))
    assert index_dict(kp)[3] == (1, -1) and 6 not in index_dict(kp)
    # Exact-check path that fits: U = 4 > 1 free, but only key 3 crosses the threshold.
    res = check_batch(kp, ref, rec, *segments(([3, 6, 7, 1], 1)), True)
    assert res.rows.tolist() == [2, -1, -1, 0]


def test_fast_path_with_many_free_rows():
    kp, ref, rec = make(row_limit=100_000, threshold=None, capacity_hint=16)
    rng = np.random.default_rng(0)
    keys = rng.integers(INT64_MIN, INT64_MAX, 20_000, np.int64, endpoint=True)
    res = check_batch(kp, ref, rec, *segments((keys[:15_000], 1), (keys[5_000:], 2)), True)
    assert res.n_new == 20_000 and sorted(res.rows.tolist()) == list(range(20_000))
    assert kp.index.size == 20_000 and kp.index.capacity >= 20_000 / 0.75


# --- static padding ---------------------------------------------------------------------------

def test_pad_to_pads_with_minus_one():
    kp, ref, rec = make(threshold=None)
    res = check_batch(kp, ref, rec, *segments(([4, 5, 4, 6], 1)), True, pad_to=7)
    assert res.rows.tolist() == [0, 1, 2, -1, -1, -1, -1]
    res = check_batch(kp, ref, rec, *segments(([6, 5, 4], 1)), False, pad_to=3)
    assert res.rows.tolist() == [2, 1, 0]
    res = check_batch(kp, ref, rec, *segments(([], 1)), True, pad_to=2)
    assert res.rows.tolist() == [-1, -1] and res.restore.shape == (0,)


@pytest.mark.parametrize("train", [True, False])
def test_send_count_overflow_names_the_unique_key_count_and_changes_nothing(train):
    kp, ref, rec = make(threshold=None)
    check_batch(kp, ref, rec, *segments(([1, 2], 1)), True)
    before = snapshot(kp)
    keys, ends, coefs = segments(([1, 2, 3, 4, 5, 3, 3], 1))
    with pytest.raises(SendCountOverflowError) as info:
        kp.process(keys, ends, coefs, train, timestamp=3, pad_to=4)
    msg = str(info.value)
    assert "`my_table`" in msg and "5 unique keys" in msg and "the 4 rows" in msg
    assert re.search(r">= 5\b", msg)
    assert_same(before, snapshot(kp))
    assert len(rec.calls) == 1
    assert issubclass(SendCountOverflowError, ValueError)
    assert sf.SendCountOverflowError is SendCountOverflowError
    assert sf.TableFullError is TableFullError and issubclass(TableFullError, RuntimeError)


# --- timestamps --------------------------------------------------------------------------------

def test_timestamps_only_on_the_training_channel():
    kp, ref, rec = make(threshold=2)
    assert int(kp.clock) == INT64_MIN
    check_batch(kp, ref, rec, *segments(([1, 1, 2], 1)), True, timestamp=100)
    assert kp.last_seen[0] == 100 and int(kp.clock) == 100
    check_batch(kp, ref, rec, *segments(([2, 3, 3], 1)), True, timestamp=200)
    assert kp.last_seen[:3].tolist() == [100, 200, 200]    # 1 untouched, 2 admitted now, 3 new
    check_batch(kp, ref, rec, *segments(([1, 2], 1)), False, timestamp=500)   # eval: no change
    assert kp.last_seen[:3].tolist() == [100, 200, 200] and int(kp.clock) == 200
    check_batch(kp, ref, rec, *segments(([1, 2], 1)), True, timestamp=150)    # older: max
    assert kp.last_seen[:3].tolist() == [150, 200, 200] and int(kp.clock) == 200
    check_batch(kp, ref, rec, *segments(([3, 9], 1)), True)                   # no timestamp
    assert kp.last_seen[:3].tolist() == [150, 200, 200] and int(kp.clock) == 200
    check_batch(kp, ref, rec, *segments(([9], 1)), True, timestamp=300)       # 9 -> row 3
    assert kp.last_seen[:4].tolist() == [150, 200, 200, 300] and int(kp.clock) == 300


def test_touch_rows_vs_numpy():
    rng = np.random.default_rng(4)
    last_seen = rng.integers(0, 1000, 50).astype(np.int64)
    rows = rng.integers(-1, 50, 80).astype(np.int32)
    n = 60
    expected = last_seen.copy()
    sel = rows[:n][rows[:n] >= 0]
    np.maximum.at(expected, sel, 500)
    kk.touch_rows(last_seen, rows, n, np.int64(500))
    np.testing.assert_array_equal(last_seen, expected)
    kk.touch_rows(last_seen, rows, 0, np.int64(10**6))
    np.testing.assert_array_equal(last_seen, expected)




# --- randomised multi-batch runs -------------------------------------------------------------

def zipf_keys(rng, n, a=1.3):
    z = rng.zipf(a, n).astype(np.uint64)
    return (z * np.uint64(0x9E3779B97F4A7C15)).view(np.int64)   # spread over all of int64


@pytest.mark.parametrize("threshold", [None, 0, 1, 3, 15])
@pytest.mark.parametrize("tight", [False, True])
def test_random_batches_vs_reference(threshold, tight):
    # tight: a row limit the run outgrows, so that some batches raise TableFullError.
    row_limit = {None: 300, 0: 300, 1: 300, 3: 60, 15: 12}[threshold] if tight else 100_000
    rng = np.random.default_rng(1000 + (threshold or 0) * 7 + row_limit)
    kp, ref, rec = make(row_limit=row_limit, threshold=threshold, capacity_hint=16)
    raised = 0
    for batch in range(20):
        parts = [(zipf_keys(rng, int(rng.integers(0, 400))), int(c))
                 for c in rng.integers(1, 4, int(rng.integers(1, 4)))]
        if batch % 5 == 4:
            parts.append((np.array(EXTREME_KEYS, np.int64), 1))
        train = batch % 4 != 3
        pad_to = None if batch % 3 else 2000
        res = check_batch(kp, ref, rec, *segments(*parts), train, timestamp=batch * 10,
                          pad_to=pad_to)
        raised += res is None
    if tight:
        assert raised > 0            # the small table really filled up
        assert kp.size <= row_limit
    else:
        assert raised == 0 and kp.size > 0
    # Every row handed out was initialised exactly once.
    rows_init = [r for r, _ in rec.pairs()]
    assert rows_init == list(range(kp.size))
    keys, rows = kp.admitted()
    assert sorted(zip(rows.tolist(), keys.tolist())) == rec.pairs()
