"""Whole-row copies between a row store (``[rows, width]`` float32) and a batch of rows: the
homes of a tiered table (``HostRows``, ``DiskRows``) and a disk tier's host slots read and
write rows this way, one kernel call each (``ops/tier_kernels.py``), without the GIL."""

from __future__ import annotations

import numpy as np

from sparseflow.ops import tier_kernels


def _indices(name: str, rows, what: str) -> np.ndarray:
    """``rows`` as a 1-D signed integer array (no value changed: a large int64 is not
    truncated to int32)."""
    rows = np.ascontiguousarray(rows)
    if rows.ndim != 1 or rows.dtype.kind not in "iu":
        raise TypeError(f"Table `{name}`: the {what}s to copy must be a 1-D integer array; "
                        f"received {rows.dtype} of shape {rows.shape}.")
    return rows.astype(np.int64) if rows.dtype.kind == "u" else rows


def _checked(name: str, rows: np.ndarray, bad: int, n_rows: int, what: str) -> None:
    if bad >= 0:
        raise IndexError(f"Table `{name}`: {what} {int(rows[bad])} is outside its "
                         f"{n_rows:,} {what}s (0 .. {n_rows - 1}); nothing was copied.")


def read(name: str, storage: np.ndarray, rows, what: str = "row") -> np.ndarray:
    """``storage[rows]``: float32 ``[len(rows), width]`` (a copy).

    Args:
      name: the table's name, for messages.
      storage: C-contiguous float32 ``[n_rows, width]``.
      rows: 1-D integer rows.
      what: what a row of ``storage`` is, for messages ("row", "slot").

    Raises:
      TypeError: ``rows`` is not a 1-D integer array.
      IndexError: a row outside ``[0, n_rows)``.
    """
    rows = _indices(name, rows, what)
    out = np.empty((rows.shape[0], storage.shape[1]), np.float32)
    _checked(name, rows, tier_kernels.read_rows(storage, rows, out), storage.shape[0], what)
    return out


def write(name: str, storage: np.ndarray, rows, values, what: str = "row") -> None:
    """``storage[rows] = values`` (a row given twice keeps its last values).

    Args:
      name: the table's name, for messages.
      storage: C-contiguous, writeable float32 ``[n_rows, width]``.
      rows: 1-D integer rows.
      values: float32 ``[len(rows), width]``, or what broadcasts to it.
      what: what a row of ``storage`` is, for messages ("row", "slot").

    Raises:
      TypeError: ``rows`` is not a 1-D integer array.
      IndexError: a row outside ``[0, n_rows)`` (nothing written).
      ValueError: ``values`` does not broadcast to ``[len(rows), width]`` (nothing written).
    """
    rows = _indices(name, rows, what)
    values = np.asarray(values, np.float32)
    shape = (rows.shape[0], storage.shape[1])
    if values.shape != shape:
        try:
            values = np.broadcast_to(values, shape)
        except ValueError:
            raise ValueError(f"Table `{name}`: values of shape {values.shape} do not fit "
                             f"{shape[0]} {what}s of {shape[1]} floats.") from None
    _checked(name, rows, tier_kernels.write_rows(storage, rows, values), storage.shape[0],
             what)
