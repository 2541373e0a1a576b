"""Kernels over every table of a batch (``ops/batch_kernels.py``) against numpy references."""

import numpy as np
import pytest

from sparseflow.ops import batch_kernels as bk


def random_batch(rng, tables, dim):
    """A flat parts array as the insert function lays it out: each table's unique rows (some
    -1), then each member's restore vector; with the members (table, rows part, restore
    part) of every table's features, a table's features consecutive."""
    parts, rows_parts = [], []
    for capacity, _ in tables:
        n_unique = int(rng.integers(0, min(30, capacity) + 1))
        rows = rng.choice(capacity, size=n_unique, replace=False).astype(np.int32)
        rows[rng.random(n_unique) < 0.2] = -1
        rows_parts.append(len(parts))
        parts.append(rows)
    members = []
    for t, (_, n_features) in enumerate(tables):
        n_unique = parts[rows_parts[t]].shape[0]
        for _ in range(n_features):
            n_keys = int(rng.integers(0, 50)) if n_unique else 0
            members.append((t, rows_parts[t], len(parts)))
            parts.append(rng.integers(0, max(n_unique, 1), n_keys).astype(np.int32))
    sizes = np.array([p.shape[0] for p in parts], np.int64)
    flat = np.concatenate(parts) if parts else np.zeros(0, np.int32)
    layout = tuple(np.array(c, np.int64) for c in zip(*members))
    return parts, flat, sizes, members, layout


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_expand_tables_and_sum_tables_vs_numpy(seed):
    rng = np.random.default_rng(seed)
    dim = 4
    tables = [(50, 1), (80, 3), (7, 2), (60, 1)]
    storages = tuple(rng.normal(size=(cap, 3 * dim)).astype(np.float32) for cap, _ in tables)
    parts, flat, sizes, members, layout = random_batch(rng, tables, dim)
    starts, ends = bk.part_bounds(sizes, len(parts))

    expected = []
    for t, w, r in members:
        rows = parts[w]
        unique = np.where(rows[:, None] >= 0, storages[t][np.maximum(rows, 0), :dim], 0.0)
        expected.append(unique[parts[r]])
    expected = np.concatenate(expected).astype(np.float32)
    out = np.full((expected.shape[0], dim), np.nan, np.float32)
    bk.expand_tables(storages, flat, starts, ends, *layout, dim, out)
    np.testing.assert_array_equal(out, expected)

    grads = [rng.normal(size=(parts[r].shape[0], dim)).astype(np.float32)
             for _, _, r in members]
    reference = []
    for t in range(len(tables)):
        rows_part = [w for tt, w, _ in members if tt == t][0]
        summed = np.zeros((parts[rows_part].shape[0], dim), np.float64)
        for (tt, _, r), grad in zip(members, grads):
            if tt == t:
                np.add.at(summed, parts[r], grad)
        reference.append(summed)
    reference = np.concatenate(reference)
    out_sum = np.zeros_like(reference, np.float32)
    bk.sum_tables(bk.as_tuple(grads), flat, starts, ends, layout[1], layout[2], out_sum)
    np.testing.assert_allclose(out_sum, reference, rtol=1e-5, atol=1e-6)


def test_as_tuple_makes_mixed_arrays_one_type():
    writeable = np.ones((2, 3), np.float32)
    read_only = np.ones((4, 3), np.float32)
    read_only.flags.writeable = False
    strided = np.ones((4, 6), np.float32)[:, ::2]
    arrays = bk.as_tuple([writeable, read_only, strided])
    assert all(a.flags.writeable and a.flags.c_contiguous for a in arrays)
    np.testing.assert_array_equal(arrays[2], strided)
    assert arrays[0] is writeable


def test_expand_tables_reads_a_table_of_several_features_once_per_feature_order():
    # Members of one table need not be consecutive for the gather (it reads the rows again).
    storage = np.arange(40, dtype=np.float32).reshape(10, 4)
    other = -np.arange(40, dtype=np.float32).reshape(10, 4)
    parts = [np.array([2, 5], np.int32), np.array([7], np.int32),
             np.array([1, 0, 1], np.int32), np.array([0, 0], np.int32),
             np.array([0], np.int32)]
    sizes = np.array([p.shape[0] for p in parts], np.int64)
    starts, ends = bk.part_bounds(sizes, len(parts))
    layout = (np.array([0, 1, 0]), np.array([0, 1, 0]), np.array([2, 3, 4]))
    out = np.zeros((6, 2), np.float32)
    bk.expand_tables((storage, other), np.concatenate(parts), starts, ends, *layout, 2, out)
    np.testing.assert_array_equal(out, np.stack([storage[5, :2], storage[2, :2],
                                                 storage[5, :2], other[7, :2], other[7, :2],
                                                 storage[2, :2]]))


def test_batch_kernels_empty():
    sizes = np.zeros(2, np.int64)
    starts, ends = bk.part_bounds(sizes, 2)
    layout = (np.array([0]), np.array([0]), np.array([1]))
    out = np.zeros((0, 3), np.float32)
    bk.expand_tables((np.ones((4, 3), np.float32),), np.zeros(0, np.int32), starts, ends,
                     *layout, 3, out)
    summed = np.zeros((0, 3), np.float32)
    bk.sum_tables((out,), np.zeros(0, np.int32), starts, ends, layout[1], layout[2], summed)
    assert out.shape == (0, 3) and summed.shape == (0, 3)


def test_batch_kernels_release_the_gil():
    # The gather and the gradient sum run in the training step beside TensorFlow's threads.
    for kernel in (bk.expand_tables, bk.sum_tables, bk.gather_rows):
        assert kernel.targetoptions["nogil"] is True

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gather_rows_vs_numpy(dtype):
    rng = np.random.default_rng(5)
    storage = rng.standard_normal((40, 12)).astype(dtype)
    rows = rng.integers(-1, 40, 300).astype(np.int32)   # past the prefetch distance
    for dim in (12, 7, 1):
        out = np.full((rows.shape[0], dim), np.nan, dtype)
        bk.gather_rows(storage, rows, dim, out)
        expected = np.where((rows >= 0)[:, None], storage[np.maximum(rows, 0), :dim], 0)
        np.testing.assert_array_equal(out, expected)
    out = np.full((0, 4), np.nan, dtype)
    bk.gather_rows(storage, np.zeros(0, np.int32), 4, out)
