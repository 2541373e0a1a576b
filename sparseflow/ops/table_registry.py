"""Where compiled ops find a table's rows, and how they hand back the batches they read.

A compiled op (``ops/tf_capi.py``) cannot hold a Python object, and a table's storage is a
numpy array Python may replace (allocation, a wider slot layout, ``terminate``). So every
host table gets an entry in one process-wide int64 array, the registry: its storage's
address, rows and width, a generation, and a queue of the batches its gathers released. The
registry is allocated once and never moves; kernels reach it through the symbol
:data:`SYMBOL` (bound to its address with ``llvm.add_symbol``), so the kernels that read it
are cached by numba like any other.

A graph names a table by its token (slot and generation, :attr:`TableEntry.token`): a token
of a released table, or of another process, matches no entry and the op fails cleanly.

The release queue: a gather op pushes each table's batch sequence number (its rows were read,
``KeyProcessor.release``) with atomic operations, without any lock; the key processor takes
them under its own lock (:meth:`TableEntry.take_released`). Should a queue ever fill (a
graph gathering thousands of batches no key processing followed), the op records the newest
sequence number it could not queue instead.
"""

from __future__ import annotations

import random
import threading
import weakref

import llvmlite.binding as llvm
import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic

SYMBOL = "sparseflow_table_registry"
MAX_TABLES = 1 << 14        # tables alive at once in a process
QUEUE_SIZE = 1 << 12        # released batches a table's queue holds before overflow
_QUEUE_MARGIN = 64          # slack for gathers pushing at once

# Fields of an entry (one int64 row of the registry).
STORAGE, ROWS, WIDTH, GENERATION, QUEUE, HEAD, TAIL, OVERFLOW = range(8)
_FIELDS = 8

_REGISTRY = np.zeros((MAX_TABLES, _FIELDS), np.int64)
llvm.add_symbol(SYMBOL, _REGISTRY.ctypes.data)

_lock = threading.Lock()
_free = list(range(MAX_TABLES - 1, -1, -1))
# Generations start at a random point per process: a token from a graph built in another
# process names no live entry here.
_next_generation = random.SystemRandom().randrange(1, 1 << 40)


# -- kernel side ----------------------------------------------------------------------------

@intrinsic
def _registry_address(typingctx):
    def codegen(context, builder, signature, args):
        registry = cgutils.add_global_variable(builder.module, ir.IntType(64), SYMBOL)
        return builder.ptrtoint(registry, ir.IntType(64))
    return types.int64(), codegen


@intrinsic
def _int64_pointer(typingctx, address):
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], ir.IntType(64).as_pointer())
    return types.CPointer(types.int64)(address), codegen


@intrinsic
def _atomic(typingctx, operation, address, value):
    """``operation`` ("add", "max", "xchg") on the int64 at ``address``, sequentially
    consistent; returns the value before."""
    if not isinstance(operation, types.StringLiteral):
        return None
    op = operation.literal_value

    def codegen(context, builder, signature, args):
        pointer = builder.inttoptr(args[1], ir.IntType(64).as_pointer())
        return builder.atomic_rmw(op, pointer, args[2], "seq_cst")
    return types.int64(operation, address, value), codegen


@numba.njit(nogil=True, cache=True)
def registry():
    """The registry, an int64 ``[MAX_TABLES, 8]`` view (kernels only)."""
    return numba.carray(_int64_pointer(_registry_address()), (MAX_TABLES, _FIELDS))


@numba.njit(nogil=True, cache=True)
def entry_slot(token):
    """The registry slot a token names, or -1 when it names no live entry (a released table,
    or a token from another process)."""
    if token < 0:
        return -1
    slot = token % MAX_TABLES
    if registry()[slot, GENERATION] != token // MAX_TABLES or registry()[slot, STORAGE] == 0:
        return -1
    return slot


@numba.njit(nogil=True, cache=True)
def push_released(slot, seq):
    """Queues batch ``seq`` as read (``seq`` >= 0) on entry ``slot``'s release queue; a
    full queue records it in the entry's overflow field instead."""
    entry_address = _registry_address() + slot * _FIELDS * 8
    reg = registry()
    if reg[slot, HEAD] - reg[slot, TAIL] >= QUEUE_SIZE - _QUEUE_MARGIN:
        _atomic("max", entry_address + OVERFLOW * 8, seq)
        return
    at = _atomic("add", entry_address + HEAD * 8, 1)
    # Stored as seq + 1: 0 marks a place not written yet.
    _atomic("xchg", reg[slot, QUEUE] + (at % QUEUE_SIZE) * 8, seq + 1)


@numba.njit(nogil=True, cache=True)
def _take_released(slot, out):
    """Moves the queued sequence numbers of entry ``slot`` into ``out`` (in queue order, up
    to a place not yet written); returns (how many, the overflow field's seq or -1)."""
    reg = registry()
    entry_address = _registry_address() + slot * _FIELDS * 8
    head = reg[slot, HEAD]
    tail = reg[slot, TAIL]
    n = 0
    while tail < head:
        value = _atomic("xchg", reg[slot, QUEUE] + (tail % QUEUE_SIZE) * 8, 0)
        if value == 0:   # reserved by a push still writing: taken next time
            break
        out[n] = value - 1
        n += 1
        tail += 1
    _atomic("xchg", entry_address + TAIL * 8, tail)
    overflow = _atomic("xchg", entry_address + OVERFLOW * 8, -1)
    return n, overflow


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
        nothing (ops then fail naming the table as released). The caller keeps ``storage``
        alive while ops may read it and publishes its replacement before dropping it."""
        entry = _REGISTRY[self.slot]
        if storage is None:
            entry[STORAGE] = 0
        else:
            if storage.dtype != np.float32 or storage.ndim != 2 or \
                    not storage.flags.c_contiguous:
                raise ValueError(f"Table `{self.name}`: a registered storage must be a "
                                 f"C-contiguous float32 matrix; got {storage.dtype} "
                                 f"{storage.shape}")
            entry[ROWS], entry[WIDTH] = storage.shape
            entry[STORAGE] = storage.ctypes.data
        self._storage = storage

    def take_released(self) -> tuple[np.ndarray, int]:
        """The batches ops released since the last call: (int64 sequence numbers in release
        order, the newest sequence number a full queue could not hold or -1). Call from one
        thread at a time (the key processor's lock)."""
        n, overflow = _take_released(self.slot, self._taken)
        return self._taken[:n].copy(), int(overflow)

    def has_released(self) -> bool:
        """Whether :meth:`take_released` has anything to return (a cheap check)."""
        entry = _REGISTRY[self.slot]
        return bool(entry[HEAD] != entry[TAIL] or entry[OVERFLOW] >= 0)

    def close(self) -> None:
        """Frees the entry: its token no longer names anything."""
        self._storage = None
        self._finalizer()


def _free_slot(slot: int, queue: np.ndarray) -> None:
    # ``queue`` is held until here: the entry's queue address stays valid while it is live.
    _REGISTRY[slot] = 0
    with _lock:
        _free.append(slot)
    del queue
