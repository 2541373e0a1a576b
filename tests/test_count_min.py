"""``CountMinSketch`` (``sparseflow/ops/count_min.py``) against exact and numpy references.

References, written from the documented semantics only: a numpy murmur3 finaliser and
multiply-shift for the columns; a pure Python loop for the conservative update; ``np.add.at``
for the plain update; ``np.unique`` counts for the true counts. Accuracy tests compare observed
over-counts and false admissions with the bounds the module documents.
"""

from __future__ import annotations

import math
import re
import tracemalloc

import numpy as np
import pytest

from sparseflow.ops import count_min as cm
from sparseflow.ops.count_min import CountMinSketch

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
SAT = 2**32 - 1
EXTREME_KEYS = [0, -1, -2, 1, INT64_MIN, INT64_MAX]


# --- references ------------------------------------------------------------------------------

def mix64_np(x: np.ndarray) -> np.ndarray:
    """murmur3's fmix64 over uint64 arrays (numpy array arithmetic wraps mod 2^64)."""
    h = np.asarray(x).astype(np.uint64)
    h = h ^ (h >> np.uint64(33))
    h = h * np.uint64(0xFF51AFD7ED558CCD)
    h = h ^ (h >> np.uint64(33))
    h = h * np.uint64(0xC4CEB9FE1A85EC53)
    return h ^ (h >> np.uint64(33))


def columns_np(seeds: np.ndarray, keys: np.ndarray, width: int) -> np.ndarray:
    """int64[depth, N]: the column of each key in each row."""
    k = keys.astype(np.int64).view(np.uint64)
    h = mix64_np(k[None, :] ^ seeds[:, None])
    return ((h >> np.uint64(32)) * np.uint64(width) >> np.uint64(32)).astype(np.int64)


def conservative_ref(counters, seeds, keys, weights):
    """Pure Python conservative update, one entry at a time; returns the estimates."""
    cols = columns_np(seeds, keys, counters.shape[1])
    out = []
    for i in range(len(keys)):
        cells = [int(counters[r, cols[r, i]]) for r in range(counters.shape[0])]
        new = min(min(cells) + int(weights[i]), SAT)
        for r in range(counters.shape[0]):
            counters[r, cols[r, i]] = max(cells[r], new)
        out.append(new)
    return np.array(out, np.int64)


def plain_estimates(seeds, width, keys, weights, query):
    """Plain count-min (every row += w), built with np.add.at; estimates of ``query``."""
    counters = np.zeros((seeds.shape[0], width), np.int64)
    cols = columns_np(seeds, keys, width)
    for r in range(seeds.shape[0]):
        np.add.at(counters[r], cols[r], weights)
    qcols = columns_np(seeds, query, width)
    return np.min([counters[r, qcols[r]] for r in range(seeds.shape[0])], axis=0)


def zipf_stream(n, a=1.2, seed=0):
    """``n`` Zipf-distributed occurrences, scrambled into int64 keys of any sign."""
    rng = np.random.default_rng(seed)
    ranks = rng.zipf(a, n).astype(np.uint64)
    return (ranks * np.uint64(0x9E3779B97F4A7C15)).view(np.int64)


def feed(sketch, stream, n_batches):
    """Adds ``stream`` in batches, each batch deduplicated into (unique keys, counts)."""
    for chunk in np.array_split(stream, n_batches):
        uniq, counts = np.unique(chunk, return_counts=True)
        sketch.add(uniq, counts.astype(np.int64))


def ones(n):
    return np.ones(n, np.int64)


def arr(values):
    return np.array(values, np.int64)


def binomial_slack(p, n):
    return 4 * math.sqrt(max(p * (1 - p), 1e-4) / n)


# --- hashing and the exact update ------------------------------------------------------------

def test_columns_match_numpy_reference_for_extreme_keys_and_widths():
    rng = np.random.default_rng(0)
    keys = arr(EXTREME_KEYS + rng.integers(INT64_MIN, INT64_MAX, 300, np.int64).tolist())
    seeds = np.empty(5, np.uint64)
    cm.cms_row_seeds(np.int64(123), 5, seeds)
    for width in [16, 17, 1000, 2**20 + 7, 2**31]:
        ref = columns_np(seeds, keys, width)
        assert ref.min() >= 0 and ref.max() < width
        got = np.array([[cm.cms_column(seeds[r], k, width) for k in keys] for r in range(5)])
        np.testing.assert_array_equal(got, ref)


def test_row_seeds_are_distinct_and_depend_on_seed():
    a, b = np.empty(16, np.uint64), np.empty(16, np.uint64)
    cm.cms_row_seeds(np.int64(0), 16, a)
    cm.cms_row_seeds(np.int64(1), 16, b)
    assert len(set(a.tolist())) == 16 and len(set(a.tolist()) & set(b.tolist())) == 0
    np.testing.assert_array_equal(CountMinSketch(64, 16, seed=0).seeds, a)


def test_rows_hash_uniformly_and_pairwise_independently():
    # Sequential keys are the hardest case for weak hashing. Rows r, r': among the key pairs
    # that collide in row r, a fraction 1/width must also collide in row r'.
    width, n = 64, 20000
    sketch = CountMinSketch(width, 4, seed=7)
    cols = columns_np(sketch.seeds, np.arange(n, dtype=np.int64), width)
    for r in range(4):
        per_col = np.bincount(cols[r], minlength=width)
        chi2 = ((per_col - n / width) ** 2 / (n / width)).sum()
        assert chi2 < 130  # 63 degrees of freedom: mean 63, sd 11
    for r in range(4):
        per_col = np.bincount(cols[r]).astype(np.int64)
        n_r = (per_col * (per_col - 1) // 2).sum()
        for s in range(r + 1, 4):
            both = np.unique(cols[r] * width + cols[s], return_counts=True)[1].astype(np.int64)
            n_both = (both * (both - 1) // 2).sum()
            expected = n_r / width
            assert abs(n_both - expected) < 5 * math.sqrt(expected), (r, s, n_both, expected)


def test_add_matches_python_reference_exactly_including_repeats_within_a_call():
    rng = np.random.default_rng(1)
    sketch = CountMinSketch(width=37, depth=3, seed=9)
    ref = np.zeros((3, 37), np.int64)
    for _ in range(20):
        n = int(rng.integers(0, 60))
        keys = rng.integers(-50, 50, n).astype(np.int64)   # repeats within a call
        weights = rng.integers(0, 5, n).astype(np.int64)
        got = sketch.add(keys, weights)
        np.testing.assert_array_equal(got, conservative_ref(ref, sketch.seeds, keys, weights))
        np.testing.assert_array_equal(sketch.counters, ref)
        query = np.arange(-60, 60, dtype=np.int64)
        cols = columns_np(sketch.seeds, query, 37)
        np.testing.assert_array_equal(sketch.estimate(query),
                                      np.min([ref[r, cols[r]] for r in range(3)], axis=0))
    assert sketch.counters.dtype == np.uint32 and sketch.counters.shape == (3, 37)


def test_add_and_estimate_accept_non_contiguous_keys():
    sketch = CountMinSketch(1024, 2)
    keys = np.arange(40, dtype=np.int64)[::2]
    out = sketch.add(keys, ones(40)[::2])
    np.testing.assert_array_equal(out, ones(20))
    np.testing.assert_array_equal(sketch.estimate(np.arange(40, dtype=np.int64)[::2]), ones(20))


# --- accuracy on Zipf keys -------------------------------------------------------------------

@pytest.mark.parametrize("depth", [1, 2, 3, 4])
def test_zipf_never_under_counts_and_over_count_bound_holds(depth):
    stream = zipf_stream(300_000, seed=depth)
    keys, true = np.unique(stream, return_counts=True)
    sketch = CountMinSketch(width=2048, depth=depth, seed=depth)
    feed(sketch, stream, 30)
    assert sketch.total == stream.shape[0]
    over = sketch.estimate(keys) - true
    assert over.min() >= 0
    bound = sketch.error_bound(sketch.total)
    assert bound == pytest.approx(math.e / 2048 * 300_000)
    p = math.exp(-depth)
    frac = (over > bound).mean()
    assert keys.shape[0] > 20_000
    assert frac <= p + binomial_slack(p, keys.shape[0]), (frac, p)


@pytest.mark.parametrize("depth", [1, 2, 3, 4])
def test_bound_holds_where_it_is_nearly_tight(depth):
    # One-off keys with total / width just under 1/e: the bound e*total/width < 1, so any
    # collision exceeds it. Per row that happens with probability ~ 1 - exp(-0.36) = 0.30
    # against the bound's 1/e = 0.37, so the test also fails if the rows hash dependently.
    width = 1 << 17
    n = int(0.36 * width)
    keys = np.random.default_rng(depth).permutation(n).astype(np.int64) * 1_000_003
    sketch = CountMinSketch(width, depth, seed=11)
    for chunk in np.array_split(keys, 5):
        sketch.add(chunk, ones(chunk.shape[0]))
    bound = sketch.error_bound(n)
    assert bound < 1
    p = math.exp(-depth)
    slack = binomial_slack(p, n)
    frac = (sketch.estimate(keys) - 1 > bound).mean()
    plain = (plain_estimates(sketch.seeds, width, keys, ones(n), keys) - 1 > bound).mean()
    assert frac <= plain <= p + slack, (frac, plain, p)
    # And the plain update matches independent rows: (1 - exp(-(n-1)/width))^depth.
    expected = (1 - math.exp(-(n - 1) / width)) ** depth
    assert abs(plain - expected) <= binomial_slack(expected, n)


def test_conservative_update_is_at_least_as_tight_as_plain_update():
    stream = zipf_stream(200_000, a=1.1, seed=5)
    sketch = CountMinSketch(width=1024, depth=3, seed=2)
    keys_seen, weights_seen = [], []
    for chunk in np.array_split(stream, 20):
        uniq, counts = np.unique(chunk, return_counts=True)
        sketch.add(uniq, counts.astype(np.int64))
        keys_seen.append(uniq)
        weights_seen.append(counts.astype(np.int64))
    keys, true = np.unique(stream, return_counts=True)
    cons = sketch.estimate(keys)
    plain = plain_estimates(sketch.seeds, 1024, np.concatenate(keys_seen),
                            np.concatenate(weights_seen), keys)
    assert (plain >= true).all() and (cons >= true).all()
    assert (cons <= plain).all()   # elementwise: CU counters never exceed plain counters
    mean_cons, mean_plain = (cons - true).mean(), (plain - true).mean()
    assert mean_cons < 0.8 * mean_plain, (mean_cons, mean_plain)


# --- fixed memory ----------------------------------------------------------------------------

def test_ten_million_one_off_keys_keep_memory_flat():
    sketch = CountMinSketch()          # 2^20 x 4, 16 MiB
    counters, nbytes = sketch.counters, sketch.nbytes
    assert nbytes == 4 * (1 << 20) * 4
    batch = 100_000
    weights = ones(batch)
    sketch.add(arr([1]), ones(1))      # compiled / loaded from cache outside the trace
    sketch.clear()
    tracemalloc.start()
    try:
        start, _ = tracemalloc.get_traced_memory()
        for b in range(100):
            keys = np.arange(b * batch, (b + 1) * batch, dtype=np.int64) * 7 + 3
            out = sketch.add(keys, weights)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    batch_arrays = 2 * keys.nbytes     # this batch's keys and estimates (+ the previous ones)
    assert peak - start < 2 * batch_arrays + (1 << 20), peak - start
    assert sketch.counters is counters and counters.shape == (4, 1 << 20)
    assert sketch.nbytes == nbytes and sketch.total == 10**7
    assert out.min() >= 1
    assert (sketch.estimate(np.arange(1000, dtype=np.int64) * 7 + 3) >= 1).all()


# --- admission -------------------------------------------------------------------------------

def _admission_run(width, depth, threshold, n_flood, n_probe, seed):
    """Flood of one-off keys plus, for each c < threshold, ``n_probe`` keys seen c times.

    Returns (sketch, {c: keys seen c times}, every key added, once per occurrence).
    """
    rng = np.random.default_rng(seed)
    n_counts = threshold - 1
    keys = rng.permutation(n_flood + n_probe * n_counts).astype(np.int64) * 7919 - 10**9
    flood, probes = keys[:n_flood], keys[n_flood:].reshape(n_counts, n_probe)
    sketch = CountMinSketch(width, depth, seed=seed)
    added = []
    for rnd, part in enumerate(np.array_split(flood, n_counts)):
        # Round rnd: a slice of the flood and every probe key still short of its count.
        batch = np.concatenate([part] + [probes[c - 1] for c in range(rnd + 1, n_counts + 1)])
        sketch.add(batch, ones(batch.shape[0]))
        added.append(batch)
    probe_keys = {c: probes[c - 1] for c in range(1, n_counts + 1)}
    return sketch, probe_keys, np.concatenate(added)


def test_false_admissions_stay_below_the_documented_bound():
    threshold, width = 4, 1 << 18
    for depth in (2, 4):
        sketch, probes, added = _admission_run(width, depth, threshold, n_flood=width // 4,
                                               n_probe=10_000, seed=depth)
        assert sketch.total / width < 0.5   # one-offs at width / 4: the rule of thumb
        for c, keys in probes.items():
            est = sketch.estimate(keys)
            plain = plain_estimates(sketch.seeds, width, added, ones(added.shape[0]), keys)
            assert est.min() >= c and (est <= plain).all()
            rate = (est >= threshold).mean()
            bound = sketch.false_admission_bound(c, threshold)
            assert bound < 0.3
            assert rate <= (plain >= threshold).mean() <= bound, (depth, c, rate, bound)


def test_false_admission_rate_matches_theory_at_depth_one():
    # At depth 1 the conservative and plain updates coincide, and the over-count of a key is
    # the weight of the other keys in its column: a compound Poisson with one class per count.
    threshold, width, n_flood, n_probe = 4, 1 << 16, 1 << 15, 8000
    sketch, probes, _ = _admission_run(width, 1, threshold, n_flood, n_probe, seed=3)
    classes = {1: n_flood + n_probe, 2: n_probe, 3: n_probe}   # keys per final count

    def tail(x, own):
        # P(other keys' weight in the column >= x), by convolving Poisson pmfs up to x.
        pmf = np.zeros(x + 1)
        pmf[0] = 1.0
        for c, n in classes.items():
            lam = (n - (own == c)) / width
            term = np.zeros(x + 1)
            for j in range(0, x // c + 1):
                term[j * c] = math.exp(-lam) * lam**j / math.factorial(j)
            pmf = np.convolve(pmf, term)[: x + 1]
        return 1.0 - pmf[:x].sum()

    for c, keys in probes.items():
        rate = (sketch.estimate(keys) >= threshold).mean()
        theory = tail(threshold - c, c)
        assert abs(rate - theory) <= binomial_slack(theory, n_probe), (c, rate, theory)
        assert rate <= sketch.false_admission_bound(c, threshold)


def test_false_admission_bound_formula_and_checks():
    sketch = CountMinSketch(1000, 3)
    assert sketch.false_admission_bound(1, 4, total=600) == pytest.approx((600 / 3000) ** 3)
    assert sketch.false_admission_bound(0, 1, total=10**6) == 1.0
    assert sketch.false_admission_bound(2, 3) == 0.0            # nothing added yet
    with pytest.raises(ValueError, match=r"^Argument `count` must be an int in \[0, 3\]\. "
                                         r"Received: 4$"):
        sketch.false_admission_bound(4, 4)
    with pytest.raises(ValueError, match=r"^Argument `threshold` must be an int >= 1\."):
        sketch.false_admission_bound(0, 0)
    with pytest.raises(ValueError, match=r"^Argument `total` must be an int >= 0\. "
                                         r"Received: -1$"):
        sketch.false_admission_bound(0, 2, total=-1)


# --- saturation, empty inputs, clear, determinism --------------------------------------------

def test_counters_saturate_at_uint32_max_and_total_stays_exact():
    sketch = CountMinSketch(64, 2)
    np.testing.assert_array_equal(sketch.add(arr([5]), arr([SAT - 3])), [SAT - 3])
    np.testing.assert_array_equal(sketch.add(arr([5]), arr([10])), [SAT])
    np.testing.assert_array_equal(sketch.add(arr([5]), arr([INT64_MAX])), [SAT])
    np.testing.assert_array_equal(sketch.add(arr([6, 7]), arr([INT64_MAX, INT64_MAX])),
                                  [SAT, SAT])
    np.testing.assert_array_equal(sketch.estimate(arr([5, 6, 7])), [SAT, SAT, SAT])
    assert int(sketch.counters.max()) == SAT
    assert sketch.total == SAT - 3 + 10 + 3 * INT64_MAX


def test_empty_inputs():
    sketch = CountMinSketch(64, 2)
    sketch.add(arr([1, 2]), arr([3, 4]))
    before = sketch.counters.copy()
    out = sketch.add(arr([]), arr([]))
    assert out.dtype == np.int64 and out.shape == (0,)
    out = sketch.estimate(arr([]))
    assert out.dtype == np.int64 and out.shape == (0,)
    np.testing.assert_array_equal(sketch.counters, before)
    assert sketch.total == 7
    np.testing.assert_array_equal(sketch.add(arr([9]), arr([0])), [0])   # zero weight


def test_clear_zeroes_in_place():
    sketch = CountMinSketch(128, 3)
    counters = sketch.counters
    sketch.add(np.arange(100, dtype=np.int64), ones(100))
    sketch.clear()
    assert sketch.counters is counters and not counters.any() and sketch.total == 0
    np.testing.assert_array_equal(sketch.estimate(np.arange(100, dtype=np.int64)), np.zeros(100))
    assert sketch.error_bound() == 0.0
    np.testing.assert_array_equal(sketch.add(arr([1]), arr([2])), [2])


def test_same_seed_same_estimates_different_seed_different_hashes():
    stream = zipf_stream(50_000, seed=9)
    keys = np.unique(stream)
    a, b, c = (CountMinSketch(512, 4, seed=s) for s in (42, 42, 43))
    for s in (a, b, c):
        feed(s, stream, 10)
    np.testing.assert_array_equal(a.counters, b.counters)
    np.testing.assert_array_equal(a.estimate(keys), b.estimate(keys))
    assert not np.array_equal(a.counters, c.counters)


def test_error_bound_and_nbytes_and_repr():
    sketch = CountMinSketch(width=1 << 10, depth=5)
    assert sketch.nbytes == 4 * (1 << 10) * 5
    assert sketch.error_bound(1024) == pytest.approx(math.e)
    sketch.add(arr([1, 2]), arr([1000, 24]))
    assert sketch.error_bound() == pytest.approx(math.e)
    assert "width=1024" in repr(sketch) and "depth=5" in repr(sketch)


# --- validation ------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, error, text", [
    (dict(width=15), ValueError, r"`width` must be an int in \[16, 2147483648\]\. Received: 15"),
    (dict(width=2**31 + 1), ValueError, r"`width` must be an int in \[16, 2147483648\]\. "
                                        r"Received: 2147483649"),
    (dict(width=1024.0), TypeError, r"`width` must be an int in .* Received: 1024\.0"),
    (dict(width=True), TypeError, r"`width` must be an int in .* Received: True"),
    (dict(depth=0), ValueError, r"`depth` must be an int in \[1, 16\]\. Received: 0"),
    (dict(depth=17), ValueError, r"`depth` must be an int in \[1, 16\]\. Received: 17"),
    (dict(depth="4"), TypeError, r"`depth` must be an int in \[1, 16\]\. Received: '4'"),
    (dict(seed=-1), ValueError, r"`seed` must be an int in \[0, 9223372036854775807\]\. "
                                r"Received: -1"),
])
def test_constructor_errors_name_the_argument(kwargs, error, text):
    with pytest.raises(error, match=r"^Argument " + text + "$"):
        CountMinSketch(**{"width": 64, **kwargs})


def test_key_and_weight_errors_name_the_argument():
    sketch = CountMinSketch(64, 2)
    i32 = np.array([1, 2], np.int32)
    with pytest.raises(TypeError, match=r"^Argument `keys` must be a 1-D int64 numpy array\. "
                                        r"Received: dtype\('int32'\)$"):
        sketch.add(i32, ones(2))
    with pytest.raises(TypeError, match=r"^Argument `keys` .*Received: dtype\('uint64'\)$"):
        sketch.estimate(np.array([1], np.uint64))
    with pytest.raises(TypeError, match=r"^Argument `keys` .*Received: <class 'list'>$"):
        sketch.estimate([1, 2])
    with pytest.raises(TypeError, match=r"^Argument `keys` .*Received: 'int64\[2, 2\]'$"):
        sketch.estimate(np.zeros((2, 2), np.int64))
    with pytest.raises(TypeError, match=r"^Argument `weights` .*Received: dtype\('float64'\)$"):
        sketch.add(arr([1, 2]), np.ones(2))
    with pytest.raises(ValueError, match=re.escape("Argument `weights` must be of the length "
                                                   "of `keys` (2). Received: 3")):
        sketch.add(arr([1, 2]), ones(3))
    with pytest.raises(ValueError, match=r"^Argument `weights` must be all >= 0\. "
                                         r"Received: -5$"):
        sketch.add(arr([1, 2]), arr([1, -5]))
    with pytest.raises(TypeError, match=r"^Argument `total` must be an int >= 0\. "
                                        r"Received: 1\.5$"):
        sketch.error_bound(1.5)
    assert sketch.total == 0 and not sketch.counters.any()   # failed calls changed nothing


# --- undo, copy, merge, save and load (checkpoints) --------------------------------------------

def test_undo_takes_adds_back_last_in_first_out_against_the_reference():
    stream = zipf_stream(20_000, seed=5)
    sketch = CountMinSketch(256, 3, seed=1)
    sketch.add(stream[:5000], ones(5000))
    before, total = sketch.counters.copy(), sketch.total
    reference = before.copy()
    changes = []
    for start in range(5000, 20_000, 3000):   # repeats within and across calls collide
        keys = stream[start:start + 3000]
        weights = (keys % 3 + 1).astype(np.int64)
        out, change = sketch.add_undoable(keys, weights)
        np.testing.assert_array_equal(out, conservative_ref(reference, sketch.seeds, keys,
                                                            weights))   # same as add()
        changes.append(change)
    np.testing.assert_array_equal(sketch.counters, reference)
    for change in reversed(changes):
        sketch.undo(change)
    np.testing.assert_array_equal(sketch.counters, before)
    assert sketch.total == total


def test_copy_load_and_from_counters_keep_every_counter():
    sketch = CountMinSketch(128, 2, seed=7)
    sketch.add(np.arange(500, dtype=np.int64), ones(500))
    copy = sketch.copy()
    sketch.add(arr([1]), arr([5]))
    assert copy.total == 500 and copy.counters is not sketch.counters
    restored = CountMinSketch.from_counters(copy.counters.copy(), 7, copy.total)
    assert restored.geometry == (128, 2, 7)
    np.testing.assert_array_equal(restored.counters, copy.counters)
    sketch.load(restored)
    np.testing.assert_array_equal(sketch.counters, copy.counters)
    assert sketch.total == 500
    with pytest.raises(ValueError, match=r"^Argument `other` must be a sketch of the same "
                                         r"\(width, depth, seed\) \(128, 2, 7\)\. Received: "
                                         r"\(128, 2, 8\)$"):
        sketch.load(CountMinSketch(128, 2, seed=8))
    with pytest.raises(TypeError, match=r"^Argument `counters` must be a uint32 numpy array"):
        CountMinSketch.from_counters(np.zeros((2, 128), np.int64), 7, 0)
    with pytest.raises(ValueError, match=r"^Argument `total` must be an int >= 0"):
        CountMinSketch.from_counters(np.zeros((2, 128), np.uint32), 7, -1)


def test_merge_keeps_the_larger_counter_so_estimates_cover_both():
    a, b = CountMinSketch(64, 3, seed=2), CountMinSketch(64, 3, seed=2)
    ka, kb = np.arange(0, 300, 2, dtype=np.int64), np.arange(1, 300, 2, dtype=np.int64)
    a.add(ka, ones(ka.shape[0]))
    b.add(kb, 2 * ones(kb.shape[0]))
    expected = np.maximum(a.counters, b.counters)
    a.merge(b)
    np.testing.assert_array_equal(a.counters, expected)
    assert (a.estimate(ka) >= 1).all() and (a.estimate(kb) >= 2).all()
    assert a.total == 150 + 300
