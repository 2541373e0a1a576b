"""Automatic graph modification: Rec SDK's ``modify_graph=True`` mode.

The model looks up raw id tensors straight from ``iterator.get_next()``::

    emb = sparse_lookup(table, batch["user_ids"], send_count, modify_graph=True,
                        access_and_evict_config={"access_threshold": 2})
    ...
    modify_graph_and_start_emb_cache()
    sess.run(get_initializer(True))

A per-sample timestamp for eviction is an output of the same ``get_next()`` added to the
``ASCEND_TIMESTAMP`` collection (Rec SDK's convention). Until the rewrite, each lookup gathers from placeholders. The rewrite then, per iterator:
finds the dataset behind its ``IteratorGetNext`` (the iterator's ``MakeIterator`` takes it as a
variant tensor; ``tf.data.experimental.from_variant`` gives it back), maps the key processing
over it (the same insert function as FeatureSpec mode, one spec per lookup), makes a new
iterator, and points every consumer of the old ``get_next`` outputs and of the placeholders at
the new iterator's outputs. The new iterator is of the user's kind: initializable, started by
``sess.run(get_initializer(is_training))`` as in Rec SDK's documented flow; or one-shot (its
``dataset_factory`` function rebuilds the dataset), which starts itself at its first
``get_next`` as the user's would have (little_demo with ``USE_ONE_SHOT=1`` runs no
initializer), ``get_initializer`` then returning a no-op.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import tensorflow as tf

from sparseflow import runtime as _runtime
from sparseflow.featurespec.spec import FeatureSpec
from sparseflow.pipeline import insert_func as _insert

_counter = itertools.count()
TIMESTAMP_COLLECTION = "ASCEND_TIMESTAMP"


def graph_function(graph: tf.Graph, name: str):
    """The graph-library function ``name`` of ``graph``, callable (with no arguments) in any
    graph (TF's private Graph._get_function, wrapped here like update_input)."""
    return graph._get_function(name)  # noqa: SLF001


def one_shot_iterator(graph: tf.Graph, factory_name: str, build):
    """A one-shot iterator over ``build(variant)`` (a dataset), ``variant`` being the dataset
    that the graph-library function ``factory_name`` (a one-shot iterator's
    ``dataset_factory``) makes.

    TF's ``make_one_shot_iterator`` copies the ops that make a dataset into a new factory
    function, which cannot copy a call of another graph function; so the new factory calls
    the old one itself.
    """
    made = {}
    old_factory = graph_function(graph, factory_name)

    @tf.function(autograph=False)
    def factory():
        made["dataset"] = build(old_factory(name="dataset_factory"))
        return tf.data.experimental.to_variant(made["dataset"])

    with graph.as_default():
        concrete = factory.get_concrete_function()
        concrete.add_to_graph(graph)
        dataset = made["dataset"]
        flat = tf.nest.flatten(dataset.element_spec)
        handle = tf.raw_ops.OneShotIterator(
            dataset_factory=concrete, output_types=[s.dtype for s in flat],
            output_shapes=[s.shape for s in flat])
        return tf.compat.v1.data.Iterator(
            handle, None, tf.compat.v1.data.get_output_types(dataset),
            tf.compat.v1.data.get_output_shapes(dataset),
            tf.compat.v1.data.get_output_classes(dataset))


def update_input(op: tf.Operation, index: int, tensor: tf.Tensor) -> None:
    """Points input ``index`` of ``op`` at ``tensor`` (TF's private Operation._update_input,
    wrapped here so that a TF upgrade breaks one place and one test)."""
    op._update_input(index, tensor)  # noqa: SLF001


@dataclass
class PendingLookup:
    """A modify-graph lookup waiting for the rewrite."""

    ids: tf.Tensor
    spec: FeatureSpec
    is_train: bool
    rows: tf.Tensor          # placeholder int32 [None] (None over several ranks)
    restore: tf.Tensor       # placeholder int32 [n]
    seq: tf.Tensor           # placeholder int64 [] (None over several ranks)


@dataclass
class ModifyState:
    """The lookups registered in one init(), and the initializers after the rewrite."""

    lookups: list = field(default_factory=list)
    placeholders: dict = field(default_factory=dict)  # (get_next op, table, train) -> (rows, seq)
    initializers: dict = field(default_factory=dict)  # is_training -> iterator initializer
    rewritten: set = field(default_factory=set)  # names of the IteratorGetNext ops rewritten
    replacements: dict = field(default_factory=dict)  # old get_next output name -> new output
    # Over several ranks: (get_next op, train, table) -> sharded_lookup.LazyTable.
    lazy_tables: dict = field(default_factory=dict)


def _state() -> ModifyState:
    rt = _runtime.current("automatic graph modification")
    if rt.modify is None:
        rt.modify = ModifyState()
    return rt.modify


def register_lookup(table, ids: tf.Tensor, is_train: bool, thresholds: dict | None,
                    send_count: int | None = None):
    """Registers a raw-ids lookup; returns the (rows, restore, seq) placeholders it reads.
    ``send_count`` (``init(use_dynamic=False)``) is recorded for the lookup's spec: the
    table's unique keys per batch are padded to the sum over its lookups.

    Raises:
      ValueError: ``ids`` does not come from an ``IteratorGetNext``, or is not int32/int64.
    """
    state = _state()
    spec = _lookup_spec(table, ids, thresholds, send_count)
    key = (ids.op.name, table.table_name, is_train)
    if key not in state.placeholders:
        state.placeholders[key] = (
            tf.compat.v1.placeholder(tf.int32, [None], name=f"{table.table_name}_rows"),
            tf.compat.v1.placeholder(tf.int64, [], name=f"{table.table_name}_seq"))
    rows, seq = state.placeholders[key]
    restore = tf.compat.v1.placeholder(tf.int32, [ids.shape.num_elements()],
                                       name=f"{spec.name}_restore")
    state.lookups.append(PendingLookup(ids, spec, is_train, rows, restore, seq))
    return rows, restore, seq


def register_sharded_lookup(table, ids: tf.Tensor, is_train: bool, thresholds: dict | None,
                            send_count: int | None = None):
    """:func:`register_lookup` over several ranks: returns ``(rows, has_row, restore)``,
    the table's unique rows of the iterator's batch (float32 ``[U, dim]``, one tensor per
    table and iterator, whose gradient reaches the owners), whether each owns a row, and
    the lookup's restore placeholder; the rewrite connects them (``sharded_lookup``).

    Raises:
      ValueError: as :func:`register_lookup`.
    """
    from sparseflow.distributed.sharded_lookup import LazyTable

    state = _state()
    spec = _lookup_spec(table, ids, thresholds, send_count)
    key = (ids.op.name, is_train, table.table_name)
    if key not in state.lazy_tables:
        state.lazy_tables[key] = LazyTable(table)
    lazy = state.lazy_tables[key]
    restore = tf.compat.v1.placeholder(tf.int32, [ids.shape.num_elements()],
                                       name=f"{spec.name}_restore")
    state.lookups.append(PendingLookup(ids, spec, is_train, None, restore, None))
    return lazy.output, lazy.has_row, restore


def lazy_table(table, ids: tf.Tensor, is_train: bool):
    """The :class:`~sparseflow.distributed.sharded_lookup.LazyTable` of ``table`` on the
    iterator output ``ids`` (made by :func:`register_sharded_lookup`)."""
    return _state().lazy_tables[(ids.op.name, is_train, table.table_name)]


def _lookup_spec(table, ids: tf.Tensor, thresholds: dict | None, send_count: int | None):
    """The feature spec a modify-graph lookup of ``ids`` stands for."""
    if ids.op.type != "IteratorGetNext":
        raise ValueError(f"Argument `ids` must be an output of iterator.get_next() for "
                         f"modify_graph=True (the rewrite inserts key processing behind that "
                         f"iterator). Received: {ids.name} from a {ids.op.type} op")
    if ids.dtype not in (tf.int32, tf.int64):
        raise ValueError(f"Argument `ids` must be int32 or int64. Received: {ids.dtype.name}")
    thresholds = dict(thresholds or {})
    spec = FeatureSpec(f"{table.table_name}_lookup_{next(_counter)}", table_name=table.table_name,
                       index_key=str(ids.value_index),
                       access_threshold=thresholds.get("access_threshold"),
                       eviction_threshold=thresholds.get("eviction_threshold"),
                       faae_coefficient=thresholds.get("faae_coefficient", 1))
    if send_count is not None:
        table.send_counts[spec.unique_name] = send_count
    return spec


def rewire(old: tf.Tensor, new: tf.Tensor) -> None:
    """Points every consumer of ``old`` at ``new`` (same graph, dtype and a compatible
    shape): the rewrite's way of replacing a placeholder or an old iterator output.
    Returns nothing; raises what TF's ``Operation._update_input`` raises for a mismatch."""
    for consumer in list(old.consumers()):
        for index, tensor in enumerate(consumer.inputs):
            if tensor is old:
                update_input(consumer, index, new)


def replace_tensor(old: tf.Tensor, new: tf.Tensor) -> None:
    """Points every consumer of ``old`` at ``new``, as :func:`rewire` does, and moves every
    control dependency on ``old``'s op to ``new``'s (TF's private
    ``Operation._control_outputs``, ``_remove_all_control_inputs`` and
    ``_add_control_inputs``): ``old``'s op then has no consumer left. Only before a session
    has run the consumers."""
    rewire(old, new)
    for consumer in list(old.op._control_outputs):  # noqa: SLF001
        kept = [op for op in consumer.control_inputs if op is not old.op]
        consumer._remove_all_control_inputs()  # noqa: SLF001
        consumer._add_control_inputs(kept + [new.op])  # noqa: SLF001


def modify_graph_and_start_emb_cache(full_graph=None, dump_graph=False) -> None:
    """Inserts key processing behind every iterator a modify-graph lookup reads, rewires the
    graph, and starts the pipeline (Rec SDK's call of the same name).

    Args:
      full_graph: the graph to rewrite (default: the default graph).
      dump_graph: write the graph before and after as pbtxt under ``./sparseflow_dump/``.

    Raises:
      ValueError: no modify-graph lookup was built, or an iterator is not initializable.
    """
    state = _state()
    graph = full_graph or tf.compat.v1.get_default_graph()
    if not state.lookups:
        raise ValueError("modify_graph_and_start_emb_cache() found no lookup built with "
                         "sparse_lookup(..., modify_graph=True).")
    if dump_graph:
        _insert._dump(graph)
    by_iterator: dict = {}
    for lookup in state.lookups:
        by_iterator.setdefault((lookup.ids.op.name, lookup.is_train), []).append(lookup)
    channels: dict = {}
    for op_name, is_train in by_iterator:
        channels.setdefault(op_name, set()).add(is_train)
    for op_name, both in channels.items():
        if len(both) > 1:
            raise ValueError(f"Lookups with is_train=True and is_train=False read the same "
                             f"iterator ({op_name}): give training and evaluation their own "
                             f"iterators, as Rec SDK does.")
    with graph.as_default():
        for (op_name, is_train), lookups in by_iterator.items():
            _rewrite(graph.get_operation_by_name(op_name), is_train, lookups, state)
    if dump_graph:
        _insert._dump(graph)
    from sparseflow.pipeline.manager import start_asc_pipeline
    start_asc_pipeline()


def _rewrite(get_next: tf.Operation, is_train: bool, lookups, state: ModifyState) -> None:
    makers = [c for c in get_next.inputs[0].consumers() if c.type == "MakeIterator"]
    source = get_next.inputs[0].op
    one_shot = not makers and source.type == "OneShotIterator"
    if makers:  # initializable iterator: MakeIterator takes the dataset variant
        variant = makers[0].inputs[0]
    elif not one_shot:
        raise ValueError(f"Iterator behind {get_next.name} ({source.type}) is neither "
                         f"initializable nor one-shot: automatic graph modification needs "
                         f"tf.compat.v1.data.make_initializable_iterator or "
                         f"make_one_shot_iterator.")
    outputs = list(get_next.outputs)
    spec = tuple(tf.TensorSpec(t.shape, t.dtype) for t in outputs)
    specs = [lk.spec for lk in lookups]
    # Rec SDK's modify-graph timestamp: a get_next output added to the ASCEND_TIMESTAMP
    # collection.
    stamps = [t for t in tf.compat.v1.get_collection(TIMESTAMP_COLLECTION)
              if isinstance(t, tf.Tensor) and t.op is get_next]
    if len(stamps) > 1:
        raise ValueError(f"The {TIMESTAMP_COLLECTION} collection holds {len(stamps)} outputs of "
                         f"{get_next.name}; at most one timestamp per iterator is allowed.")
    if stamps:
        specs.append(FeatureSpec(f"timestamp_{next(_counter)}", is_timestamp=True,
                                 index_key=str(stamps[0].value_index)))
    insert = _insert.get_asc_insert_func(tgt_key_specs=specs, is_training=is_train)
    rt = _runtime.current()
    plan = rt.insert_plans[-1]
    added = []   # the batch-dict keys the insert function adds (rows, or routed keys)

    def add_rows(*flat):
        batch = {str(i): t for i, t in enumerate(flat)}
        out = insert(batch)
        added[:] = sorted(k for k in out if k not in batch)
        return flat + tuple(out[k] for k in added)

    def with_rows(variant):
        return tf.data.experimental.from_variant(variant, spec).map(add_rows)

    if one_shot:  # its dataset_factory function builds the dataset
        iterator = one_shot_iterator(get_next.graph, source.get_attr("dataset_factory").name,
                                     with_rows)
    else:
        iterator = tf.compat.v1.data.make_initializable_iterator(with_rows(variant))
    new = iterator.get_next()
    batch = {str(i): t for i, t in enumerate(new[:len(outputs)])}
    for old, replacement in zip(outputs, new[:len(outputs)]):
        state.replacements[old.name] = replacement
    batch.update(zip(added, new[len(outputs):]))
    for old_tensor, new_tensor in zip(outputs, new[:len(outputs)]):
        rewire(old_tensor, new_tensor)
    done = set()
    if rt.world is not None:   # the tables are sharded over the ranks
        from sparseflow.distributed.sharded_lookup import connect_rewritten
        lazy = {table: found for (op, train, table), found in state.lazy_tables.items()
                if op == get_next.name and train == is_train}
        connect_rewritten(rt, batch, plan, lazy, {lk.spec.unique_name: lk.restore
                                                  for lk in lookups})
        lookups = []
    for lookup in lookups:
        table = lookup.spec.table_name
        if (table, lookup.rows.name) not in done:
            rewire(lookup.rows, _insert.batch_rows(batch, table))
            rewire(lookup.seq, _insert.batch_seq(batch, table))
            done.add((table, lookup.rows.name))
        rewire(lookup.restore, _insert.batch_restore(batch, lookup.spec))
    # A one-shot iterator starts itself; a no-op keeps sess.run(get_initializer(...)) valid.
    state.initializers[is_train] = (tf.no_op(name="one_shot_iterator_starts_itself")
                                    if one_shot else iterator.initializer)
    state.rewritten.add(get_next.name)


def was_rewritten(get_next: tf.Operation) -> bool:
    """Whether the rewrite replaced the iterator behind ``get_next`` (an ``IteratorGetNext``
    op): its consumers now read the new iterator, whose initializer is
    :func:`get_initializer`'s, not the original's."""
    rt = _runtime.current("automatic graph modification")
    return rt.modify is not None and get_next.name in rt.modify.rewritten


def rewritten(tensor):
    """The tensor to fetch for ``tensor`` after the rewrite: the new iterator's output where
    ``tensor`` is an output of a rewritten ``get_next`` (the rewrite re-points the ops that
    read it, but a fetch of the output itself would read the original iterator, which is no
    longer started), else ``tensor`` itself."""
    rt = _runtime.current("automatic graph modification")
    if rt.modify is None or not isinstance(tensor, tf.Tensor):
        return tensor
    return rt.modify.replacements.get(tensor.name, tensor)


class GraphModifierHook(tf.compat.v1.train.SessionRunHook):
    """Rewrites the graph and starts the key pipeline for a monitored session (Rec SDK's
    ``mx_rec.graph.modifier.GraphModifierHook``; the Estimator's train, evaluate and predict
    hooks).

    Args:
      dump_graph: write the graph before and after the rewrite (modify_graph=True).
      modify_graph: True: automatic graph modification at ``begin`` and every rewritten
        iterator (training or evaluation) initialized when the session is created; False:
        only start the pipeline (FeatureSpec mode).
    """

    def __init__(self, dump_graph=False, modify_graph=True):
        self.dump_graph = dump_graph
        self.modify_graph = modify_graph

    def begin(self):
        rt = _runtime.current("GraphModifierHook")
        if self.modify_graph:
            modify_graph_and_start_emb_cache(dump_graph=self.dump_graph)
        elif not rt.pipeline_started:
            from sparseflow.pipeline.manager import start_asc_pipeline
            start_asc_pipeline()

    def after_create_session(self, session, coord):
        if self.modify_graph:
            session.run(list(_state().initializers.values()))


def get_initializer(is_training: bool) -> tf.Operation:
    """The new iterator initializer for the training (True) or eval (False) channel: a
    no-op when the user's iterator (hence the rewritten one) is one-shot.

    Raises:
      RuntimeError: ``modify_graph_and_start_emb_cache()`` has not run, or built no iterator
        for that channel.
    """
    state = _state()
    if is_training not in state.initializers:
        raise RuntimeError(f"No rewritten {'training' if is_training else 'eval'} iterator: "
                           f"call modify_graph_and_start_emb_cache() after building lookups "
                           f"with sparse_lookup(..., modify_graph=True, is_train="
                           f"{is_training}).")
    return state.initializers[is_training]
