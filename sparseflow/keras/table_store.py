"""A table's state in a Keras layer's variable store (``save_own_variables``), and back.

``SparseEmbedding`` keeps its one table at the top of its store; ``DistributedEmbedding``
keeps each table in a group named after it (:class:`Prefixed`). Both write the arrays of
``sparseflow.tf2.saved_state.layer_arrays``, so ``merge_weight_shards`` joins either.
"""

from __future__ import annotations

from sparseflow.checkpoint import table_state
from sparseflow.tf2 import saved_state
from sparseflow.tf2.sharding import states_for_this_rank

# Every name layer_arrays may write: a group's keys are found among these.
_NAMES = saved_state.LAYER_KEYS + ("slot_names", "world")


class Prefixed:
    """The part of a Keras variable store under ``prefix/`` (an H5 group), as a store."""

    def __init__(self, store, prefix: str):
        self._store, self._prefix = store, prefix

    def __setitem__(self, key: str, value) -> None:
        self._store[f"{self._prefix}/{key}"] = value

    def __getitem__(self, key: str):
        return self._store[f"{self._prefix}/{key}"]

    def keys(self) -> list[str]:
        """The table arrays present under the prefix."""
        return [name for name in _NAMES if f"{self._prefix}/{name}" in self._store]


def save_table(store, table, world: list[int]) -> None:
    """Writes ``table``'s state (a consistent snapshot) into ``store``; ``world`` =
    ``[rank, size]`` of its shard."""
    for key, value in saved_state.layer_arrays(table_state.capture(table), world).items():
        store[key] = value


def read_tables(stores_and_tables: list, world: list[int], source: str) -> list:
    """The states to restore: per ``(store, table)``, the store's state as this rank's
    shard (a one-process file re-split by owner), each checked to fit its table.

    Raises:
      ValueError: a shard of another rank or world, or a state the table cannot take
        (naming ``source``); nothing has changed then.
    """
    states = []
    for store, table in stores_and_tables:
        # Files written before slot names were stored: the table's own layout.
        state, saved = saved_state.state_from_layer(store, tuple(table.rows.slot_names))
        (state,) = states_for_this_rank([state], saved, world, source)
        table_state.check_fits(table, state, source)
        states.append(state)
    return states


def apply_tables(tables: list, states: list, source: str) -> None:
    """Replaces each table's state with its checked state (:func:`read_tables`)."""
    for table, state in zip(tables, states):
        table_state.apply(table, state, source=source)
