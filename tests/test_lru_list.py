"""The fast tier's LRU list (ops/lru_list.py): its order against the stamps, and its walk
against the scan (tier_kernels.select_victims, itself tested against numpy), over random
operations on a TierCache."""

import numpy as np
import pytest

from sparseflow.ops import lru_list, tier_kernels
from sparseflow.pipeline.tier_cache import CacheFullError, TierCache


def listed(cache):
    """The list's slots, head (oldest) first."""
    nxt, _ = cache._lru   # noqa: SLF001
    sentinel = nxt.shape[0] - 1
    out, s = [], nxt[sentinel]
    while s != sentinel:
        out.append(int(s))
        s = nxt[s]
        assert len(out) <= sentinel, "the list has a cycle"
    return out


def check_list(cache):
    """The list holds exactly the slots holding a row, by their stamps (each its own)."""
    got = listed(cache)
    held = np.flatnonzero(cache.row_in >= 0)
    assert np.unique(cache.last_used[held]).shape == held.shape
    assert got == held[np.argsort(cache.last_used[held])].tolist()
    _, prv = cache._lru   # noqa: SLF001
    assert (prv[:-1][cache.row_in < 0] == -1).all()   # the others are out of it


def check_walk(cache, rng):
    """The walk picks what the scan picks, for random own slots and counts."""
    slots = cache.slots
    resident = rng.choice(slots, int(rng.integers(0, slots // 3 + 1)),
                          replace=False).astype(np.int32)
    for n in sorted({0, 1, 3, slots // 4, slots, slots + 2}):
        for enough in (0, n + 5):
            want = np.full(n, -7, np.int32)
            marks = np.zeros(slots, np.bool_)
            want_eligible = tier_kernels.select_victims(
                cache.pins, cache.row_in, cache.last_used, np.zeros(0, np.int64), False,
                resident, n, want, marks)
            got = np.full(n, -7, np.int32)
            eligible = lru_list.victims(*cache._lru, cache.pins, marks, resident, n,   # noqa: SLF001
                                        enough, got)
            assert eligible == min(want_eligible, max(n, enough))
            np.testing.assert_array_equal(got, want)
            assert not marks.any()


@pytest.mark.parametrize("seed", range(5))
def test_the_list_walk_picks_the_victims_the_scan_picks(seed):
    rng = np.random.default_rng(seed)
    slots, n_rows = int(rng.integers(8, 60)), 200
    cache = TierCache("t", slots, n_rows)
    seq = 0
    claimed = []
    for _ in range(400):
        op = rng.random()
        rows = np.unique(rng.integers(0, n_rows, int(rng.integers(1, max(2, slots // 3)))))
        rows = rows.astype(np.int32)
        if op < 0.35:       # the pipeline places a batch early
            cache.prefetch(rows, seq)
            seq += 1
        elif op < 0.65:     # a step claims a batch (placed early or not)
            try:
                cache.place(rows, seq)
                claimed.append(seq)
            except CacheFullError:
                pass
            seq += 1
        elif op < 0.8 and claimed:   # gathered, then updated
            cache.release(claimed.pop(0))
            cache.settle()
        elif op < 0.95:     # rows handed to new keys
            cache.forget(rows[:2])
        elif op < 0.97:
            cache.reset()
            claimed.clear()
        cache.pop_plans()
        check_list(cache)
        check_walk(cache, rng)


def test_the_free_slots_taken_are_the_lowest_after_forget_and_reset():
    cache = TierCache("t", 6, 50)
    first = cache.place(np.arange(4, dtype=np.int32), 0)
    assert first.tolist() == [0, 1, 2, 3]
    assert cache.forget(np.array([1, 3], np.int32)).tolist() == [1, 3]
    cache.release(0)
    cache.settle()
    assert cache.place(np.array([10, 11, 12], np.int32), 1).tolist() == [1, 3, 4]
    cache.reset()
    assert cache.place(np.array([20], np.int32), 2).tolist() == [0]


def test_a_placement_without_room_leaves_the_free_slots_to_the_next():
    """Early placement of a batch that does not fit changes nothing: the free slots it
    looked at are still the first the next batch gets."""
    cache = TierCache("t", 4, 50)
    cache.place(np.array([0, 1], np.int32), 0)            # pinned: no victims
    cache.prefetch(np.arange(10, 14, dtype=np.int32), 1)  # 4 rows, 2 free slots: no room
    assert 1 not in cache._read_ahead                      # noqa: SLF001
    assert cache.place(np.array([20, 21], np.int32), 2).tolist() == [2, 3]


def test_a_slot_touched_twice_moves_once_and_the_list_stays_whole():
    """Repeated slots in one touch (a batch with a row twice) used to link a slot twice:
    a cycle the walk never left."""
    nxt, prv = lru_list.empty(4)
    lru_list.touch(nxt, prv, np.array([0, 1, 2, 3], np.int32))
    for slots in ([0, 3, 0, 0], [1, 1, 1], [2, 3, 3], [3, -1, 3, 0]):
        lru_list.touch(nxt, prv, np.array(slots, np.int32))
        order, s = [], nxt[4]
        while s != 4 and len(order) <= 4:
            order.append(int(s))
            s = nxt[s]
        assert sorted(order) == [0, 1, 2, 3]
        firsts = list(dict.fromkeys(x for x in slots if x >= 0))
        assert order[-len(firsts):] == firsts   # moved to the newest end, first places
    out = np.empty(4, np.int32)
    assert lru_list.victims(nxt, prv, np.zeros(4, np.int32), np.zeros(4, np.bool_),
                            np.zeros(0, np.int32), 4, 0, out) == 4


def test_a_broken_list_stops_the_walk_instead_of_looping():
    cache = TierCache("t", 3, 20)
    cache.place(np.array([0, 1, 2], np.int32), 0)   # pinned: never a victim
    nxt, _ = cache._lru   # noqa: SLF001
    nxt[nxt[3]] = nxt[3]   # the oldest slot points at itself
    with pytest.raises(RuntimeError, match="LRU list is broken"):
        cache.place(np.array([5], np.int32), 1)
