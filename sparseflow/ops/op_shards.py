"""How many compiled ops a batch's tables are split over: each op runs on one of
TensorFlow's inter-op threads, so the shards of one step's gather, gradient sum and update run
side by side instead of one op reading every table on one core (e2e Session step, 4
interleaved rounds: 41.0 -> 38.4 ms median, docs/design-notes.md)."""

from __future__ import annotations

import os

# At most this many ops: more than the cores only add their per-op cost.
MAX_OP_SHARDS = 4


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity: one block of them under
    ``sparseflow launch``)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def op_shards(weights: list, cpus: int | None = None) -> list[range]:
    """Splits members (tables, in order) into contiguous runs of about equal total weight,
    one compiled op each: as many runs as this process may use CPUs (its affinity; at most
    :data:`MAX_OP_SHARDS`, at most one per member).

    Args:
      weights: per member, a positive cost (its features, say).
      cpus: the CPUs to spread over (default: :func:`available_cpus`).

    Returns:
      ``[range]``: the members of each op, in order, covering ``range(len(weights))``.
    """
    if cpus is None:
        cpus = available_cpus()
    n = max(1, min(cpus, MAX_OP_SHARDS, len(weights)))
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    # Cut k ends where the running total comes nearest k n-ths of the total, each run keeping
    # at least one member.
    cuts = [0]
    for k in range(1, n):
        target = prefix[-1] * k / n
        candidates = range(cuts[-1] + 1, len(weights) - (n - k) + 1)
        cuts.append(min(candidates, key=lambda j: abs(prefix[j] - target)))
    cuts.append(len(weights))
    return [range(a, b) for a, b in zip(cuts, cuts[1:])]
