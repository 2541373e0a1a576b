"""How many compiled ops a batch's tables are split over: each op runs on one of
TensorFlow's inter-op threads, so the shards of one step's gather, gradient sum and update run
side by side instead of one op reading every table on one core (e2e Session step, 4
interleaved rounds: 41.0 -> 38.4 ms median, docs/design-notes.md)."""

from __future__ import annotations

from sparseflow.distributed.cluster import usable_cpus

# At most this many ops: more than the cores only add their per-op cost.
MAX_OP_SHARDS = 4


def available_cpus() -> int:
    """How many CPUs this process may run on (``cluster.usable_cpus``)."""
    return len(usable_cpus())


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


def width_shards(dims: list[int], weights: list) -> list[tuple[int, list[int]]]:
    """Members (tables) by width, each width's split over ops (:func:`op_shards`): one op
    reads, sums or updates one width.

    Args:
      dims: per member, its embedding width.
      weights: per member, a positive cost (its features, say).

    Returns:
      ``[(dim, member indices)]``: one entry per op, widths ascending, members in order.
    """
    out = []
    for dim in sorted(set(dims)):
        same = [i for i, d in enumerate(dims) if d == dim]
        out.extend((dim, [same[i] for i in run])
                   for run in op_shards([weights[i] for i in same]))
    return out
