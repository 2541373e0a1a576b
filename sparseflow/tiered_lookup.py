"""The tiered device tables of a batch (``rows_on="device"`` over a host tier), looked up
together: one claim of their fast slots, one swap and one release per batch for all of them.

Each of those steps is a numpy function, which takes the GIL; the input pipeline's thread
holds it while it processes the next batch, so the step waits at every one. Per table they
were four on the step's path (the claim, the take of the queued moves, the homes' write-back
and read, the release): eight a step for two tables, each 0.1-0.4 ms of wall time for tens of
microseconds of Python (issue 21, twenty-first pass; ``benchmarks/bench_tiers.py``). Together
they are four a batch, however many tables.

In order, for the members (the batch's tiered device tables that exist when its first
tiered lookup is built; a table created later, or a lookup without the batch dict, as in
automatic graph modification, is a group of its own):

1. the claim: one numpy function places every member's rows (:meth:`TierCache.place`),
   returning its fast slots;
2. the swaps (:func:`tier_swaps`), under the graph's one tier critical section: one numpy
   function pops every member's queued moves, TF gathers read the rows leaving each member's
   variables, one numpy function writes them home and reads the homes of the rows entering,
   TF scatters write those;
3. each member's gather of its slots;
4. the release: one numpy function, once every member's gather has run.

A member that no lookup in the graph reads is neither claimed nor released (at run time the
graph is complete): a training batch's slots stay pinned from its claim until its update, and
a table no update reaches would keep them pinned for good.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from sparseflow import runtime as _runtime
from sparseflow.embed.device_rows import tier_swap_section, when_laid_out
from sparseflow.lookup import read_after
from sparseflow.pipeline.graph_cache import graph_cache
from sparseflow.pipeline.insert_func import batch_plan, batch_rows, batch_seq


def tiered_gather(table, rows: tf.Tensor, seq: tf.Tensor,
                  batch: dict | None) -> tuple[tf.Tensor, tf.Tensor]:
    """A tiered device table's unique rows of a batch: ``(gathered float32 [U, dim], slots
    int32 [U])``, the slots being what its gradient is over. With ``batch`` (the dict from
    ``get_asc_insert_func``), the batch's tiered device tables share one claim, swap and
    release; without it the table has its own.

    Args:
      table: a ``SparseTable`` with ``rows_on="device"`` and a host tier.
      rows: its int32 ``[U]`` logical rows in the batch (-1: none).
      seq: the batch's int64 sequence number for the table.
      batch: the batch dict, or None.
    """
    group = _group_of(table, rows, seq, batch)
    group.used.add(table.table_name)
    return group.gathered[table.table_name], group.slots[table.table_name]


def _group_of(table, rows: tf.Tensor, seq: tf.Tensor, batch: dict | None) -> _TierGroup:
    cache = graph_cache(rows.graph, "tier_groups")
    plan = batch_plan(batch, table.table_name) if batch is not None else None
    if plan is not None:
        key = batch[plan.flat_key].name
        if key not in cache:
            rt = _runtime.current("sparse_lookup")
            members = [t for t in (rt.tables.get(name) for name in plan.tables)
                       if t is not None and _joins(t, rows.graph)]
            cache[key] = _TierGroup(members, [batch_rows(batch, t.table_name) for t in members],
                                    [batch_seq(batch, t.table_name) for t in members])
        if table.table_name in cache[key].slots:
            return cache[key]
    key = (table.table_name, rows.name)
    if key not in cache:
        cache[key] = _TierGroup([table], [rows], [seq])
    return cache[key]


def _joins(table, graph) -> bool:
    """Whether ``table`` is a tiered device table whose variables live (or will) in
    ``graph``."""
    if table.rows_on != "device" or table.tiers is None:
        return False
    existing = table.rows.device_rows
    return existing is None or existing.graph is graph


class _TierGroup:
    """The claim, swaps, gathers and release of several tiered device tables' rows of one
    batch (see the module's docstring)."""

    def __init__(self, tables: list, rows: list, seqs: list):
        self.used: set[str] = set()
        names = [t.table_name for t in tables]
        used, k = self.used, len(tables)
        tiers = [t.tiers for t in tables]

        @tf.autograph.experimental.do_not_convert
        def claim(*arrays):
            seqs_in, rows_in = arrays[:k], arrays[k:]
            return [tiers[i].place(rows_in[i], int(seqs_in[i])) if names[i] in used
                    else np.full(rows_in[i].shape[0], -1, np.int32) for i in range(k)]

        # Built now on the rows and seqs (placeholders in modify-graph mode, rewired later).
        slots = tf.numpy_function(claim, [*seqs, *rows], [tf.int32] * k, stateful=True,
                                  name=f"sparseflow_claim_{names[0]}")
        for s, r in zip(slots, rows):
            s.set_shape(r.shape)
        device_rows = [t.rows.rows_in(rows[0].graph) for t in tables]
        swapped = tier_swaps(tables, slots)
        gathered = [d.gather(read_after(swapped, s)) for d, s in zip(device_rows, slots)]

        @tf.autograph.experimental.do_not_convert
        def release(*seqs_in):
            for table, name, seq in zip(tables, names, seqs_in):
                if name in used:
                    table.release_batch(int(seq), drain=table.rows.optimizer is None)
            return np.int64(0)

        with tf.control_dependencies(gathered):
            released = tf.numpy_function(release, list(seqs), tf.int64, stateful=True,
                                         name=f"sparseflow_release_{names[0]}")
        with tf.control_dependencies([released]):
            gathered = [tf.identity(g) for g in gathered]
        self.slots = dict(zip(names, slots))
        self.gathered = dict(zip(names, gathered))


def tier_swaps(tables: list, slots: list) -> tf.Operation:
    """The op after which tiered device ``tables`` have run their queued swaps (their claims,
    which ``slots`` come from, queued this batch's), under the graph's tier critical section.
    Through identities made now, so that swaps built later (once every table's slot layout is
    fixed) wait for the claims.

    Args:
      tables: tiered device tables whose variables live in ``slots``' graph.
      slots: the int32 tensors the swaps must follow (one per table, or any).
    """
    graph = slots[0].graph
    device_rows = [t.rows.rows_in(graph) for t in tables]
    after = [tf.identity(s) for s in slots]
    return when_laid_out(device_rows, lambda: tier_swap_section(graph).execute(
        lambda: _swap(tables, device_rows, after), exclusive_resource_access=False))


def _swap(tables: list, device_rows: list, after: list) -> tf.Tensor:
    """The swaps of ``tables`` (built in the critical section's control context: every op
    here waits for its lock). Returns an int32 tensor that exists once the scatters ran."""
    k = len(tables)

    @tf.autograph.experimental.do_not_convert
    def take(*_):
        return [array for t in tables for array in t.tiers.take()]

    @tf.autograph.experimental.do_not_convert
    def write_back_and_read(*arrays):
        return [t.tiers.write_back_and_read(*arrays[4 * i:4 * i + 4])
                for i, t in enumerate(tables)]

    taken = tf.numpy_function(take, after, [tf.int32, tf.int32, tf.int64, tf.int32,
                                            tf.int32] * k, stateful=True, name="take_swaps")
    homes_in, in_slots = [], []
    for i, d in enumerate(device_rows):
        out_slots, out_rows, out_gens, slots_in, rows_in = taken[5 * i:5 * i + 5]
        homes_in += [out_rows, out_gens, d.read_slots(out_slots), rows_in]
        in_slots.append(slots_in)
    in_values = tf.numpy_function(write_back_and_read, homes_in, [tf.float32] * k,
                                  stateful=True, name="swap_homes")
    scatters = [op for d, s, v in zip(device_rows, in_slots, in_values)
                for op in d.write_slots(s, v)]
    with tf.control_dependencies(scatters):
        return tf.identity(in_slots[0])
