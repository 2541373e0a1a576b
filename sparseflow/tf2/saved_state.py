"""How the TF2 faces write a table's state into their files, and read it back.

Two layouts, one per face:

- ``tf.train.Checkpoint`` of an :class:`~sparseflow.tf2.Embedding`: per table, tensors named
  ``<table>-<field>`` (:data:`CHECKPOINT_FIELDS`). Over several ranks each rank's file holds
  its shard, marked by a last "slot name" ``__world__:<rank>/<size>``.
- The Keras layer's saved variables (``save_own_variables``: ``.weights.h5``, ``.keras``):
  arrays named :data:`LAYER_KEYS`, the slot names as UTF-8 bytes, and over several ranks a
  ``world`` array ``[rank, size]``.

A one-process file carries no mark, so its layout is what it always was. :func:`merge_shards`
joins the shards that N ranks saved into the state one process would have saved, which then
restores on any number of ranks (the merge tools in ``tf2/merge_shards.py`` and
``keras/merge_shards.py`` write it).
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from sparseflow.checkpoint.table_state import TableState

WORLD_MARK = "__world__:"
CHECKPOINT_FIELDS = ("keys", "counts", "last_seen", "values", "slot_names", "counted_keys",
                     "counted_counts", "clock", "optimizer_steps")
LAYER_KEYS = ("keys", "counts", "last_seen", "values", "counted_keys", "counted_counts",
              "clock", "optimizer_steps")
ONE_PROCESS = [0, 1]


def checkpoint_arrays(state: TableState, world: list[int]) -> dict:
    """``{field: numpy array}`` of ``state`` for a ``tf.train.Checkpoint`` (the tensors
    ``<table>-<field>``), the slot names marked with ``world`` = ``[rank, size]`` when
    ``size`` > 1."""
    mark = [] if world[1] == 1 else [f"{WORLD_MARK}{world[0]}/{world[1]}"]
    return {
        "keys": np.asarray(state.keys, np.int64), "counts": np.asarray(state.counts, np.int32),
        "last_seen": np.asarray(state.last_seen, np.int64),
        "values": np.asarray(state.values, np.float32),
        "slot_names": np.asarray([s.encode() for s in (*state.slot_names, *mark)], object),
        "counted_keys": np.asarray(state.counted_keys, np.int64),
        "counted_counts": np.asarray(state.counted_counts, np.int32),
        "clock": np.asarray(state.clock, np.int64),
        "optimizer_steps": np.asarray(state.optimizer_steps, np.int64)}


def state_from_checkpoint(get: Callable[[str], np.ndarray]) -> tuple[TableState, list[int]]:
    """The table state and ``[rank, size]`` of the shard it is (``[0, 1]``: one process's
    whole table) from ``get(field)``, each field's array as :func:`checkpoint_arrays` wrote
    it."""
    names = [s.decode() if isinstance(s, bytes) else str(s) for s in get("slot_names")]
    marks = [n for n in names if n.startswith(WORLD_MARK)]
    world = ([int(v) for v in marks[0][len(WORLD_MARK):].split("/")] if marks
             else list(ONE_PROCESS))
    state = TableState(
        keys=np.asarray(get("keys"), np.int64), counts=np.asarray(get("counts"), np.int32),
        last_seen=np.asarray(get("last_seen"), np.int64),
        values=np.ascontiguousarray(get("values"), np.float32),
        slot_names=tuple(n for n in names if not n.startswith(WORLD_MARK)),
        counted_keys=np.asarray(get("counted_keys"), np.int64),
        counted_counts=np.asarray(get("counted_counts"), np.int32),
        clock=int(get("clock")), optimizer_steps=int(get("optimizer_steps")))
    return state, world


def layer_arrays(state: TableState, world: list[int]) -> dict:
    """``{key: numpy array}`` of ``state`` for the Keras layer's variable store, with a
    ``world`` array when ``world`` = ``[rank, size]`` has ``size`` > 1."""
    arrays = {key: np.asarray(getattr(state, key)) for key in LAYER_KEYS}
    # As UTF-8 bytes of the comma-joined names: the store takes numeric arrays only.
    arrays["slot_names"] = np.frombuffer(",".join(state.slot_names).encode(), np.uint8)
    if world[1] > 1:
        arrays["world"] = np.asarray(world, np.int64)
    return arrays


def state_from_layer(store: Mapping, default_slots: tuple = ()) -> tuple[TableState,
                                                                         list[int]]:
    """The table state and ``[rank, size]`` from a Keras layer's variable store
    (:func:`layer_arrays`' keys); ``default_slots`` for files written before slot names were
    stored."""
    keys = set(store.keys())
    get = {key: np.asarray(store[key]) for key in LAYER_KEYS}
    slots = (tuple(n for n in bytes(np.asarray(store["slot_names"], np.uint8)).decode()
                   .split(",") if n) if "slot_names" in keys else tuple(default_slots))
    state = TableState(
        keys=get["keys"].astype(np.int64), counts=get["counts"].astype(np.int32),
        last_seen=get["last_seen"].astype(np.int64),
        values=np.ascontiguousarray(get["values"], np.float32), slot_names=slots,
        counted_keys=get["counted_keys"].astype(np.int64),
        counted_counts=get["counted_counts"].astype(np.int32),
        clock=int(get["clock"]), optimizer_steps=int(get["optimizer_steps"]))
    world = ([int(v) for v in np.asarray(store["world"])] if "world" in keys
             else list(ONE_PROCESS))
    return state, world


def merge_shards(shards: list[tuple[TableState, list[int]]], sources: list[str],
                 what: str) -> TableState:
    """The state one process would hold, from the shards every rank of one world saved.

    Args:
      shards: ``(state, [rank, size])`` per file, in any order.
      sources: each file's path, for messages.
      what: the table or layer, for messages.

    Returns:
      The joined state: every key once, with its row, counts and last-seen time.

    Raises:
      ValueError: a file is not a shard (one process's), the files come from worlds of
        different sizes, a rank is missing or given twice.
    """
    from sparseflow.distributed.sharding import rebucket

    sizes = {world[1] for _, world in shards}
    for (_, world), source in zip(shards, sources):
        if world[1] == 1:
            raise ValueError(f"{source} holds one process's whole {what}, not one rank's "
                             f"shard: it restores on any number of ranks as it is.")
    if len(sizes) > 1:
        raise ValueError(f"The files hold {what} shards of worlds of different sizes "
                         f"{sorted(sizes)}: " + ", ".join(
                             f"{s} (rank {w[0]} of {w[1]})"
                             for (_, w), s in zip(shards, sources)))
    (size,) = sizes
    ranks = sorted(w[0] for _, w in shards)
    if ranks != list(range(size)):
        raise ValueError(f"Merging {what} needs the shards of all {size} ranks, each once; "
                         f"got ranks {ranks} from " + ", ".join(sources) + ".")
    return rebucket([state for state, _ in shards], 1)[0]
