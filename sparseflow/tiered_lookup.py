"""The tiered device tables of a batch (``rows_on="device"`` over a host tier): one claim of
their fast slots, one swap and one release per batch for all of them.

Each of those steps is a numpy function, which takes the GIL; the input pipeline's thread
holds it while it processes the next batch, so the step waits at every one. Per table they
were four on the step's path (the claim, the take of the queued moves, the homes' write-back
and read, the release): eight a step for two tables, each 0.1-0.4 ms of wall time for tens of
microseconds of Python (issue 21, twenty-first pass; ``benchmarks/bench_tiers.py``). Merged,
they are four a batch, however many tables.

A lookup builds its table's own claim, swaps, gather and release (:func:`tiered_gather`).
``start_asc_pipeline``, with the graph complete, merges the lookups of one batch
(:func:`merge_batch_lookups`): it builds one group over their tables and points every op
that read a table's own slots or rows at the group's. It merges only tables that are
trained together: a run reads all of a group or none of it, and a training batch's slots
stay pinned from its claim until its table's update. Were one table of a group trained by an
update that runs without the others' (alternating train ops), every run of the others would
claim its rows too and pin them until its own update, and a small fast tier would fill. So
a training batch's tables merge when each is trained by a sparse optimizer update built
before ``start_asc_pipeline`` and every such update trains all of them or none; an
evaluation batch's always merge. A lookup built after ``start_asc_pipeline``, one without
the batch dict (automatic graph modification) or inside v1 control flow keeps its own, and
so do a training batch's when its optimizer is built after ``start_asc_pipeline``
(little_demo's order): the merge cannot see that update.

In order, for a group:

1. the claim: one numpy function places every member's rows (:meth:`TierCache.place`),
   returning its fast slots;
2. the swaps (:func:`tier_swaps`), under the graph's one tier critical section: one numpy
   function pops every member's queued moves, TF gathers read the rows leaving each member's
   variables, one numpy function writes them home and reads the homes of the rows entering,
   TF scatters write those;
3. each member's gather of its slots;
4. the release: one numpy function, once every member's gather has run.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from sparseflow.embed.device_rows import tier_swap_section, when_laid_out
from sparseflow.lookup import mark_batch_unique_rows, read_after
from sparseflow.pipeline.graph_cache import graph_cache
from sparseflow.pipeline.graph_modifier import replace_tensor
from sparseflow.pipeline.insert_func import batch_plan


class TieredLookup:
    """One lookup's tiered device table on one batch: its gathered rows and its fast slots,
    from its own group until ``start_asc_pipeline`` merges it into its batch's
    (:func:`merge_batch_lookups`); read them when building on them."""

    def __init__(self, table, rows: tf.Tensor, seq: tf.Tensor, training: bool):
        self.table, self.rows, self.seq, self.training = table, rows, seq, training
        self.group = _TierGroup([table], [rows], [seq])

    @property
    def gathered(self) -> tf.Tensor:
        """float32 ``[U, dim]``: the table's rows of the batch, once gathered and released."""
        return self.group.gathered[self.table.table_name]

    @property
    def slots(self) -> tf.Tensor:
        """int32 ``[U]``: the batch's fast slots (-1 where its rows are -1)."""
        return self.group.slots[self.table.table_name]


def tiered_gather(table, rows: tf.Tensor, seq: tf.Tensor, batch: dict | None) -> TieredLookup:
    """A tiered device table's lookup of a batch, built for the table alone; with ``batch``
    (the dict from ``get_asc_insert_func``) it is recorded for :func:`merge_batch_lookups`.

    Args:
      table: a ``SparseTable`` with ``rows_on="device"`` and a host tier.
      rows: its int32 ``[U]`` logical rows in the batch (-1: none).
      seq: the batch's int64 sequence number for the table.
      batch: the batch dict, or None.
    """
    plan = batch_plan(batch, table.table_name) if batch is not None else None
    lookup = TieredLookup(table, rows, seq, training=plan is None or plan.is_training)
    if plan is not None:
        graph_cache(rows.graph, "tier_lookups").setdefault(
            batch[plan.flat_key].name, []).append(lookup)
    return lookup


def record_update(graph, tables) -> None:
    """Records that one sparse optimizer update in ``graph`` trains ``tables`` together
    (:func:`merge_batch_lookups` and :func:`is_trained` read it). An update built after a
    merge that trains some of a group's tables without the others is logged: a run of it
    claims them all and keeps the others' slots pinned until their own update."""
    trained = frozenset(tables)
    cache = graph_cache(_outermost(graph), "device_updates")
    cache.setdefault("sets", []).append(trained)
    for merged in cache.get("merged", ()):
        if 0 < len(merged & trained) < len(merged):
            tf.compat.v1.logging.warning(
                "sparseflow: a sparse optimizer update built after start_asc_pipeline() "
                "trains tables %s but not %s, whose lookups of one batch were merged into "
                "one claim: a run of this update alone claims them all, and keeps the others' "
                "fast slots pinned until their own update. Build every sparse optimizer "
                "update before start_asc_pipeline() to keep them apart.",
                sorted(t.table_name for t in merged & trained),
                sorted(t.table_name for t in merged - trained))


def is_trained(graph, table) -> bool:
    """Whether a sparse optimizer update built in ``graph`` trains ``table``. A tiered table
    no update trains (a frozen one) has its batches claimed as evaluation ones, unpinned at
    their gather: no update would ever settle them, and its fast tier would fill."""
    return any(table in trained for trained in
               graph_cache(_outermost(graph), "device_updates").get("sets", ()))


def _outermost(graph):
    """The graph a function graph (a ``tf.function`` or v2 control-flow branch traced inside
    ``graph``) sits in, outermost first: an update and the lookup it trains may be built at
    different depths, and both must read one record."""
    while getattr(graph, "outer_graph", None) is not None:
        graph = graph.outer_graph
    return graph


def merge_batch_lookups(graph, live_tables: dict) -> int:
    """Merges, per batch, the tiered device lookups in ``graph`` whose tables are trained
    together into one group (see the module's docstring); ``start_asc_pipeline`` calls it
    with the graph complete, before the tables' host-side ops are built.

    A training batch's lookups merge when every one of its tables is trained by a sparse
    optimizer update built so far, and every such update trains all of them or none (a
    table whose update is built later stays alone: the merge could not see it). An
    evaluation batch's merge regardless (its slots are unpinned at its gather). Lookups of
    tables that ``live_tables`` (the runtime's, by name) no longer holds are left alone.

    Returns:
      The number of groups made.
    """
    lookups = graph_cache(graph, "tier_lookups", create=False)
    if not lookups:
        return 0
    cache = graph_cache(_outermost(graph), "device_updates")
    updates = cache.get("sets", [])
    made = 0
    for alone in lookups.values():
        tables = frozenset(lookup.table for lookup in alone)
        if (len(alone) < 2 or any(live_tables.get(t.table_name) is not t for t in tables)
                or not _mergeable(alone, tables, updates)):
            continue
        with graph.as_default(), graph.name_scope(None), tf.control_dependencies(None), \
                graph.device(None):
            group = _TierGroup([lookup.table for lookup in alone],
                               [lookup.rows for lookup in alone],
                               [lookup.seq for lookup in alone])
        for lookup in alone:
            name = lookup.table.table_name
            lookup.group.superseded = True   # its swaps are never built
            replace_tensor(lookup.slots, group.slots[name])
            replace_tensor(lookup.gathered, group.gathered[name])
            lookup.group = group
            mark_batch_unique_rows(group.slots[name])
        cache.setdefault("merged", []).append(tables)
        made += 1
    lookups.clear()
    return made


def _mergeable(alone: list, tables: frozenset, updates: list) -> bool:
    """Whether one batch's lookups ``alone`` of ``tables`` may share a claim."""
    # No lookup in a v1 control-flow context, whose ops may not read a tensor made outside.
    if any(lookup.rows.op._get_control_flow_context() is not None  # noqa: SLF001
           or lookup.slots.op._get_control_flow_context() is not None  # noqa: SLF001
           for lookup in alone):
        return False
    if not any(lookup.training for lookup in alone):
        return True
    trained = [u & tables for u in updates if u & tables]
    return (all(u == tables for u in trained)
            and all(any(t in u for u in trained) for t in tables))


class _TierGroup:
    """The claim, swaps, gathers and release of several tiered device tables' rows of one
    batch (see the module's docstring)."""

    def __init__(self, tables: list, rows: list, seqs: list):
        self.superseded = False   # merged into a batch's group: nothing reads it any more
        names = [t.table_name for t in tables]
        k = len(tables)
        tiers = [t.tiers for t in tables]
        graph = rows[0].graph

        def release_all(seqs_in):
            for table, seq in zip(tables, seqs_in):
                table.release_batch(int(seq), drain=table.rows.optimizer is None)

        @tf.autograph.experimental.do_not_convert
        def claim(*arrays):
            seqs_in, rows_in = arrays[:k], arrays[k:]
            slots = []
            try:
                for i in range(k):
                    training = None if is_trained(graph, tables[i]) else False
                    slots.append(tiers[i].place(rows_in[i], int(seqs_in[i]), training))
            except BaseException:
                # The run fails here (a full fast tier): every member's batch is released,
                # as a gathered batch is, so no slot it placed stays pinned for good.
                release_all(seqs_in)
                raise
            return slots

        # Built now on the rows and seqs (placeholders in modify-graph mode, rewired later).
        slots = tf.numpy_function(claim, [*seqs, *rows], [tf.int32] * k, stateful=True,
                                  name=f"sparseflow_claim_{'_'.join(names)}")
        for s, r in zip(slots, rows):
            s.set_shape(r.shape)
        device_rows = [t.rows.rows_in(graph) for t in tables]
        swapped = tier_swaps(tables, slots, wanted=lambda: not self.superseded)
        gathered = [d.gather(read_after(swapped, s)) for d, s in zip(device_rows, slots)]

        @tf.autograph.experimental.do_not_convert
        def release(*seqs_in):
            release_all(seqs_in)
            return np.int64(0)

        with tf.control_dependencies(gathered):
            released = tf.numpy_function(release, list(seqs), tf.int64, stateful=True,
                                         name=f"sparseflow_release_{'_'.join(names)}")
        with tf.control_dependencies([released]):
            gathered = [tf.identity(g) for g in gathered]
        self.slots = dict(zip(names, slots))
        self.gathered = dict(zip(names, gathered))


def tier_swaps(tables: list, slots: list, wanted=None) -> tf.Operation:
    """The op after which tiered device ``tables`` have run their queued swaps (their claims,
    which ``slots`` come from, queued this batch's), under the graph's tier critical section.
    Through identities made now, so that swaps built later (once every table's slot layout is
    fixed) wait for the claims.

    Args:
      tables: tiered device tables whose variables live in ``slots``' graph.
      slots: the int32 tensors the swaps must follow (one per table, or any).
      wanted: asked when the swaps are built later; False: they are not (nothing reads
        them any more).
    """
    graph = slots[0].graph
    device_rows = [t.rows.rows_in(graph) for t in tables]
    after = [tf.identity(s) for s in slots]

    def build():
        if wanted is not None and not wanted():
            return None
        return tier_swap_section(graph).execute(
            lambda: _swap(tables, device_rows, after), exclusive_resource_access=False)

    return when_laid_out(device_rows, build)


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
