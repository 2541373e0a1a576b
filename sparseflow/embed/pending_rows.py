"""Initial values of new rows waiting to be written into a device table.

The key processor assigns rows in the input pipeline, ahead of the training step, and draws
the new rows' initial values there (per key, on the host). A device table cannot be written
from that thread, so the values wait here until the next training step pops them all and
scatters them into the variables before its gather.

Popping everything, including rows assigned for batches still in the prefetch buffer, is
safe: a new row belongs to no batch being trained (fresh rows were never used; a reused
row left quarantine only after every batch that read it had been consumed).
"""

from __future__ import annotations

import threading

import numpy as np


class PendingRows:
    """A FIFO of ``(rows, values)`` chunks for one table.

    Args:
      dim: the width of each row's values.
    """

    def __init__(self, dim: int):
        self.dim = int(dim)
        self._chunks: list[tuple[np.ndarray, np.ndarray]] = []
        self._lock = threading.Lock()

    def push(self, rows: np.ndarray, values: np.ndarray) -> None:
        """Queues initial ``values`` (float32 ``[n, dim]``) for ``rows`` (int32 ``[n]``)."""
        rows = np.ascontiguousarray(rows, np.int32)
        values = np.ascontiguousarray(values, np.float32).reshape(rows.shape[0], self.dim)
        with self._lock:
            self._chunks.append((rows, values))

    def pop(self) -> tuple[np.ndarray, np.ndarray]:
        """Takes every queued row: int32 ``[n]`` distinct rows and float32 ``[n, dim]`` values.

        A row queued twice (reused after an eviction before a step took the first values)
        keeps its latest values: one scatter must not hold a row twice, whose order TF does
        not define.
        """
        with self._lock:
            chunks, self._chunks = self._chunks, []
        if not chunks:
            return np.zeros(0, np.int32), np.zeros((0, self.dim), np.float32)
        rows = np.concatenate([c[0] for c in chunks])
        values = np.concatenate([c[1] for c in chunks])
        # The last occurrence of each row wins.
        _, last_from_end = np.unique(rows[::-1], return_index=True)
        keep = np.sort(rows.shape[0] - 1 - last_from_end)
        return rows[keep], values[keep]

    def __len__(self) -> int:
        with self._lock:
            return sum(c[0].shape[0] for c in self._chunks)
