"""Key ownership across N workers, per-owner send buffers, and checkpoint re-bucketing.

Worker r owns the keys with ``key mod N == r`` (Rec SDK's rule; ``hash="mix"`` mixes the key
first, for keys whose low bits are skewed). Per step each worker buckets its batch's unique
keys by owner into a ``[N, send_count]`` buffer, padded, for an all-to-all: row r goes to
worker r. ``send_count`` is Rec SDK's: the most keys a worker sends one owner per step;
without it (``use_dynamic``) the width is the largest bucket of the step.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sparseflow.checkpoint.table_state import TableState, NO_CLOCK
from sparseflow.ops import shard_kernels
from sparseflow.pipeline.key_processor import SendCountOverflowError
from sparseflow.validation import INT32_MAX, check_int, check_one_of

HASHES = ("mod", "mix")
PAD_KEY = np.int64(-1)   # fills unused slots of a send buffer; counts say which are real


def owner_of(keys: np.ndarray, world_size: int, hash: str = "mod") -> np.ndarray:
    """The worker owning each key.

    Args:
      keys: int64 ``[n]``.
      world_size: workers, in [1, 2^31-1].
      hash: ``mod`` (``key mod world_size``, non-negative) or ``mix`` (of the mixed key).

    Returns:
      int32 ``[n]`` in ``[0, world_size)``.

    Raises:
      ValueError: ``world_size`` or ``hash`` out of range.
    """
    world_size = check_int("world_size", world_size, 1, INT32_MAX)
    check_one_of("hash", hash, HASHES)
    keys = np.ascontiguousarray(keys, np.int64)
    out = np.empty(keys.shape[0], np.int32)
    shard_kernels.owners_of(keys, world_size, hash == "mix", out)
    return out


@dataclasses.dataclass(frozen=True)
class Buckets:
    """A batch's unique keys bucketed by owner.

    Attributes:
      send: int64 ``[world_size, width]``: row r holds the keys worker r owns, padded with
        ``PAD_KEY``.
      counts: int32 ``[world_size]``: real keys per row.
      positions: int64 ``[U]``: where each unique key sits in ``send`` flattened (to read its
        embedding back from the ``[world_size, width, dim]`` reply).
    """

    send: np.ndarray
    counts: np.ndarray
    positions: np.ndarray

    @property
    def width(self) -> int:
        """Keys per owner row (``send_count``, or the largest bucket)."""
        return self.send.shape[1]


def bucket_keys(unique_keys: np.ndarray, world_size: int, send_count: int | None = None,
                hash: str = "mod") -> Buckets:
    """Buckets a batch's unique keys by owner for an all-to-all.

    Args:
      unique_keys: int64 ``[U]``, distinct.
      world_size: workers.
      send_count: the buffer's width (Rec SDK's ``send_count``); None (``use_dynamic``): the
        largest bucket of this batch.
      hash: the owner rule (:func:`owner_of`).

    Returns:
      :class:`Buckets`.

    Raises:
      SendCountOverflowError: an owner gets more than ``send_count`` keys (names the value to
        set).
      ValueError: an argument out of range.
    """
    owners = owner_of(unique_keys, world_size, hash)
    keys = np.ascontiguousarray(unique_keys, np.int64)
    counts = np.bincount(owners, minlength=world_size).astype(np.int32)
    most = int(counts.max()) if counts.size else 0
    if send_count is None:
        width = max(most, 1)
    else:
        width = check_int("send_count", send_count, 1, INT32_MAX)
        if most > width:
            raise SendCountOverflowError(
                f"A batch sends {most} unique keys to worker {int(counts.argmax())} of "
                f"{world_size}, more than send_count={width}. Set `send_count` to at least "
                f"{most}, or use init(use_dynamic=True).")
    positions = np.empty(keys.shape[0], np.int64)
    shard_kernels.bucket_positions(owners, world_size, width, np.zeros(world_size, np.int32),
                                   positions)
    send = np.full(world_size * width, PAD_KEY, np.int64)
    send[positions] = keys
    return Buckets(send.reshape(world_size, width), counts, positions)


def rebucket(states: list[TableState], world_size: int, hash: str = "mod") -> list[TableState]:
    """A table's per-worker states (a checkpoint saved by ``len(states)`` workers) split
    for ``world_size`` workers: every key goes to its new owner with its row, counts and
    last-seen time; keys counted but not admitted likewise; the clock is the latest of all;
    admission sketches are joined and copied to every new worker.

    Args:
      states: one :class:`TableState` per old worker (the same slot layout).
      world_size: the new number of workers.
      hash: the owner rule.

    Returns:
      ``world_size`` states, worker r's holding exactly the keys r owns.

    Raises:
      ValueError: no states, different slot layouts, or a key held by two old workers.
    """
    if not states:
        raise ValueError("Argument `states` must hold one TableState per old worker; "
                         "received none.")
    slots = {tuple(s.slot_names) for s in states}
    if len(slots) > 1:
        raise ValueError(f"Argument `states` mixes optimizer slot layouts: {sorted(slots)}.")

    def cat(field):
        return np.concatenate([getattr(s, field) for s in states])

    keys, counted = cat("keys"), cat("counted_keys")
    if np.unique(keys).shape[0] != keys.shape[0]:
        raise ValueError("Argument `states` holds a key on two workers: a table shard owns "
                         "each key once.")
    values, counts, last_seen = cat("values"), cat("counts"), cat("last_seen")
    counted_counts = cat("counted_counts")
    owners, counted_owners = owner_of(keys, world_size, hash), owner_of(counted, world_size,
                                                                       hash)
    clocks = [s.clock for s in states if s.clock != NO_CLOCK]
    clock = max(clocks) if clocks else NO_CLOCK
    steps = max(s.optimizer_steps for s in states)
    sketch = _joined_sketch(states)
    out = []
    for r in range(world_size):
        mine, theirs = owners == r, counted_owners == r
        out.append(TableState(keys=keys[mine], counts=counts[mine],
                              last_seen=last_seen[mine], values=values[mine],
                              slot_names=states[0].slot_names, counted_keys=counted[theirs],
                              counted_counts=counted_counts[theirs], clock=clock,
                              optimizer_steps=steps,
                              sketch=sketch.copy() if sketch is not None else None))
    return out


def _joined_sketch(states: list[TableState]):
    """The old workers' admission sketches joined (``CountMinSketch.merge``), for every new
    worker: a sketch cannot be split by key, so each gets one that counts every key at
    least as often as its old owner did. None when no state has a sketch."""
    sketches = [s.sketch for s in states if s.sketch is not None]
    if not sketches:
        return None
    joined = sketches[0].copy()
    for other in sketches[1:]:
        joined.merge(other)
    return joined
