"""Open-addressing int64 → row index over plain numpy arrays.

Layout (one 16-byte record per slot, exposed as three strided views):

    keys   int64[capacity]   the raw key
    rows   int32[capacity]   EMPTY (-2): free slot; UNADMITTED (-1): counted, owns no row;
                             >= 0: the table row the key owns
    counts int32[capacity]   admission count (saturating)

16 bytes per slot; at the default maximum load of 0.75 that is at most 21.3 bytes of index per
key, so 10^8 keys fit in 2.1 GB. Any int64 is a valid key: emptiness is marked in ``rows``, not
with a sentinel key. Linear probing over a capacity that need not be a power of two (the home
slot is ``(hash32 * capacity) >> 32``, Lemire's multiply-shift), deletion by backward shifting
so that no tombstones accumulate under eviction.

Kernels are pure functions over the arrays; :class:`HashIndex` is the thin stateful wrapper
that sizes and grows them.
"""

from __future__ import annotations

import numba
import numpy as np

EMPTY = np.int32(-2)
UNADMITTED = np.int32(-1)
MAX_LOAD = 0.75
MAX_CAPACITY = 2**32 - 1  # multiply-shift homing needs capacity < 2^32
COUNT_MAX = np.int32(2**31 - 1)

_JIT = dict(nogil=True, cache=True, error_model="numpy", boundscheck=False)


@numba.njit(**_JIT)
def mix64(key):
    """murmur3's 64-bit finaliser: a bijection on 64 bits with full avalanche."""
    h = np.uint64(key)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xC4CEB9FE1A85EC53)
    h ^= h >> np.uint64(33)
    return h


@numba.njit(**_JIT)
def home_slot(key, capacity):
    return np.int64(((mix64(key) >> np.uint64(32)) * np.uint64(capacity)) >> np.uint64(32))


@numba.njit(**_JIT)
def find_slot(keys, rows, key):
    """Slot holding ``key``, or -1."""
    capacity = keys.shape[0]
    i = home_slot(key, capacity)
    while True:
        r = rows[i]
        if r == EMPTY:
            return np.int64(-1)
        if keys[i] == key:
            return i
        i += 1
        if i == capacity:
            i = 0


@numba.njit(**_JIT)
def find_or_empty_slot(keys, rows, key):
    """Slot holding ``key``, else the empty slot where it would be inserted."""
    capacity = keys.shape[0]
    i = home_slot(key, capacity)
    while True:
        if rows[i] == EMPTY or keys[i] == key:
            return i
        i += 1
        if i == capacity:
            i = 0


@numba.njit(**_JIT)
def lookup_rows(keys, rows, query, out):
    """out[i] = row of query[i], or -1 when absent or not admitted."""
    for i in range(query.shape[0]):
        s = find_slot(keys, rows, query[i])
        out[i] = rows[s] if s >= 0 and rows[s] >= 0 else -1


@numba.njit(**_JIT)
def insert_entries(keys, rows, counts, new_keys, new_rows, new_counts):
    """Inserts or overwrites entries; returns how many keys were new."""
    added = 0
    for i in range(new_keys.shape[0]):
        s = find_or_empty_slot(keys, rows, new_keys[i])
        if rows[s] == EMPTY:
            added += 1
        keys[s] = new_keys[i]
        rows[s] = new_rows[i]
        counts[s] = new_counts[i]
    return added


@numba.njit(**_JIT)
def delete_slot(keys, rows, counts, slot):
    """Empties ``slot`` and shifts later entries of its probe run back (no tombstones)."""
    capacity = keys.shape[0]
    i = slot
    j = slot
    while True:
        j += 1
        if j == capacity:
            j = 0
        if rows[j] == EMPTY:
            break
        k = home_slot(keys[j], capacity)
        # The entry at j may move to i only if its home is not cyclically within (i, j].
        if i <= j:
            stays = i < k <= j
        else:
            stays = k > i or k <= j
        if stays:
            continue
        keys[i] = keys[j]
        rows[i] = rows[j]
        counts[i] = counts[j]
        i = j
    rows[i] = EMPTY


@numba.njit(**_JIT)
def delete_keys(keys, rows, counts, query, out_rows):
    """Removes each key of ``query``; out_rows[i] = the row it owned (-1 if none or absent).

    Returns how many keys were present.
    """
    removed = 0
    for i in range(query.shape[0]):
        s = find_slot(keys, rows, query[i])
        if s < 0:
            out_rows[i] = -1
            continue
        out_rows[i] = rows[s]
        delete_slot(keys, rows, counts, s)
        removed += 1
    return removed


@numba.njit(**_JIT)
def rehash(old_keys, old_rows, old_counts, keys, rows, counts):
    """Moves every entry of the old arrays into the new (empty) ones."""
    for s in range(old_keys.shape[0]):
        if old_rows[s] != EMPTY:
            t = find_or_empty_slot(keys, rows, old_keys[s])
            keys[t] = old_keys[s]
            rows[t] = old_rows[s]
            counts[t] = old_counts[s]


@numba.njit(**_JIT)
def collect_entries(keys, rows, counts, admitted_only):
    """All entries as (keys, rows, counts) arrays, in slot order."""
    n = 0
    for s in range(keys.shape[0]):
        if rows[s] != EMPTY and (rows[s] >= 0 or not admitted_only):
            n += 1
    out_k = np.empty(n, np.int64)
    out_r = np.empty(n, np.int32)
    out_c = np.empty(n, np.int32)
    j = 0
    for s in range(keys.shape[0]):
        if rows[s] != EMPTY and (rows[s] >= 0 or not admitted_only):
            out_k[j] = keys[s]
            out_r[j] = rows[s]
            out_c[j] = counts[s]
            j += 1
    return out_k, out_r, out_c


def slots_for(n_keys: int, max_load: float = MAX_LOAD) -> int:
    """Slot count that holds ``n_keys`` at or under ``max_load`` (at least 8; one spare slot
    guards against float rounding at the limit)."""
    return max(8, int(np.ceil(n_keys / max_load)) + 1)


class HashIndex:
    """A growable int64 key → (row, count) index; the arrays are public for the kernels.

    Not thread-safe: its owner (the key processor) serialises access.
    """

    def __init__(self, expected_keys: int = 1024, max_load: float = MAX_LOAD):
        """Sizes the index for ``expected_keys`` keys at ``max_load``.

        Raises:
          ValueError: ``expected_keys`` < 0, ``max_load`` not in (0, 0.95], or too many slots.
        """
        if expected_keys < 0:
            raise ValueError(f"Argument `expected_keys` must be >= 0. Received: {expected_keys!r}")
        if not 0.0 < max_load <= 0.95:
            raise ValueError(f"Argument `max_load` must be in (0, 0.95]. Received: {max_load!r}")
        slots = slots_for(expected_keys, max_load)
        if slots > MAX_CAPACITY:
            raise ValueError(f"Argument `expected_keys` needs {slots} slots at max_load "
                             f"{max_load}, more than the maximum of {MAX_CAPACITY}. "
                             f"Received: {expected_keys!r}")
        self.max_load = max_load
        self.size = 0
        self._allocate(slots)

    def _allocate(self, capacity: int) -> None:
        if capacity > MAX_CAPACITY:
            raise ValueError(f"A hash index of {capacity} slots exceeds the maximum of "
                             f"{MAX_CAPACITY}.")
        # One 16-byte record per slot — [key int64 | count int32 | row int32] — so a probe
        # touches one cache line; keys, counts and rows are strided views into it, which keeps
        # the kernels' (keys, rows, counts) signature.
        self._slots = np.zeros((capacity, 2), np.int64)
        words = self._slots.view(np.int32)
        self.keys = self._slots[:, 0]
        self.counts = words[:, 2]
        self.rows = words[:, 3]
        self.rows[:] = EMPTY

    @property
    def capacity(self) -> int:
        """Number of slots."""
        return self.keys.shape[0]

    @property
    def nbytes(self) -> int:
        """Bytes held by the index arrays."""
        return self._slots.nbytes

    @property
    def room(self) -> int:
        """Keys the index holds under its load limit (:meth:`reserve` grows it past)."""
        return int(self.max_load * self.capacity)

    def reserve(self, extra: int, max_keys: int | None = None) -> None:
        """Grows so that ``extra`` more keys fit under the load limit.

        Args:
          extra: keys that may be added (an upper bound: some may already be present).
          max_keys: the most keys this index will ever hold, if known; growth stops at the size
            that holds them, so a presized table keeps its bytes per key.
        """
        needed = self.size + extra
        if max_keys is not None:
            needed = min(needed, max_keys)
        if needed <= self.max_load * self.capacity:
            return
        # 1.5x rather than 2x: less memory overshoot for tables of 10^8 keys.
        capacity = max(slots_for(needed, self.max_load), int(self.capacity * 1.5))
        if max_keys is not None:
            capacity = min(capacity, max(slots_for(max_keys, self.max_load), self.capacity))
        old = (self.keys, self.rows, self.counts)
        self._allocate(min(capacity, MAX_CAPACITY))
        rehash(*old, self.keys, self.rows, self.counts)

    def lookup(self, query: np.ndarray) -> np.ndarray:
        """Rows of ``query`` keys (int32, -1 for absent or not admitted)."""
        query = np.ascontiguousarray(query, np.int64)
        out = np.empty(query.shape[0], np.int32)
        lookup_rows(self.keys, self.rows, query, out)
        return out

    def insert(self, keys: np.ndarray, rows: np.ndarray, counts: np.ndarray | None = None) -> None:
        """Inserts or overwrites ``keys`` with their ``rows`` and ``counts`` (default 0)."""
        keys = np.ascontiguousarray(keys, np.int64)
        rows = np.ascontiguousarray(rows, np.int32)
        counts = (np.zeros(keys.shape[0], np.int32) if counts is None
                  else np.ascontiguousarray(counts, np.int32))
        if not keys.shape == rows.shape == counts.shape:
            raise ValueError(f"keys, rows and counts must have one shape. Received: "
                             f"{keys.shape}, {rows.shape}, {counts.shape}")
        if rows.shape[0] and rows.min() < UNADMITTED:
            raise ValueError(f"Argument `rows` must hold rows >= 0 or -1 (counted, no row). "
                             f"Received: {int(rows.min())}")
        self.reserve(keys.shape[0])
        self.size += insert_entries(self.keys, self.rows, self.counts, keys, rows, counts)

    def delete(self, keys: np.ndarray) -> np.ndarray:
        """Removes ``keys``; returns the rows they owned (-1 where none)."""
        keys = np.ascontiguousarray(keys, np.int64)
        out = np.empty(keys.shape[0], np.int32)
        self.size -= delete_keys(self.keys, self.rows, self.counts, keys, out)
        return out

    def entries(self, admitted_only: bool = False):
        """(keys int64, rows int32, counts int32) of every entry, in slot order."""
        return collect_entries(self.keys, self.rows, self.counts, admitted_only)
