"""``ApproxFeatureCounter`` (``sparseflow/stats/approx.py``) against exact counts.

Generated Zipf data with about 200k distinct keys (more than the 2^16-key sample holds), fed in
batches; the reference is ``np.unique(..., return_counts=True)`` and plain numpy. Each
approximate number is checked against the error the module documents: distinct keys within 3
HyperLogLog standard errors, top keys equal to the exact top keys with counts within the
count-min bound, thresholds within 5 % (and 4 documented standard errors). Merging is checked
to give exactly the one-pass sketches, memory to stay fixed whatever the number of distinct
keys, and inputs that fit the sample to give exactly the exact counter's section.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from sparseflow import synthetic
from sparseflow.stats.approx import (
    ApproxFeatureCounter,
    hll_relative_std_error,
    sample_relative_std_error,
)
from sparseflow.stats.counts import FeatureCounter

BATCH = 100_000
N_KEYS = 2_000_000


def zipf_keys(seed: int, cardinality: int, n: int, exponent: float = 1.05) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ranks = synthetic.zipf_ranks(rng, cardinality, exponent, n)
    return synthetic.scatter_keys(ranks, salt=seed + 1)


def feed(counter, keys, times=None):
    for i in range(0, keys.shape[0], BATCH):
        counter.update(keys[i:i + BATCH],
                       timestamps=None if times is None else times[i:i + BATCH])
    return counter


@pytest.fixture(scope="module")
def data():
    keys = zipf_keys(0, 400_000, N_KEYS)
    uniq, counts = np.unique(keys, return_counts=True)
    assert 150_000 < uniq.shape[0] < 300_000   # ~200k distinct: far more than the sample
    counter = feed(ApproxFeatureCounter(), keys)
    return keys, uniq, counts, counter


def sorted_sample(counter):
    keys, counts, times = counter.sample_entries()
    order = np.argsort(keys)
    return keys[order], counts[order], times[order]


# --- accuracy ----------------------------------------------------------------------------------

def test_distinct_within_three_standard_errors(data):
    _, uniq, _, counter = data
    section = counter.result(top_k=10, max_threshold=5)
    exact = uniq.shape[0]
    se = hll_relative_std_error(14)
    assert se == pytest.approx(0.008125)
    assert not counter.exact and counter.sample_level >= 1
    assert abs(section["distinct_keys"] - exact) <= 3 * se * exact
    assert section["mode"] == "approximate"
    err = section["error"]
    assert err["exact"] is False
    assert err["hll_relative_std_error"] == pytest.approx(se)
    assert err["cms_epsilon"] == pytest.approx(math.e / 2**20)
    assert err["cms_delta"] == pytest.approx(math.exp(-4))
    assert err["sample_capacity"] == 2**16
    assert 2**15 <= err["sample_size"] <= 2**16
    assert err["sample_rate"] == 2.0 ** -counter.sample_level
    # Exact fields stay exact.
    assert section["total_keys"] == section["rows"] == N_KEYS
    assert section["null_rows"] == section["empty_rows"] == 0
    assert section["thresholds"][0]["keys_kept"] == section["distinct_keys"]
    assert json.loads(json.dumps(section)) == section


def test_hll_small_and_large_range():
    # Ertl's estimator covers the small range (most registers empty) without a switch-over.
    se = hll_relative_std_error(14)
    for n in (500, 5_000, 40_000, 300_000):
        keys = np.arange(n, dtype=np.int64) * 3 - 1000
        counter = ApproxFeatureCounter(cms_width=16, cms_depth=1, heavy_hitters=1,
                                       sample_size=16)
        counter.update(keys)
        assert abs(counter.hll_estimate() - n) <= 3 * se * n + 1, n


def test_top_keys_equal_exact_within_count_min_bound(data):
    _, uniq, counts, counter = data
    section = counter.result(top_k=10)
    order = np.lexsort((uniq, -counts))[:10]
    top = section["top_keys"]
    assert [t["key"] for t in top] == uniq[order].tolist()
    bound = math.e / 2**20 * N_KEYS
    assert section["error"]["cms_overcount_bound"] == pytest.approx(bound)
    for t, true in zip(top, counts[order]):
        assert true <= t["count"] <= true + bound
    # Every key above the documented floor is a candidate.
    floor = counter.heavy_hitter_floor()
    candidates = set(counter.heavy_entries()[0].tolist())
    assert set(uniq[counts > floor].tolist()) <= candidates


def test_thresholds_histogram_within_documented_error(data):
    _, uniq, counts, counter = data
    section = counter.result(max_threshold=5)
    exact_d = uniq.shape[0]
    k = section["error"]["sample_size"]
    se_hll = hll_relative_std_error(14)
    for entry in section["thresholds"]:
        t = entry["threshold"]
        kept = int(np.count_nonzero(counts >= t))
        rel = abs(entry["keys_kept"] - kept) / kept
        documented = math.hypot(se_hll, sample_relative_std_error(kept / exact_d, k))
        assert rel <= 0.05, (t, entry["keys_kept"], kept)
        assert rel <= 4 * documented, (t, rel, documented)
        share = counts[counts >= t].sum() / N_KEYS
        assert entry["traffic_kept_share"] == pytest.approx(share, abs=0.01)
    singletons = int(np.count_nonzero(counts == 1))
    assert section["singleton_keys"] == pytest.approx(singletons, rel=0.05)
    # Buckets above the heavy-hitter floor come from the candidates: counted one by one.
    floor = counter.heavy_hitter_floor()
    for b in section["histogram"]:
        in_bucket = (counts >= b["min_count"]) & (counts <= b["max_count"])
        if b["min_count"] > 2 * floor:
            assert b["keys"] == int(np.count_nonzero(in_bucket))
        elif np.count_nonzero(in_bucket) > 1000:
            assert b["keys"] == pytest.approx(np.count_nonzero(in_bucket), rel=0.05)
    assert sum(b["keys"] for b in section["histogram"]) == pytest.approx(exact_d, rel=0.03)


def test_eviction_keys_alive_within_error():
    keys = zipf_keys(3, 300_000, 1_000_000)
    times = np.arange(keys.shape[0], dtype=np.int64) // 10
    counter = feed(ApproxFeatureCounter(timed=True), keys, times)
    window = 30_000
    section = counter.result(eviction_window=window)
    clock = int(times.max())
    uniq, inverse = np.unique(keys, return_inverse=True)
    latest = np.full(uniq.shape[0], np.iinfo(np.int64).min)
    np.maximum.at(latest, inverse, times)
    alive = int(np.count_nonzero(clock - latest < window))
    assert section["eviction"]["clock"] == clock
    assert section["eviction"]["keys_alive"] == pytest.approx(alive, rel=0.05)


@pytest.mark.parametrize("heavy_hitters", [1, 7, 64])
def test_heavy_hitter_candidates_stay_consistent(heavy_hitters):
    # A tiny sketch (many collisions) and few candidates: constant eviction and index shifts.
    keys = zipf_keys(11, 5_000, 60_000, exponent=0.9)
    counter = ApproxFeatureCounter(cms_width=256, cms_depth=2, heavy_hitters=heavy_hitters,
                                   sample_size=64)
    feed(counter, keys[:30_000])
    other = feed(ApproxFeatureCounter(cms_width=256, cms_depth=2, heavy_hitters=heavy_hitters,
                                      sample_size=64), keys[30_000:])
    for c in (counter, other):
        size = int(c._hh_meta[0])
        assert size == heavy_hitters
        cand, vals = c._hh_keys[:size], c._hh_vals[:size]
        assert np.unique(cand).shape[0] == size
        for i in range(1, size):                       # min-heap on the values
            assert vals[(i - 1) // 2] <= vals[i]
        index = c._hh_index
        assert np.count_nonzero(index) == size
        np.testing.assert_array_equal(index[c._hh_slot[:size]], np.arange(1, size + 1))
    counter.merge(other)
    uniq, counts = np.unique(keys, return_counts=True)
    cand, est = counter.heavy_entries()
    floor = counter.heavy_hitter_floor()
    assert set(uniq[counts > floor].tolist()) <= set(cand.tolist())
    true = dict(zip(uniq.tolist(), counts.tolist()))
    assert all(e >= true[k] for k, e in zip(cand.tolist(), est.tolist()))


# --- exact while the sample holds every key ----------------------------------------------------

@pytest.mark.parametrize("timed", [False, True])
def test_equals_exact_counter_when_keys_fit_the_sample(timed):
    rng = np.random.default_rng(7)
    keys = synthetic.zipf_ranks(rng, 3000, 1.1, 50_000) * 7 - 300
    keys[::97] = np.iinfo(np.int64).min
    keys[::89] = np.iinfo(np.int64).max
    lengths = rng.integers(0, 4, 15_000)
    lengths[-1] += 30_000 - lengths.sum()
    assert lengths.sum() == 30_000 and lengths.min() >= 0
    times = rng.integers(0, 10_000, keys.shape[0]) if timed else None
    approx = ApproxFeatureCounter(timed=timed, sample_size=4096)
    exact = FeatureCounter(timed=timed)
    for counter in (approx, exact):
        counter.update(keys[:20_000], None, None if times is None else times[:20_000], 5)
        counter.update(keys[20_000:], lengths, None if times is None else times[20_000:], 3)
    assert approx.exact
    options = {"top_k": 15, "max_threshold": 12, "eviction_window": 500 if timed else None,
               "dim": 8, "optimizer": "adagrad", "encoding": "int", "multi_hot": True}
    got = approx.result(**options)
    assert got.pop("mode") == "approximate"
    assert got.pop("error")["exact"] is True
    assert got == exact.result(**options)


# --- merge -------------------------------------------------------------------------------------

def test_merge_equals_one_pass(data):
    keys, _, _, one_pass = data
    a = ApproxFeatureCounter()
    b = ApproxFeatureCounter()
    feed(a, keys[:N_KEYS // 3])            # unequal halves: different sample levels
    feed(b, keys[N_KEYS // 3:])
    a.merge(b)
    np.testing.assert_array_equal(a._registers, one_pass._registers)
    np.testing.assert_array_equal(a._cms.counters, one_pass._cms.counters)
    assert a._cms.total == one_pass._cms.total == N_KEYS
    assert a.sample_level == one_pass.sample_level
    for x, y in zip(sorted_sample(a), sorted_sample(one_pass)):
        np.testing.assert_array_equal(x, y)
    assert a.distinct_keys == one_pass.distinct_keys
    got, want = a.result(top_k=10), one_pass.result(top_k=10)
    assert got["top_keys"] == want["top_keys"]
    assert got["thresholds"][:5] == want["thresholds"][:5]
    assert (a.rows, a.total_keys) == (one_pass.rows, one_pass.total_keys)
    # b is unchanged by the merge; merging a counter into itself doubles its counts.
    assert b.total_keys == N_KEYS - N_KEYS // 3
    registers = b._registers.copy()
    before = b.result(top_k=3)["top_keys"]
    b.merge(b)
    np.testing.assert_array_equal(b._registers, registers)
    assert [t["key"] for t in b.result(top_k=3)["top_keys"]] == [t["key"] for t in before]
    assert b.total_keys == 2 * (N_KEYS - N_KEYS // 3)


def test_merge_of_timed_counters_keeps_latest_times():
    keys = zipf_keys(5, 200_000, 300_000)
    times = np.arange(keys.shape[0], dtype=np.int64)
    one = feed(ApproxFeatureCounter(timed=True, sample_size=4096), keys, times)
    a = feed(ApproxFeatureCounter(timed=True, sample_size=4096), keys[::2], times[::2])
    b = feed(ApproxFeatureCounter(timed=True, sample_size=4096), keys[1::2], times[1::2])
    b.merge(a)
    for x, y in zip(sorted_sample(b), sorted_sample(one)):
        np.testing.assert_array_equal(x, y)
    assert b.clock == one.clock == times[-1]
    assert b.result(eviction_window=1000)["eviction"] == \
        one.result(eviction_window=1000)["eviction"]


def test_merge_refuses_other_configurations():
    with pytest.raises(TypeError, match="other"):
        ApproxFeatureCounter().merge(FeatureCounter())
    with pytest.raises(ValueError, match="precision"):
        ApproxFeatureCounter().merge(ApproxFeatureCounter(precision=12))
    with pytest.raises(ValueError, match="seed"):
        ApproxFeatureCounter().merge(ApproxFeatureCounter(seed=1))
    with pytest.raises(ValueError, match="timed"):
        ApproxFeatureCounter().merge(ApproxFeatureCounter(timed=True))


# --- memory ------------------------------------------------------------------------------------

def test_memory_is_fixed_whatever_the_distinct_keys():
    approx = ApproxFeatureCounter()
    exact = FeatureCounter()
    start = approx.nbytes
    assert start < 20 * 2**20
    small = np.arange(10_000, dtype=np.int64)
    approx.update(small)
    exact.update(small)
    at_10k, exact_10k = approx.nbytes, exact.nbytes
    arrays = [a.__array_interface__["data"][0] for a in
              (approx._registers, approx._cms.counters, approx._sample, approx._hh_keys)]
    big = synthetic.scatter_keys(np.arange(1_000_000), salt=9)
    approx.update(big)
    exact.update(big)
    assert exact.distinct_keys == 1_010_000
    assert approx.nbytes == at_10k == start
    assert exact.nbytes > 50 * exact_10k
    assert exact.nbytes > approx.nbytes   # the exact table outgrew the fixed sketches
    assert arrays == [a.__array_interface__["data"][0] for a in
                      (approx._registers, approx._cms.counters, approx._sample, approx._hh_keys)]
    assert approx.distinct_keys == pytest.approx(1_010_000, rel=3 * hll_relative_std_error(14))


# --- arguments ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name, value", [
    ("precision", 3), ("precision", 19), ("precision", 14.0), ("precision", True),
    ("cms_width", 8), ("cms_width", 2**31 + 1), ("cms_depth", 0), ("cms_depth", 17),
    ("heavy_hitters", 0), ("seed", -1), ("sample_size", 8), ("sample_size", "big"),
    ("timed", "yes"),
])
def test_bad_constructor_arguments_name_the_argument(name, value):
    with pytest.raises(ValueError, match=f"`{name}`"):
        ApproxFeatureCounter(**{name: value})


def test_bad_update_and_result_arguments():
    counter = ApproxFeatureCounter(cms_width=1024, sample_size=64)
    with pytest.raises(ValueError, match="`keys`"):
        counter.update(np.zeros((2, 2), np.int64))
    with pytest.raises(ValueError, match="`keys`"):
        counter.update(np.array([1.5]))
    with pytest.raises(ValueError, match="`row_lengths`"):
        counter.update(np.arange(3), row_lengths=np.array([1, 1]))
    with pytest.raises(ValueError, match="`null_rows`"):
        counter.update(np.arange(3), null_rows=-1)
    with pytest.raises(ValueError, match="`timestamps`"):
        counter.update(np.arange(3), timestamps=np.arange(3))
    with pytest.raises(ValueError, match="`timestamps`"):
        ApproxFeatureCounter(timed=True).update(np.arange(3))
    with pytest.raises(ValueError, match="`timestamps`"):
        ApproxFeatureCounter(timed=True).update(np.arange(3), timestamps=np.arange(2))
    assert counter.total_keys == 0   # refused batches count nothing
    for kwargs, name in [({"top_k": -1}, "top_k"), ({"max_threshold": 0}, "max_threshold"),
                         ({"dim": 0}, "dim"), ({"optimizer": "lamb"}, "optimizer"),
                         ({"eviction_window": 0}, "eviction_window")]:
        with pytest.raises(ValueError, match=name):
            counter.result(**kwargs)
    with pytest.raises(ValueError, match="eviction_window"):
        counter.result(eviction_window=10)   # untimed


def test_empty_counter_result():
    section = ApproxFeatureCounter(cms_width=1024, sample_size=64).result(eviction_window=None)
    assert section["distinct_keys"] == section["total_keys"] == 0
    assert section["top_keys"] == [] and section["histogram"] == []
    assert section["thresholds"][0]["keys_kept"] == 0
