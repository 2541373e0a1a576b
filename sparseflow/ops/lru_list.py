"""The fast tier's slots in least-recently-used order: a doubly linked list in two int32
arrays, so that choosing a batch's victims walks from the oldest slot and stops once it has
them, instead of passing over every slot (``tier_kernels.select_victims``: ~0.09 ms a batch
and table at 23,000 slots, ~4 ms at a million, ~26 ms at ten million).

The list holds exactly the slots that hold a row, in the order of their LRU stamps: the
cache stamps each slot it touches with the next tick of its clock (a batch's slots in batch
order) and appends it to the list in that order. So the walk meets the slots in the order
``select_victims`` ranks them by their stamps, and picks the same victims. (Stamps shared by a
batch's slots, ties by slot, would need a sort of the batch's slots at every touch: 33 us
for 1,500 slots, against 5 us for relinking them.)

Layout: ``nxt`` and ``prv`` have one entry per slot plus a sentinel at index ``slots`` (the
list's head is ``nxt[slots]``, its tail ``prv[slots]``); a slot outside the list has
``prv == -1``.
"""

from __future__ import annotations

import numba
import numpy as np

_JIT = dict(nogil=True, cache=True, error_model="numpy", boundscheck=False)
_MOVING = -2   # prv of a slot being moved by touch (-1: not in the list)


def empty(slots: int) -> tuple[np.ndarray, np.ndarray]:
    """``(nxt, prv)`` of an empty list over ``slots`` slots."""
    nxt = np.full(slots + 1, -1, np.int32)
    prv = np.full(slots + 1, -1, np.int32)
    clear(nxt, prv)
    return nxt, prv


@numba.njit(**_JIT)
def clear(nxt, prv):
    """Empties the list (every slot out of it)."""
    sentinel = nxt.shape[0] - 1
    for s in range(sentinel):
        nxt[s] = -1
        prv[s] = -1
    nxt[sentinel] = sentinel
    prv[sentinel] = sentinel


@numba.njit(**_JIT)
def _unlink(nxt, prv, s):
    if prv[s] < 0:
        return
    before, after = prv[s], nxt[s]
    nxt[before] = after
    prv[after] = before
    nxt[s] = -1
    prv[s] = -1


@numba.njit(**_JIT)
def touch(nxt, prv, slots):
    """Moves ``slots`` (int32; -1 entries skipped), just stamped in this order with stamps
    newer than any in the list, to its newest end in that order; slots not yet in the list
    join it there. A slot given twice moves once, at its first place."""
    sentinel = nxt.shape[0] - 1
    # Unlinked all first (their own links left for the chain to overwrite), then chained:
    # each loop's accesses are independent of the last iteration's, where unlinking and
    # appending slot by slot carried the tail through every iteration, and resetting a
    # slot's links on unlinking made each iteration wait on the stores before it (~4x
    # slower: 22 against 5.4 us for 1,500 slots in a tier of 23,000).
    # A slot given twice moves once, at its first place (``_MOVING`` marks it between the
    # loops): repeated slots must not break the list, whose walk would then never end.
    for i in range(slots.shape[0]):
        s = slots[i]
        if s < 0 or prv[s] == _MOVING:
            continue
        if prv[s] >= 0:   # out of the list (its own links are rewritten below)
            before, after = prv[s], nxt[s]
            nxt[before] = after
            prv[after] = before
        prv[s] = _MOVING
    tail = prv[sentinel]
    for i in range(slots.shape[0]):
        s = slots[i]
        if s < 0 or prv[s] != _MOVING:
            continue
        nxt[tail] = s
        prv[s] = tail
        tail = s
    nxt[tail] = sentinel
    prv[sentinel] = tail


@numba.njit(**_JIT)
def unlink(nxt, prv, slots):
    """Takes ``slots`` (int32, freed) out of the list."""
    for i in range(slots.shape[0]):
        _unlink(nxt, prv, slots[i])


@numba.njit(**_JIT)
def victims(nxt, prv, pins, marks, resident, n, enough, out):
    """The ``n`` slots a batch may empty first, oldest first: the list's slots that no batch
    pins (``pins == 0``) and that are not among ``resident`` (the batch's own).

    Args:
      nxt, prv: the list.
      pins: int32 per slot, batches holding it.
      marks: bool per slot, all False: scratch (as ``select_victims``'); all False again on
        return.
      resident: int32 slots the batch keeps (values outside ``[0, slots)`` are ignored).
      n: victims wanted, >= 0.
      enough: count eligible slots up to at least this many (a caller that only asks
        whether there is room for that many).
      out: int32 ``[>= n]``; receives ``min(n, eligible)`` victims.

    Returns:
      How many slots may be emptied, counted up to ``max(n, enough)``: exact when fewer;
      -1 if the walk passed more slots than there are (a broken list: it stops instead of
      going round forever, nogil, under the cache's lock).
    """
    sentinel = nxt.shape[0] - 1
    for i in range(resident.shape[0]):
        s = resident[i]
        if 0 <= s < sentinel:
            marks[s] = True
    limit = max(n, enough)
    eligible = 0
    walked = 0
    s = nxt[sentinel]
    while s != sentinel and eligible < limit:
        walked += 1
        if walked > sentinel or s < 0:
            eligible = -1
            break
        if pins[s] == 0 and not marks[s]:
            if eligible < n:
                out[eligible] = s
            eligible += 1
        s = nxt[s]
    for i in range(resident.shape[0]):
        s = resident[i]
        if 0 <= s < sentinel:
            marks[s] = False
    return eligible
