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


def test_marks_are_left_clear_when_the_batchs_own_slots_repeat():
    marks = np.zeros(6, np.bool_)
    tier_kernels.select_victims(np.zeros(6, np.int32), np.arange(6, dtype=np.int32),
                                np.arange(6, dtype=np.int64), np.zeros(0, np.int64), False,
                                np.array([5, 5, 2, 9, -1], np.int32), 3,
                                np.empty(3, np.int32), marks)
    assert not marks.any()


@pytest.mark.parametrize("seed", range(4))
def test_find_slots_and_commit_slots_match_numpy(seed):
    rng = np.random.default_rng(seed)
    n_rows, n_slots = 60, 20
    slot_of = np.full(n_rows, -1, np.int32)
    row_in = np.full(n_slots, -1, np.int32)
    held_rows = rng.choice(n_rows, 15, replace=False).astype(np.int32)
    held_slots = rng.choice(n_slots, 15, replace=False).astype(np.int32)
    slot_of[held_rows], row_in[held_slots] = held_slots, held_rows
    gen = rng.integers(0, 5, n_rows).astype(np.int64)
    uses = rng.integers(0, 5, n_rows).astype(np.int64)
    last_used = rng.integers(0, 5, n_slots).astype(np.int64)
    rows = np.concatenate([rng.choice(n_rows, 12, replace=False), [-1, -1]]).astype(np.int32)
    u = rows.shape[0]
    slots, missing, resident = (np.full(u, -9, np.int32) for _ in range(3))
    n, n_res, bad = tier_kernels.find_slots(rows, slot_of, slots, missing, resident)
    valid = rows >= 0
    want_slots = np.where(valid, slot_of[np.maximum(rows, 0)], -1)
    want_missing = np.flatnonzero(valid & (want_slots < 0))
    assert bad == -1
    np.testing.assert_array_equal(slots, want_slots)
    np.testing.assert_array_equal(missing[:n], want_missing)
    np.testing.assert_array_equal(resident[:n_res], want_slots[valid & (want_slots >= 0)])

    # The numpy reference of a placement: free slots, then victims (slots not the batch's).
    free = np.flatnonzero(row_in < 0).astype(np.int32)
    own = set(want_slots[want_slots >= 0].tolist())
    others = np.array([s for s in range(n_slots) if row_in[s] >= 0 and s not in own],
                      np.int32)
    take = min(n, free.shape[0])
    victims = others[:n - take]
    new_slots = np.concatenate([free[:take], victims]).astype(np.int32)
    ref = dict(slot_of=slot_of.copy(), row_in=row_in.copy(), last_used=last_used.copy(),
               uses=uses.copy(), slots=want_slots.astype(np.int32))
    out_rows_ref = ref["row_in"][victims].copy()
    out_gens_ref = gen[out_rows_ref].copy()
    ref["slot_of"][out_rows_ref] = -1
    in_rows_ref = rows[want_missing]
    ref["slot_of"][in_rows_ref] = new_slots
    ref["row_in"][new_slots] = in_rows_ref
    ref["slots"][want_missing] = new_slots
    ref["last_used"][ref["slots"][valid]] = 7 + np.arange(int(valid.sum()))   # batch order
    ref["uses"][rows[valid]] += 1

    out_rows = np.empty(victims.shape[0], np.int32)
    out_gens = np.empty(victims.shape[0], np.int64)
    in_rows = np.empty(n, np.int32)
    tier_kernels.commit_slots(rows, slots, missing[:n], victims, new_slots, slot_of, row_in,
                              last_used, 7, uses, True, gen, out_rows, out_gens, in_rows)
    for name, got in (("slot_of", slot_of), ("row_in", row_in), ("last_used", last_used),
                      ("uses", uses), ("slots", slots)):
        np.testing.assert_array_equal(got, ref[name], err_msg=name)
    np.testing.assert_array_equal(out_rows, out_rows_ref)
    np.testing.assert_array_equal(out_gens, out_gens_ref)
    np.testing.assert_array_equal(in_rows, in_rows_ref)


def test_find_slots_reports_a_row_past_the_table():
    slot_of = np.full(10, -1, np.int32)
    rows = np.array([3, -1, 12, 4], np.int32)
    out = [np.empty(4, np.int32) for _ in range(3)]
    assert tier_kernels.find_slots(rows, slot_of, *out)[2] == 2


def test_forget_rows_matches_numpy():
    rng = np.random.default_rng(3)
    slot_of = np.full(30, -1, np.int32)
    row_in = np.full(8, -1, np.int32)
    slot_of[[2, 5, 7]] = [6, 0, 3]
    row_in[[6, 0, 3]] = [2, 5, 7]
    gen = rng.integers(0, 4, 30).astype(np.int64)
    uses = rng.integers(1, 4, 30).astype(np.int64)
    rows = np.array([5, 11, 2], np.int32)
    want_gen, want_uses = gen.copy(), uses.copy()
    want_gen[rows] += 1
    want_uses[rows] = 0
    freed = np.empty(3, np.int32)
    n = tier_kernels.forget_rows(rows, slot_of, row_in, gen, uses, True, freed)
    assert freed[:n].tolist() == [0, 6]
    assert (slot_of[rows] == -1).all() and row_in.tolist() == [-1, -1, -1, 7, -1, -1, -1, -1]
    np.testing.assert_array_equal(gen, want_gen)
    np.testing.assert_array_equal(uses, want_uses)
