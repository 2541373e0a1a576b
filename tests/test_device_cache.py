"""DeviceCache: residency of rows in a small device tier over host homes, and swap plans.

The hammer test simulates the device and host stores with numpy and a reference store that
holds every row's true value: whatever the cache decides, every batch must read its rows'
latest values from the device, and no update may be lost when rows move.
"""

from collections import deque

import numpy as np
import pytest

from sparseflow.pipeline.device_cache import DeviceCache, DeviceCacheFullError


def _execute(plans, device, host):
    for plan in plans:
        host[plan.out_rows] = device[plan.out_slots]   # write back first: slots are reused
        device[plan.in_slots] = host[plan.in_rows]


@pytest.mark.parametrize("slots, in_flight, seed", [(24, 1, 0), (24, 3, 1), (40, 4, 2),
                                                    (18, 2, 3)])
def test_hammer_a_tiny_cache_never_loses_an_update(slots, in_flight, seed):
    rng = np.random.default_rng(seed)
    n_rows, dim, batch = 300, 3, 6
    cache = DeviceCache("t", slots, n_rows)
    truth = rng.normal(size=(n_rows, dim))            # every row's true value
    host = truth.copy()                                # host homes start with the init values
    device = np.full((slots, dim), np.nan)             # garbage until something is swapped in
    queue = deque()
    for seq in range(600):
        # Zipf-ish rows, distinct within the batch, sometimes a key without a row (-1).
        rows = np.unique(np.minimum(rng.zipf(1.3, batch) - 1, n_rows - 1)).astype(np.int32)
        if seq % 7 == 0:
            rows = np.append(rows, -1).astype(np.int32)
        queue.append((seq, rows, cache.place(rows, seq)))   # the input pipeline runs ahead
        if len(queue) <= in_flight:
            continue
        step_seq, step_rows, step_slots = queue.popleft()   # the training step
        _execute(cache.pop_plans(), device, host)
        valid = step_rows >= 0
        np.testing.assert_array_equal(device[step_slots[valid]], truth[step_rows[valid]])
        delta = rng.normal(size=(int(valid.sum()), dim))
        device[step_slots[valid]] += delta                  # the update lands on the device
        truth[step_rows[valid]] += delta
        cache.release(step_seq)
        assert len(set(cache.row_in[cache.row_in >= 0].tolist())) == int(
            (cache.row_in >= 0).sum())                      # a row is in at most one slot
    # Flush: every row's latest value is on the device if resident, else at home.
    while queue:
        step_seq, _, _ = queue.popleft()
        cache.release(step_seq)
    _execute(cache.pop_plans(), device, host)
    final = host.copy()
    resident = cache.row_in >= 0
    final[cache.row_in[resident]] = device[resident]
    np.testing.assert_allclose(final, truth)
    assert cache.swapped_out > 0 and 0.0 < cache.hit_rate < 1.0


def test_rows_of_batches_in_flight_are_never_victims():
    cache = DeviceCache("t", 4, 10)
    cache.place(np.array([0, 1], np.int32), seq=0)       # in flight
    cache.place(np.array([2, 3], np.int32), seq=1)       # in flight: the cache is full
    with pytest.raises(DeviceCacheFullError, match=r"device_vocabulary_size=4.*"
                                                   r"host_vocabulary_size"):
        cache.place(np.array([4], np.int32), seq=2)
    assert cache.slot_of[4] == -1                        # nothing changed
    cache.release(0)
    slots = cache.place(np.array([4, 2], np.int32), seq=2)
    assert cache.slot_of[0] == -1 or cache.slot_of[1] == -1   # an unpinned row left ...
    assert slots[1] == cache.slot_of[2]                  # ... and row 2 kept its slot
    plans = cache.pop_plans()
    assert [p.in_rows.tolist() for p in plans] == [[0, 1], [2, 3], [4]]
    assert plans[2].out_rows.tolist() == [0]             # least recently used first


def test_forget_frees_the_slots_of_evicted_rows():
    cache = DeviceCache("t", 3, 10)
    cache.place(np.array([5, 6], np.int32), seq=0)
    cache.release(0)
    freed = cache.forget(np.array([5, 9], np.int32))
    assert freed.shape == (1,) and cache.slot_of[5] == -1 and cache.row_in[freed[0]] == -1
