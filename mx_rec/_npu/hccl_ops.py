"""The Ascend TF adapter's HCCL collectives (``hccl_ops.allreduce(grad, "sum")``...).

Over one rank a collective is the identity: a sum, max, min or product over one rank is the
rank's own tensor, gathering from one rank gives its tensor, broadcasting from rank 0 to itself
changes nothing. The rank count comes from ``mx_rec.util.communication.hccl_ops.world``;
under several ranks each collective raises ``NotImplementedError`` naming itself, until the
multi-process facade maps them onto TensorFlow's collectives (the all-reduce and all-gather of
``MultiWorkerMirroredStrategy`` that sparseflow's multi-worker training already uses).
"""

from __future__ import annotations

from mx_rec.util.communication.hccl_ops import world
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


def _single_rank(collective: str) -> int:
    """The rank count, which must be 1 until the multi-process facade maps ``collective``."""
    size = world()[1]
    if size != 1:
        raise NotImplementedError(
            f"hccl_ops.{collective} over {size} ranks: the mx_rec facade runs one process; "
            f"collectives over several ranks come with the multi-process facade.")
    return size


def allreduce(tensor, reduction, fusion=1, fusion_id=-1, group="hccl_world_group"):
    """Reduces ``tensor`` over the ranks of ``group`` (HCCL's AllReduce).

    Args:
      tensor: a ``tf.Tensor``, ``tf.IndexedSlices`` or ``tf.Variable``.
      reduction: one of ``"sum"``, ``"max"``, ``"min"``, ``"prod"``.
      fusion: 0, 1 or 2 (how Ascend fuses all-reduces; no effect on the result).
      fusion_id: int, the fusion group of ``fusion=2`` (no effect on the result).
      group: the group's name.

    Returns:
      ``tensor`` itself over one rank (the reduction of one value is that value).

    Raises:
      TypeError, ValueError: an argument is not one of the allowed values.
      NotImplementedError: the process is one of several ranks.
    """
    _check_tensor(tensor)
    if not isinstance(reduction, str) or reduction not in REDUCTIONS:
        fail("reduction", f"one of {', '.join(REDUCTIONS)}", reduction)
    check_int("fusion", fusion, 0, 2)
    check_int("fusion_id", fusion_id, -1, INT32_MAX)
    _check_group(group)
    _single_rank("allreduce")
    return tensor


def allgather(tensor, rank_size, group="hccl_world_group"):
    """Concatenates ``tensor`` of every rank along axis 0 (HCCL's AllGather).

    Args:
      tensor: a ``tf.Tensor``.
      rank_size: the number of ranks in ``group``; must be the process's rank size.
      group: the group's name.

    Returns:
      ``tensor`` itself over one rank.

    Raises:
      TypeError, ValueError: an argument is not one of the allowed values.
      NotImplementedError: the process is one of several ranks.
    """
    _check_tensor(tensor)
    size = world()[1]
    if check_int("rank_size", rank_size, 1, INT32_MAX) != size:
        fail("rank_size", f"the number of ranks, {size}", rank_size)
    _check_group(group)
    _single_rank("allgather")
    return tensor


def broadcast(tensor, root_rank, fusion=2, fusion_id=0, group="hccl_world_group"):
    """Sends the tensors of rank ``root_rank`` to every rank (HCCL's Broadcast).

    Args:
      tensor: a list of ``tf.Tensor`` (HCCL broadcasts a list).
      root_rank: the sending rank, in ``[0, rank_size)``.
      fusion, fusion_id: how Ascend fuses broadcasts (no effect on the result).
      group: the group's name.

    Returns:
      The list ``tensor`` over one rank.

    Raises:
      TypeError, ValueError: an argument is not one of the allowed values.
      NotImplementedError: the process is one of several ranks.
    """
    if not isinstance(tensor, (list, tuple)):
        fail("tensor", "a list of tensors", tensor, TypeError)
    check_int("root_rank", root_rank, 0, world()[1] - 1)
    check_int("fusion", fusion, 0, 2)
    check_int("fusion_id", fusion_id, -1, INT32_MAX)
    _check_group(group)
    _single_rank("broadcast")
    return list(tensor)
