"""A table's rows in two tiers: a few fast slots caching rows whose homes are in a slow tier.

Two configurations use it:

- ``rows_on="device"`` with ``host_vocabulary_size > 0``: ``device_vocabulary_size`` slots in
  TF variables (``DeviceRows``) over a home for every row in host memory (``HostRows``).
- host rows with ``ssd_vocabulary_size > 0``: ``device_vocabulary_size +
  host_vocabulary_size`` slots in host memory (``HostRows``) over a home for every row in a
  memory-mapped file (``DiskRows``); rows leave host memory least frequently used first.

The key processor keeps handing out *logical* rows (``0 .. capacity-1``), which the batch
carries; the pipeline places a batch read ahead early when there is room
(:meth:`RowTiers.prefetch`), and the step's gather turns its unique logical rows into fast
slots (:meth:`RowTiers.place`; a :class:`TierCache` decides which), so that the gather and the
optimizer update run on the fast tier.
New rows get their initial values at home; the swap in carries them to the fast tier.

The fast tier's data is moved by its owner — the training step, before its gather, for both
configurations (:meth:`RowTiers.swap` with row-copy callbacks for host slots; for device slots
the step splits it into :meth:`take` / TF gather / :meth:`write_back_and_read` / TF scatter).
Checkpoints, exports and restores go through :meth:`read` and :meth:`load`, which see a row
where it currently is.
"""

from __future__ import annotations

from typing import Callable

import threading

import numpy as np

from sparseflow.embed import row_copies
from sparseflow.embed.initializers import InitSpec, init_rows
from sparseflow.ops import tier_kernels
from sparseflow.pipeline.tier_cache import TierCache


class RowTiers:
    """Fast slots over homes, for one table.

    Args:
      name: the table's name.
      slots: fast slots.
      rows: logical rows (the table's capacity).
      dim: embedding width.
      init_spec: how new rows' weights are drawn (as for host rows).
      policy: the cache's victim policy, "lru" or "lfu".
      size_hint: names the fast tier's size in a full-cache error.
      make_homes: ``() -> (homes, slot_values)``, called once, when the homes are first
        needed (``start_asc_pipeline``, or the first new row): the optimizer's slot layout is
        fixed by then. ``homes`` has ``read(rows) -> float32 [n, width]``,
        ``write(rows, values)`` and ``pinned()``, a context yielding its rows as a
        C-contiguous, writeable float32 ``[rows, width]`` array (the swap's and the new rows'
        kernels write there); ``slot_values`` are the optimizer's slot initial values.
    """

    def __init__(self, name: str, slots: int, rows: int, dim: int, init_spec: InitSpec,
                 policy: str, size_hint: str, make_homes: Callable):
        self.name = name
        self.dim = int(dim)
        self.init_spec = init_spec
        self.cache = TierCache(name, slots, rows, policy=policy, size_hint=size_hint)
        self._make_homes = make_homes
        self._homes = None
        # One swap at a time: two gathers of the table in one session run (different batches)
        # run in parallel, and one's swap in of a row must not read its home before the
        # other's write-back of it. Device swaps are serialized by the table's critical
        # section instead (their steps are separate ops). Lock order: this, then the cache's.
        self._swap_lock = threading.Lock()
        self.slot_values: tuple[float, ...] = ()

    @property
    def homes(self):
        """The slow tier's store (made on first use)."""
        if self._homes is None:
            homes, slot_values = self._make_homes()
            self.slot_values = tuple(float(v) for v in slot_values)
            self._homes = homes
        return self._homes

    @property
    def width(self) -> int:
        """Floats per row: weights plus the optimizer's slots."""
        return self.dim * (1 + len(self.slot_values))

    # -- the input pipeline (key processor, under its lock) and the step's claim ---------

    def initialize(self, rows: np.ndarray, keys: np.ndarray) -> None:
        """The key processor's callback for newly assigned rows: writes their initial values
        (deterministic per key) at home, after dropping any old contents from the cache."""
        n = rows.shape[0]
        if n == 0:
            return
        homes = self.homes
        # Under the cache's lock, the draw included (~30 us for a batch's new rows): a step's
        # claim or swap waits that long, and nothing can read a row's home between the
        # cache forgetting its old contents and its new values landing.
        with self.cache.lock, homes.pinned() as storage:
            self.cache.forget(rows)
            init_rows(storage, rows, np.ascontiguousarray(keys, np.int64), self.init_spec,
                      self.dim, self.slot_values)

    def prefetch(self, rows: np.ndarray, seq: int, training: bool = True) -> None:
        """The pipeline's early placement of a batch read ahead, if room allows; see
        :meth:`TierCache.prefetch`."""
        self.cache.prefetch(rows, seq, training)

    def place(self, rows: np.ndarray, seq: int, training: bool | None = None) -> np.ndarray:
        """The step's claim of the fast slots of a batch's unique logical rows (-1 stays -1);
        see :meth:`TierCache.place`."""
        return self.cache.place(rows, seq, training)

    # -- the training step -----------------------------------------------------------------

    def take(self, after=None):
        """Pops every queued plan (``after``: ignored, the value a training step's pop waits
        for), merged: ``(out_slots, out_rows, out_gens, in_slots,
        in_rows)``. Merging is safe: within one pop no row or slot enters and then leaves
        (an entered slot stays pinned until its batch is gathered and updated, after this
        pop's step)."""
        plans = self.cache.pop_plans()
        if not plans:
            empty = np.zeros(0, np.int32)
            return empty, empty, np.zeros(0, np.int64), empty, empty

        def cat(field, dtype):
            return np.concatenate([getattr(p, field) for p in plans]).astype(dtype, copy=False)

        return (cat("out_slots", np.int32), cat("out_rows", np.int32),
                cat("out_gens", np.int64), cat("in_slots", np.int32), cat("in_rows", np.int32))

    def write_back_and_read(self, out_rows, out_gens, out_values, in_rows) -> np.ndarray:
        """Writes the rows leaving the fast tier home (except rows handed to a new key since
        their plan was made), then reads the homes of the rows entering it.

        Raises:
          ValueError: ``out_gens`` or ``out_values`` do not match ``out_rows`` (one
            generation and one row of ``width`` floats each); nothing written.
          RuntimeError: the homes' rows are not ``width`` floats wide.
        """
        homes = self.homes   # made first: it fixes the slot layout, hence the width
        out_rows = np.ascontiguousarray(out_rows, np.int32)
        out_gens = np.ascontiguousarray(out_gens, np.int64)
        out_values = np.ascontiguousarray(out_values, np.float32)
        in_rows = np.ascontiguousarray(in_rows, np.int32)
        n_out = out_rows.shape[0]
        values_fit = (out_values.shape == (n_out, self.width)
                      or (n_out == 0 and out_values.size == 0))
        if out_gens.shape != (n_out,) or not values_fit:
            raise ValueError(f"Table `{self.name}`: {n_out} rows leaving the fast tier need "
                             f"{n_out} generations and values of shape ({n_out}, "
                             f"{self.width}); received {out_gens.shape} and "
                             f"{out_values.shape}.")
        in_values = np.empty((in_rows.shape[0], self.width), np.float32)
        with self.cache.lock, homes.pinned() as storage:
            if storage.shape[1] != self.width:   # the kernel copies whole rows
                raise RuntimeError(f"Table `{self.name}`: its homes hold rows of "
                                   f"{storage.shape[1]} floats, its fast tier {self.width}.")
            tier_kernels.write_back_and_read(storage, self.cache.gen, out_rows, out_gens,
                                             out_values.reshape(n_out, self.width), in_rows,
                                             in_values)
        return in_values

    def swap(self, read_slots: Callable, write_slots: Callable) -> None:
        """Executes every queued plan with the fast tier's ``read_slots(slots) -> values``
        and ``write_slots(slots, values)``."""
        with self._swap_lock:
            out_slots, out_rows, out_gens, in_slots, in_rows = self.take()
            if out_slots.shape[0] == 0 and in_slots.shape[0] == 0:
                return
            out_values = read_slots(out_slots) if out_slots.shape[0] else \
                np.zeros((0, self.width), np.float32)
            in_values = self.write_back_and_read(out_rows, out_gens, out_values, in_rows)
            if in_slots.shape[0]:
                write_slots(in_slots, in_values)

    def swap_host(self, storage: np.ndarray) -> None:
        """:meth:`swap` for host slots: ``storage`` is their ``[slots, width]`` array."""
        self.swap(*self.host_slots(storage))

    def host_slots(self, storage: np.ndarray) -> tuple[Callable, Callable]:
        """``(read_slots, write_slots)`` over host slots' ``[slots, width]`` ``storage``
        (row-copy kernels, as the homes use)."""
        return (lambda slots: row_copies.read(self.name, storage, slots, "slot"),
                lambda slots, values: row_copies.write(self.name, storage, slots, values,
                                                       "slot"))

    def release(self, seq: int) -> None:
        """The batch ``seq`` was gathered (see :meth:`TierCache.release`)."""
        if seq >= 0:
            self.cache.release(seq)

    def settle(self) -> None:
        """The released batches' updates have run (see :meth:`TierCache.settle`)."""
        self.cache.settle()

    def logical(self, slots: np.ndarray) -> np.ndarray:
        """The logical rows in ``slots`` (of a batch still pinned), -1 for -1."""
        slots = np.asarray(slots)
        rows = np.full(slots.shape[0], -1, np.int32)
        valid = slots >= 0
        rows[valid] = self.cache.row_in[slots[valid]]
        return rows

    # -- checkpoints, exports, restores ----------------------------------------------------

    def read(self, rows: np.ndarray, read_slots: Callable, write_slots: Callable,
             weights_only: bool = False) -> np.ndarray:
        """``[weights | slots]`` (or weights) of logical ``rows``, wherever each one is now:
        queued plans are executed first, then resident rows are read from the fast tier and
        the others from home. Call it between training steps (a checkpoint)."""
        self.swap(read_slots, write_slots)
        rows = np.asarray(rows, np.int32)
        with self.cache.lock:
            values = self.homes.read(rows)
            slots = self.cache.slot_of[rows]
            resident = np.flatnonzero(slots >= 0)
            if resident.shape[0]:
                values[resident] = read_slots(slots[resident])
        return values[:, :self.dim] if weights_only else values

    def load(self, values: np.ndarray) -> None:
        """Writes ``values`` (host layout, rows 0..n-1; columns past this table's width, the
        slots of a checkpoint restored into a table without an optimizer, are dropped) home
        and empties the fast tier (a restore)."""
        self.cache.reset()
        if values.shape[0]:
            with self.cache.lock:
                self.homes.write(np.arange(values.shape[0], dtype=np.int32),
                                 np.ascontiguousarray(values[:, :self.width], np.float32))

    def close(self) -> None:
        """Releases the homes (a disk tier's file is deleted: the checkpoint persists)."""
        if self._homes is not None and hasattr(self._homes, "close"):
            self._homes.close()
        self._homes = None

    def stats(self) -> dict:
        """The cache's ``resident_rows``, ``hit_rate``, ``rows_swapped_in``/``out``."""
        return self.cache.stats()
