"""Rec SDK ``mx_rec.util.communication.hccl_ops``: rank id and rank size.

Every rank question of the facade (these functions, ``mx_rec.util.initialize.get_rank_id``,
the collectives of ``mx_rec.util.tf_version_adapter.hccl_ops``) goes through :func:`world`,
so that the multi-process facade plugs in here: it will answer from sparseflow's worker
(``TF_CONFIG`` / ``MultiWorkerMirroredStrategy``) and map the collectives onto TF's
collective ops. Today the facade trains in one process: rank 0 of 1. Unlike Rec SDK, these
work before ``init()`` (Rec SDK scripts call them while importing their config).
"""

from __future__ import annotations

__all__ = ["get_local_rank_size", "get_rank_id", "get_rank_size", "world"]


def world() -> tuple[int, int]:
    """This process's ``(rank_id, rank_size)``.

    Returns:
      ``(0, 1)``: the facade runs one process.

    Raises:
      NotImplementedError: the process was started as one of several ranks (mpirun,
        horovodrun, an MPI launcher, Rec SDK's rank table or TF_CONFIG: see
        ``sparseflow/distributed/ranks.py``). Each rank would train its own copy of the
        tables and none would see the others' gradients; the facade does not run several
        ranks yet.
    """
    from sparseflow.distributed.ranks import detect
    ranks = detect()
    if ranks.size > 1:
        raise NotImplementedError(
            f"This process was launched as rank {ranks.rank} of {ranks.size} "
            f"({ranks.source}), and the mx_rec facade runs one process (rank 0 of 1). Run the "
            f"script with `python` alone, or use sparseflow's multi-worker training "
            f"(docs/multi-worker.md).")
    return 0, 1


def get_rank_id() -> int:
    """This process's rank, in ``[0, get_rank_size())``: 0 in one process."""
    return world()[0]


def get_rank_size() -> int:
    """The number of ranks training together: 1 in one process."""
    return world()[1]


def get_local_rank_size() -> int:
    """The number of ranks on this machine: 1 in one process."""
    return world()[1]
