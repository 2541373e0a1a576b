"""The Ascend TF adapter's HCCL collectives (``hccl_ops.allreduce(grad, "sum")``...), on
TensorFlow's collective ops (``sparseflow/distributed/collectives.py``) among the ranks
``init()`` joined. Over one rank a collective is the identity: a sum, max, min or product over
one rank is the rank's own tensor, gathering from one rank gives its tensor, broadcasting from
rank 0 to itself changes nothing.
"""

from __future__ import annotations

from mx_rec.util.communication.hccl_ops import world
from sparseflow.distributed import collectives
from sparseflow.validation import INT32_MAX, check_int, fail

__all__ = ["allgather", "allreduce", "broadcast"]

REDUCTIONS = ("sum", "max", "min", "prod")


def _check_group(group) -> None:
    if not isinstance(group, str) or not group:
        fail("group", 'a non-empty str (a group name, "hccl_world_group" by default)', group,
             TypeError)


def _check_tensor(tensor) -> None:
    if tensor is None:
        fail("tensor", "a tensor", tensor, TypeError)


def _joined(collective: str) -> None:
    """Several ranks need ``init()`` first: it starts the rank's server the collective
    ops run on."""
    from sparseflow.distributed.graph_world import current
    size = world()[1]
    if size > 1 and current() is None:
        raise RuntimeError(
            f"hccl_ops.{collective} on rank {world()[0]} of {size}: call init() first; it "
            f"joins the ranks whose TensorFlow collectives the op runs on.")


def allreduce(tensor, reduction, fusion=1, fusion_id=-1, group="hccl_world_group"):
    """Reduces ``tensor`` over the ranks of ``group`` (HCCL's AllReduce).

    Args:
      tensor: a ``tf.Tensor``, ``tf.IndexedSlices`` or ``tf.Variable``.
      reduction: one of ``"sum"``, ``"max"``, ``"min"``, ``"prod"``.
      fusion: 0, 1 or 2 (how Ascend fuses all-reduces; no effect on the result).
      fusion_id: int, the fusion group of ``fusion=2`` (no effect on the result).
      group: the group's name.

    Returns:
      The reduction over the ranks (``tensor`` itself over one rank).

    Raises:
      TypeError, ValueError: an argument is not one of the allowed values.
      RuntimeError: several ranks before ``init()``.
    """
    _check_tensor(tensor)
    if not isinstance(reduction, str) or reduction not in REDUCTIONS:
        fail("reduction", f"one of {', '.join(REDUCTIONS)}", reduction)
    check_int("fusion", fusion, 0, 2)
    check_int("fusion_id", fusion_id, -1, INT32_MAX)
    _check_group(group)
    _joined("allreduce")
    return collectives.all_reduce(tensor, reduction)


def allgather(tensor, rank_size, group="hccl_world_group"):
    """Concatenates ``tensor`` of every rank along axis 0 (HCCL's AllGather).

    Args:
      tensor: a ``tf.Tensor``.
      rank_size: the number of ranks in ``group``; must be the process's rank size.
      group: the group's name.

    Returns:
      The ranks' tensors concatenated (``tensor`` itself over one rank).

    Raises:
      TypeError, ValueError: an argument is not one of the allowed values.
      RuntimeError: several ranks before ``init()``.
    """
    _check_tensor(tensor)
    size = world()[1]
    if check_int("rank_size", rank_size, 1, INT32_MAX) != size:
        fail("rank_size", f"the number of ranks, {size}", rank_size)
    _check_group(group)
    _joined("allgather")
    return collectives.all_gather(tensor)


def broadcast(tensor, root_rank, fusion=2, fusion_id=0, group="hccl_world_group"):
    """Sends the tensors of rank ``root_rank`` to every rank (HCCL's Broadcast).

    Args:
      tensor: a list of ``tf.Tensor`` (HCCL broadcasts a list).
      root_rank: the sending rank, in ``[0, rank_size)``.
      fusion, fusion_id: how Ascend fuses broadcasts (no effect on the result).
      group: the group's name.

    Returns:
      The list of ``root_rank``'s tensors (``tensor`` itself over one rank).

    Raises:
      TypeError, ValueError: an argument is not one of the allowed values.
      RuntimeError: several ranks before ``init()``.
    """
    if not isinstance(tensor, (list, tuple)):
        fail("tensor", "a list of tensors", tensor, TypeError)
    check_int("root_rank", root_rank, 0, world()[1] - 1)
    check_int("fusion", fusion, 0, 2)
    check_int("fusion_id", fusion_id, -1, INT32_MAX)
    _check_group(group)
    _joined("broadcast")
    return [collectives.broadcast(t, root_rank) for t in tensor]
