"""Joins the ``tf.train.Checkpoint`` files that N ranks saved into one process's checkpoint.

Over N ranks each rank's checkpoint holds the shard of every :class:`~sparseflow.tf2.Embedding`
table it owns (and a copy of the replicated dense variables), so it restores on the same N
ranks only. The merged checkpoint holds every key, as one process would have saved it, and
restores on any number of ranks (each keeps the keys it owns) or in one process for export
and evaluation.
"""

from __future__ import annotations

import os
from typing import Sequence

import tensorflow as tf

from sparseflow.tf2 import saved_state


def merge_checkpoint_shards(prefixes: Sequence[str], merged_prefix: str) -> str:
    """Writes one process's checkpoint from the checkpoints every rank of one run saved.

    Args:
      prefixes: each rank's checkpoint prefix (what ``tf.train.Checkpoint.write`` /
        ``save`` returned on it), in any order; all ranks of the run, each once.
      merged_prefix: the prefix to write (its directory is created); not one of
        ``prefixes``.

    Returns:
      ``merged_prefix``, for ``tf.train.Checkpoint.read`` / ``restore`` on any number of
      ranks. Every tensor that is not a sparseflow table's (the dense variables, the object
      graph) comes from rank 0's file: the ranks hold the same replicated values.

    Raises:
      ValueError: no prefixes, an unreadable file (naming it), a file that is not a rank's
        shard, ranks missing or given twice, files of different programs, or
        ``merged_prefix`` among ``prefixes``.
    """
    if isinstance(prefixes, (str, bytes)) or not prefixes:
        raise ValueError(f"Argument `prefixes` must be a list of every rank's checkpoint "
                         f"prefix; received: {prefixes!r}")
    prefixes = [os.fspath(p) for p in prefixes]
    merged_prefix = os.fspath(merged_prefix)
    if merged_prefix in prefixes:
        raise ValueError(f"Argument `merged_prefix` ({merged_prefix!r}) is one of the "
                         f"checkpoints being merged: give a new prefix (nothing is replaced).")
    readers = [_reader(p) for p in prefixes]
    dtypes = [r.get_variable_to_dtype_map() for r in readers]
    for prefix, names in zip(prefixes[1:], dtypes[1:]):
        if set(names) != set(dtypes[0]):
            raise ValueError(f"{prefix} and {prefixes[0]} are not checkpoints of one program "
                             f"(their tensors differ: "
                             f"{sorted(set(names) ^ set(dtypes[0]))[:5]}).")
    suffix = "-slot_names"
    tables = sorted(name[:-len("slot_names")] for name in dtypes[0] if name.endswith(suffix)
                    and all(name[:-len("slot_names")] + f in dtypes[0]
                            for f in saved_state.CHECKPOINT_FIELDS))
    if not tables:
        raise ValueError(f"{prefixes[0]} holds no sparseflow.tf2.Embedding table: there is "
                         f"nothing to merge.")
    merged, rank_of = {}, None
    for table in tables:
        shards = [saved_state.state_from_checkpoint(
            lambda field, r=r: r.get_tensor(table + field)) for r in readers]
        owner, _, name = table[:-1].rpartition("/.ATTRIBUTES/")
        state = saved_state.merge_shards(shards, prefixes, f"table `{name}` of `{owner}`")
        rank_of = [world[0] for _, world in shards]
        merged.update({table + field: value for field, value in
                       saved_state.checkpoint_arrays(state, list(saved_state.ONE_PROCESS))
                       .items()})
    first = readers[rank_of.index(0)]
    names = sorted(dtypes[0])
    tensors = [tf.constant(merged[n] if n in merged else first.get_tensor(n), dtypes[0][n])
               for n in names]
    os.makedirs(os.path.dirname(os.path.abspath(merged_prefix)), exist_ok=True)
    tf.raw_ops.SaveV2(prefix=merged_prefix, tensor_names=names,
                      shape_and_slices=[""] * len(names), tensors=tensors)
    return merged_prefix


def _reader(prefix: str):
    try:
        return tf.train.load_checkpoint(prefix)
    except (tf.errors.OpError, ValueError) as err:
        raise ValueError(f"Cannot read the checkpoint {prefix!r}: "
                         f"{str(err).strip().splitlines()[0][:300]}") from None

