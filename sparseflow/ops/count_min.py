"""Fixed-memory admission counting: a count-min sketch with conservative update.

Feature admission gives a key a table row once it has been seen ``access_threshold`` times.
Counting every not-yet-admitted key exactly lets a flood of one-off keys grow memory without
bound; this sketch counts them in a fixed block of memory instead, at the price of estimates
that may over-count (never under-count).

Layout::

    counters  uint32[depth, width]   saturating at 2^32 - 1
    seeds     uint64[depth]          one hash seed per row, derived from ``seed``

Row ``r`` counts key ``k`` in column ``((mix64(k ^ seeds[r]) >> 32) * width) >> 32`` (the
multiply-shift of ``hash_index``), so each key touches one counter per row. Its estimate is the
minimum of those ``depth`` counters. Adding weight ``w`` uses the *conservative update*: the
new estimate is ``min_r counter_r + w`` and each of the key's counters is raised to at least
that, never more — counters only grow where needed, so every counter (and so every estimate)
is at most what the plain update (``counter_r += w`` in every row) would hold.

Memory: ``4 * width * depth`` bytes (plus ``8 * depth`` for the seeds), fixed at construction;
``add`` and ``estimate`` allocate only their output array. The default 2^20 x 4 takes 16 MiB.

Accuracy: let ``total`` be the sum of all weights added since the last :meth:`clear`. Every
estimate is >= the key's true count, and with probability >= ``1 - exp(-depth)`` per key

    estimate - true count <= (e / width) * total                        (error_bound)

(Markov in each row: the expected over-count in one row is at most ``total / width``, so it
exceeds ``e`` times that with probability <= 1/e, and the ``depth`` rows hash independently.)

What that costs in admissions: a key with true count ``c < threshold`` is admitted early when
``c + over-count >= threshold``. By the same argument, for ``x = threshold - c``

    P(false admission) <= (total / (width * x)) ** depth   when total < width * x
                                                          (false_admission_bound)

Rule of thumb: choose ``width`` so that ``e * total / width`` is well below 1. A flood of one-off
keys between clears (or evictions) is the bulk of ``total``; ``width >= 3 * (expected one-off
keys between clears)`` keeps the expected over-count per row under 1/3 and the high-probability
bound ``e * total / width`` under 1, so a key one short of the threshold (x = 1) is admitted
early with probability <= 3^-depth (1.2 % at depth 4), and one two short with <= 6^-depth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numba
import numpy as np

from sparseflow import validation
from sparseflow.ops.hash_index import mix64
from sparseflow.ops.prefetch import prefetch_for_write

_JIT = dict(nogil=True, cache=True, error_model="numpy", boundscheck=False)

COUNTER_MAX = np.uint32(2**32 - 1)
MIN_WIDTH = 16
MAX_WIDTH = 2**31
MAX_DEPTH = 16
MAX_SEED = 2**63 - 1

# Keys ahead whose counters cms_add / cms_estimate prefetch (the default sketch, 16 MiB, is
# larger than L2; each key costs ``depth`` independent misses).
PREFETCH_AHEAD = 8

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_ROW_STEP = np.uint64(0xD6E8FEB86659FD93)
_COUNTER_MAX_I64 = np.int64(2**32 - 1)
_INT64_MAX = np.int64(2**63 - 1)


@numba.njit(**_JIT)
def cms_column(seed, key, width):
    """Column in [0, width) of ``key`` in the row hashed with ``seed`` (uint64)."""
    h = mix64(np.uint64(key) ^ seed)
    return np.int64(((h >> np.uint64(32)) * np.uint64(width)) >> np.uint64(32))


@numba.njit(**_JIT)
def cms_row_seeds(seed, depth, out):
    """out[r] = the hash seed of row r (uint64[depth]), a function of ``seed`` (int64 >= 0)."""
    base = mix64(np.uint64(seed) * _GOLDEN)
    for r in range(depth):
        out[r] = mix64(base + np.uint64(r + 1) * _ROW_STEP)


@numba.njit(**_JIT)
def stage_columns(counters, seeds, key, ring, slot):
    """Writes the columns of ``key`` to ``ring[slot]`` and prefetches its counters."""
    width = counters.shape[1]
    for r in range(counters.shape[0]):
        col = cms_column(seeds[r], key, width)
        ring[slot, r] = col
        prefetch_for_write(counters, (r, col))


@numba.njit(**_JIT)
def cms_add(counters, seeds, keys, weights, out):
    """Conservative update of ``counters`` with ``weights[i]`` for ``keys[i]``, in order.

    For each key: ``new = min(min_r counters[r, col_r] + w, 2^32 - 1)``; then every
    ``counters[r, col_r] = max(counters[r, col_r], new)``. A key repeated within the call is
    simply counted again (out[i] is its estimate after the i-th entry).

    Args:
      counters: uint32[depth, width], C-contiguous; updated in place.
      seeds: uint64[depth], the row seeds (:func:`cms_row_seeds`).
      keys: int64[N].
      weights: int64[N], each >= 0 (not checked here).
      out: int64[N] out, the estimate of each key after its update.

    Returns:
      The sum of ``weights`` (int64), or -1 if that sum overflows int64.
    """
    depth = counters.shape[0]
    return _add(counters, seeds, keys, weights, out, np.empty((0, depth), np.int64),
                np.empty((0, depth), np.uint32), False)


@numba.njit(**_JIT)
def cms_add_logged(counters, seeds, keys, weights, out, cols, old):
    """:func:`cms_add` that also writes what :func:`cms_undo` needs to take it back.

    Args:
      counters, seeds, keys, weights, out: as for :func:`cms_add`.
      cols: int64[N, depth] out: the column of ``keys[i]`` in each row.
      old: uint32[N, depth] out: those counters just before ``keys[i]`` was added.

    Returns:
      As :func:`cms_add`.
    """
    return _add(counters, seeds, keys, weights, out, cols, old, True)


@numba.njit(**_JIT)
def _add(counters, seeds, keys, weights, out, cols, old, log):
    depth = counters.shape[0]
    n = keys.shape[0]
    # Columns of the next PREFETCH_AHEAD keys, hashed once and prefetched PREFETCH_AHEAD keys
    # early so that their misses overlap (a fixed 8 * depth * PREFETCH_AHEAD bytes per call).
    ring = np.empty((PREFETCH_AHEAD, depth), np.int64)
    for i in range(min(n, PREFETCH_AHEAD)):
        stage_columns(counters, seeds, keys[i], ring, i)
    total = np.int64(0)
    for i in range(n):
        slot = i % PREFETCH_AHEAD
        w = weights[i]
        total = -1 if total < 0 or w > _INT64_MAX - total else total + w
        low = _COUNTER_MAX_I64
        for r in range(depth):
            c = np.int64(counters[r, ring[slot, r]])
            if c < low:
                low = c
        if log:
            for r in range(depth):
                cols[i, r] = ring[slot, r]
                old[i, r] = counters[r, ring[slot, r]]
        # Saturate without overflowing int64 for weights near 2^63.
        new = _COUNTER_MAX_I64 if w >= _COUNTER_MAX_I64 - low else low + w
        # Branch-free max: which rows lag behind is random, so a branch would mispredict.
        for r in range(depth):
            col = ring[slot, r]
            counters[r, col] = np.uint32(max(np.int64(counters[r, col]), new))
        out[i] = new
        if i + PREFETCH_AHEAD < n:
            stage_columns(counters, seeds, keys[i + PREFETCH_AHEAD], ring, slot)
    return total


@numba.njit(**_JIT)
def cms_undo(counters, cols, old):
    """Takes back a :func:`cms_add_logged` call: writes ``old`` back at ``cols``, last key
    first, so that a counter several keys of the call raised gets its value from before the
    first of them. Exact only while no later add is still in ``counters`` (undo last in,
    first out)."""
    for i in range(cols.shape[0] - 1, -1, -1):
        for r in range(cols.shape[1]):
            counters[r, cols[i, r]] = old[i, r]


@numba.njit(**_JIT)
def cms_estimate(counters, seeds, keys, out):
    """out[i] = min over rows of the counter of ``keys[i]`` (int64); read-only.

    Args:
      counters: uint32[depth, width]; seeds: uint64[depth]; keys: int64[N]; out: int64[N].
    """
    depth = counters.shape[0]
    n = keys.shape[0]
    ring = np.empty((PREFETCH_AHEAD, depth), np.int64)
    for i in range(min(n, PREFETCH_AHEAD)):
        stage_columns(counters, seeds, keys[i], ring, i)
    for i in range(n):
        slot = i % PREFETCH_AHEAD
        low = _COUNTER_MAX_I64
        for r in range(depth):
            c = np.int64(counters[r, ring[slot, r]])
            if c < low:
                low = c
        out[i] = low
        if i + PREFETCH_AHEAD < n:
            stage_columns(counters, seeds, keys[i + PREFETCH_AHEAD], ring, slot)


def _check_int64_vector(argument: str, keys) -> np.ndarray:
    if not isinstance(keys, np.ndarray) or keys.dtype != np.int64 or keys.ndim != 1:
        received = keys.dtype if isinstance(keys, np.ndarray) and keys.ndim == 1 else (
            f"{keys.dtype}{list(keys.shape)}" if isinstance(keys, np.ndarray) else type(keys))
        validation.fail(argument, "a 1-D int64 numpy array", received, TypeError)
    return np.ascontiguousarray(keys)


@dataclass(frozen=True)
class SketchUndo:
    """What one :meth:`CountMinSketch.add_undoable` call changed: ``keys`` and ``weights``
    (int64 ``[N]``, to add them again), the counters' ``cols`` (int64 ``[N, depth]``) and
    ``old`` values (uint32 ``[N, depth]``), and ``total`` (the weights' sum)."""

    keys: np.ndarray
    weights: np.ndarray
    cols: np.ndarray
    old: np.ndarray
    total: int


class CountMinSketch:
    """Count-min sketch with conservative update over ``uint32[depth, width]`` counters.

    See the module docstring for memory and accuracy. Not thread-safe: one writer at a time.

    Args:
      width: counters per row, an int in [16, 2^31].
      depth: rows (independent hashes), an int in [1, 16].
      seed: an int in [0, 2^63 - 1]; the same seed gives the same hashes and so the same
        estimates for the same sequence of ``add`` calls.

    Raises:
      TypeError: an argument is not an int.
      ValueError: an argument is out of range.

    Example:
      >>> sketch = CountMinSketch(width=1 << 16, depth=4)
      >>> sketch.add(np.array([7, 9], np.int64), np.array([1, 2], np.int64))
      array([1, 2])
      >>> sketch.estimate(np.array([7, 9, 11], np.int64))
      array([1, 2, 0])
    """

    def __init__(self, width: int = 1 << 20, depth: int = 4, seed: int = 0):
        self.width = validation.check_int("width", width, MIN_WIDTH, MAX_WIDTH)
        self.depth = validation.check_int("depth", depth, 1, MAX_DEPTH)
        self.seed = validation.check_int("seed", seed, 0, MAX_SEED)
        self.seeds = np.empty(self.depth, np.uint64)
        cms_row_seeds(np.int64(self.seed), self.depth, self.seeds)
        self.counters = np.zeros((self.depth, self.width), np.uint32)
        self.total = 0  # sum of all weights added since construction or clear()

    def __repr__(self) -> str:
        return (f"CountMinSketch(width={self.width}, depth={self.depth}, seed={self.seed}) "
                f"# {self.nbytes} bytes, total={self.total}")

    @property
    def nbytes(self) -> int:
        """Bytes held by the counters: ``4 * width * depth``; never changes."""
        return self.counters.nbytes

    def add(self, keys: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """Counts ``weights[i]`` more occurrences of ``keys[i]`` (conservative update).

        Args:
          keys: int64[N] (1-D). Meant to be unique within the call; a repeated key is counted
            once per entry, in order.
          weights: int64[N], each >= 0.

        Returns:
          int64[N], the estimate of each key after its update (>= its true count).

        Raises:
          TypeError: ``keys`` or ``weights`` is not a 1-D int64 numpy array.
          ValueError: their lengths differ, or a weight is negative.
        """
        keys, weights = self._checked(keys, weights)
        out = np.empty(keys.shape[0], np.int64)
        added = int(cms_add(self.counters, self.seeds, keys, weights, out))
        # Only weights near 2^63 overflow the kernel's int64 sum; keep `total` exact anyway.
        self.total += added if added >= 0 else sum(int(w) for w in weights)
        return out

    def add_undoable(self, keys: np.ndarray, weights: np.ndarray):
        """:meth:`add`, also returning what :meth:`undo` needs to take it back.

        Args:
          keys, weights: as for :meth:`add`.

        Returns:
          ``(estimates, undo)``: the estimates as :meth:`add` returns them, and a
          :class:`SketchUndo` (``12 * depth`` bytes per key plus the keys and weights).

        Raises:
          TypeError, ValueError: as :meth:`add`.
        """
        keys, weights = self._checked(keys, weights)
        n = keys.shape[0]
        out = np.empty(n, np.int64)
        cols = np.empty((n, self.depth), np.int64)
        old = np.empty((n, self.depth), np.uint32)
        added = int(cms_add_logged(self.counters, self.seeds, keys, weights, out, cols, old))
        total = added if added >= 0 else sum(int(w) for w in weights)
        self.total += total
        return out, SketchUndo(keys.copy(), weights.copy(), cols, old, total)

    def undo(self, change: SketchUndo) -> None:
        """Takes back an :meth:`add_undoable` call. Undo the calls last in, first out: a
        call is undone exactly when every later one has been undone first."""
        cms_undo(self.counters, change.cols, change.old)
        self.total -= change.total

    @classmethod
    def from_counters(cls, counters: np.ndarray, seed: int, total: int) -> "CountMinSketch":
        """A sketch holding ``counters`` (a saved sketch read back).

        Args:
          counters: uint32 ``[depth, width]`` with depth and width as the constructor allows.
          seed: the seed the counters were hashed with.
          total: the sum of the weights they hold, an int >= 0.

        Raises:
          TypeError, ValueError: naming the argument that is not as described.
        """
        if (not isinstance(counters, np.ndarray) or counters.dtype != np.uint32
                or counters.ndim != 2):
            validation.fail("counters", "a uint32 numpy array [depth, width]",
                            getattr(counters, "dtype", type(counters)), TypeError)
        sketch = cls(counters.shape[1], counters.shape[0], seed)
        sketch.counters[...] = counters
        sketch.total = validation.check_int("total", total, 0)
        return sketch

    @property
    def geometry(self) -> tuple[int, int, int]:
        """``(width, depth, seed)``: sketches with the same geometry hash keys alike."""
        return self.width, self.depth, self.seed

    def copy(self) -> "CountMinSketch":
        """An independent sketch with the same geometry, counters and total."""
        other = CountMinSketch(self.width, self.depth, self.seed)
        other.counters[...] = self.counters
        other.total = self.total
        return other

    def load(self, other: "CountMinSketch") -> None:
        """Replaces the counters and total by ``other``'s, in place (a checkpoint restore).

        Raises:
          TypeError: ``other`` is not a CountMinSketch.
          ValueError: ``other`` has another geometry (width, depth, seed).
        """
        self._check_same_geometry(other)
        self.counters[...] = other.counters
        self.total = other.total

    def merge(self, other: "CountMinSketch") -> None:
        """Takes in ``other``'s counts, counter by counter the larger of the two: every
        key's estimate stays >= its estimate in either sketch, so >= its true count in
        whichever counted it. Joins the sketches of keys counted apart (the shards of a
        table, each key counted by its owner alone) without adding up history they share
        (a shard's sketch copied to several workers and joined again). :attr:`total`
        becomes the sum of both, an upper bound.

        Raises:
          TypeError: ``other`` is not a CountMinSketch.
          ValueError: ``other`` has another geometry (width, depth, seed).
        """
        self._check_same_geometry(other)
        np.maximum(self.counters, other.counters, out=self.counters)
        self.total += other.total

    def _check_same_geometry(self, other) -> None:
        if not isinstance(other, CountMinSketch):
            validation.fail("other", "a CountMinSketch", type(other).__name__, TypeError)
        if other.geometry != self.geometry:
            validation.fail("other", f"a sketch of the same (width, depth, seed) "
                            f"{self.geometry}", other.geometry)

    def _checked(self, keys, weights):
        keys = _check_int64_vector("keys", keys)
        weights = _check_int64_vector("weights", weights)
        if weights.shape != keys.shape:
            validation.fail("weights", f"of the length of `keys` ({keys.shape[0]})",
                            weights.shape[0])
        if weights.shape[0] and weights.min() < 0:
            validation.fail("weights", "all >= 0", int(weights.min()))
        return keys, weights

    def estimate(self, keys: np.ndarray) -> np.ndarray:
        """Estimated counts of ``keys`` (read-only).

        Args:
          keys: int64[N] (1-D).

        Returns:
          int64[N]: for each key, >= its true count; 0 for keys never added (up to collisions).

        Raises:
          TypeError: ``keys`` is not a 1-D int64 numpy array.
        """
        keys = _check_int64_vector("keys", keys)
        out = np.empty(keys.shape[0], np.int64)
        cms_estimate(self.counters, self.seeds, keys, out)
        return out

    def error_bound(self, total: int | None = None) -> float:
        """The additive over-count bound ``(e / width) * total``.

        Holds for each key with probability >= ``1 - exp(-depth)``.

        Args:
          total: the sum of weights added, an int >= 0; None for :attr:`total`.

        Returns:
          The bound, a float.

        Raises:
          TypeError, ValueError: ``total`` is not an int >= 0.
        """
        total = self.total if total is None else validation.check_int("total", total, 0)
        return math.e / self.width * total

    def false_admission_bound(self, count: int, threshold: int,
                              total: int | None = None) -> float:
        """Upper bound on P(estimate >= threshold) for a key whose true count is ``count``.

        ``min(1, (total / (width * (threshold - count))) ** depth)``; 0 when ``count >=
        threshold`` is excluded (that key is rightly admitted).

        Args:
          count: the key's true count, an int >= 0 and < ``threshold``.
          threshold: the admission threshold, an int >= 1.
          total: the sum of weights added, an int >= 0; None for :attr:`total`.

        Returns:
          The bound, a float in [0, 1].

        Raises:
          TypeError, ValueError: an argument is not an int in range.
        """
        threshold = validation.check_int("threshold", threshold, 1)
        count = validation.check_int("count", count, 0, threshold - 1)
        total = self.total if total is None else validation.check_int("total", total, 0)
        ratio = total / (self.width * (threshold - count))
        return min(1.0, ratio ** self.depth)

    def clear(self) -> None:
        """Zeroes every counter and :attr:`total`, in place (same arrays, same memory)."""
        self.counters.fill(0)
        self.total = 0
