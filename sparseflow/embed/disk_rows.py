"""Rows on disk: the SSD tier's store, memory-mapped files of ``[weights | slots]`` rows.

Rows that fall out of the host tier are written here, least frequently used first
(:func:`least_frequent`), and read back when their key returns. A store is one file of
``capacity`` rows of ``width`` float32 in the first directory of ``ssd_data_path`` with room
for it (Rec SDK tries the entries in order when a disk fills); the file is created sparse, so
disk blocks are used only as rows are written. Slots (disk rows) are handed out from a free
list; the key → slot mapping belongs to the caller.
"""

from __future__ import annotations

import os
import shutil
from typing import Sequence

import numpy as np

_FILE_SUFFIX = ".sparseflow-rows"


class DiskFullError(RuntimeError):
    """The store has no free slot left (``ssd_vocabulary_size`` rows in use)."""


class DiskRows:
    """A memory-mapped store of ``capacity`` rows of ``width`` float32.

    Args:
      name: the table's name; the file is ``<dir>/<name>.sparseflow-rows``.
      capacity: rows (``ssd_vocabulary_size``), >= 1.
      width: floats per row (``dim * (1 + optimizer slots)``), >= 1.
      data_paths: directories to try in order; the first one that exists (or can be created)
        and has ``capacity * width * 4`` bytes free is used.

    Raises:
      ValueError: ``capacity``/``width`` < 1 or ``data_paths`` empty.
      OSError: no directory in ``data_paths`` can hold the file (names each one and why).
    """

    def __init__(self, name: str, capacity: int, width: int, data_paths: Sequence[str]):
        if capacity < 1 or width < 1:
            raise ValueError(f"Table `{name}`: the disk tier needs capacity >= 1 and width >= 1. "
                             f"Received: capacity={capacity}, width={width}")
        if isinstance(data_paths, (str, os.PathLike)):
            data_paths = [data_paths]
        if not data_paths:
            raise ValueError(f"Argument `ssd_data_path` must name at least one directory for "
                             f"table `{name}`. Received: {data_paths!r}")
        self.name = name
        self.capacity = int(capacity)
        self.width = int(width)
        need = self.capacity * self.width * 4
        reasons = []
        for directory in data_paths:
            directory = os.path.abspath(os.path.expanduser(str(directory)))
            try:
                os.makedirs(directory, exist_ok=True)
                free = shutil.disk_usage(directory).free
                if free < need:
                    reasons.append(f"{directory}: {free:,} bytes free, {need:,} needed")
                    continue
                self.path = os.path.join(directory, name + _FILE_SUFFIX)
                self.rows = np.memmap(self.path, np.float32, "w+",
                                      shape=(self.capacity, self.width))
                break
            except OSError as e:
                reasons.append(f"{directory}: {e.strerror or e}")
        else:
            raise OSError(f"Table `{name}`: no directory of `ssd_data_path` can hold its disk "
                          f"tier ({need:,} bytes): " + "; ".join(reasons))
        # Free slots as a stack: the lowest slots are handed out first.
        self._free = np.arange(self.capacity - 1, -1, -1, dtype=np.int32)
        self._top = self.capacity

    @property
    def used(self) -> int:
        """Slots holding rows."""
        return self.capacity - self._top

    def allocate(self, n: int) -> np.ndarray:
        """``n`` free slots (int32), taken off the free list.

        Raises:
          DiskFullError: fewer than ``n`` slots are free; nothing is taken.
        """
        if n > self._top:
            raise DiskFullError(
                f"Table `{self.name}`: its disk tier is full ({self.capacity:,} rows, "
                f"ssd_vocabulary_size); {n:,} more rows need a place. Raise "
                f"ssd_vocabulary_size or evict keys.")
        slots = self._free[self._top - n:self._top][::-1].copy()
        self._top -= n
        return slots

    def release(self, slots: np.ndarray) -> None:
        """Returns ``slots`` to the free list (their contents are left as they are)."""
        slots = np.asarray(slots, np.int32)
        self._free[self._top:self._top + slots.shape[0]] = slots[::-1]
        self._top += slots.shape[0]

    def write(self, slots: np.ndarray, values: np.ndarray) -> None:
        """Stores ``values`` (float32 ``[n, width]``) at ``slots``."""
        self.rows[np.asarray(slots, np.int64)] = np.asarray(values, np.float32)

    def read(self, slots: np.ndarray) -> np.ndarray:
        """The rows at ``slots``, float32 ``[n, width]`` (a copy)."""
        return np.array(self.rows[np.asarray(slots, np.int64)], np.float32)

    def flush(self) -> None:
        """Writes dirty pages to the file."""
        self.rows.flush()

    def close(self, delete: bool = True) -> None:
        """Unmaps the file and (by default) deletes it: a disk tier is scratch space, the
        checkpoint is what persists."""
        path = self.path
        self.rows = None
        if delete and os.path.exists(path):
            os.remove(path)


def least_frequent(frequency: np.ndarray, eligible: np.ndarray, n: int) -> np.ndarray:
    """The ``n`` eligible rows with the lowest ``frequency`` (the LFU victims to demote).

    Args:
      frequency: int64 ``[rows]``, each row's access count.
      eligible: bool ``[rows]``: rows that may move (holding a key, not needed by a batch in
        flight).
      n: victims wanted.

    Returns:
      int32 row numbers, lowest frequency first (ties: lower row first).

    Raises:
      ValueError: fewer than ``n`` rows are eligible.
    """
    candidates = np.flatnonzero(eligible)
    if n > candidates.shape[0]:
        raise ValueError(f"{n} rows must move down a tier but only {candidates.shape[0]} may: "
                         f"the others are needed by batches in flight.")
    if n == 0:
        return np.zeros(0, np.int32)
    freq = frequency[candidates]
    if n < candidates.shape[0]:
        part = np.argpartition(freq, n - 1)[:n]
    else:
        part = np.arange(candidates.shape[0])
    order = np.lexsort((candidates[part], freq[part]))
    return candidates[part][order].astype(np.int32)
