"""``sparse_lookup``: embeddings of a feature spec's keys, from the rows the pipeline assigned.

Per table and batch, the unique rows are gathered once (feature specs sharing a table share
that gather) with a numba kernel, then expanded with the spec's restore vector:

    rows[U] --gather--> unique_emb[U, dim] --tf.gather(restore)--> emb[n, dim] --> ids.shape+[dim]

The gradient w.r.t. the table is an ``IndexedSlices`` whose indices are the unique rows and whose
values are the summed gradients of each row's occurrences; rows of -1 (unadmitted or unknown
keys) are carried along and ignored by the optimizers.

A device table (``rows_on="device"``) takes the per-table path with TF ops instead
(:func:`_device_gather`): one numpy function pops the rows the key processor assigned since
the last step and their initial values, a scatter writes them, then ``tf.gather`` reads the
batch's unique rows from the variables; its gradient is the same ``IndexedSlices``. A
device table over a host tier claims its fast slots and runs its queued swaps first, in one
claim, one swap and one release shared by the batch's tiered device tables
(``tiered_lookup.py``).

Under dynamic expansion every lookup takes the per-table path, and each training lookup adds
its table's gathered unique rows (``unique_emb``, the "local embeddings") to the collection
``ASCEND_SPARSE_LOOKUP_LOCAL_EMB`` and their rows as int64 addresses to
``ASCEND_SPARSE_LOOKUP_ID_OFFSET``, once per table and batch, for the by-address optimizers.
The same address tensors, in the same order, go to ``ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS``: Rec
SDK's scripts read that collection under ``APPLY_GRADIENTS_STRATEGY=
sum_same_id_gradients_and_apply`` (sum each key's gradients, then apply); the local embeddings
here are already one per unique row, so the two strategies are the same update.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from sparseflow import lookup_args
from sparseflow import runtime as _runtime
from sparseflow.custom_gradient import custom_gradient
from sparseflow.featurespec.spec import FeatureSpec
from sparseflow.ops.op_shards import width_shards
from sparseflow.pipeline.graph_cache import graph_cache
from sparseflow.pipeline.insert_func import (batch_parts, batch_plan, batch_restore, batch_rows,
                                             batch_seq)
from sparseflow.row_sums import sum_rows_by_index
from sparseflow.table import SparseTable
from sparseflow.validation import INT32_MAX, check_bool, check_int, fail



# Keyword arguments Rec SDK passes between its own layers; accepted so ported code runs.
_REC_SDK_INTERNAL_KWARGS = frozenset({"feature_spec_name_ids_dict", "multi_lookup", "lookup_ids"})

# Rec SDK's collections of the dynamic-expansion lookups (mx_rec.constants.constants).
LOCAL_EMB_COLLECTION = "ASCEND_SPARSE_LOOKUP_LOCAL_EMB"
ADDRESS_COLLECTION = "ASCEND_SPARSE_LOOKUP_ID_OFFSET"
UNIQUE_KEYS_COLLECTION = "ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS"


def sparse_lookup(hashtable, ids, send_count=None, is_train=True, name=None, modify_graph=False,
                  batch=None, access_and_evict_config=None, is_grad=True,
                  serving_default_value=None, dim=None, **kwargs):
    """Looks up the embeddings of a feature spec's keys (Rec SDK ``sparse_lookup``).

    Args:
      hashtable: a table from ``create_table``.
      ids: the ``FeatureSpec`` whose keys to look up; its ``table_name`` must be the table's.
      send_count: int in [1, 2^31-1]; required with ``init(use_dynamic=False)``, where the
        table's unique keys per batch are padded to the sum of its lookups' send_count.
      is_train: False stops gradients (eval graphs).
      name: op name scope.
      modify_graph: automatic graph modification: ``ids`` is then a raw id tensor from
        ``iterator.get_next()``; call ``modify_graph_and_start_emb_cache()`` once the graph
        is built.
      batch: the dataset element (dict) produced through ``get_asc_insert_func``.
      access_and_evict_config: None or a dict with some of ``access_threshold``,
        ``eviction_threshold``, ``faae_coefficient``. Modify-graph mode: this lookup's
        table's settings. FeatureSpec mode: the FeatureSpec sets them (as in Rec SDK); a
        value given here must equal the spec's.
      is_grad: False: this lookup adds no gradient (other lookups of the table still do).
      serving_default_value: a tensor broadcastable to ``[dim]`` read by keys that own no row
        (unadmitted or unknown), in training and evaluation; default zeros.
      dim: None (Rec SDK's scripts pass it), or the table's dim (int or 1-D TensorShape).
      **kwargs: only Rec SDK's internal ``feature_spec_name_ids_dict``, ``multi_lookup`` and
        ``lookup_ids`` (ignored); anything else raises TypeError.

    Returns:
      float32 tensor of shape ``batch[ids.index_key].shape + [dim]``. Under
      ``init(use_dynamic_expansion=True)`` a lookup with ``is_train=True`` also adds, once per
      table and batch, the table's gathered unique rows (float32 ``[U, dim]``) to the graph
      collection ``ASCEND_SPARSE_LOOKUP_LOCAL_EMB`` and their addresses (int64 ``[U]``) to
      ``ASCEND_SPARSE_LOOKUP_ID_OFFSET`` (and ``ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS``), in the
      same order: differentiate the loss w.r.t. the former and pass ``zip(grads,
      addresses)`` to a by-address optimizer.

    Raises:
      NotInitializedError, TypeError, ValueError: see the argument descriptions; in
        FeatureSpec mode, ``access_and_evict_config`` differs from the FeatureSpec.
    """
    rt = _runtime.current("sparse_lookup")
    unknown = sorted(set(kwargs) - _REC_SDK_INTERNAL_KWARGS)
    if unknown:
        raise TypeError(f"sparse_lookup() got an unexpected keyword argument `{unknown[0]}`. "
                        f"Received: {unknown[0]}={kwargs[unknown[0]]!r}")
    if not isinstance(hashtable, SparseTable):
        fail("hashtable", "a table returned by create_table", hashtable, TypeError)
    check_bool("is_train", is_train)
    check_bool("is_grad", is_grad)
    check_bool("modify_graph", modify_graph)
    if send_count is not None:
        send_count = check_int("send_count", send_count, 1, INT32_MAX)
    lookup_args.check_dim(hashtable, dim)
    access_and_evict_config = lookup_args.check_access_and_evict_config(access_and_evict_config)
    serving_default_value = lookup_args.check_serving_default_value(hashtable,
                                                                    serving_default_value)
    if not rt.config.use_dynamic and send_count is None:
        fail("send_count", "an int in [1, 2147483647] when init(use_dynamic=False)",
             send_count)
    if isinstance(ids, tf.Tensor) and not modify_graph:
        fail("modify_graph", "True when `ids` is a tensor (automatic graph modification); "
             "otherwise pass a FeatureSpec", modify_graph)
    # An evaluation or prediction runtime (the Estimator's) never adds keys.
    is_train = is_train and not rt.read_only
    if rt.serving is not None:  # an export graph: the checkpoint's rows through plain TF
        from sparseflow.serving_graph import serving_lookup
        return serving_lookup(rt.serving, hashtable, ids, batch, serving_default_value, name)
    if modify_graph:
        if not isinstance(ids, tf.Tensor):
            fail("ids", "a tensor from iterator.get_next() when modify_graph=True", ids,
                 TypeError)
        if rt.world is not None:   # the table is sharded over the ranks
            from sparseflow.distributed.sharded_lookup import modify_graph_lookup
            return modify_graph_lookup(hashtable, ids, name, is_train and is_grad,
                                       serving_default_value, is_train,
                                       access_and_evict_config,
                                       None if rt.config.use_dynamic else send_count)
        from sparseflow.pipeline.graph_modifier import register_lookup
        rows, restore, seq = register_lookup(hashtable, ids, is_train, access_and_evict_config,
                                             None if rt.config.use_dynamic else send_count)
        return _lookup(hashtable, rows, restore, seq, ids, name, is_train and is_grad,
                       serving_default_value, is_train)
    if not isinstance(ids, FeatureSpec):
        fail("ids", "a FeatureSpec", ids, TypeError)
    if ids.table_name != hashtable.table_name:
        raise ValueError(f"FeatureSpec `{ids.name}` has `table_name`={ids.table_name!r}, but "
                         f"sparse_lookup was given table {hashtable.table_name!r}: a FeatureSpec "
                         f"is looked up in the table its `table_name` names. Pass the table "
                         f"{ids.table_name!r}, or build the FeatureSpec with "
                         f"table_name={hashtable.table_name!r}.")
    if access_and_evict_config is not None:
        lookup_args.check_config_matches_spec(access_and_evict_config, ids)
    if not rt.config.use_dynamic:
        hashtable.send_counts[ids.unique_name] = send_count
    if not isinstance(batch, dict):
        fail("batch", "the dict produced by dataset.map(get_asc_insert_func(...)) then "
             "get_next()", type(batch).__name__, TypeError)
    if rt.world is not None:   # the table is sharded over the ranks
        from sparseflow.distributed.sharded_lookup import sharded_lookup
        return sharded_lookup(rt, batch, hashtable, ids, name, is_train and is_grad,
                              serving_default_value)
    rows = batch_rows(batch, hashtable.table_name) if ids.index_key in batch else None
    restore = batch_restore(batch, ids) if rows is not None else None
    if restore is None:
        raise ValueError(
            f"Argument `batch` has no rows for FeatureSpec `{ids.name}` of table "
            f"{hashtable.table_name!r}: map the dataset with get_asc_insert_func(tgt_key_specs="
            f"[...]) including this FeatureSpec before batch = iterator.get_next().")

    id_tensor = batch[ids.index_key]
    # Dynamic expansion takes the per-table path: its gathered unique rows are the local
    # embeddings the by-address optimizers are given gradients of.
    # Device tables take the per-table path too: their rows are gathered by TF ops. So do
    # tiered tables: their gather claims fast slots, which their gradient is over.
    if (serving_default_value is None and not hashtable.expands
            and hashtable.rows_on == "host" and hashtable.tiers is None):
        flat_emb = _batch_embeddings(batch, batch_plan(batch, hashtable.table_name)).get(
            ids.unique_name)
        if flat_emb is not None:
            with tf.name_scope(name or f"{hashtable.table_name}_lookup"):
                if not (is_train and is_grad):
                    flat_emb = tf.stop_gradient(flat_emb)
                out = tf.reshape(flat_emb, tf.concat([tf.shape(id_tensor), [hashtable.dim]], 0))
                out.set_shape(id_tensor.shape.concatenate([hashtable.dim]))
                return out
    return _lookup(hashtable, rows, restore, batch_seq(batch, hashtable.table_name),
                   id_tensor, name, is_train and is_grad, serving_default_value, is_train,
                   batch)


def _lookup(table, rows, restore, seq, id_tensor, name, with_grad, serving_default_value,
            is_train, batch=None):
    """Gathers the unique rows once per batch, expands them with ``restore`` and reshapes
    to ``id_tensor.shape + [dim]``. ``batch``: the batch dict (None in automatic graph
    modification), through which a batch's tiered device tables share their claim."""
    with tf.name_scope(name or f"{table.table_name}_lookup"):
        unique_emb = _unique_embeddings(table, rows, seq, batch)
        if is_train and table.expands:
            _add_local_embeddings(table, rows, unique_emb)
        if serving_default_value is not None:
            default = tf.broadcast_to(serving_default_value, [table.dim])
            unique_emb = tf.where(tf.expand_dims(rows >= 0, 1), unique_emb,
                                  tf.expand_dims(default, 0))
        if not with_grad:
            unique_emb = tf.stop_gradient(unique_emb)
        emb = tf.gather(unique_emb, restore)
        out = tf.reshape(emb, tf.concat([tf.shape(id_tensor), [table.dim]], 0))
        out.set_shape(id_tensor.shape.concatenate([table.dim]))
        return out


def _unique_embeddings(table: SparseTable, rows: tf.Tensor, seq: tf.Tensor,
                       batch: dict | None) -> tf.Tensor:
    # Lookups of one table on one batch share one gather (and one gradient).
    cache = graph_cache(rows.graph, "unique_embeddings")
    key = (table.table_name, rows.name)
    if key not in cache:
        cache[key] = (_device_gather(table, rows, seq, batch) if table.rows_on == "device"
                      else _host_gather(table, rows, seq))
    return cache[key]


def _add_local_embeddings(table: SparseTable, rows: tf.Tensor, unique_emb: tf.Tensor) -> None:
    """Adds a table's local embeddings and addresses of one batch to Rec SDK's collections,
    once however many lookups share them, and registers the address tensor so that a
    by-address optimizer finds its table (``address_owner``)."""
    key = (table.table_name, rows.name)
    if key in graph_cache(rows.graph, "local_embeddings"):
        return
    register_local_embeddings(table, key, unique_emb,
                              tf.cast(rows, tf.int64, name=f"{table.table_name}_address"))


def register_local_embeddings(table: SparseTable, key, unique_emb: tf.Tensor,
                              address: tf.Tensor) -> None:
    """Adds one batch's unique rows of ``table`` (``unique_emb``) and their ``address`` to
    Rec SDK's collections and registers the address for the by-address optimizers
    (:func:`address_owner`). ``key`` names the batch's rows of the table (registered once)."""
    graph_cache(address.graph, "local_embeddings")[key] = address
    graph_cache(address.graph, "addresses")[address.name] = (table, unique_emb)
    tf.compat.v1.add_to_collection(LOCAL_EMB_COLLECTION, unique_emb)
    tf.compat.v1.add_to_collection(ADDRESS_COLLECTION, address)
    # The local embeddings are unique rows already: summing "same id" gradients is a no-op.
    tf.compat.v1.add_to_collection(UNIQUE_KEYS_COLLECTION, address)


def address_owner(address) -> tuple[SparseTable, tf.Tensor] | None:
    """(table, local embeddings) of an address tensor from ``ASCEND_SPARSE_LOOKUP_ID_OFFSET``,
    or None when ``address`` is no such tensor."""
    if not isinstance(address, tf.Tensor) or not hasattr(address, "graph"):
        return None
    return graph_cache(address.graph, "addresses").get(address.name)


def local_embedding_address(local_emb) -> tf.Tensor | None:
    """The address tensor (``ASCEND_SPARSE_LOOKUP_ID_OFFSET``) of a local embedding from
    ``ASCEND_SPARSE_LOOKUP_LOCAL_EMB``, or None when ``local_emb`` is no such tensor."""
    if not isinstance(local_emb, tf.Tensor) or not hasattr(local_emb, "graph"):
        return None
    for address in graph_cache(local_emb.graph, "local_embeddings").values():
        if address_owner(address)[1] is local_emb:
            return address
    return None


def _host_gather(table: SparseTable, rows: tf.Tensor, seq: tf.Tensor) -> tf.Tensor:
    """The unique rows of a host table's batch. A table over a disk tier first claims the
    batch's fast slots (placing the rows now unless the pipeline placed them early) and runs
    the queued moves; its gradient is over those slots, where the optimizer updates them."""
    dim = table.dim
    capacity = table.capacity()
    tiers = table.tiers
    graph = rows.graph
    from sparseflow.tiered_lookup import is_trained  # imported here: it builds on this module

    @tf.autograph.experimental.do_not_convert
    def gather_and_release(rows, seq):
        slots = rows
        if tiers is not None:
            # A frozen table's batches: evaluation ones, unpinned now (nothing settles them).
            slots = tiers.place(rows, int(seq), None if is_trained(graph, table) else False)
            tiers.swap_host(table.rows.allocate())
        values = table.rows.gather(slots)
        # The batch's rows are read. With an optimizer bound, evicted rows are freed only
        # after its update has run (it calls drain), so no late update lands on a reused row.
        table.release_batch(int(seq), drain=table.rows.optimizer is None)
        return values, np.asarray(slots, np.int32)

    @custom_gradient
    def gather(anchor, rows):
        del anchor  # only carries the gradient to the table
        values, slots = tf.numpy_function(gather_and_release, [rows, seq],
                                          [tf.float32, tf.int32], stateful=True,
                                          name=f"sparseflow_gather_{table.table_name}")
        values.set_shape(rows.shape.concatenate([dim]))
        slots.set_shape(rows.shape)

        def grad(dy):
            if isinstance(dy, tf.IndexedSlices):
                dy = sum_rows_by_index(dy.values, dy.indices, tf.shape(rows)[0])
            slices = tf.IndexedSlices(dy, slots, tf.constant([capacity, dim], tf.int64))
            return slices, None

        return values, grad

    return gather(table.gradient_anchor(), rows)


def _device_gather(table: SparseTable, rows: tf.Tensor, seq: tf.Tensor,
                   batch: dict | None) -> tf.Tensor:
    """The unique rows of a device table's batch, gathered from its variables.

    A table holding every row on the device writes the rows the key processor assigned since
    the last step first (:func:`_pending_device_gather`); a table over a host tier claims its
    fast slots and runs the queued swaps first, with the batch's other tiered device tables
    (``tiered_lookup.py``). The gradient is an ``IndexedSlices``
    over the batch's rows (slots), as for host tables; it depends on the gather, so that an
    update built from it never overwrites the rows before the batch has read them.
    """
    store = table.rows
    device_rows = store.rows_in(rows.graph)
    dim = table.dim
    if table.tiers is not None:
        # Imported here: tiered_lookup builds on this module's helpers.
        from sparseflow.tiered_lookup import tiered_gather
        tiered = tiered_gather(table, rows, seq, batch)
        # Read when the gradient is built: start_asc_pipeline may have merged the lookup
        # into its batch's group since (tiered_lookup.merge_batch_lookups).
        current = lambda: (tiered.gathered, tiered.slots)  # noqa: E731
    else:
        pending = _pending_device_gather(table, device_rows, rows, seq)
        current = lambda: (pending, rows)  # noqa: E731
    gathered, rows = current()
    # The optimizer needs no dedup for these rows (or a tiered table's fast slots): the
    # batch's unique rows.
    mark_batch_unique_rows(rows)
    capacity = table.capacity()

    @custom_gradient
    def attach(anchor, unique_emb):
        del anchor  # only carries the gradient to the table

        def grad(dy):
            gathered, rows = current()
            if isinstance(dy, tf.IndexedSlices):
                dy = sum_rows_by_index(dy.values, dy.indices, tf.shape(rows)[0])
            with tf.control_dependencies([gathered]):
                dy = tf.identity(dy)
            slices = tf.IndexedSlices(dy, rows, tf.constant([capacity, dim], tf.int64))
            return slices, None

        return tf.identity(unique_emb), grad

    out = attach(table.gradient_anchor(), gathered)
    out.set_shape(rows.shape.concatenate([dim]))
    return out


def _pending_device_gather(table: SparseTable, device_rows, rows: tf.Tensor,
                           seq: tf.Tensor) -> tf.Tensor:
    """A device table holding every row. In order: one numpy function pops the table's
    pending rows (rows the key processor assigned since the last pop, this batch's new rows
    among them, with their initial values) and releases the batch; a scatter writes them
    (slots reset) — both in the table's critical section; the gather reads the batch's
    unique rows."""
    # The critical section makes its lock wait for the ops its function reads: through an
    # identity, so that a modify-graph rewire of the seq placeholder reaches them (a control
    # dependency on the placeholder itself would not be rewired).
    seq = tf.identity(seq)
    return device_rows.gather(read_after(pending_rows_written(table, device_rows, seq,
                                                              release=True), rows))


def pending_rows_written(table: SparseTable, device_rows, trigger: tf.Tensor,
                         release: bool) -> tf.Tensor:
    """The op after which a device table's pending rows (the rows its key processor assigned
    since the last pop, with their initial values) are written, slots reset: one numpy
    function pops them, once ``trigger`` is computed, and a scatter writes them, both in the
    table's critical section (another lookup of the table in the same run that pops this
    batch's new rows has written them before this pop returns: ``DeviceRows.exclusive``).

    Args:
      table: the device table; ``device_rows``: its ``DeviceRows`` in the graph.
      trigger: what the pop waits for; with ``release``, the batch's int64 seq, released
        there (with an optimizer bound, evicted rows are freed only after its update has
        run: it calls drain, so no late update lands on a reused row).
    """
    store = table.rows

    @tf.autograph.experimental.do_not_convert
    def pop(trigger):
        new_rows, values = store.pending.pop()
        if release:
            table.release_batch(int(trigger), drain=store.optimizer is None)
        return new_rows, values

    def pop_and_initialize():
        new_rows, values = tf.numpy_function(pop, [trigger], [tf.int32, tf.float32],
                                             stateful=True,
                                             name=f"sparseflow_pending_{table.table_name}")
        new_rows.set_shape([None])
        values.set_shape([None, table.dim])
        with tf.control_dependencies([device_rows.initialize(new_rows, values)]):
            return tf.identity(new_rows)

    return device_rows.exclusive(pop_and_initialize)


def read_after(dependency, rows: tf.Tensor) -> tf.Tensor:
    """``rows`` through an identity that runs after ``dependency`` (a tensor or op, or a
    list of them): a gather built on it reads the variables only then. (A control
    dependency put on the gather's own block reaches only its constant inputs, which graph
    optimization may fold away with it.)"""
    if not isinstance(dependency, (list, tuple)):
        dependency = [dependency]
    with tf.control_dependencies(dependency):
        return tf.identity(rows)


def mark_batch_unique_rows(rows: tf.Tensor) -> None:
    """Records that ``rows`` are one batch's unique keys' rows (distinct, -1 for none), as
    one gather reads them: a gradient over them needs no dedup."""
    graph_cache(rows.graph, "batch_unique_rows")[rows.name] = True


def is_batch_unique_rows(indices) -> bool:
    """Whether ``indices`` are one batch's unique keys' rows (:func:`mark_batch_unique_rows`:
    a gradient's indices straight from one gather, not a concatenation that may repeat
    rows)."""
    return isinstance(indices, tf.Tensor) and indices.name in graph_cache(
        indices.graph, "batch_unique_rows")


# -- one gather (and one gradient) for every table of a batch --------------------------------

def _batch_embeddings(batch: dict, plan) -> dict:
    """Every feature spec's embeddings in ``batch``, flat (float32 ``[n_keys, dim]``), by
    spec ``unique_name``, for the tables of ``plan`` that exist when the batch's first lookup
    is built (a table created later is looked up on its own).

    Compiled ops (``ops/batch_ops.py``; per width, its tables split over one op per core,
    ``ops/op_shards.py``) gather every table's unique rows and expand them by each spec's
    restore vector; their gradient, compiled ops split the same way,
    sums each key's gradient into its unique row by the same restore vector, handing each
    table an ``IndexedSlices`` over its unique rows. With 26 tables, a numpy function per
    table plus the TF ops that expand and segment-sum per feature cost more than the work
    itself, and a numpy function per batch still waited for the GIL (BENCHMARKS.md,
    end-to-end). Only fixed-capacity host tables come here (``SparseTable.gathers_in_kernel``;
    ``sparse_lookup`` sends the others down the per-table path).
    """
    flat = batch[plan.flat_key]
    cache = graph_cache(flat.graph, "batch_embeddings")
    if flat.name not in cache:
        cache[flat.name] = _build_batch_embeddings(batch, plan)
    return cache[flat.name]


def _build_batch_embeddings(batch: dict, plan) -> dict:
    rt = _runtime.current("sparse_lookup")
    flat, sizes = batch[plan.flat_key], batch[plan.sizes_key]
    parts = batch_parts(batch, plan)
    # Device tables are gathered by TF ops on their own (_device_gather), tiered tables on
    # their own too (their gather claims fast slots, _host_gather).
    tables = [t for t in (rt.tables.get(n) for n in plan.tables)
              if t is not None and t.gathers_in_kernel]
    if not tables:
        return {}
    # Imported here: loading the compiled ops' kernels starts numba's compiler (~0.4 s),
    # which a process that never looks up a batch need not pay.
    from sparseflow.ops import batch_ops

    # Per distinct dim and shard, one output: (dim, [(table, its rows' part, [(spec, its
    # restore part)])]). A width's tables are split over a few ops (ops/op_shards.py) that
    # TensorFlow runs side by side: one op read (and summed, and updated) every table on one
    # core.
    members = [(t, plan.part_index(t.table_name),
                [(s, plan.part_index(t.table_name, s)) for s in plan.tables[t.table_name]])
               for t in tables]
    groups = [(dim, [members[i] for i in run]) for dim, run in width_shards(
        [t.dim for t in tables], [len(plan.tables[t.table_name]) for t in tables])]
    n_parts = plan.n_parts
    # Per group, each member's table token and parts, in output order: a table's specs are
    # consecutive, so the kernel reads its unique rows once.
    layouts = []
    for _, members in groups:
        tokens, rows_of, restore_of = [], [], []
        for table, w, specs in members:
            token = table.registry_token()
            for _, r in specs:
                tokens.append(token)
                rows_of.append(w)
                restore_of.append(r)
        layouts.append(tuple(np.asarray(a, np.int64) for a in (tokens, rows_of, restore_of)))

    # Per group, its specs in output order.
    group_specs = [[(s, r) for _, _, pairs in members for s, r in pairs]
                   for _, members in groups]

    def split(tensor, part_indices):
        if len(part_indices) == 1:
            return [tensor]
        counts = tf.stack([tf.shape(parts[i])[0] for i in part_indices])
        return tf.split(tensor, counts, num=len(part_indices))

    @custom_gradient
    def gather(*anchors):
        del anchors  # only carry the gradients to the tables
        # The op releases each table's batch once its rows are read (through the registry:
        # KeyProcessor.release, applied under the key processor's lock).
        outs = [batch_ops.gather_tables(flat, sizes, tokens, rows_of, restore_of, n_parts,
                                        dim, name="sparseflow_gather")
                for (dim, _), (tokens, rows_of, restore_of) in zip(groups, layouts)]
        pieces = []
        for (dim, _), out, specs in zip(groups, outs, group_specs):
            out.set_shape([None, dim])
            pieces.extend(split(out, [r for _, r in specs]))

        def grad(*dys):
            dys = [tf.zeros_like(piece) if dy is None else tf.convert_to_tensor(dy)
                   for dy, piece in zip(dys, pieces)]
            # One compiled op per group, not a numpy function: the backward pass reaches
            # the sparse update without entering Python (ops/batch_ops.py).
            # After the gathers: an update applied from this gradient must not overwrite the
            # rows before the batch has read them (a loss linear in the embeddings gives a
            # gradient that does not depend on them). The ops read the batch's parts through
            # an identity that runs after the gathers: a control dependency on their block
            # would reach only their constant inputs.
            flat_after_gather = read_after(outs, flat)
            summed, at = [], 0
            for (_, rows_of, restore_of), specs in zip(layouts, group_specs):
                summed.append(batch_ops.sum_tables(
                    flat_after_gather, sizes, rows_of, restore_of, n_parts,
                    dys[at:at + len(specs)], name="sparseflow_gather_grad"))
                at += len(specs)
            by_table = {}
            for (dim, members), total in zip(groups, summed):
                total.set_shape([None, dim])
                for (table, w, _), piece in zip(members,
                                                split(total, [w for _, w, _ in members])):
                    mark_batch_unique_rows(parts[w])
                    by_table[table.table_name] = tf.IndexedSlices(
                        piece, parts[w], tf.constant([table.capacity(), dim], tf.int64))
            return [by_table[t.table_name] for t in tables]

        return pieces, grad

    pieces = gather(*[t.gradient_anchor() for t in tables])
    specs = [spec for group in group_specs for spec, _ in group]
    embeddings = {spec.unique_name: piece for spec, piece in zip(specs, pieces)}
    return embeddings
