"""Which rows of a table are on the device, and the moves that put a batch's rows there.

With a host tier behind the device tier (``host_vocabulary_size > 0``), the device rows are a
cache of ``device_vocabulary_size`` slots over the table's rows, which all have a home in host
memory. Per batch, in the input pipeline, :meth:`DeviceCache.place` maps the batch's unique
rows to device slots: rows already resident keep their slot; missing rows take free slots, then
the least recently used slots that no batch in flight needs (their rows are written back to
the host first). The moves are queued as :class:`SwapPlan`s; the training step pops every
queued plan and executes them in order — swap out (device → host), then swap in (host →
device) — before its gather.

Executing plans of batches still in the prefetch buffer early is safe: a plan only moves rows
out of slots no batch in flight uses (those slots are pinned from placement until the batch
is released) and into slots it took from no one in flight.

Row init needs nothing here: a new row's initial values are written to its host home by the
key processor, and the swap-in carries them to the device.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

import numpy as np


class DeviceCacheFullError(RuntimeError):
    """The device tier cannot hold the unique rows of the batches in flight."""


@dataclass(frozen=True)
class SwapPlan:
    """The moves one batch needs, in order: rows ``out_rows`` leave slots ``out_slots``
    (written back to their host homes), then rows ``in_rows`` enter slots ``in_slots``."""

    out_slots: np.ndarray   # int32
    out_rows: np.ndarray    # int32
    in_slots: np.ndarray    # int32
    in_rows: np.ndarray     # int32


class DeviceCache:
    """The residency of ``rows`` logical rows in ``slots`` device slots.

    Args:
      table_name: for messages.
      slots: device slots (``device_vocabulary_size``), >= 1.
      rows: logical rows (every row the table can hold).
      host_rows: ``host_vocabulary_size``, for messages.
    """

    def __init__(self, table_name: str, slots: int, rows: int, host_rows: int = 0):
        self.table_name = table_name
        self.slots = int(slots)
        self.host_rows = int(host_rows)
        self.slot_of = np.full(int(rows), -1, np.int32)      # row -> slot, -1: on the host
        self.row_in = np.full(self.slots, -1, np.int32)      # slot -> row, -1: free
        self.last_used = np.zeros(self.slots, np.int64)      # LRU clock per slot
        self.pins = np.zeros(self.slots, np.int32)           # batches in flight per slot
        self._pinned: dict[int, np.ndarray] = {}             # seq -> slots it pinned
        self._clock = 0
        self._plans: deque[SwapPlan] = deque()
        self.lock = threading.Lock()
        self.swapped_in = 0
        self.swapped_out = 0
        self.hits = 0

    def place(self, rows: np.ndarray, seq: int) -> np.ndarray:
        """Device slots for a batch's unique rows, queueing the moves that make them resident.

        Args:
          rows: int32 ``[U]`` distinct logical rows, -1 for keys without a row.
          seq: the batch's sequence number (its slots stay pinned until :meth:`release`).

        Returns:
          int32 ``[U]`` slots (-1 where ``rows`` is -1).

        Raises:
          DeviceCacheFullError: the rows missing on the device exceed the free slots plus the
            slots no batch in flight needs; nothing changed.
        """
        rows = np.asarray(rows, np.int32)
        with self.lock:
            valid = rows >= 0
            slots = np.full(rows.shape[0], -1, np.int32)
            slots[valid] = self.slot_of[rows[valid]]
            missing = np.flatnonzero(valid & (slots < 0))
            resident = slots[valid & (slots >= 0)]
            n = missing.shape[0]
            free = np.flatnonzero(self.row_in < 0)
            take_free = free[:n]
            n_victims = n - take_free.shape[0]
            victims = np.zeros(0, np.int32)
            if n_victims:
                eligible = (self.pins == 0) & (self.row_in >= 0)
                eligible[resident] = False
                candidates = np.flatnonzero(eligible)
                if candidates.shape[0] < n_victims:
                    raise DeviceCacheFullError(
                        f"Table `{self.table_name}`: a batch needs {n} rows moved onto the "
                        f"device, but only {take_free.shape[0] + candidates.shape[0]} of its "
                        f"{self.slots} slots (device_vocabulary_size={self.slots}) are free or "
                        f"unused by the {len(self._pinned)} batches in flight "
                        f"(host_vocabulary_size={self.host_rows}). Raise "
                        f"device_vocabulary_size to at least the unique keys of the batches "
                        f"in flight, or prefetch fewer batches.")
                # The n least recently used: a partition (O(slots)), then only those sorted.
                age = self.last_used[candidates]
                if n_victims < candidates.shape[0]:
                    pick = np.argpartition(age, n_victims - 1)[:n_victims]
                else:
                    pick = np.arange(candidates.shape[0])
                pick = pick[np.lexsort((candidates[pick], age[pick]))]
                victims = candidates[pick].astype(np.int32)
            out_rows = self.row_in[victims].copy()
            self.slot_of[out_rows] = -1
            new_slots = np.concatenate([take_free.astype(np.int32), victims])
            in_rows = rows[missing]
            self.slot_of[in_rows] = new_slots
            self.row_in[new_slots] = in_rows
            slots[missing] = new_slots
            used = slots[valid]
            self.pins[used] += 1
            self._pinned[int(seq)] = used
            self.last_used[used] = self._clock
            self._clock += 1
            self.hits += int(resident.shape[0])
            self.swapped_in += int(n)
            self.swapped_out += int(victims.shape[0])
            if n:
                self._plans.append(SwapPlan(out_slots=victims, out_rows=out_rows,
                                            in_slots=new_slots, in_rows=in_rows))
            return slots

    def release(self, seq: int) -> None:
        """Unpins the slots of batch ``seq`` (its step has read and updated them)."""
        with self.lock:
            used = self._pinned.pop(int(seq), None)
            if used is not None:
                self.pins[used] -= 1

    def pop_plans(self) -> list[SwapPlan]:
        """Every queued plan, oldest first, to execute in this order."""
        with self.lock:
            plans = list(self._plans)
            self._plans.clear()
        return plans

    def forget(self, rows: np.ndarray) -> np.ndarray:
        """Frees the slots of ``rows`` (evicted keys' rows, no longer needed by any batch).

        Returns:
          the int32 slots freed.
        """
        rows = np.asarray(rows, np.int32)
        with self.lock:
            slots = self.slot_of[rows]
            slots = slots[slots >= 0]
            self.slot_of[rows] = -1
            self.row_in[slots] = -1
            return slots

    @property
    def hit_rate(self) -> float:
        """Share of placed rows that were already on the device."""
        total = self.hits + self.swapped_in
        return self.hits / total if total else 1.0
