"""The TF2 faces (``sparseflow.tf2.Embedding``, the Keras layer) over several ranks: each rank
holds the keys ``key mod N`` of every table; a batch's keys travel to their owners and rows
back on the collectives of ``tf.distribute.MultiWorkerMirroredStrategy``.

Per batch, as the Session API's sharded lookups (``distributed/sharded_lookup.py``):
:meth:`BoundSharding.route` in the ``tf.data`` map deduplicates every table's ids over its
features and lays them out by owner (``KeyRouter.route``); :meth:`BoundSharding.embeddings`
exchanges them, runs admission, timestamps and row allocation at the owners and brings the
rows back; :meth:`BoundSharding.update` sends the rows' gradients to the owners, which sum
each key's over the ranks and apply the table's optimizer once.
"""

from __future__ import annotations

import tensorflow as tf

from sparseflow.distributed.batch_exchange import BatchExchange, split_per_feature
from sparseflow.distributed.exchange import GROUP_KEY, CountedExchange
from sparseflow.distributed.routing import KeyRouter
from sparseflow.ops.route_ops import route_keys_op

# Above the eager Exchange's groups (GROUP_KEY .. GROUP_KEY + 2).
TF2_GROUP_KEY = GROUP_KEY + 10
_ROUTE = ("route/send", "route/counts", "route/place", "route/gather", "route/sizes",
          "route/timestamp")


class Tf2Sharding:
    """This process's place among the ranks of a TF2 program.

    Args:
      rank, world_size: this process and the number of ranks.
    """

    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size

    @classmethod
    def for_process(cls, face: str) -> "Tf2Sharding | None":
        """The ranks this process is one of (None when alone).

        Raises:
          RuntimeError: several ranks, and the current strategy is not a
            ``MultiWorkerMirroredStrategy`` with one replica per rank.
        """
        from sparseflow.distributed.ranks import detect

        ranks = detect()
        if ranks.size == 1:
            return None
        strategy = tf.distribute.get_strategy()
        replicas = strategy.num_replicas_in_sync
        if (not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
                or replicas != ranks.size):
            raise RuntimeError(
                f"{face}: this process is rank {ranks.rank} of {ranks.size} ({ranks.source}); "
                f"the tables are shared among the ranks over the collectives of "
                f"tf.distribute.MultiWorkerMirroredStrategy: create it under "
                f"`strategy.scope()` of one with a replica per rank. Found "
                f"{type(strategy).__name__} with {replicas} replica(s).")
        from sparseflow.distributed.graph_world import collective_timeout
        from sparseflow.tf2 import lost_rank

        lost_rank.watch(ranks.rank, ranks.size, collective_timeout(), TF2_GROUP_KEY + 1)
        return cls(ranks.rank, ranks.size)

    def bind(self, tables: list, feature_tables: list[int]) -> "BoundSharding":
        """The routing of ``tables`` (this rank's shards), read by features whose table is
        ``feature_tables[k]``: a :class:`BoundSharding`."""
        return BoundSharding(self, tables, feature_tables)


class BoundSharding:
    """One Embedding's tables among the ranks (see the module docstring)."""

    def __init__(self, sharding: Tf2Sharding, tables: list, feature_tables: list[int]):
        self.rank, self.world_size = sharding.rank, sharding.world_size
        self.tables = tables
        self.router = KeyRouter(tables, feature_tables, [1] * len(feature_tables),
                                sharding.world_size, commit_in_process=True)
        self._route_config = self.router.route_config()
        from sparseflow.distributed.graph_world import collective_timeout
        self.exchange = CountedExchange(sharding.world_size, collective_timeout(),
                                        TF2_GROUP_KEY)

    def route(self, timestamp: tf.Tensor, ids: list, stamped: bool) -> dict:
        """The batch's ids (per feature, int64 ``[n]``) laid out by owner: what
        ``preprocess`` returns (under ``route/...`` keys; ``route/stamped`` when the batch
        has a timestamp)."""
        # A compiled op, not a numpy function: the Keras layers route in the step, one
        # table each (``ops/route_ops.py``).
        send, counts, place, gather, sizes = route_keys_op(
            self._route_config, ids, name="sparseflow_tf2_route_keys")
        out = dict(zip(_ROUTE, (send, counts, place, gather, sizes,
                                tf.cast(timestamp, tf.int64))))
        if stamped:
            out["route/stamped"] = tf.constant(True)
        return out

    def id_count(self, batch: dict, k: int) -> tf.Tensor:
        """Feature ``k``'s ids in a routed batch (int32 scalar)."""
        return tf.cast(batch["route/sizes"][len(self.tables) + k], tf.int32)

    def embeddings(self, batch: dict, training: bool, dims: list[int]) -> list:
        """Each feature's embeddings (float32 ``[n_ids, dim]``, feature order) of a routed
        batch; for training, the batch's exchange stays in ``batch`` for :meth:`update`."""
        exchange = BatchExchange(
            self.router, self.exchange, batch["route/send"], batch["route/counts"],
            batch["route/place"], batch["route/timestamp"], training,
            training and "route/stamped" in batch, keep=training)
        rows, _ = exchange.forward(flags=False, keys=batch["route/gather"])
        if training:
            batch["route/exchange"] = exchange
        return split_per_feature(rows, batch["route/sizes"][len(self.tables):], dims)

    def update(self, batch: dict, per_id: list) -> tf.Tensor:
        """Sends each id's gradient (``per_id``: float32 ``[n_ids, dim]`` per feature) to
        its key's owner, which sums them over the ranks and applies the table's optimizer
        once. Returns the owners' update output (int64), for control dependencies.

        Raises:
          RuntimeError: the batch's embeddings were not read for training first.
        """
        if "route/exchange" not in batch:
            raise RuntimeError("Embedding.update() needs the batch's activations read for "
                               "training first (dequeue, or activations(training=True)).")
        max_dim = self.router.max_dim
        # Every feature's ids in one tensor, in the order the exchange gathered them: it sums
        # them per entry once, for every feature.
        dy = tf.concat([tf.pad(grad, [[0, 0], [0, max_dim - grad.shape[1]]])
                        for grad in per_id], 0)
        return batch["route/exchange"].apply_at_owners(dy)


def states_for_this_rank(states: list, saved: list, current: list, source: str) -> list:
    """The table states a checkpoint of the TF2 faces restores on this rank.

    Args:
      states: the checkpoint's ``TableState`` per table.
      saved: ``[rank, size]`` of the shard the checkpoint holds (``[0, 1]``: one process's
        whole tables).
      current: ``[rank, size]`` here.
      source: the checkpoint, for the message.

    Returns:
      ``states`` as they are on the ranks that saved them; a one-process checkpoint's
      re-split by owner (the keys this rank owns).

    Raises:
      ValueError: one rank's shard restored on another rank or number of ranks (it would
        be taken for the whole table, the other shards' keys lost).
    """
    if saved == current:
        return states
    if saved[1] != 1:
        raise ValueError(
            f"{source} is rank {saved[0]}'s shard of {saved[1]} ranks; this is rank "
            f"{current[0]} of {current[1]}. A checkpoint of the TF2 faces restores on the "
            f"ranks that saved it, or, saved by one process, on any number of ranks; "
            f"restoring shards on another number of ranks is not supported yet.")
    from sparseflow.distributed.sharding import rebucket
    return [rebucket([state], current[1])[current[0]] for state in states]
