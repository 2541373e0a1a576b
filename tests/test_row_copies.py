"""Whole-row copies at a tiered table's homes (embed/row_copies.py, ops/tier_kernels.py)
against numpy indexing, and the swap's write-back-then-read."""

import numpy as np
import pytest

from sparseflow.embed import row_copies
from sparseflow.ops import tier_kernels


def test_read_and_write_match_numpy_indexing():
    rng = np.random.default_rng(0)
    storage = rng.normal(size=(50, 6)).astype(np.float32)
    want = storage.copy()
    rows = np.array([3, 49, 0, 3, 17], np.int64)    # int64 and a repeated row
    np.testing.assert_array_equal(row_copies.read("t", storage, rows), want[rows])
    values = rng.normal(size=(5, 6)).astype(np.float32)
    row_copies.write("t", storage, rows, values)
    want[rows] = values                              # a repeated row keeps its last values
    np.testing.assert_array_equal(storage, want)
    row_copies.write("t", storage, [7, 8], 0.5)      # a scalar broadcasts
    want[[7, 8]] = 0.5
    np.testing.assert_array_equal(storage, want)


@pytest.mark.parametrize("bad", [50, -1])
def test_a_row_outside_the_store_is_an_error_and_nothing_is_written(bad):
    storage = np.zeros((50, 4), np.float32)
    with pytest.raises(IndexError, match=f"Table `t`: row {bad} is outside its 50 rows"):
        row_copies.write("t", storage, [1, bad], np.ones((2, 4), np.float32))
    assert not storage.any()
    with pytest.raises(IndexError, match=f"row {bad}"):
        row_copies.read("t", storage, [bad])


def test_values_of_the_wrong_shape_are_an_error():
    storage = np.zeros((5, 4), np.float32)
    with pytest.raises(ValueError):
        row_copies.write("t", storage, [1, 2], np.ones((2, 3), np.float32))
    assert not storage.any()


def test_write_back_skips_rows_handed_to_new_keys_then_reads_the_entering_rows():
    rng = np.random.default_rng(1)
    storage = rng.normal(size=(20, 3)).astype(np.float32)
    gen = rng.integers(0, 3, 20).astype(np.int64)
    out_rows = np.array([2, 5, 9], np.int32)
    out_gens = gen[out_rows].copy()
    out_gens[1] += 1                                  # row 5 was reused since its plan
    out_values = rng.normal(size=(3, 3)).astype(np.float32)
    in_rows = np.array([9, 5, 11], np.int32)
    want = storage.copy()
    want[[2, 9]] = out_values[[0, 2]]
    in_values = np.empty((3, 3), np.float32)
    tier_kernels.write_back_and_read(storage, gen, out_rows, out_gens, out_values, in_rows,
                                     in_values)
    np.testing.assert_array_equal(storage, want)
    np.testing.assert_array_equal(in_values, want[in_rows])   # written back, then read
