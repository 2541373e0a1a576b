"""Whole-row copies between a row store (``[rows, width]`` float32) and a batch of rows: the
homes of a tiered table (``HostRows``, ``DiskRows``) read and write rows this way, one kernel
call each (``ops/tier_kernels.py``), without the GIL."""

from __future__ import annotations

import numpy as np

from sparseflow.ops import tier_kernels


def _checked(name: str, rows: np.ndarray, bad: int, n_rows: int) -> None:
    if bad >= 0:
        raise IndexError(f"Table `{name}`: row {int(rows[bad])} is outside its "
                         f"{n_rows:,} rows (rows are 0 .. {n_rows - 1}); nothing was copied.")


def read(name: str, storage: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``storage[rows]``: float32 ``[len(rows), width]`` (a copy).

    Args:
      name: the table's name, for messages.
      storage: float32 ``[n_rows, width]``.
      rows: int rows.

    Raises:
      IndexError: a row outside ``[0, n_rows)``.
    """
    rows = np.ascontiguousarray(rows, np.int32)
    out = np.empty((rows.shape[0], storage.shape[1]), np.float32)
    _checked(name, rows, tier_kernels.read_rows(storage, rows, out), storage.shape[0])
    return out


def write(name: str, storage: np.ndarray, rows: np.ndarray, values) -> None:
    """``storage[rows] = values`` (a row given twice keeps its last values).

    Args:
      name: the table's name, for messages.
      storage: float32 ``[n_rows, width]``.
      rows: int rows.
      values: float32 ``[len(rows), width]``, or what broadcasts to it.

    Raises:
      IndexError: a row outside ``[0, n_rows)`` (nothing written).
      ValueError: ``values`` does not broadcast to ``[len(rows), width]``.
    """
    rows = np.ascontiguousarray(rows, np.int32)
    values = np.asarray(values, np.float32)
    shape = (rows.shape[0], storage.shape[1])
    if values.shape != shape:
        values = np.broadcast_to(values, shape)
    _checked(name, rows, tier_kernels.write_rows(storage, rows, values), storage.shape[0])
