"""DiskRows: the SSD tier's memory-mapped store of row homes."""

import os

import numpy as np
import pytest

from sparseflow.embed.disk_rows import DiskRows


def test_rows_round_trip_through_the_file(tmp_path):
    store = DiskRows("t", 10, 6, [str(tmp_path)])
    rows = np.array([7, 0, 3], np.int32)
    values = np.arange(18, dtype=np.float32).reshape(3, 6)
    store.write(rows, values)
    store.flush()
    assert store.path == str(tmp_path / f"t-{os.getpid()}.sparseflow-rows")
    on_disk = np.fromfile(store.path, np.float32).reshape(10, 6)
    np.testing.assert_array_equal(on_disk[rows], values)
    np.testing.assert_array_equal(on_disk[[1, 2, 4, 5, 6, 8, 9]], 0)  # never written
    np.testing.assert_array_equal(store.read(rows[::-1]), values[::-1])
    store.close()
    assert not os.path.exists(store.path)


def test_the_next_directory_is_used_when_one_cannot_hold_the_file(tmp_path):
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where a directory should be")
    store = DiskRows("t", 4, 2, [str(blocked), str(tmp_path / "ok")])
    assert os.path.dirname(store.path) == str(tmp_path / "ok")
    with pytest.raises(OSError, match="ssd_data_path"):
        DiskRows("u", 4, 2, [str(blocked)])


def test_bad_arguments_name_them(tmp_path):
    with pytest.raises(ValueError, match="capacity >= 1"):
        DiskRows("t", 0, 2, [str(tmp_path)])
    with pytest.raises(ValueError, match="`ssd_data_path`"):
        DiskRows("t", 2, 2, [])



def test_pinned_is_the_file_and_a_closed_store_says_so(tmp_path):
    store = DiskRows("t", 6, 3, [str(tmp_path)])
    store.write(np.array([4], np.int32), np.full((1, 3), 2.5, np.float32))
    with store.pinned() as storage:
        assert storage.shape == (6, 3) and storage.flags.c_contiguous
        assert storage[4].tolist() == [2.5, 2.5, 2.5]
    store.close()
    for use in (lambda: store.read([0]), lambda: store.write([0], np.zeros((1, 3))),
                store.flush):
        with pytest.raises(RuntimeError, match="Table `t`: its disk tier .* was closed"):
            use()
