"""The fast tier's victim choice (ops/tier_kernels.py) against a numpy reference."""

import numpy as np
import pytest

from sparseflow.ops import tier_kernels
from sparseflow.pipeline.tier_cache import TierCache


def reference(pins, row_in, last_used, uses, lfu, resident, n):
    """Eligible slots by mask, sorted by (score, slot); the n first and how many."""
    eligible = (pins == 0) & (row_in >= 0)
    eligible[resident] = False
    candidates = np.flatnonzero(eligible)
    score = uses[row_in[candidates]] if lfu else last_used[candidates]
    order = np.lexsort((candidates, score))
    return candidates[order][:n], candidates.shape[0]


def random_state(rng, slots, rows, score_range):
    row_in = np.full(slots, -1, np.int32)
    held = rng.random(slots) < 0.8
    row_in[held] = rng.choice(rows, int(held.sum()), replace=False)
    pins = (rng.random(slots) < 0.2).astype(np.int32) * rng.integers(1, 3, slots,
                                                                      dtype=np.int32)
    last_used = rng.integers(0, score_range, slots).astype(np.int64)
    uses = rng.integers(0, score_range, rows).astype(np.int64)
    resident = rng.choice(slots, int(rng.integers(0, slots // 4 + 1)),
                          replace=False).astype(np.int32)
    return pins, row_in, last_used, uses, resident


@pytest.mark.parametrize("lfu", [False, True])
@pytest.mark.parametrize("score_range", [3, 1000, 2**40])   # 3: many ties; 2**40: heap path
@pytest.mark.parametrize("seed", range(6))
def test_victims_match_the_reference(lfu, score_range, seed):
    rng = np.random.default_rng(seed)
    slots = int(rng.integers(1, 400))
    pins, row_in, last_used, uses, resident = random_state(rng, slots, 2 * slots + 5,
                                                           score_range)
    pins_before = pins.copy()
    for n in sorted({0, 1, 2, 7, slots // 3, slots, slots + 10}):
        want, want_eligible = reference(pins, row_in, last_used, uses, lfu, resident, n)
        out = np.full(n + 8, -7, np.int32)
        marks = np.zeros(slots, np.bool_)
        eligible = tier_kernels.select_victims(pins, row_in, last_used,
                                               uses if lfu else np.zeros(0, np.int64), lfu,
                                               resident, n, out, marks)
        assert eligible == want_eligible
        np.testing.assert_array_equal(out[:min(n, eligible)], want)
        assert (out[min(n, eligible):] == -7).all()   # nothing written past the victims
        assert not marks.any()                         # the scratch is left clear
    np.testing.assert_array_equal(pins, pins_before)


def test_resident_slots_listed_twice_are_left_out_once():
    pins = np.zeros(6, np.int32)
    row_in = np.arange(6, dtype=np.int32)
    last_used = np.array([5, 4, 3, 2, 1, 0], np.int64)
    out = np.empty(6, np.int32)
    eligible = tier_kernels.select_victims(pins, row_in, last_used, np.zeros(0, np.int64),
                                           False, np.array([5, 5, 2], np.int32), 6, out,
                                           np.zeros(6, np.bool_))
    assert eligible == 4
    np.testing.assert_array_equal(out[:4], [4, 3, 1, 0])


@pytest.mark.parametrize("lfu", [False, True])
@pytest.mark.parametrize("scores", [
    [np.iinfo(np.int64).max, np.iinfo(np.int64).min, 0, 5],   # a range that wraps int64
    [2**62, -2**62, 0, 5],
    [-3, -1, -2, -3],
])
def test_scores_of_any_sign_and_size_match_the_reference(lfu, scores):
    scores = np.array(scores, np.int64)
    pins = np.zeros(4, np.int32)
    row_in = np.arange(4, dtype=np.int32)
    resident = np.zeros(0, np.int32)
    for n in range(6):
        want, want_eligible = reference(pins, row_in, scores, scores, lfu, resident, n)
        out = np.full(n + 8, -7, np.int32)
        eligible = tier_kernels.select_victims(pins, row_in, scores, scores, lfu, resident,
                                               n, out, np.zeros(4, np.bool_))
        assert eligible == want_eligible
        np.testing.assert_array_equal(out[:min(n, eligible)], want)


def test_the_cache_evicts_the_oldest_slot_neither_pinned_nor_the_batchs_own():
    cache = TierCache("t", slots=4, rows=10)
    with cache.lock:
        first = cache._assign(np.array([0, 1, 2, 3], np.int32), take_back=False)
        cache._assign(np.array([0, 1, 3], np.int32), take_back=False)   # row 2 is oldest
        cache.pins[first[0]] += 1                                        # row 0 in flight
        slots = cache._assign(np.array([2, 7], np.int32), take_back=False)
    # Row 2 is the batch's own and row 0 pinned; of rows 1 and 3 (one clock), the lower slot.
    assert slots[0] == first[2]
    assert slots[1] == min(first[1], first[3])
    assert cache.slot_of[2] == first[2] and cache.slot_of[0] == first[0]
