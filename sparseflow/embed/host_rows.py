"""Host-resident rows of one table: weights and optimizer slots, interleaved.

``storage`` is one C-contiguous float32 array ``[capacity, dim * (1 + n_slots)]``; a row is
``[weights | slot 1 | slot 2]`` so that an optimizer update touches one contiguous span. It is
allocated when the first rows are initialised (by then the optimizer, which decides the slot
count, is bound), zero-filled lazily by the OS, so untouched capacity costs no memory.

Under dynamic expansion (``expansion_block_rows`` set) the storage starts at one block of rows
and grows (see :meth:`HostRows.ensure_rows`) as the key processor hands out rows past it; it
never shrinks. Growth replaces ``storage`` by a larger copy, so every read or write of rows from
outside the key processor's lock goes through :meth:`HostRows.pinned`.
"""

from __future__ import annotations

import contextlib
import threading
import weakref

import numpy as np

from sparseflow import tensor_buffers
from sparseflow.embed import page_commit, row_copies
from sparseflow.embed.initializers import InitSpec, init_rows
from sparseflow.ops import init_kernels
from sparseflow.ops.batch_kernels import gather_rows
from sparseflow.validation import INT32_MAX


@contextlib.contextmanager
def pinned_storages(rows: list):
    """Yields the storages of ``rows`` (``HostRows``), as a tuple, none of which growth
    replaces until the block exits (:meth:`HostRows.pinned`; a fixed-capacity table takes no
    lock). A kernel over several tables runs inside; take no key processor's lock inside
    (growth takes a table's resize lock under its key processor's lock)."""
    with contextlib.ExitStack() as stack:
        yield tuple(stack.enter_context(r.pinned()) if r.block_rows is not None
                    else r.allocate() for r in rows)


class HostRows:
    """Row storage of one table.

    Args:
      name: the table's name, for messages.
      capacity: number of rows (fixed); under expansion, the rows to allocate at first
        (rounded up to a whole block).
      dim: embedding width.
      init_spec: how weights of new rows are drawn.
      expansion_block_rows: None for a fixed capacity; else dynamic expansion: the storage
        grows in whole blocks of this many rows (at least doubling), up to 2^31 - 1 rows.
    """

    def __init__(self, name: str, capacity: int, dim: int, init_spec: InitSpec, *,
                 expansion_block_rows: int | None = None):
        self.name = name
        self.block_rows = expansion_block_rows
        self.capacity = capacity if expansion_block_rows is None else self._grown(capacity, 0)
        self.dim = dim
        self.init_spec = init_spec
        self.slot_values: tuple[float, ...] = ()
        self.slot_names: tuple[str, ...] = ()
        self.optimizer = None
        self._storage: np.ndarray | None = None
        self._entry = None   # registry entry, made when a compiled op first needs it
        self.closed = False
        self._fill_args: tuple | None = None
        self._lock = threading.Lock()         # first allocation
        # Dynamic expansion only. Growth copies the rows into a new array and swaps it in; an
        # optimizer update still running on the old array after the copy would be lost. So
        # growth holds this lock, and so does every gather and update of the TF step thread
        # (through pinned()). Growth itself only runs under the key processor's lock (new rows,
        # a restore), so the key processor's own writes (initialising rows no batch holds yet)
        # need no pinning. Lock order: key processor's lock, then this one; pinned() holders
        # never take the key processor's lock.
        self._resize_lock = threading.Lock()
        # Rows [0, _resident_until) of the storage _resident_of refers to (weakly: a closed or
        # grown table's old array must be freed) were made resident ahead of use.
        self._resident_until = 0
        self._resident_of = None

    @property
    def storage(self) -> np.ndarray | None:
        """The rows, float32 ``[capacity, width]``, or None before allocation."""
        return self._storage

    @storage.setter
    def storage(self, storage: np.ndarray | None) -> None:
        # The registry entry follows every replacement: compiled ops read the rows through it.
        self._storage = storage
        if self._entry is not None:
            self._entry.publish(storage)

    def registry_entry(self):
        """This table's entry in the registry compiled ops read rows through
        (``ops/table_registry.py``), made on first call; it follows the storage from then on.

        Raises:
          ValueError: the storage expands (growth replaces it while ops may read it: those
            tables are read under :meth:`pinned`).
          RuntimeError: the table was closed, or the registry is full.
        """
        if self.block_rows is not None:
            raise ValueError(f"Table `{self.name}` grows by dynamic expansion; compiled ops "
                             f"read fixed-capacity tables only.")
        if self.closed:
            raise RuntimeError(f"Table `{self.name}` was released by "
                               f"terminate_config_initializer(); its rows are gone.")
        with self._lock:   # two graphs built at once get one entry
            if self._entry is None:
                from sparseflow.ops.table_registry import TableEntry

                entry = TableEntry(self.name)
                entry.publish(self._storage)
                self._entry = entry
        return self._entry

    @property
    def expands(self) -> bool:
        """Whether the storage grows (dynamic expansion)."""
        return self.block_rows is not None

    def bind_optimizer(self, optimizer, holds_no_row: bool = False) -> None:
        """Fixes the slot layout from ``optimizer`` (``slot_names``, ``slot_initial_values``).

        Args:
          optimizer: the sparse optimizer.
          holds_no_row: the caller (the table, under its key processor's lock) knows that no
            key was ever given a row: storage allocated without the optimizer's slots is then
            replaced at once by a wider one.

        Raises:
          ValueError: another optimizer is already bound, or the rows were already allocated
            with a different slot layout and may hold rows.
        """
        if self.optimizer is optimizer:
            return
        if self.optimizer is not None:
            raise ValueError(
                f"Table `{self.name}` is already updated by optimizer `{self.optimizer.name}`; "
                f"a table takes one sparse optimizer. Received: `{optimizer.name}`")
        names = tuple(optimizer.slot_names)
        if self.storage is not None and names != self.slot_names:
            if not holds_no_row:
                raise ValueError(
                    f"Table `{self.name}` already holds rows without optimizer slots: build "
                    f"the sparse optimizer's apply_gradients (or pass it to create_table's "
                    f"optimizer_list) before the first batch is drawn.")
            with self._lock:
                # A new, wider array now rather than at first use: compiled ops read the
                # rows through the registry, which must never point at nothing once a
                # table has storage.
                self.storage = np.zeros((self.capacity, self.width_for(names)), np.float32)
        self.optimizer = optimizer
        self.slot_names = names
        self.slot_values = tuple(float(v) for v in optimizer.slot_initial_values)
        self._fill_args = None

    @property
    def width(self) -> int:
        """Floats per row: weights plus slots."""
        return self.width_for(self.slot_names)

    def width_for(self, slot_names) -> int:
        """Floats per row with ``slot_names`` as the optimizer's slots."""
        return self.dim * (1 + len(slot_names))

    def allocate(self) -> np.ndarray:
        """Allocates the storage if not yet done; returns it.

        Under dynamic expansion the array returned may be replaced by a larger one later:
        outside the key processor's lock, use :meth:`pinned` instead.

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

    @contextlib.contextmanager
    def pinned(self):
        """Yields the storage, which growth does not replace until the block exits.

        Hold it around every gather or update made outside the key processor's lock. For a
        fixed-capacity table it takes no lock.
        """
        if self.block_rows is None:
            yield self.allocate()
            return
        with self._resize_lock:
            yield self.allocate()

    def ensure_rows(self, n: int) -> None:
        """Makes rows ``[0, n)`` exist: under dynamic expansion, grows the storage to the
        next whole block at or above ``max(n, 2 x capacity)``, copying the rows held.

        The caller holds the key processor's lock (the only place rows are handed out), so
        growth never runs twice at once.

        Raises:
          IndexError: ``n`` exceeds a fixed capacity, or 2^31 - 1 rows under expansion.
        """
        if n <= self.capacity:
            return
        if self.block_rows is None or n > INT32_MAX:
            raise IndexError(f"Table `{self.name}`: row {n - 1} is past its "
                             f"{self.capacity if self.block_rows is None else INT32_MAX} rows.")
        capacity = self._grown(n, self.capacity)
        with self._resize_lock:  # no gather or update runs on the old array from here
            if self.storage is not None:
                grown = np.zeros((capacity, self.storage.shape[1]), np.float32)
                grown[:self.capacity] = self.storage
                self.storage = grown
            self.capacity = capacity

    def _grown(self, needed: int, current: int) -> int:
        """Doubling amortises the copies (each row is copied O(1) times on average); whole
        blocks keep the size a multiple of ``block_rows``."""
        target = max(needed, 2 * current, 1)
        blocks = -(-target // self.block_rows)
        return min(blocks * self.block_rows, INT32_MAX)

    def commit_memory(self, first_unused_row: int) -> None:
        """Touches the pages of rows ``[first_unused_row, capacity)`` now, so that those rows
        pay no first-touch page fault when they are handed out later.

        Rows below ``first_unused_row`` may hold trained values and are not written; the caller
        holds the key processor's lock so that no row is handed out meanwhile. Allocates the
        storage if needed; makes ``capacity x width x 4`` bytes resident (under expansion, the
        rows allocated so far).
        """
        storage = self.allocate()
        storage[first_unused_row:].fill(0.0)  # never-used rows hold zeros either way

    def commit_ahead(self, next_row: int, rows_ahead: int) -> None:
        """Makes the memory of the rows the key processor hands out next resident, without
        writing them, so that their first write (:meth:`initialize`) pays no page fault.

        Call from a thread off the step's path where there is one (the input pipeline;
        the TF2 faces on several ranks call it from the owner's key processing in the step,
        where their routing, a compiled op, cannot); safe while rows are
        written (``page_commit.populate_write``). Keeps ``rows_ahead`` to ``2 x rows_ahead``
        rows past ``next_row`` resident: one call in two or fewer does any work. Does nothing
        before the storage exists or once the table is closed.

        Args:
          next_row: the first row never handed out (``KeyProcessor.rows_ever_used``; may be
            read without the processor's lock: a stale value only commits less).
          rows_ahead: rows to keep resident ahead of it (>= 0).
        """
        storage = self.storage
        if storage is None or self.closed or rows_ahead <= 0:
            return
        if self._resident_of is None or self._resident_of() is not storage:
            # First call, or the storage grew (a new array): start over.
            self._resident_of, self._resident_until = weakref.ref(storage), 0
        rows = storage.shape[0]
        if self._resident_until >= min(next_row + rows_ahead, rows):
            return
        first = max(self._resident_until, next_row)
        last = min(next_row + 2 * rows_ahead, rows)
        row_bytes = storage.strides[0]
        if last > first and page_commit.populate_write(storage, first * row_bytes,
                                                       last * row_bytes):
            self._resident_until = last

    def initialize(self, rows: np.ndarray, keys: np.ndarray) -> None:
        """Draws fresh weights for ``rows`` (deterministic per key) and resets their slots.

        Called by the key processor under its lock. Under dynamic expansion it first grows the
        storage to hold ``rows``; no pinning is needed for the writes: only this caller grows
        the storage, and no batch holds these rows yet.

        Args:
          rows: int32 row indices in ``[0, capacity)`` (under expansion, any row >= 0), from
            the key processor.
          keys: int64 keys, one per row.
        """
        if self.block_rows is not None and rows.shape[0]:
            self.ensure_rows(int(rows.max()) + 1)
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
            out = tensor_buffers.empty((rows.shape[0], self.dim), np.float32)
        with self.pinned() as storage:
            gather_rows(storage, rows, self.dim, out)
        return out

    def read(self, rows: np.ndarray) -> np.ndarray:
        """``[weights | slots]`` of ``rows`` (int32, >= 0), float32 ``[n, width]`` (a copy).

        Raises:
          IndexError: a row outside the storage.
        """
        with self.pinned() as storage:
            return row_copies.read(self.name, storage, rows)

    def write(self, rows: np.ndarray, values: np.ndarray) -> None:
        """Stores ``values`` (float32 ``[n, width]``) at ``rows`` (int32, >= 0).

        Raises:
          IndexError: a row outside the storage (nothing written).
        """
        with self.pinned() as storage:
            row_copies.write(self.name, storage, rows, values)

    def slots(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Each optimizer slot of ``rows``, by slot name, as ``[len(rows), dim]`` copies."""
        with self.pinned() as storage:
            return {name: storage[rows, self.dim * (i + 1):self.dim * (i + 2)].copy()
                    for i, name in enumerate(self.slot_names)}

    def close(self) -> None:
        """Releases the storage; any later use raises."""
        self.closed = True
        self.storage = None
        self._resident_of = None
        if self._entry is not None:
            self._entry.close()
