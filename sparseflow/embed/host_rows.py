"""Host-resident rows of one table: weights and optimizer slots, interleaved.

``storage`` is one C-contiguous float32 array ``[capacity, dim * (1 + n_slots)]``; a row is
``[weights | slot 1 | slot 2]`` so that an optimizer update touches one contiguous span. It is
allocated when the first rows are initialised (by then the optimizer, which decides the slot
count, is bound), zero-filled lazily by the OS, so untouched capacity costs no memory.
"""

from __future__ import annotations

import threading

import numpy as np

from sparseflow.embed.initializers import InitSpec, init_rows
from sparseflow.ops import init_kernels
from sparseflow.ops.key_kernels import gather_rows


class HostRows:
    """Row storage of one table.

    Args:
      name: the table's name, for messages.
      capacity: number of rows.
      dim: embedding width.
      init_spec: how weights of new rows are drawn.
    """

    def __init__(self, name: str, capacity: int, dim: int, init_spec: InitSpec):
        self.name = name
        self.capacity = capacity
        self.dim = dim
        self.init_spec = init_spec
        self.slot_values: tuple[float, ...] = ()
        self.slot_names: tuple[str, ...] = ()
        self.optimizer = None
        self.storage: np.ndarray | None = None
        self.closed = False
        self._fill_args: tuple | None = None
        self._lock = threading.Lock()

    def bind_optimizer(self, optimizer) -> None:
        """Fixes the slot layout from ``optimizer`` (``slot_names``, ``slot_initial_values``).

        Raises:
          ValueError: another optimizer is already bound, or the rows were already allocated
            with a different slot layout.
        """
        if self.optimizer is optimizer:
            return
        if self.optimizer is not None:
            raise ValueError(
                f"Table `{self.name}` is already updated by optimizer `{self.optimizer.name}`; "
                f"a table takes one sparse optimizer. Received: `{optimizer.name}`")
        names = tuple(optimizer.slot_names)
        if self.storage is not None and names != self.slot_names:
            raise ValueError(
                f"Table `{self.name}` already holds rows without optimizer slots: build the "
                f"sparse optimizer's apply_gradients before start_asc_pipeline() and before "
                f"the first batch.")
        self.optimizer = optimizer
        self.slot_names = names
        self.slot_values = tuple(float(v) for v in optimizer.slot_initial_values)
        self._fill_args = None

    @property
    def width(self) -> int:
        """Floats per row: weights plus slots."""
        return self.dim * (1 + len(self.slot_names))

    def allocate(self) -> np.ndarray:
        """Allocates the storage if not yet done; returns it.

        Raises:
          RuntimeError: the table was closed by ``terminate_config_initializer()``.
        """
        if self.closed:
            raise RuntimeError(f"Table `{self.name}` was released by "
                               f"terminate_config_initializer(); its rows are gone.")
        if self.storage is None:
            with self._lock:
                if self.storage is None:
                    self.storage = np.zeros((self.capacity, self.width), np.float32)
        return self.storage

    def commit_memory(self, first_unused_row: int) -> None:
        """Touches the pages of rows ``[first_unused_row, capacity)`` now, so that those rows
        pay no first-touch page fault when they are handed out later.

        Rows below ``first_unused_row`` may hold trained values and are not written; the caller
        holds the key processor's lock so that no row is handed out meanwhile. Allocates the
        storage if needed; makes ``capacity x width x 4`` bytes resident.
        """
        storage = self.allocate()
        storage[first_unused_row:].fill(0.0)  # never-used rows hold zeros either way

    def initialize(self, rows: np.ndarray, keys: np.ndarray) -> None:
        """Draws fresh weights for ``rows`` (deterministic per key) and resets their slots.

        Args:
          rows: int32 row indices in ``[0, capacity)``, from the key processor.
          keys: int64 keys, one per row.
        """
        storage = self.allocate()
        if self._fill_args is None:
            # Validate the layout once through the checked wrapper; later calls come from the
            # key processor with rows it allocated itself and go straight to the kernel.
            init_rows(storage, rows, keys, self.init_spec, self.dim, self.slot_values)
            spec = self.init_spec
            upper = np.float32(0.0)
            if spec.kind == "uniform":
                upper = np.nextafter(np.float32(spec.b), np.float32(-np.inf))
            self._fill_args = (init_kernels.KIND_CODES[spec.kind], float(spec.a), float(spec.b),
                               upper, np.uint64(spec.seed), self.dim,
                               np.asarray(self.slot_values, np.float32))
            return
        init_kernels.fill_rows(storage, rows, keys.view(np.uint64), *self._fill_args)

    def gather(self, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Weights of ``rows`` as float32 ``[len(rows), dim]``; zeros where a row is -1.

        Args:
          rows: int32 row numbers (or -1).
          out: optional C-contiguous float32 ``[len(rows), dim]`` to write into.

        Returns:
          ``out`` (or a new array) holding the weights.
        """
        rows = np.ascontiguousarray(rows, np.int32)
        if out is None:
            out = np.empty((rows.shape[0], self.dim), np.float32)
        gather_rows(self.allocate(), rows, self.dim, out)
        return out

    def slots(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Each optimizer slot of ``rows``, by slot name, as ``[len(rows), dim]`` copies."""
        storage = self.allocate()
        return {name: storage[rows, self.dim * (i + 1):self.dim * (i + 2)].copy()
                for i, name in enumerate(self.slot_names)}

    def close(self) -> None:
        """Releases the storage; any later use raises."""
        self.closed = True
        self.storage = None
