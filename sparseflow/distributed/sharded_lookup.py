"""The Session API's lookups when N ranks train one model: each rank holds the keys
``key mod N`` it owns, and every batch's keys travel to their owners and rows back.

Per batch of one ``get_asc_insert_func`` (its plan), on every rank:

1. The ``tf.data`` map (:func:`route_batch`) deduplicates each table's keys over the plan's
   feature specs, finds their owners and lays them out in one ``[N, width, 2]`` send buffer
   (``KeyRouter.route``); no key is admitted, counted or given a row there.
2. In the step (:func:`sharded_lookup`, once per batch however many lookups share it): the
   counts and keys go to their owners (``GraphExchange``: TensorFlow's collective ops in
   the graph); each owner runs the keys it received through its shards' key processors
   (admission, timestamps, eviction and row allocation where the key lives, a key sent by
   two ranks counted once with both ranks' occurrences), reads their rows and sends them
   back.
3. The gradient of the step's loss w.r.t. the gathered rows goes back to the owners the same
   way; each owner sums every key's gradients from all ranks and hands the table's sparse
   optimizer one ``IndexedSlices`` over its rows, as one process would.

Dense gradients are the program's to all-reduce (``hccl_ops.allreduce(grad, "sum")``, as
Rec SDK's examples do): a loss written as the local batch's sum divided by the global batch
size then trains N ranks exactly like one.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from sparseflow.custom_gradient import custom_gradient
from sparseflow.distributed.batch_exchange import BatchExchange, split_per_feature
from sparseflow.distributed.routing import KeyRouter
from sparseflow.pipeline.graph_cache import graph_cache

_ROUTE = "__sparseflow__/route/"
_PARTS = ("send", "counts", "place", "gather", "sizes", "timestamp")


def _key(part: str, plan) -> str:
    return f"{_ROUTE}{part}/{plan.plan_id}"


def router(rt, plan) -> KeyRouter:
    """The plan's router over this rank's shards of the plan's tables, made on first use
    (once every table exists).

    Raises:
      ValueError: a feature spec names a table that does not exist.
    """
    with rt.lock:
        found = rt.routers.get(plan.plan_id)
        if found is None:
            missing = [name for name in plan.tables if name not in rt.tables]
            if missing:
                raise ValueError(f"FeatureSpec table_name {missing[0]!r} names no table. "
                                 f"Tables: {sorted(rt.tables)}")
            specs = list(plan.tables.values())
            found = KeyRouter([rt.tables[name] for name in plan.tables],
                              [t for t, group in enumerate(specs) for _ in group],
                              [s.faae_coefficient for group in specs for s in group],
                              rt.world.size, rt.world.hash, rt.world.send_count)
            rt.routers[plan.plan_id] = found
    return found


def route_batch(rt, plan, inputs: list, timestamp: tf.Tensor) -> dict:
    """What the insert function adds to a batch on one of several ranks: the batch's keys
    laid out by owner (see the module docstring), under reserved keys.

    Args:
      rt: the runtime (``rt.world`` set).
      plan: the insert function's ``InsertPlan``.
      inputs: each feature spec's key tensor, in the plan's spec order.
      timestamp: int64 scalar (the batch's timestamp, or ``no_timestamp()``).

    Returns:
      dict of the batch's routed keys (send buffer, counts, places, per-spec indices,
      sizes, timestamp) under ``__sparseflow__/route/...`` keys.
    """
    n, n_tables, n_specs = rt.world.size, len(plan.tables), len(inputs)

    @tf.autograph.experimental.do_not_convert
    def route(*keys):
        if not rt.pipeline_started:
            raise RuntimeError("The sparseflow pipeline is not started: call "
                               "start_asc_pipeline() before running the dataset.")
        return router(rt, plan).route([np.asarray(k).reshape(-1) for k in keys])

    flat = [tf.reshape(tf.cast(x, tf.int64), [-1]) for x in inputs]
    send, counts, place, gather, sizes = tf.numpy_function(
        route, flat, [tf.int64, tf.int32, tf.int32, tf.int32, tf.int64], stateful=True,
        name="sparseflow_route_keys")
    values = (tf.ensure_shape(send, [n, None, 2]), tf.ensure_shape(counts, [n, n_tables]),
              tf.ensure_shape(place, [None, 2]), tf.ensure_shape(gather, [None]),
              tf.ensure_shape(sizes, [n_tables + n_specs]), tf.cast(timestamp, tf.int64))
    return {_key(part, plan): value for part, value in zip(_PARTS, values)}


def routed_plan(batch: dict, table_name: str):
    """The plan whose routed keys in ``batch`` include ``table_name``'s, or None."""
    from sparseflow import runtime as _runtime

    rt = _runtime.current("sparse_lookup")
    prefix = f"{_ROUTE}send/"
    for key in batch:
        if isinstance(key, str) and key.startswith(prefix):
            plan = rt.insert_plans[int(key[len(prefix):])]
            if table_name in plan.tables:
                return plan
    return None


def sharded_lookup(rt, batch: dict, table, spec, name, with_grad: bool,
                   serving_default_value) -> tf.Tensor:
    """``sparse_lookup`` of ``spec`` on one of several ranks: float32
    ``batch[spec.index_key].shape + [dim]``.

    Raises:
      ValueError: ``batch`` was not mapped by an insert function with ``spec``.
    """
    plan = routed_plan(batch, table.table_name)
    if plan is None or spec.unique_name not in {s.unique_name for group in plan.tables.values()
                                                 for s in group}:
        raise ValueError(
            f"Argument `batch` has no routed keys for FeatureSpec `{spec.name}` of table "
            f"{table.table_name!r}: map the dataset with get_asc_insert_func(tgt_key_specs="
            f"[...]) including this FeatureSpec before batch = iterator.get_next().")
    flat, has_row = _batch_embeddings(rt, batch, plan)[spec.unique_name]
    return _shaped(table, flat, has_row, batch[spec.index_key], name, with_grad,
                   serving_default_value)


def _shaped(table, rows, has_row, ids, name, with_grad: bool, serving_default_value,
            restore=None) -> tf.Tensor:
    """``rows`` (each key's, or with ``restore`` each unique key's) as the lookup's output,
    ``ids.shape + [dim]``: the serving default where a key owns no row, gradients
    stopped unless ``with_grad``."""
    with tf.name_scope(name or f"{table.table_name}_lookup"):
        if serving_default_value is not None:
            default = tf.broadcast_to(serving_default_value, [table.dim])
            rows = tf.where(tf.expand_dims(has_row, 1), rows, tf.expand_dims(default, 0))
        if not with_grad:
            rows = tf.stop_gradient(rows)
        if restore is not None:
            rows = tf.gather(rows, restore)
        out = tf.reshape(rows, tf.concat([tf.shape(ids), [table.dim]], 0))
        out.set_shape(ids.shape.concatenate([table.dim]))
        return out


def _batch_embeddings(rt, batch: dict, plan) -> dict:
    send = batch[_key("send", plan)]
    cache = graph_cache(send.graph, "sharded_embeddings")
    if send.name not in cache:
        cache[send.name] = _build(rt, batch, plan)
    return cache[send.name]


def _exchange(rt, batch: dict, plan) -> BatchExchange:
    """The exchange of one batch of ``plan`` (graph programs: its keys are released after
    the read unless a gradient of its rows is built)."""
    send, counts, place, _, _, timestamp = (batch[_key(p, plan)] for p in _PARTS)
    return BatchExchange(router(rt, plan), rt.world.exchange(send.graph), send, counts,
                         place, timestamp, plan.is_training,
                         plan.timestamp is not None and plan.is_training)


def _spec_indices(batch: dict, plan) -> list:
    """Per spec (plan order), each key's index into the exchange's rows."""
    gather, sizes = batch[_key("gather", plan)], batch[_key("sizes", plan)]
    n_tables, specs = len(plan.tables), [s for group in plan.tables.values() for s in group]
    return tf.split(gather, sizes[n_tables:], num=len(specs))


def _table_bounds(batch: dict, plan) -> list:
    """Per table (plan order), ``(start, end)`` of its unique keys among the rows."""
    sizes = tf.cast(batch[_key("sizes", plan)][:len(plan.tables)], tf.int32)
    ends = tf.cumsum(sizes)
    return [(ends[t] - sizes[t], ends[t]) for t in range(len(plan.tables))]


def _build(rt, batch: dict, plan) -> dict:
    """Every spec's embeddings of one batch (flat ``[n_keys, dim]``, by unique name)."""
    ex = _exchange(rt, batch, plan)
    if not any(table.expands for table in ex.router.tables):
        return _build_keyed(ex, batch, plan)
    unique, has_row = _exchanged_rows(ex)
    # An expanding table's unique rows, which its lookups gather from in training: the
    # "local embeddings" a by-address optimizer differentiates w.r.t.
    bounds = _table_bounds(batch, plan)
    per_table = {}
    if ex.train:
        per_table = {table.table_name: tf.ensure_shape(unique[start:end, :table.dim],
                                                       [None, table.dim])
                     for table, (start, end) in zip(ex.router.tables, bounds)
                     if table.expands}
        _add_local_embeddings(ex, bounds, per_table)
    tables = {table.table_name: (t, table) for t, table in enumerate(ex.router.tables)}
    specs = [s for group in plan.tables.values() for s in group]
    out = {}
    for spec, piece in zip(specs, _spec_indices(batch, plan)):
        t, table = tables[spec.table_name]
        if spec.table_name in per_table:
            # Through the table's local embeddings, which its optimizer differentiates.
            rows = tf.gather(per_table[spec.table_name], piece - bounds[t][0])
        else:
            # Gathered from the exchanged rows, then cut to the table's width: the gradient
            # is the ids' rows only (a cut of the table's part first made every lookup's
            # gradient a dense pass over all the batch's rows, 26 of them per step).
            rows = tf.gather(unique, piece)
            if table.dim != unique.shape[1]:
                rows = rows[:, :table.dim]
        out[spec.unique_name] = (tf.ensure_shape(rows, [None, table.dim]),
                                 tf.gather(has_row, piece))
    return out


def _build_keyed(ex: BatchExchange, batch: dict, plan) -> dict:
    """:func:`_build` without expanding tables: every spec's keys' rows gathered from the
    exchange at once (``BatchExchange.forward`` with keys), then split per spec; their
    gradient is one ``[n_keys, max_dim]`` tensor that the exchange sums per entry."""
    rows, has_row = _exchanged_rows(ex, batch[_key("gather", plan)])
    specs = [s for group in plan.tables.values() for s in group]
    sizes = batch[_key("sizes", plan)][len(plan.tables):]
    dims = {table.table_name: table.dim for table in ex.router.tables}
    pieces = split_per_feature(rows, sizes, [dims[spec.table_name] for spec in specs])
    return {spec.unique_name: (piece, owned) for spec, piece, owned in
            zip(specs, pieces, tf.split(has_row, sizes, num=len(specs)))}


def _exchanged_rows(ex: BatchExchange, keys: tf.Tensor | None = None):
    """``ex.forward(flags=True, keys=keys)``: ``(rows, has_row)``; in training the rows'
    gradient goes to the owners (``BatchExchange.owner_gradients``), through the tables'
    gradient anchors."""
    if not ex.train:
        return ex.forward(flags=True, keys=keys)
    flags = []   # the row flags, which carry no gradient, leave through this list

    @custom_gradient
    def exchanged(*anchors):
        del anchors  # only carry the gradients to the tables
        rows, has_row = ex.forward(flags=True, keys=keys)
        flags.append(has_row)
        return rows, lambda dy: ex.owner_gradients(tf.convert_to_tensor(dy))

    rows = exchanged(*[t.gradient_anchor() for t in ex.router.tables])
    return rows, flags[0]


def _add_local_embeddings(ex: BatchExchange, bounds: list, per_table: dict) -> None:
    """Rec SDK's collections for the by-address optimizers of dynamic expansion: each
    expanding table's unique rows of this batch (``ASCEND_SPARSE_LOOKUP_LOCAL_EMB``) and
    their "addresses" (``ASCEND_SPARSE_LOOKUP_ID_OFFSET``): over ranks, the rows' places
    among the batch's exchanged rows, which :func:`apply_by_address` sends to the owners."""
    from sparseflow.lookup import register_local_embeddings

    for t, (table, (start, end)) in enumerate(zip(ex.router.tables, bounds)):
        if not table.expands:
            continue
        address = tf.range(tf.cast(start, tf.int64), tf.cast(end, tf.int64),
                           name=f"{table.table_name}_address")
        register_local_embeddings(table, (table.table_name, ex.send.name),
                                  per_table[table.table_name], address)
        graph_cache(address.graph, "sharded_addresses")[address.name] = (ex, t, bounds)


def sharded_address(address) -> tuple | LazyTable | None:
    """``(BatchExchange, table index, the tables' bounds)`` of an address from
    :func:`_add_local_embeddings`, the :class:`LazyTable` of a modify-graph lookup's
    address, or None (an address of one process's lookup)."""
    if not isinstance(address, tf.Tensor) or not hasattr(address, "graph"):
        return None
    found = graph_cache(address.graph, "sharded_addresses").get(address.name)
    return found or graph_cache(address.graph, "lazy_addresses").get(address.name)


def apply_by_address(pairs: list) -> list:
    """The updates of a by-address optimizer's ``(gradient [U_t, dim], address)`` pairs of
    sharded lookups: per batch, every table's gradients placed at their addresses in one
    ``[U, max_dim]`` gradient of the batch's rows, sent to the owners, which sum each key's
    gradients over the ranks and apply the table's (by-address) optimizer there. Returns
    the update ops."""
    batches: dict = {}   # id(exchange) -> (exchange, bounds, per table its gradients)
    updates = []
    for values, address in pairs:
        found = sharded_address(address)
        if isinstance(found, LazyTable):   # modify-graph: the rewrite builds the update
            found.address_dys.append(values)
            updates.append(tf.identity(found.applied))
            continue
        ex, t, bounds = found
        batch = batches.setdefault(id(ex), (ex, bounds, [[] for _ in ex.router.tables]))
        batch[2][t].append(values)
    for ex, bounds, dys in batches.values():
        updates.append(ex.apply_at_owners(_batch_gradient(ex, bounds, dys)))
    return updates


# -- automatic graph modification (modify_graph=True) ----------------------------------------

class LazyTable:
    """One table's unique rows of one iterator's batches in a modify-graph program, before
    the rewrite makes the batches' routed keys: placeholders for the rows (and their
    gradient at the owners), which :func:`connect_rewritten` points at the exchange.
    Lookups gather from :attr:`output` (one gradient per table and batch, however many
    lookups read it)."""

    def __init__(self, table):
        self.table = table
        self.unique = tf.compat.v1.placeholder(tf.float32, [None, table.dim],
                                               name=f"{table.table_name}_sharded_rows")
        self.has_row = tf.compat.v1.placeholder(tf.bool, [None],
                                                name=f"{table.table_name}_sharded_has_row")
        self.grad_rows = tf.compat.v1.placeholder(tf.int32, [None],
                                                  name=f"{table.table_name}_owner_rows")
        self.grad_values = tf.compat.v1.placeholder(tf.float32, [None, table.dim],
                                                    name=f"{table.table_name}_owner_grads")
        self.dys = []   # the gradients of output built (before the rewrite)
        # Under dynamic expansion, for a by-address optimizer: the rows' places among the
        # batch's exchanged rows, and the gradients it applies (before the rewrite), whose
        # update at the owners the rewrite builds and points `applied` at.
        self.address = None
        self.address_dys = []
        self.applied = None
        lazy = self

        @custom_gradient
        def rows(anchor):
            del anchor  # only carries the gradient to the table

            def grad(dy):
                lazy.dys.append(tf.convert_to_tensor(dy))
                return tf.IndexedSlices(lazy.grad_values, lazy.grad_rows,
                                        tf.constant([table.capacity(), table.dim], tf.int64))

            return tf.identity(lazy.unique), grad

        self.output = rows(table.gradient_anchor())

    def add_local_embeddings(self) -> None:
        """Rec SDK's by-address collections for this table's rows of the batch (once): the
        rows (``ASCEND_SPARSE_LOOKUP_LOCAL_EMB``) and a placeholder for their addresses,
        which the rewrite points at the rows' places among the exchanged rows."""
        if self.address is not None:
            return
        from sparseflow.lookup import register_local_embeddings

        name = self.table.table_name
        self.address = tf.compat.v1.placeholder(tf.int64, [None], name=f"{name}_address")
        self.applied = tf.compat.v1.placeholder(tf.int64, [], name=f"{name}_owner_update")
        register_local_embeddings(self.table, (name, self.address.name), self.output,
                                  self.address)
        graph_cache(self.address.graph, "lazy_addresses")[self.address.name] = self


def modify_graph_lookup(table, ids: tf.Tensor, name, with_grad: bool, serving_default_value,
                        is_train: bool, thresholds, send_count) -> tf.Tensor:
    """``sparse_lookup(modify_graph=True)`` on one of several ranks: float32
    ``ids.shape + [dim]``, read from the table's rows of the batch once the rewrite has
    connected them (:func:`connect_rewritten`).

    Raises:
      ValueError: as ``graph_modifier.register_lookup``.
    """
    from sparseflow.pipeline.graph_modifier import register_sharded_lookup

    rows, has_row, restore = register_sharded_lookup(table, ids, is_train, thresholds,
                                                     send_count)
    if is_train and table.expands:
        from sparseflow.pipeline.graph_modifier import lazy_table
        lazy_table(table, ids, is_train).add_local_embeddings()
    return _shaped(table, rows, has_row, ids, name, with_grad, serving_default_value, restore)


def connect_rewritten(rt, batch: dict, plan, lazy_tables: dict, restores: dict) -> None:
    """Points a rewritten iterator's lookups at the exchange of its batches.

    Args:
      rt: the runtime (``rt.world`` set).
      batch: the new iterator's outputs with the routed keys of ``plan``.
      plan: the insert plan the rewrite made (one spec per lookup).
      lazy_tables: table name -> :class:`LazyTable` of this iterator.
      restores: spec unique name -> the lookup's restore placeholder (int32, each key's
        index into its table's unique rows).
    """
    from sparseflow.pipeline.graph_modifier import rewire

    ex = _exchange(rt, batch, plan)
    unique, has_row = ex.forward(flags=True)
    bounds = _table_bounds(batch, plan)
    tables = ex.router.tables
    for t, table in enumerate(tables):
        lazy = lazy_tables[table.table_name]
        start, end = bounds[t]
        rewire(lazy.unique, unique[start:end, :table.dim])
        rewire(lazy.has_row, has_row[start:end])
        if lazy.address is not None:
            rewire(lazy.address, tf.range(tf.cast(start, tf.int64), tf.cast(end, tf.int64)))
    table_index = {table.table_name: t for t, table in enumerate(tables)}
    specs = [s for group in plan.tables.values() for s in group]
    for spec, piece in zip(specs, _spec_indices(batch, plan)):
        rewire(restores[spec.unique_name], piece - bounds[table_index[spec.table_name]][0])
    if any(lazy_tables[t.table_name].address_dys for t in tables):
        # A by-address optimizer's gradients: one update at the owners for the batch, which
        # every table's `applied` stands for.
        applied = ex.apply_at_owners(_batch_gradient(
            ex, bounds, [lazy_tables[t.table_name].address_dys for t in tables]))
        for table in tables:
            if lazy_tables[table.table_name].applied is not None:
                rewire(lazy_tables[table.table_name].applied, applied)
    if any(lazy_tables[t.table_name].dys for t in tables):
        grads = ex.owner_gradients(_batch_gradient(
            ex, bounds, [lazy_tables[t.table_name].dys for t in tables]))
        for table, grad in zip(tables, grads):
            lazy = lazy_tables[table.table_name]
            rewire(lazy.grad_rows, grad.indices)
            rewire(lazy.grad_values, grad.values)


def _batch_gradient(ex: BatchExchange, bounds: list, dys_per_table: list) -> tf.Tensor:
    """The gradient of a batch's exchanged rows ``[U, max_dim]``, one table after another:
    per table the sum of its gradients (zeros without one), padded to the widest table."""
    parts = []
    for table, (start, end), dys in zip(ex.router.tables, bounds, dys_per_table):
        dy = tf.add_n(dys) if dys else tf.zeros(tf.stack([end - start, table.dim]))
        parts.append(tf.pad(dy, [[0, 0], [0, ex.router.max_dim - table.dim]]))
    return tf.concat(parts, 0)
