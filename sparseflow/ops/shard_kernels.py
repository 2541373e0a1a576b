"""Numba kernels of multi-worker sharding: which worker owns a key, and the per-owner buckets
a worker sends its batch's unique keys in (``sparseflow/distributed/sharding.py``)."""

from __future__ import annotations

import numba
import numpy as np

from sparseflow.ops.hash_index import mix64

_JIT = dict(nogil=True, cache=True, error_model="numpy", boundscheck=False)


@numba.njit(**_JIT)
def owners_of(keys, world, mixed, out):
    """out[i] = the worker owning keys[i]: ``key mod world`` (non-negative for negative keys,
    Rec SDK's rule), or ``mix64(key) mod world`` when ``mixed`` (for keys whose low bits are
    skewed, e.g. multiples of the world size)."""
    w = np.int64(world)
    for i in range(keys.shape[0]):
        k = keys[i]
        if mixed:
            out[i] = np.int32(mix64(k) % np.uint64(world))
        else:
            r = k % w
            out[i] = np.int32(r + w if r < 0 else r)


@numba.njit(**_JIT)
def bucket_positions(owners, world, width, counts, positions):
    """A stable counting sort by owner: ``counts[w]`` keys go to worker w, and key i lands at
    ``positions[i] = owner * width + its rank among that owner's keys`` of a ``[world,
    width]`` send buffer. Returns False (leaving ``positions`` partial) when an owner gets more
    than ``width`` keys."""
    for w in range(world):
        counts[w] = 0
    for i in range(owners.shape[0]):
        o = owners[i]
        if counts[o] >= width:
            return False
        positions[i] = o * width + counts[o]
        counts[o] += 1
    return True
