"""Collectives of a graph program's ranks (what Rec SDK programs call through
``hccl_ops``): all-reduce, all-gather and broadcast as TensorFlow collective ops, built in
the current graph on the ranks :func:`sparseflow.init` joined. Over one rank each is the
identity.
"""

from __future__ import annotations

import tensorflow as tf

from sparseflow.validation import check_int, fail

# HCCL's names for the reductions, and the CollectiveReduceV2 merge op of each.
REDUCTIONS = {"sum": "Add", "max": "Max", "min": "Min", "prod": "Mul"}


def rank_and_size() -> tuple[int, int]:
    """``(rank, size)`` of this process among the ranks (``(0, 1)`` alone): those
    :func:`sparseflow.init` (or an Estimator) joined, else what the launcher's environment
    says (``ranks.detect``), so that it may be asked before joining (to shard a dataset).

    Raises:
      ValueError: the launcher's variables are malformed.
    """
    from sparseflow.distributed.graph_world import current
    from sparseflow.distributed.ranks import detect

    world = current()
    if world is not None:
        return world.rank, world.size
    found = detect()
    return found.rank, found.size


def _exchange(collective: str):
    from sparseflow.distributed.graph_world import current

    world = current()
    if world is None:
        return None
    if tf.executing_eagerly():
        raise RuntimeError(
            f"{collective} over {world.size} ranks is a graph op: build it in a "
            f"tf.compat.v1 graph run by a Session (TF2 programs use "
            f"tf.distribute.MultiWorkerMirroredStrategy's collectives).")
    return world.exchange()


def all_reduce(tensor, reduction: str = "sum") -> tf.Tensor:
    """``tensor`` reduced element-wise over the ranks; every rank gets the result.

    Args:
      tensor: a tensor (or ``IndexedSlices``, made dense first) of the same shape on every
        rank.
      reduction: ``"sum"``, ``"max"``, ``"min"`` or ``"prod"``.

    Raises:
      ValueError: ``reduction`` is none of those.
      RuntimeError: several ranks and eager execution.
    """
    if not isinstance(reduction, str) or reduction not in REDUCTIONS:
        fail("reduction", f"one of {', '.join(REDUCTIONS)}", reduction)
    exchange = _exchange("all_reduce")
    if exchange is None:
        return tensor
    return exchange.reduce(tf.convert_to_tensor(tensor), REDUCTIONS[reduction])


def all_gather(tensor) -> tf.Tensor:
    """Every rank's ``tensor`` (same shape everywhere) concatenated along axis 0, in rank
    order; ``tensor`` itself over one rank.

    Raises:
      RuntimeError: several ranks and eager execution.
    """
    exchange = _exchange("all_gather")
    return tensor if exchange is None else exchange.gather(tf.convert_to_tensor(tensor))


def broadcast(tensor, root_rank: int = 0) -> tf.Tensor:
    """Rank ``root_rank``'s ``tensor`` (same shape everywhere) on every rank; ``tensor``
    itself over one rank.

    Raises:
      TypeError, ValueError: ``root_rank`` is not an int in ``[0, ranks)``.
      RuntimeError: several ranks and eager execution.
    """
    from sparseflow.distributed.graph_world import current

    check_int("root_rank", root_rank, 0, rank_and_size()[1] - 1)
    exchange = _exchange("broadcast")
    if exchange is None:
        return tensor
    tensor = tf.convert_to_tensor(tensor)
    mine = tensor if current().rank == root_rank else tf.zeros_like(tensor)
    if tensor.dtype.is_bool:
        return tf.cast(exchange.reduce(tf.cast(mine, tf.int32), "Add"), tf.bool)
    return exchange.reduce(mine, "Add")


def broadcast_global_variables(root_rank: int = 0) -> tf.Operation:
    """One op that sets every global variable of the current graph to rank ``root_rank``'s
    value (as ``horovod.broadcast_global_variables``): run it once after the variables are
    initialized, so that ranks whose initializers drew different values train one model.
    A no-op over one rank.

    Raises:
      TypeError, ValueError: ``root_rank`` is not an int in ``[0, ranks)``.
    """
    variables = tf.compat.v1.global_variables()
    return tf.group(*[v.assign(broadcast(v.read_value() if hasattr(v, "read_value") else v,
                                         root_rank)) for v in variables])
