"""Key ownership, per-owner send buffers and checkpoint re-bucketing (multi-worker sharding),
against plain numpy."""

import numpy as np
import pytest

import sparseflow as sf
from sparseflow.checkpoint.table_state import NO_CLOCK, TableState
from sparseflow.distributed.sharding import PAD_KEY, bucket_keys, owner_of, rebucket


def test_owners_follow_key_mod_n_and_the_mixed_rule_spreads_skewed_keys():
    keys = np.array([0, 1, 2, 3, -1, -2, -7, 2**62 + 3, -(2**63)], np.int64)
    np.testing.assert_array_equal(owner_of(keys, 3), np.mod(keys, 3))   # non-negative
    skewed = np.arange(0, 4000, 4, dtype=np.int64)     # multiples of the world size
    assert set(owner_of(skewed, 4).tolist()) == {0}
    spread = np.bincount(owner_of(skewed, 4, hash="mix"), minlength=4)
    assert spread.min() > 150                            # about 250 each
    with pytest.raises(ValueError, match=r"Argument `hash` must be one of"):
        owner_of(keys, 2, hash="crc")


@pytest.mark.parametrize("send_count", [None, 400])
def test_buckets_hold_each_key_once_in_its_owners_row(send_count):
    rng = np.random.default_rng(0)
    keys = np.unique(rng.integers(-(2**40), 2**40, 1000))
    b = bucket_keys(keys, 4, send_count)
    owners = np.mod(keys, 4)
    np.testing.assert_array_equal(b.counts, np.bincount(owners, minlength=4))
    assert b.width == (send_count or b.counts.max())
    np.testing.assert_array_equal(b.send.reshape(-1)[b.positions], keys)  # read back
    for r in range(4):
        row = b.send[r]
        np.testing.assert_array_equal(np.sort(row[:b.counts[r]]), np.sort(keys[owners == r]))
        assert (row[b.counts[r]:] == PAD_KEY).all()
    # Keys keep their batch order within a row (a stable sort).
    np.testing.assert_array_equal(b.send[1][:b.counts[1]], keys[owners == 1])


def test_a_bucket_over_send_count_names_the_value_to_set():
    keys = np.arange(0, 30, 2, dtype=np.int64)          # all owned by worker 0 of 2
    with pytest.raises(sf.SendCountOverflowError,
                       match=r"sends 15 unique keys to worker 0 of 2, more than "
                             r"send_count=10. Set `send_count` to at least 15"):
        bucket_keys(keys, 2, send_count=10)


def _state(keys, dim=2, slots=("momentum",), clock=5, steps=3):
    keys = np.asarray(keys, np.int64)
    n = keys.shape[0]
    values = (keys[:, None] * np.ones((1, dim * (1 + len(slots))))).astype(np.float32)
    return TableState(keys=keys, counts=(keys % 7).astype(np.int32), last_seen=keys * 10,
                      values=values, slot_names=slots,
                      counted_keys=keys[:2] + 1000, counted_counts=np.ones(min(n, 2), np.int32),
                      clock=clock, optimizer_steps=steps)


@pytest.mark.parametrize("old, new", [(2, 1), (1, 2), (2, 3), (3, 2)])
def test_rebucketing_a_checkpoint_moves_every_key_to_its_new_owner_once(old, new):
    keys = np.arange(-20, 40, dtype=np.int64)
    states = [_state(keys[np.mod(keys, old) == r], clock=5 + r) for r in range(old)]
    out = rebucket(states, new)
    assert len(out) == new
    got = np.concatenate([s.keys for s in out])
    np.testing.assert_array_equal(np.sort(got), keys)   # each key exactly once
    for r, s in enumerate(out):
        assert (np.mod(s.keys, new) == r).all() and (np.mod(s.counted_keys, new) == r).all()
        np.testing.assert_array_equal(s.values[:, 0], s.keys.astype(np.float32))  # its row
        np.testing.assert_array_equal(s.last_seen, s.keys * 10)
        assert s.clock == 5 + old - 1 and s.optimizer_steps == 3
    assert sum(s.counted_keys.shape[0] for s in out) == sum(
        s.counted_keys.shape[0] for s in states)


@pytest.mark.parametrize("old, new", [(2, 1), (2, 3)])
def test_rebucketing_joins_the_admission_sketches_for_every_new_worker(old, new):
    """A sketch cannot be split by key: every new worker gets the old ones joined, which
    counts each key at least as often as its old owner counted it (numpy reference: the
    true counts), and joining them again adds nothing up twice."""
    from sparseflow.ops.count_min import CountMinSketch

    rng = np.random.default_rng(4)
    keys = rng.integers(0, 5000, 3000).astype(np.int64)
    states, true = [], {}
    for r in range(old):
        mine = keys[np.mod(keys, old) == r]
        sketch = CountMinSketch(width=256, depth=3, seed=9)
        sketch.add(mine, np.ones_like(mine))
        uniq, counts = np.unique(mine, return_counts=True)
        true.update(zip(uniq.tolist(), counts.tolist()))
        state = _state(np.arange(r, 40, old))
        state.sketch = sketch
        states.append(state)
    out = rebucket(states, new)
    query = np.array(sorted(true), np.int64)
    expected = np.array([true[k] for k in query.tolist()])
    for s in out:
        assert (s.sketch.estimate(query) >= expected).all()
        np.testing.assert_array_equal(   # the larger of the old counters, cell by cell
            s.sketch.counters, np.maximum.reduce([t.sketch.counters for t in states]))
    again = rebucket(out, 1)[0].sketch   # e.g. 2 -> 3 -> 1: nothing counted twice
    np.testing.assert_array_equal(again.counters, out[0].sketch.counters)


def test_rebucketing_refuses_inconsistent_shards():
    with pytest.raises(ValueError, match=r"mixes optimizer slot layouts"):
        rebucket([_state([0, 2]), _state([1, 3], slots=())], 2)
    with pytest.raises(ValueError, match=r"holds a key on two workers"):
        rebucket([_state([0, 2]), _state([2, 3])], 2)
    with pytest.raises(ValueError, match=r"one TableState per old worker"):
        rebucket([], 2)
    assert rebucket([_state([], clock=NO_CLOCK)], 2)[1].keys.shape == (0,)
