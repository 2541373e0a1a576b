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


def test_values_of_the_wrong_shape_are_an_error_and_nothing_is_written():
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


def test_large_rows_are_not_truncated_and_rows_must_be_1d_integers():
    storage = np.zeros((8, 2), np.float32)
    with pytest.raises(IndexError, match=f"row {2**32 + 3} is outside"):
        row_copies.read("t", storage, np.array([2**32 + 3], np.int64))
    with pytest.raises(TypeError, match="1-D integer array"):
        row_copies.read("t", storage, np.zeros((2, 1), np.int32))
    with pytest.raises(TypeError, match="1-D integer array"):
        row_copies.write("t", storage, np.array([1.0]), np.ones((1, 2), np.float32))


def test_errors_name_the_table_the_shapes_and_what_a_row_is():
    storage = np.zeros((5, 4), np.float32)
    with pytest.raises(ValueError, match=r"Table `t`: values of shape \(2, 3\) do not fit 2 "
                                         r"slots of 4 floats"):
        row_copies.write("t", storage, [1, 2], np.ones((2, 3), np.float32), "slot")
    with pytest.raises(IndexError, match="slot 5 is outside its 5 slots"):
        row_copies.read("t", storage, [5], "slot")


def test_a_swap_with_values_of_the_wrong_shape_is_an_error_and_writes_nothing():
    from sparseflow.embed.host_rows import HostRows
    from sparseflow.embed.initializers import InitSpec
    from sparseflow.embed.row_tiers import RowTiers

    spec = InitSpec("constant", 0.0, 0.0, 0)
    homes = HostRows("t", 10, 4, spec)
    homes.allocate()
    tiers = RowTiers("t", 3, 10, 4, spec, "lru", "3 slots", lambda: (homes, ()))
    rows = np.array([1, 2], np.int32)
    gens = tiers.cache.gen[rows].copy()
    with pytest.raises(ValueError, match=r"Table `t`: 2 rows leaving the fast tier need 2 "
                                         r"generations and values of shape \(2, 4\)"):
        tiers.write_back_and_read(rows, gens, np.ones((4, 2), np.float32),
                                  np.zeros(0, np.int32))
    assert not homes.read(np.arange(10)).any()
    got = tiers.write_back_and_read(rows, gens, np.ones((2, 4), np.float32),
                                    np.array([2, 3], np.int32))
    np.testing.assert_array_equal(got, [[1, 1, 1, 1], [0, 0, 0, 0]])
