"""TierCache: residency of rows in a small fast tier over homes, and swap plans.

The hammer test simulates the device and host stores with numpy and a reference store that
holds every row's true value: whatever the cache decides, every batch must read its rows'
latest values from the device, and no update may be lost when rows move.
"""

from collections import deque

import numpy as np
import pytest

from sparseflow.pipeline.tier_cache import CacheFullError, TierCache

from tests.thread_utils import returns_while_locked


def _execute(plans, device, host, gen=None):
    """As the training step does: every write-back (unless the row was reused since), then
    every swap in."""
    for plan in plans:
        keep = np.ones(plan.out_rows.shape[0], bool) if gen is None else \
            gen[plan.out_rows] == plan.out_gens
        host[plan.out_rows[keep]] = device[plan.out_slots[keep]]
    for plan in plans:
        device[plan.in_slots] = host[plan.in_rows]


@pytest.mark.parametrize("slots, in_flight, seed", [(24, 1, 0), (24, 3, 1), (40, 4, 2),
                                                    (28, 2, 3)])
def test_hammer_a_tiny_cache_never_loses_an_update(slots, in_flight, seed):
    rng = np.random.default_rng(seed)
    n_rows, dim, batch = 300, 3, 6
    cache = TierCache("t", slots, n_rows)
    truth = rng.normal(size=(n_rows, dim))            # every row's true value
    host = truth.copy()                                # host homes start with the init values
    device = np.full((slots, dim), np.nan)             # garbage until something is swapped in
    queue = deque()
    for seq in range(600):
        # Zipf-ish rows, distinct within the batch, sometimes a key without a row (-1).
        rows = np.unique(np.minimum(rng.zipf(1.3, batch) - 1, n_rows - 1)).astype(np.int32)
        if seq % 7 == 0:
            rows = np.append(rows, -1).astype(np.int32)
        late = seq % 3 == 0   # placed between the step's gather and its update
        if not late:
            queue.append((seq, rows, cache.place(rows, seq)))   # the pipeline runs ahead
        if len(queue) <= in_flight:
            if late:
                queue.append((seq, rows, cache.place(rows, seq)))
            continue
        step_seq, step_rows, step_slots = queue.popleft()   # the training step
        _execute(cache.pop_plans(), device, host)
        valid = step_rows >= 0
        np.testing.assert_array_equal(device[step_slots[valid]], truth[step_rows[valid]])
        cache.release(step_seq)                             # the gather read the rows
        if late:
            queue.append((seq, rows, cache.place(rows, seq)))
        delta = rng.normal(size=(int(valid.sum()), dim))
        device[step_slots[valid]] += delta                  # the update lands on the device
        truth[step_rows[valid]] += delta
        if seq % 2:
            cache.settle()          # after the update (one settle covers both batches)
        assert len(set(cache.row_in[cache.row_in >= 0].tolist())) == int(
            (cache.row_in >= 0).sum())                      # a row is in at most one slot
    # Flush: every row's latest value is on the device if resident, else at home.
    while queue:
        step_seq, _, _ = queue.popleft()
        cache.release(step_seq)
    cache.settle()
    _execute(cache.pop_plans(), device, host)
    final = host.copy()
    resident = cache.row_in >= 0
    final[cache.row_in[resident]] = device[resident]
    np.testing.assert_allclose(final, truth)
    assert cache.swapped_out > 0 and 0.0 < cache.hit_rate < 1.0


@pytest.mark.parametrize("slots, ahead, seed", [(8, 6, 0), (14, 12, 1), (30, 40, 2)])
def test_hammer_read_ahead_placements_taken_back_never_lose_an_update(slots, ahead, seed):
    """The pipeline places up to ``ahead`` batches early (``prefetch``, room permitting); each
    step claims its batch (``place``), taking back early placements when short of room; now
    and then the read-ahead is abandoned (an iterator re-initialized) or a batch is an
    evaluation one. Every gather reads its rows' latest values; no update is lost."""
    rng = np.random.default_rng(seed)
    n_rows, dim, batch = 300, 3, 6
    cache = TierCache("t", slots, n_rows)
    truth = rng.normal(size=(n_rows, dim))
    host = truth.copy()
    device = np.full((slots, dim), np.nan)
    queue, seq = deque(), 0
    for step in range(400):
        while len(queue) < ahead:                           # the pipeline reads ahead
            rows = np.unique(np.minimum(rng.zipf(1.3, batch) - 1, n_rows - 1)).astype(np.int32)
            training = seq % 5 != 0
            cache.prefetch(rows, seq, training)
            queue.append((seq, rows, training))
            seq += 1
        if step % 37 == 36:
            queue.clear()                                   # re-initialized: abandoned
            continue
        step_seq, step_rows, training = queue.popleft()
        step_slots = cache.place(step_rows, step_seq)       # the step's claim
        _execute(cache.pop_plans(), device, host)
        np.testing.assert_array_equal(device[step_slots], truth[step_rows])
        cache.release(step_seq)                             # gathered
        if training:
            delta = rng.normal(size=(step_rows.shape[0], dim))
            device[step_slots] += delta                     # the update
            truth[step_rows] += delta
            cache.settle()
        assert len(set(cache.row_in[cache.row_in >= 0].tolist())) == int(
            (cache.row_in >= 0).sum())
    _execute(cache.pop_plans(), device, host)
    final = host.copy()
    resident = cache.row_in >= 0
    final[cache.row_in[resident]] = device[resident]
    np.testing.assert_allclose(final, truth)
    assert cache.swapped_out > 0


def test_read_ahead_never_fills_the_cache_and_gives_its_slots_back():
    cache = TierCache("t", 4, 20)
    cache.prefetch(np.array([0, 1], np.int32), seq=0)       # placed early
    cache.prefetch(np.array([2, 3], np.int32), seq=1)       # placed early: the tier is full
    cache.prefetch(np.array([4], np.int32), seq=2)          # no room: left to its step
    assert cache.slot_of[4] == -1 and cache.pins.tolist() == [1, 1, 1, 1]
    assert cache.place(np.array([0, 1], np.int32), seq=0).tolist() == [0, 1]   # claimed
    assert [p.in_rows.tolist() for p in cache.pop_plans()] == [[0, 1], [2, 3]]
    cache.release(0)
    cache.settle()
    # Unpinned slots first: batch 1 keeps its early placement.
    assert cache.place(np.array([4], np.int32), seq=2).tolist() == [0]
    assert cache.pins.tolist() == [1, 0, 1, 1]
    # Three rows need more: batch 1's early placement is taken back.
    assert sorted(cache.place(np.array([5, 6, 7], np.int32), seq=3).tolist()) == [1, 2, 3]
    assert cache.pins.tolist() == [1, 1, 1, 1]
    with pytest.raises(CacheFullError, match=r"a batch needs 2 rows moved into the fast tier, "
                                             r"but only 0 of its 4 slots \(4 slots\) are free "
                                             r"or unused by the 2 batches in flight"):
        cache.place(np.array([2, 3], np.int32), seq=1)      # two claimed batches hold all


def test_rows_of_batches_in_flight_are_never_victims():
    cache = TierCache("t", 4, 10, size_hint="device_vocabulary_size=4, host_vocabulary_size=6")
    cache.place(np.array([0, 1], np.int32), seq=0)       # in flight
    cache.place(np.array([2, 3], np.int32), seq=1)       # in flight: the cache is full
    with pytest.raises(CacheFullError, match=r"device_vocabulary_size=4.*"
                                                   r"host_vocabulary_size"):
        cache.place(np.array([4], np.int32), seq=2)
    assert cache.slot_of[4] == -1                        # nothing changed
    # The steps of batches 0 and 1 execute their moves before their gathers.
    assert [p.in_rows.tolist() for p in cache.pop_plans()] == [[0, 1], [2, 3]]
    cache.release(0)                                     # gathered, not yet updated
    cache.settle()                                       # updated
    slots = cache.place(np.array([4, 2], np.int32), seq=2)
    assert cache.slot_of[0] == -1 or cache.slot_of[1] == -1   # an unpinned row left ...
    assert slots[1] == cache.slot_of[2]                  # ... and row 2 kept its slot
    plans = cache.pop_plans()
    assert [p.in_rows.tolist() for p in plans] == [[4]]
    assert plans[0].out_rows.tolist() == [0]             # least recently used first


def test_forget_frees_the_slots_of_evicted_rows():
    cache = TierCache("t", 3, 10)
    cache.place(np.array([5, 6], np.int32), seq=0)
    cache.release(0)
    cache.settle()
    freed = cache.forget(np.array([5, 9], np.int32))
    assert freed.shape == (1,) and cache.slot_of[5] == -1 and cache.row_in[freed[0]] == -1


def test_a_reused_row_drops_the_queued_write_back_of_its_old_contents():
    cache = TierCache("t", 2, 10)
    host = np.arange(10.0)[:, None].repeat(2, 1)
    device = np.zeros((2, 2))
    cache.place(np.array([0, 1], np.int32), seq=0)
    _execute(cache.pop_plans(), device, host, cache.gen)
    device[:] += 100.0                                   # trained
    cache.release(0)
    cache.settle()
    cache.place(np.array([2], np.int32), seq=1)         # row 0 (LRU tie: lower slot) leaves
    plan = cache.pop_plans()[0]
    assert plan.out_rows.tolist() == [0]
    cache.forget(np.array([0], np.int32))                # row 0 handed to a new key ...
    host[0] = -7.0                                       # ... which writes its initial values
    _execute([plan], device, host, cache.gen)
    assert host[0].tolist() == [-7.0, -7.0]              # not the evicted key's 100.0
    assert host[2].tolist() == device[plan.in_slots[0]].tolist()


def test_lfu_evicts_the_least_often_placed_rows_first():
    cache = TierCache("t", 3, 10, policy="lfu")
    for seq, rows in enumerate([[0, 1, 2], [0, 2], [2], [0]]):
        cache.place(np.array(rows, np.int32), seq)
        cache.release(seq)
        cache.settle()
    cache.pop_plans()
    cache.place(np.array([5], np.int32), seq=9)          # row 1 was placed once: it leaves
    assert cache.pop_plans()[0].out_rows.tolist() == [1]
    lru = TierCache("t", 3, 10)
    for seq, rows in enumerate([[0, 1, 2], [1], [2]]):
        lru.place(np.array(rows, np.int32), seq)
        lru.release(seq)
        lru.settle()
    lru.pop_plans()
    lru.place(np.array([5], np.int32), seq=9)
    assert lru.pop_plans()[0].out_rows.tolist() == [0]  # LRU: row 0 is the oldest


def test_reset_empties_the_cache():
    cache = TierCache("t", 3, 10)
    cache.place(np.array([0, 1], np.int32), seq=0)
    cache.reset()
    assert (cache.row_in == -1).all() and (cache.pins == 0).all() and not cache.pop_plans()
    cache.release(0)                                     # a batch from before: ignored
    cache.settle()
    assert (cache.pins == 0).all()


def test_a_gathered_training_batch_stays_pinned_until_its_update():
    cache = TierCache("t", 5, 20)
    cache.place(np.array([0, 1], np.int32), seq=0)                  # training batch
    cache.place(np.array([2, 3], np.int32), seq=1, training=False)  # evaluation batch
    cache.place(np.array([4], np.int32), seq=2)
    cache.release(0)    # gathered; its update has not run
    cache.release(1)    # gathered; nothing will write it: unpinned now
    cache.release(2)
    assert cache.pins[cache.slot_of[[0, 1]]].tolist() == [1, 1]    # still pinned
    assert cache.pins[cache.slot_of[[2, 3]]].tolist() == [0, 0]
    cache.settle()      # batches 0 and 2 updated
    cache.pop_plans()
    cache.place(np.array([5, 6], np.int32), seq=3)
    cache.release(3)
    # Batch 3 is gathered, not updated; a placement needing two slots takes the
    # evaluation batch's and others', never batch 3's.
    cache.place(np.array([7, 8], np.int32), seq=4)
    assert cache.slot_of[5] >= 0 and cache.slot_of[6] >= 0
    out = [r for p in cache.pop_plans() for r in p.out_rows.tolist()]
    assert 5 not in out and 6 not in out


def test_a_training_batch_whose_update_never_runs_is_named_when_the_cache_fills():
    cache = TierCache("t", 3, 20)
    cache.place(np.array([0, 1, 2], np.int32), seq=0)
    cache.release(0)                                     # no update follows
    with pytest.raises(CacheFullError, match=r"1 gathered batches await theirs"):
        cache.place(np.array([3], np.int32), seq=1)
    cache.settle()                                       # the next update
    assert cache.place(np.array([3], np.int32), seq=1).tolist() == [0]


@pytest.mark.parametrize("call", ["place", "prefetch", "forget"])
def test_a_row_past_the_table_is_an_error_and_nothing_moves(call):
    cache = TierCache("t", 4, 10)
    cache.place(np.array([1, 2], np.int32), seq=0)
    before = (cache.slot_of.copy(), cache.row_in.copy(), cache.gen.copy(), cache._n_free)
    rows = np.array([3, 10], np.int32)
    with pytest.raises(IndexError, match=r"Table `t`: row 10 is outside its 10 logical rows"):
        if call == "forget":
            with cache.lock:
                cache.forget(rows)
        else:
            getattr(cache, call)(rows, 1)
    np.testing.assert_array_equal(cache.slot_of, before[0])
    np.testing.assert_array_equal(cache.row_in, before[1])
    np.testing.assert_array_equal(cache.gen, before[2])
    assert cache._n_free == before[3]


def test_claiming_a_batch_whose_row_left_the_tier_stamps_only_its_own_slots():
    # A row of a batch placed early can leave the tier before the claim (forgotten: handed
    # to a new key). Its slot is then -1, which must not index the last slot's LRU clock.
    cache = TierCache("t", 4, 10)
    first = cache.place(np.array([0, 1, 2, 3], np.int32), seq=0)   # every slot taken
    cache.release(0)
    cache.settle()
    cache.prefetch(np.array([1, 2], np.int32), seq=1)             # placed early
    with cache.lock:
        cache.forget(np.array([2], np.int32))                     # row 2 leaves its slot
    last_before = cache.last_used.copy()
    slots = cache.place(np.array([1, 2], np.int32), seq=1)
    assert slots.tolist() == [first[1], -1]
    untouched = [s for s in range(4) if s != first[1]]
    np.testing.assert_array_equal(cache.last_used[untouched], last_before[untouched])


def test_a_release_behind_the_lock_is_applied_by_its_next_holder():
    """The step's release does not wait while the pipeline's thread holds the cache's lock
    (placing a batch early): the next holder applies it first, so a training batch's
    settle still unpins it and an evaluation batch's slots are free for the next claim."""
    cache = TierCache("t", 4, 50)
    cache.place(np.array([0, 1], np.int32), 0, training=True)
    cache.place(np.array([2, 3], np.int32), 1, training=False)
    with cache.lock:   # as the pipeline's thread would
        returns_while_locked(cache.release, 0)
        returns_while_locked(cache.release, 1)
        assert cache.pins.sum() == 4   # queued, not applied inside the section
    # The evaluation batch's slots are free for the next claim; the training batch's stay
    # pinned until its update has run.
    assert sorted(cache.place(np.array([10, 11], np.int32), 2).tolist()) == [2, 3]
    with pytest.raises(CacheFullError):
        cache.place(np.array([20], np.int32), 3)
    cache.settle()
    assert cache.place(np.array([20], np.int32), 3).tolist() == [0]
