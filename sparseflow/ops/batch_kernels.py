"""Kernels over every table of a batch in one call: the gather of a batch's embeddings and the
sum of their gradients.

A batch carries one flat int32 array of parts (each table's unique rows, each feature's
restore vector; ``pipeline/insert_func.py``). One call per batch replaces one call per table:
with 26 tables, the Python around 26 kernel calls cost more than the kernels (BENCHMARKS.md,
end-to-end). The tables' storages arrive as a tuple (numba types a tuple of same-typed arrays
as one homogeneous tuple, indexable at run time; passing it costs ~2 us for 26 arrays).

Members: the (table, feature) pairs whose embeddings one output holds, in output order;
``member_table[m]`` indexes ``storages``, ``member_rows[m]`` and ``member_restore[m]`` index
the parts (``starts`` / ``ends`` bound each part in ``flat``).
"""

from __future__ import annotations

import numba
import numpy as np

from sparseflow.ops.prefetch import prefetch_for_write

_JIT = dict(nogil=True, cache=True, error_model="numpy", boundscheck=False)

# Unique rows ahead whose weights the gather prefetches: the tables are far larger than the
# caches and a Zipf batch's tail rows are cold. Both cache lines a row's weights can straddle
# (numpy aligns rows to 16 bytes, not 64), 64 rows ahead: 5 ns per cold row against 21 ns
# with one line 8 rows ahead (1M-row tables, rows [w | m | v] of dim 16; 128 rows ahead
# measured within 10% of 64).
ROW_PREFETCH_AHEAD = 64


@numba.njit(**_JIT)
def gather_rows(storage, rows, dim, out):
    """out[i] = storage[rows[i], :dim], or zeros where rows[i] < 0. The rows are cold (a
    batch's tail in a table far larger than the caches): each row's weights are prefetched
    :data:`ROW_PREFETCH_AHEAD` rows ahead."""
    n = rows.shape[0]
    for i in range(n):
        if i + ROW_PREFETCH_AHEAD < n:
            ahead = rows[i + ROW_PREFETCH_AHEAD]
            if ahead >= 0:
                prefetch_for_write(storage, (ahead, 0))
                prefetch_for_write(storage, (ahead, dim - 1))
        r = rows[i]
        if r < 0:
            for j in range(dim):
                out[i, j] = 0.0
        else:
            for j in range(dim):
                out[i, j] = storage[r, j]


@numba.njit(**_JIT)
def expand_tables(storages, flat, starts, ends, member_table, member_rows, member_restore,
                  dim, out):
    """``out`` = every member's embeddings, concatenated in member order: member m's keys
    read ``storages[member_table[m]][rows[restore[i]], :dim]`` (zeros where the row is -1).

    A table's unique rows are read from its (large, cache-cold) storage once into a small
    buffer, then expanded by each of its features' restore vectors; consecutive members of
    one table share that read.

    Args:
      storages: tuple of float32 ``[capacity, width >= dim]`` arrays.
      flat: int32, the batch's parts.
      starts, ends: int64, each part's bounds in ``flat``.
      member_table, member_rows, member_restore: int64 ``[M]``.
      dim: embedding width.
      out: float32 ``[sum of the members' keys, dim]``, written.
    """
    n_members = member_table.shape[0]
    unique = np.empty((most_unique_rows(member_rows, starts, ends), dim), np.float32)
    at = 0
    gathered = -1
    for m in range(n_members):
        w = member_rows[m]
        if w != gathered:
            gather_rows(storages[member_table[m]], flat[starts[w]:ends[w]], dim,
                        unique[:ends[w] - starts[w]])
            gathered = w
        r = member_restore[m]
        at = expand_member(unique, flat[starts[r]:ends[r]], out, at)


@numba.njit(**_JIT)
def most_unique_rows(member_rows, starts, ends):
    """The largest unique-row count among the members' tables (the size of the buffer
    :func:`expand_tables` reads a table's unique rows into)."""
    most = 0
    for m in range(member_rows.shape[0]):
        w = member_rows[m]
        if ends[w] - starts[w] > most:
            most = ends[w] - starts[w]
    return most


@numba.njit(**_JIT)
def expand_member(unique, restore, out, at):
    """``out[at + i] = unique[restore[i]]`` for every key i of one member (the step of
    :func:`expand_tables`); returns the row after the last one written."""
    dim = out.shape[1]
    for i in range(restore.shape[0]):
        u = restore[i]
        for j in range(dim):
            out[at, j] = unique[u, j]
        at += 1
    return at


@numba.njit(**_JIT)
def sum_tables(grads, flat, starts, ends, member_rows, member_restore, out):
    """The gradient of :func:`expand_tables`: each key's gradient row summed into its table's
    unique row. ``out`` holds every table's unique rows, concatenated in member order; the
    members of one table must be consecutive.

    Args:
      grads: tuple, per member, float32 ``[its keys, dim]`` (as many rows as its restore
        vector: the caller checks).
      flat, starts, ends, member_rows, member_restore: as :func:`expand_tables`.
      out: float32 ``[sum of the tables' unique rows, dim]``, zeroed by the caller, summed
        into.
    """
    offsets, _ = member_offsets(member_rows, starts, ends)
    for m in range(member_rows.shape[0]):
        r = member_restore[m]
        add_member_gradient(grads[m], flat[starts[r]:ends[r]], offsets[m], out)


@numba.njit(**_JIT)
def member_offsets(member_rows, starts, ends):
    """Where each member's table's unique rows start in :func:`sum_tables`' output (a
    table's members consecutive, its rows once), and that output's row count: (int64
    ``[M]``, int)."""
    offsets = np.empty(member_rows.shape[0], np.int64)
    total = 0
    current = -1
    for m in range(member_rows.shape[0]):
        w = member_rows[m]
        if w != current:
            if current >= 0:
                total += ends[current] - starts[current]
            current = w
        offsets[m] = total
    if current >= 0:
        total += ends[current] - starts[current]
    return offsets, total


@numba.njit(**_JIT)
def add_member_gradient(grad, restore, offset, out):
    """``out[offset + restore[i]] += grad[i]`` for every key i of one member (the step of
    :func:`sum_tables`; ``grad`` has ``len(restore)`` rows)."""
    dim = grad.shape[1]
    for i in range(restore.shape[0]):
        u = offset + restore[i]
        for j in range(dim):
            out[u, j] += grad[i, j]


def as_tuple(arrays) -> tuple:
    """``arrays`` as a tuple numba types as one homogeneous tuple (indexable at run time):
    C-contiguous, and writeable copies of read-only ones when they mix (a tuple of mixed
    arrays is heterogeneous to numba)."""
    arrays = tuple(np.ascontiguousarray(a) for a in arrays)
    if len({a.flags.writeable for a in arrays}) > 1:
        return tuple(a if a.flags.writeable else a.copy() for a in arrays)
    return arrays


def part_bounds(part_sizes: np.ndarray, n_parts: int) -> tuple[np.ndarray, np.ndarray]:
    """int64 ``(starts, ends)`` of the first ``n_parts`` parts of a flat array whose part
    sizes are ``part_sizes``."""
    ends = np.cumsum(part_sizes[:n_parts], dtype=np.int64)
    return ends - part_sizes[:n_parts], ends
