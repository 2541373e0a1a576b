"""Where compiled ops find a table's rows, and how they hand back what they did.

A compiled op (``ops/tf_capi.py``) cannot hold a Python object, and a table's storage is a
numpy array Python may replace (allocation, a wider slot layout, ``terminate``). So every
host table a compiled op reads gets an entry in one process-wide int64 array, the registry:
its storage's address, rows and width, a generation, its optimizer's update count, its
checkpoint marks, and a queue of events for its key processor. The registry is allocated
once and never moves; kernels reach it through the symbol :data:`SYMBOL` (bound to its
address with ``llvm.add_symbol``), so the kernels that read it are cached by numba like any
other.

A graph names a table by its token (slot and generation, :attr:`TableEntry.token`): a token
of a released table, or of another process, matches no entry and the op fails cleanly.

The event queue: a gather pushes each table's batch sequence number (its rows were read,
``KeyProcessor.release``), an update pushes :data:`DRAIN` (evicted rows its batch held may be
reused, ``KeyProcessor.updated``), with atomic operations and no lock; the key processor
takes them in order under its own lock (:meth:`TableEntry.take_events`). Should a queue ever
fill (a graph gathering thousands of batches no key processing followed), the op records the
newest sequence number (or the DRAIN) it could not queue instead.
"""

from __future__ import annotations

import random
import threading
import time
import weakref

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core.extending import intrinsic

from sparseflow.ops import atomics

SYMBOL = "sparseflow_table_registry"
MAX_TABLES = 1 << 14        # tables alive at once in a process
QUEUE_SIZE = 1 << 12        # released batches a table's queue holds before overflow
_QUEUE_MARGIN = 64          # slack for gathers pushing at once

# Fields of an entry (one int64 row of the registry): the rows; the release queue (its
# address, head and tail counters, the newest release a full queue lost, whether it lost an
# update's drain); the optimizer's update count (Adam's bias-correction step); the rows'
# checkpoint marks (``KeyProcessor.dirty``: address and length); how many ops are using the
# entry (:func:`acquire`).
(STORAGE, ROWS, WIDTH, GENERATION, QUEUE, HEAD, TAIL, OVERFLOW, DRAIN_LOST, STEPS, MARKS,
 MARKS_LEN, IN_USE) = range(13)
_FIELDS = 16

# Queue events, stored + 2 (0 marks a place not yet written): a batch released (its seq,
# >= 0), or DRAIN, an update ran (quarantined rows no batch in flight needs may be freed).
DRAIN = -1

# acquire(): the token names no live entry; the entry has no storage yet.
UNKNOWN, NO_STORAGE = -1, -2
_WAIT_LIMIT_S = 60.0   # how long a replacement or close waits for ops still using an entry

_REGISTRY = np.zeros((MAX_TABLES, _FIELDS), np.int64)
atomics.bind(SYMBOL, _REGISTRY)

_lock = threading.Lock()
_free = list(range(MAX_TABLES - 1, -1, -1))
# Generations start at a random point per process: a token from a graph built in another
# process names no live entry here.
_next_generation = random.SystemRandom().randrange(1, 1 << 40)


# -- kernel side ----------------------------------------------------------------------------

_registry_address = atomics.global_address(SYMBOL)
_atomic = atomics.atomic


@intrinsic
def _int64_pointer(typingctx, address):
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], ir.IntType(64).as_pointer())
    return types.CPointer(types.int64)(address), codegen


@intrinsic
def _uint8_pointer(typingctx, address):
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], ir.IntType(8).as_pointer())
    return types.CPointer(types.uint8)(address), codegen


@numba.njit(nogil=True, cache=True)
def registry():
    """The registry, an int64 ``[MAX_TABLES, 16]`` view (kernels only)."""
    return numba.carray(_int64_pointer(_registry_address()), (MAX_TABLES, _FIELDS))


@numba.njit(nogil=True, cache=True)
def _field_address(slot, field):
    return _registry_address() + (slot * _FIELDS + field) * 8


@numba.njit(nogil=True, cache=True)
def _load(slot, field):
    # An atomic read: ordered with the atomic writes of other threads.
    return _atomic("add", _field_address(slot, field), 0)


@numba.njit(nogil=True, cache=True)
def acquire(token):
    """The registry slot a token names, marked in use: its storage is neither replaced nor
    freed, nor its slot reused, until :func:`release`. Else UNKNOWN (a released table, or a
    token from another process) or NO_STORAGE (nothing to read yet), nothing held."""
    if token < 0:
        return UNKNOWN
    slot = token % MAX_TABLES
    _atomic("add", _field_address(slot, IN_USE), 1)
    # Checked after the mark: a close or replacement that started before it waits for it.
    if _load(slot, GENERATION) != token // MAX_TABLES:
        release(slot)
        return UNKNOWN
    if _load(slot, STORAGE) == 0:
        release(slot)
        return NO_STORAGE
    return slot


@numba.njit(nogil=True, cache=True)
def release(slot):
    """Ends a use :func:`acquire` began."""
    _atomic("add", _field_address(slot, IN_USE), -1)


@numba.njit(nogil=True, cache=True)
def _retire(slot, field):
    """Zeroes ``field`` (STORAGE or GENERATION) atomically, so no new :func:`acquire`
    succeeds; returns how many ops still hold the entry."""
    _atomic("xchg", _field_address(slot, field), 0)
    return _load(slot, IN_USE)


@numba.njit(nogil=True, cache=True)
def _in_use(slot):
    return _load(slot, IN_USE)


@numba.njit(nogil=True, cache=True)
def _set(slot, field, value):
    _atomic("xchg", _field_address(slot, field), value)


@numba.njit(nogil=True, cache=True)
def _push(slot, event):
    """Queues ``event`` (a seq, or DRAIN) on entry ``slot``; False when the queue is full."""
    reg = registry()
    if reg[slot, HEAD] - reg[slot, TAIL] >= QUEUE_SIZE - _QUEUE_MARGIN:
        return False
    at = _atomic("add", _field_address(slot, HEAD), 1)
    _atomic("xchg", reg[slot, QUEUE] + (at % QUEUE_SIZE) * 8, event + 2)
    return True


@numba.njit(nogil=True, cache=True)
def push_released(slot, seq):
    """Queues batch ``seq`` (>= 0) as read on entry ``slot``; a full queue records it in
    the entry's overflow field instead (the newest such seq)."""
    if not _push(slot, seq):
        _atomic("max", _field_address(slot, OVERFLOW), seq)


@numba.njit(nogil=True, cache=True)
def push_drain(slot):
    """Queues, after what is queued, that an update of entry ``slot``'s rows ran."""
    if not _push(slot, DRAIN):
        _atomic("xchg", _field_address(slot, DRAIN_LOST), 1)


@numba.njit(nogil=True, cache=True)
def count_step(slot):
    """Counts one more update of entry ``slot``'s rows; returns its step (1-based)."""
    return _atomic("add", _field_address(slot, STEPS), 1) + 1


@numba.njit(nogil=True, cache=True)
def marks(slot):
    """Entry ``slot``'s checkpoint marks (a numpy bool per row, viewed as uint8: set to 1),
    or an empty array if none."""
    reg = registry()
    if reg[slot, MARKS] == 0:
        return np.zeros(0, np.uint8)
    return numba.carray(_uint8_pointer(reg[slot, MARKS]), reg[slot, MARKS_LEN])


@numba.njit(nogil=True, cache=True)
def _take_events(slot, out):
    """Moves the queued events of entry ``slot`` into ``out`` (in queue order, up to a place
    not yet written); returns (how many, the newest seq a full queue lost or -1, whether it
    lost a DRAIN)."""
    reg = registry()
    head = reg[slot, HEAD]
    tail = reg[slot, TAIL]
    n = 0
    while tail < head and n < out.shape[0]:
        value = _atomic("xchg", reg[slot, QUEUE] + (tail % QUEUE_SIZE) * 8, 0)
        if value == 0:   # reserved by a push still writing: taken next time
            break
        out[n] = value - 2
        n += 1
        tail += 1
    _atomic("xchg", _field_address(slot, TAIL), tail)
    overflow = _atomic("xchg", _field_address(slot, OVERFLOW), -1)
    drain_lost = _atomic("xchg", _field_address(slot, DRAIN_LOST), 0)
    return n, overflow, drain_lost != 0


# -- Python side ----------------------------------------------------------------------------

class TableEntry:
    """One table's registry entry, held by its ``HostRows``.

    Args:
      name: the table's name, for messages.

    Raises:
      RuntimeError: ``MAX_TABLES`` tables are alive already.
    """

    def __init__(self, name: str):
        global _next_generation
        with _lock:
            if not _free:
                raise RuntimeError(
                    f"Table `{name}`: {MAX_TABLES} tables are alive in this process, the most "
                    f"sparseflow's compiled ops can address; release tables "
                    f"(terminate_config_initializer()) before creating more.")
            self.slot = _free.pop()
            self.generation = _next_generation
            _next_generation += 1
        self.name = name
        self._queue = np.zeros(QUEUE_SIZE, np.int64)
        self._storage: np.ndarray | None = None
        self._marks: np.ndarray | None = None
        self._closed = False
        self._closed_steps = 0
        self._taken = np.empty(QUEUE_SIZE, np.int64)
        entry = _REGISTRY[self.slot]
        entry[:] = 0
        entry[QUEUE] = self._queue.ctypes.data
        entry[OVERFLOW] = -1
        entry[GENERATION] = self.generation
        # Freed with its owner even if never closed: the queue's memory lives as long as
        # the entry points at it.
        self._finalizer = weakref.finalize(self, _free_slot, self.slot, self._queue)

    @property
    def token(self) -> int:
        """The int64 a graph names this table by (slot and generation)."""
        return self.generation * MAX_TABLES + self.slot

    def publish(self, storage: np.ndarray | None) -> None:
        """Points the entry at ``storage`` (float32 ``[rows, width]``, C-contiguous), or at
        nothing (ops then fail: no storage). Waits for the ops using the entry to finish
        first; the entry keeps ``storage`` alive.

        Raises:
          ValueError: ``storage`` is not a C-contiguous float32 matrix.
          RuntimeError: the entry is closed, or ops held it past the wait limit.
        """
        if storage is not None and (storage.dtype != np.float32 or storage.ndim != 2
                                    or not storage.flags.c_contiguous):
            raise ValueError(
                f"Table `{self.name}`: a registered storage must be a C-contiguous float32 "
                f"matrix; got {storage.dtype} {storage.shape}"
                f"{'' if storage.flags.c_contiguous else ', not C-contiguous'}")
        if self._closed:
            raise RuntimeError(f"Table `{self.name}` was released; its entry takes no rows.")
        self._wait_unused(_retire(self.slot, STORAGE), "replacing its rows")
        if storage is not None:
            entry = _REGISTRY[self.slot]
            entry[ROWS], entry[WIDTH] = storage.shape
            _set(self.slot, STORAGE, storage.ctypes.data)
        self._storage = storage

    def _wait_unused(self, in_use: int, what: str) -> None:
        """Waits until no op holds the entry (they finish in milliseconds)."""
        deadline = time.monotonic() + _WAIT_LIMIT_S
        while in_use:
            if time.monotonic() > deadline:
                raise RuntimeError(f"Table `{self.name}`: {in_use} compiled ops still use its "
                                   f"rows after {_WAIT_LIMIT_S:.0f} s; not {what}.")
            time.sleep(0.0005)
            in_use = _in_use(self.slot)

    def publish_marks(self, marks: np.ndarray | None) -> None:
        """Points the entry at the rows' checkpoint marks (bool per row, C-contiguous), which
        compiled updates set for the rows they change; the caller keeps ``marks`` alive and
        in place while ops may write it."""
        entry = _REGISTRY[self.slot]
        if marks is None:
            entry[MARKS] = entry[MARKS_LEN] = 0
        else:
            if marks.dtype != np.bool_ or marks.ndim != 1 or not marks.flags.c_contiguous:
                raise ValueError(f"Table `{self.name}`: registered marks must be a "
                                 f"C-contiguous bool vector; got {marks.dtype} {marks.shape}")
            entry[MARKS_LEN] = marks.shape[0]
            entry[MARKS] = marks.ctypes.data
        self._marks = marks

    def take_events(self) -> tuple[np.ndarray, int, bool]:
        """What ops queued since the last call: (int64 events in queue order: a released
        batch's seq, or :data:`DRAIN` for an update that ran; the newest seq a full queue
        could not hold, or -1; whether it could not hold a DRAIN). Nothing once closed (the
        slot may serve another table). Call from one thread at a time (the key processor's
        lock)."""
        if self._closed:
            return np.zeros(0, np.int64), -1, False
        n, overflow, drain_lost = _take_events(self.slot, self._taken)
        return self._taken[:n].copy(), int(overflow), bool(drain_lost)

    def has_events(self) -> bool:
        """Whether :meth:`take_events` has anything to return (a cheap check)."""
        if self._closed:
            return False
        entry = _REGISTRY[self.slot]
        return bool(entry[HEAD] != entry[TAIL] or entry[OVERFLOW] >= 0 or entry[DRAIN_LOST])

    @property
    def steps(self) -> int:
        """Updates compiled ops (or :meth:`count_step` callers) applied to the rows."""
        return self._closed_steps if self._closed else int(_REGISTRY[self.slot, STEPS])

    @steps.setter
    def steps(self, steps: int) -> None:
        if not self._closed:
            _REGISTRY[self.slot, STEPS] = int(steps)
        self._closed_steps = int(steps)

    def queue_drain(self) -> None:
        """Queues, after what ops queued, that an update of the rows ran (from Python, as a
        compiled update does); nothing once closed."""
        if not self._closed:
            push_drain(self.slot)

    def count_step(self) -> int:
        """Counts one more update (from Python); returns its step (1-based)."""
        if self._closed:
            raise RuntimeError(f"Table `{self.name}` was released; its rows take no update.")
        return int(count_step(self.slot))

    def close(self) -> None:
        """Frees the entry once no op uses it: its token no longer names anything (its step
        count stays readable).

        Raises:
          RuntimeError: ops held the entry past the wait limit (it then stays allocated).
        """
        if self._closed:
            return
        self._wait_unused(_retire(self.slot, GENERATION), "releasing them")
        self._closed_steps = int(_REGISTRY[self.slot, STEPS])
        self._closed = True
        self._storage = self._marks = None
        self._finalizer()


def _free_slot(slot: int, queue: np.ndarray) -> None:
    # ``queue`` is held until here: the entry's queue address stays valid while it is live.
    # (Reached unclosed only when the entry was collected: no graph names it any more.)
    _retire(slot, GENERATION)
    while _in_use(slot):
        time.sleep(0.0005)
    _REGISTRY[slot] = 0
    with _lock:
        _free.append(slot)
    del queue
