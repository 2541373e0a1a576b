"""Rows on disk: the SSD tier's store, a memory-mapped file of ``[weights | slots]`` rows.

A table with a disk tier keeps a home here for every logical row (``embed/row_tiers.py``):
new rows get their initial values here, rows that fall out of host memory (least frequently
used first) are written back here, and read from here when their key returns. The store is one
file of ``capacity`` rows of ``width`` float32 in the first directory of ``ssd_data_path`` with
room for it (Rec SDK tries the entries in order when a disk fills); the file is created
sparse, so disk blocks are used only as rows are written.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from typing import Sequence

import numpy as np

from sparseflow.embed import row_copies

_FILE_SUFFIX = ".sparseflow-rows"


class DiskRows:
    """A memory-mapped store of ``capacity`` rows of ``width`` float32.

    Args:
      name: the table's name; the file is ``<dir>/<name>-<pid>.sparseflow-rows`` (the
        process id: two jobs sharing a directory never write each other's file).
      capacity: rows (the table's capacity: one home per logical row), >= 1.
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
                self.path = os.path.join(directory, f"{name}-{os.getpid()}{_FILE_SUFFIX}")
                self.rows = np.memmap(self.path, np.float32, "w+",
                                      shape=(self.capacity, self.width))
                break
            except OSError as e:
                reasons.append(f"{directory}: {e.strerror or e}")
        else:
            raise OSError(f"Table `{name}`: no directory of `ssd_data_path` can hold its disk "
                          f"tier ({need:,} bytes): " + "; ".join(reasons))

    def write(self, rows: np.ndarray, values: np.ndarray) -> None:
        """Stores ``values`` (float32 ``[n, width]``) at ``rows``.

        Raises:
          IndexError: a row outside the store (nothing written).
          RuntimeError: the store was closed.
        """
        row_copies.write(self.name, self._open(), rows, values)

    def read(self, rows: np.ndarray) -> np.ndarray:
        """The values at ``rows``, float32 ``[n, width]`` (a copy).

        Raises:
          IndexError: a row outside the store.
          RuntimeError: the store was closed.
        """
        return row_copies.read(self.name, self._open(), rows)

    @contextlib.contextmanager
    def pinned(self):
        """Yields the store as a plain float32 ``[capacity, width]`` array over the file's
        mapping (as :meth:`HostRows.pinned` yields host rows' storage).

        Raises:
          RuntimeError: the store was closed.
        """
        yield self._open()

    def _open(self) -> np.ndarray:
        """The mapping as a plain array (a view, no copy): what the kernels take."""
        if self.rows is None:
            raise RuntimeError(f"Table `{self.name}`: its disk tier ({self.path}) was closed.")
        return np.asarray(self.rows)

    def flush(self) -> None:
        """Writes dirty pages to the file.

        Raises:
          RuntimeError: the store was closed.
        """
        self._open()
        self.rows.flush()

    def close(self, delete: bool = True) -> None:
        """Unmaps the file and (by default) deletes it: a disk tier is scratch space, the
        checkpoint is what persists."""
        path = self.path
        self.rows = None
        if delete and os.path.exists(path):
            os.remove(path)

