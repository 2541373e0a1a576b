"""DiskRows (the SSD tier's memory-mapped store) and the LFU victim choice."""

import os

import numpy as np
import pytest

from sparseflow.embed.disk_rows import DiskFullError, DiskRows, least_frequent


def test_rows_round_trip_through_the_file(tmp_path):
    store = DiskRows("t", 10, 6, [str(tmp_path)])
    slots = store.allocate(3)
    assert slots.tolist() == [0, 1, 2] and store.used == 3
    values = np.arange(18, dtype=np.float32).reshape(3, 6)
    store.write(slots, values)
    store.flush()
    on_disk = np.fromfile(tmp_path / "t.sparseflow-rows", np.float32).reshape(10, 6)
    np.testing.assert_array_equal(on_disk[:3], values)
    np.testing.assert_array_equal(store.read(slots[::-1]), values[::-1])
    store.release(slots[1:2])
    assert store.allocate(1).tolist() == [1]   # a released slot is reused first
    store.close()
    assert not os.path.exists(tmp_path / "t.sparseflow-rows")


def test_full_store_raises_and_takes_nothing(tmp_path):
    store = DiskRows("t", 4, 2, [str(tmp_path)])
    store.allocate(3)
    with pytest.raises(DiskFullError, match="ssd_vocabulary_size"):
        store.allocate(2)
    assert store.used == 3
    assert store.allocate(1).tolist() == [3]


def test_the_next_directory_is_used_when_one_cannot_hold_the_file(tmp_path):
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where a directory should be")
    store = DiskRows("t", 4, 2, [str(blocked), str(tmp_path / "ok")])
    assert store.path == str(tmp_path / "ok" / "t.sparseflow-rows")
    with pytest.raises(OSError, match="ssd_data_path"):
        DiskRows("u", 4, 2, [str(blocked)])


def test_bad_arguments_name_them(tmp_path):
    with pytest.raises(ValueError, match="capacity >= 1"):
        DiskRows("t", 0, 2, [str(tmp_path)])
    with pytest.raises(ValueError, match="`ssd_data_path`"):
        DiskRows("t", 2, 2, [])


def test_least_frequent_picks_the_coldest_eligible_rows():
    freq = np.array([5, 1, 9, 1, 0, 3], np.int64)
    eligible = np.array([True, True, True, True, False, True])
    assert least_frequent(freq, eligible, 3).tolist() == [1, 3, 5]   # row 4 is in flight
    assert least_frequent(freq, eligible, 0).tolist() == []
    rng = np.random.default_rng(0)
    freq = rng.integers(0, 50, 1000)
    eligible = rng.random(1000) < 0.7
    got = least_frequent(freq, eligible, 100)
    ref = sorted(np.flatnonzero(eligible), key=lambda r: (freq[r], r))[:100]
    assert got.tolist() == ref
    with pytest.raises(ValueError, match="in flight"):
        least_frequent(freq, eligible, int(eligible.sum()) + 1)
