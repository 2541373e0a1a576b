"""Rec SDK ``mx_rec.util.communication.hccl_ops``: rank id and rank size.

Every rank question of the facade (these functions, ``mx_rec.util.initialize.get_rank_id``,
the collectives of ``mx_rec.util.tf_version_adapter.hccl_ops``) goes through :func:`world`,
which reads the launcher's environment (``sparseflow/distributed/ranks.py``: ``sparseflow
launch``, mpirun, horovodrun, Rec SDK's rank table, ``TF_CONFIG``). Unlike Rec SDK, these
work before ``init()`` (Rec SDK scripts call them while importing their config).
"""

from __future__ import annotations

__all__ = ["get_local_rank_size", "get_rank_id", "get_rank_size", "world"]


def world() -> tuple[int, int]:
    """This process's ``(rank_id, rank_size)``: ``(0, 1)`` when started alone.

    Raises:
      ValueError: the launcher's environment variables are malformed (names them).
    """
    from sparseflow.distributed.ranks import detect
    ranks = detect()
    return ranks.rank, ranks.size


def get_rank_id() -> int:
    """This process's rank, in ``[0, get_rank_size())``: 0 in one process."""
    return world()[0]


def get_rank_size() -> int:
    """The number of ranks training together: 1 in one process."""
    return world()[1]


def get_local_rank_size() -> int:
    """The number of ranks on this machine: 1 in one process."""
    return world()[1]
