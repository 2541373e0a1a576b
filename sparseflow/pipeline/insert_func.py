"""``get_asc_insert_func``: the ``dataset.map`` function that turns keys into rows.

One ``tf.numpy_function`` call per batch takes the raw key tensors of every feature spec; every
spec's keys are flattened and concatenated in table order, deduplicated per table by one kernel
call, and each table's unique keys handed to its key processor in one call
(``key_processor.process_tables``), which returns the row of each unique key. Everything
comes back as one int32 array — every table's rows, then every spec's restore vector — with the sizes of its parts; the map function adds the two to the batch dict,
and the model slices out what it uses:

    batch_rows(batch, table)     int32[U]   row per unique key (-1: none)
    batch_restore(batch, spec)   int32[n]   per spec: position of each key in rows

Carrying two tensors instead of one per table and spec keeps the dataset element small
(52 separate tensors cost 0.5 ms more per 26-table batch).
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf

from sparseflow import tensor_buffers
from sparseflow import runtime as _runtime
from sparseflow.featurespec.grouping import group_specs_by_table
from sparseflow.pipeline.batch_clock import batch_timestamp, no_timestamp
from sparseflow.pipeline.graph_cache import graph_cache
from sparseflow.pipeline.key_processor import borrow_scratch, process_tables
from sparseflow.validation import check_bool

_RESERVED = "__sparseflow__/"
_dump_counter = itertools.count()


@dataclass(frozen=True)
class InsertPlan:
    """What one insert function does, kept so ``start_asc_pipeline`` can check it and
    ``sparse_lookup`` can find a table's rows in a batch."""

    plan_id: int
    tables: dict          # table name -> list of FeatureSpec
    timestamp: object     # FeatureSpec or None
    is_training: bool
    key_dtypes: dict = field(default_factory=dict)  # spec unique_name -> tf.DType, at trace

    @property
    def flat_key(self) -> str:
        """Batch-dict key of the concatenated rows and restore vectors."""
        return f"{_RESERVED}keys/{self.plan_id}"

    @property
    def sizes_key(self) -> str:
        """Batch-dict key of the sizes of the parts of :attr:`flat_key`."""
        return f"{_RESERVED}sizes/{self.plan_id}"

    @property
    def n_parts(self) -> int:
        """Parts of the flat array: each table's rows, then each spec's restore vector."""
        return len(self.tables) + sum(len(specs) for specs in self.tables.values())

    def part_index(self, table_name: str, spec=None) -> int | None:
        """Position of a table's rows (``spec`` None) or of a spec's restore vector among the
        parts, or None when this plan does not produce it."""
        names = list(self.tables)
        if table_name not in self.tables:
            return None
        if spec is None:
            return names.index(table_name)
        position = len(names)
        for specs in self.tables.values():
            for s in specs:
                if s is spec:
                    return position
                position += 1
        return None


def _plans_of(batch: dict):
    rt = _runtime.current("sparse_lookup")
    prefix = f"{_RESERVED}keys/"
    for key in batch:
        if isinstance(key, str) and key.startswith(prefix):
            yield rt.insert_plans[int(key[len(prefix):])]


def batch_parts(batch: dict, plan: InsertPlan) -> list:
    """Every part of ``plan``'s flat array in ``batch`` (each table's rows, then each spec's
    restore vector), split out by one op that every lookup of the batch shares."""
    flat, sizes = batch[plan.flat_key], batch[plan.sizes_key]
    cache = graph_cache(flat.graph, "batch_parts")
    if flat.name not in cache:
        cache[flat.name] = tf.split(flat, sizes[:plan.n_parts], num=plan.n_parts)
    return cache[flat.name]


def _part(batch: dict, plan: InsertPlan, index: int) -> tf.Tensor:
    return batch_parts(batch, plan)[index]


def batch_plan(batch: dict, table_name: str) -> InsertPlan | None:
    """The insert plan that produced ``table_name``'s rows in ``batch``, or None."""
    for plan in _plans_of(batch):
        if plan.part_index(table_name) is not None:
            return plan
    return None


def batch_rows(batch: dict, table_name: str) -> tf.Tensor | None:
    """The rows tensor (int32 ``[U]``, -1 for keys without a row) of ``table_name`` in a batch
    produced through ``get_asc_insert_func``, or None if the batch has none."""
    for plan in _plans_of(batch):
        index = plan.part_index(table_name)
        if index is not None:
            part = _part(batch, plan, index)
            part.set_shape([None])
            return part
    return None


def batch_seq(batch: dict, table_name: str) -> tf.Tensor | None:
    """The int64 scalar sequence number the table's key processor gave this batch (-1 when
    the table does not track batches in flight), or None if the batch has no rows for it."""
    for plan in _plans_of(batch):
        index = plan.part_index(table_name)
        if index is not None:
            return batch[plan.sizes_key][plan.n_parts + index]
    return None


def batch_restore(batch: dict, spec) -> tf.Tensor | None:
    """The restore vector (int32, one entry per key of ``batch[spec.index_key]``) of a feature
    spec in a batch produced through ``get_asc_insert_func``, or None if the batch has none."""
    for plan in _plans_of(batch):
        index = plan.part_index(spec.table_name, spec)
        if index is not None:
            part = _part(batch, plan, index)
            part.set_shape([batch[spec.index_key].shape.num_elements()])
            return part
    return None


def get_asc_insert_func(tgt_key_specs=None, args_index_list=None, table_names=None,
                        is_training=True, dump_graph=False):
    """Returns the map function that adds rows and restore vectors to each batch.

    Args:
      tgt_key_specs: list of ``FeatureSpec``; each spec's ``index_key`` names a tensor of the
        batch dict (any shape, int32 or int64). At most one spec may be a timestamp spec.
      args_index_list, table_names: Rec SDK's positional mode; not supported, use specs.
      is_training: training channel (counts, admits, allocates rows) or eval channel
        (read-only: unknown and unadmitted keys read row -1).
      dump_graph: write the traced map function's graph as pbtxt under
        ``./sparseflow_dump/``.

    Returns:
      A function ``batch_dict -> batch_dict`` for ``dataset.map``, safe under
      ``num_parallel_calls`` and ``prefetch``.

    Raises:
      NotInitializedError: ``init`` was not called.
      TypeError, ValueError: invalid specs (see ``group_specs_by_table``) or arguments.
    """
    rt = _runtime.current("get_asc_insert_func")
    check_bool("is_training", is_training)
    check_bool("dump_graph", dump_graph)
    if args_index_list is not None or table_names is not None:
        raise ValueError("Arguments `args_index_list` and `table_names` are not supported: pass "
                         "`tgt_key_specs` (a list of FeatureSpec) and a dict dataset. Received: "
                         f"args_index_list={args_index_list!r}, table_names={table_names!r}")
    groups = group_specs_by_table(tgt_key_specs, argument="tgt_key_specs")
    # An evaluation or prediction runtime (the Estimator's) never adds keys.
    is_training = is_training and not rt.read_only
    with rt.lock:
        plan = InsertPlan(plan_id=len(rt.insert_plans), tables=dict(groups.tables),
                          timestamp=groups.timestamp, is_training=is_training)
        rt.insert_plans.append(plan)

    @tf.autograph.experimental.do_not_convert
    def insert(batch):
        if not isinstance(batch, dict):
            raise TypeError("get_asc_insert_func's map function needs a dataset of dicts keyed "
                            f"by FeatureSpec.index_key. Received an element of type "
                            f"{type(batch).__name__}")
        specs = [s for group in plan.tables.values() for s in group]
        inputs = [_feature(batch, s) for s in specs]
        for spec, tensor in zip(specs, inputs):
            if tensor.dtype not in (tf.int32, tf.int64):
                raise TypeError(f"FeatureSpec `{spec.name}` reads batch[{spec.index_key!r}] of "
                                f"dtype {tensor.dtype.name}; keys must be int32 or int64.")
            plan.key_dtypes[spec.unique_name] = tensor.dtype
        timestamp = no_timestamp()
        if plan.timestamp is not None:
            timestamp = batch_timestamp(_feature(batch, plan.timestamp))
        if rt.world is not None:   # one of several ranks: keys go to their owners in the step
            from sparseflow.distributed.sharded_lookup import route_batch
            return dict(batch, **route_batch(rt, plan, inputs, timestamp))
        process = _make_process(rt, plan)
        # One concatenated output plus its sizes: each numpy_function output costs ~50 us to
        # hand back (52 outputs: 2.5 ms per 26-table batch).
        flat, sizes = tf.numpy_function(process, inputs + [timestamp], [tf.int32, tf.int64],
                                        stateful=True, name="sparseflow_keys")
        flat.set_shape([None])
        sizes.set_shape([plan.n_parts + len(plan.tables)])  # part sizes, then batch seqs
        out = dict(batch)
        out[plan.flat_key] = flat
        out[plan.sizes_key] = sizes
        if dump_graph:
            _dump(tf.compat.v1.get_default_graph())
        return out

    return insert


def _feature(batch: dict, spec):
    if spec.index_key not in batch:
        raise KeyError(f"FeatureSpec `{spec.name}` reads batch[{spec.index_key!r}], which the "
                       f"dataset does not have. Its keys: {sorted(map(str, batch))}")
    return batch[spec.index_key]


def _make_process(rt, plan: InsertPlan):
    """The batch's one numpy function: every table's keys in; every table's rows, then every
    spec's restore vector, out as one int32 array, with the sizes of its parts followed by each
    table's batch sequence number (for in-flight tracking) as one int64 array.

    One call per batch rather than one per table: with 26 single-feature tables the per-call
    cost of ``tf.numpy_function`` and the reshape/concat/split ops around it cost more than
    the key kernels themselves (see BENCHMARKS.md). Tables are resolved at run time so that
    the insert function may be built before ``create_table``.
    """
    is_training = plan.is_training
    has_timestamp = plan.timestamp is not None and is_training
    static = not rt.config.use_dynamic
    groups = list(plan.tables.items())
    n_specs = sum(len(specs) for _, specs in groups)
    seg_coefs = np.asarray([s.faae_coefficient for _, specs in groups for s in specs], np.int32)
    table_segs = np.cumsum([len(specs) for _, specs in groups], dtype=np.int64)

    # Without this, autograph converts the function when dataset.map traces the insert
    # function, and every Python call inside it then runs through autograph's converted_call:
    # that overhead was half of the pipeline's time (BENCHMARKS.md).
    @tf.autograph.experimental.do_not_convert
    def process(*arrays):
        if not rt.pipeline_started:
            raise RuntimeError("The sparseflow pipeline is not started: call "
                               "start_asc_pipeline() before running the dataset.")
        timestamp = int(arrays[-1]) if has_timestamp else None
        tables = []
        for table_name, _ in groups:
            table = rt.tables.get(table_name)
            if table is None:
                raise ValueError(f"FeatureSpec table_name {table_name!r} names no table. "
                                 f"Tables: {sorted(rt.tables)}")
            tables.append(table)
        keys = [np.asarray(a) for a in arrays[:n_specs]]
        lengths = np.fromiter((k.size for k in keys), np.int64, n_specs)
        # One dedup kernel for every table (the specs' keys are in table order), then each
        # table's row assignment. Sequential on purpose: spreading tables over threads made
        # each job wait for the GIL between its (GIL-free) kernels, which was 5x slower
        # (BENCHMARKS.md).
        pad_tos = None
        if static:
            pad_tos = [sum(table.send_counts.get(s.unique_name, 0) for s in specs)
                       for table, (_, specs) in zip(tables, groups)]
        # The batch's key arrays live in a borrowed scratch, reused batch after batch: fresh
        # ones cost a page fault per page every batch (BENCHMARKS.md).
        with borrow_scratch() as scratch:
            batch, results = process_tables(
                [table.processor for table in tables], scratch.joined_keys(keys),
                np.cumsum(lengths), seg_coefs, table_segs, is_training, timestamp, pad_tos,
                scratch)
            # Every spec's restore vector, in spec order, is the batch's one restore array.
            rows = [result.rows for result in results]
            sizes = np.fromiter([r.shape[0] for r in rows] + list(lengths)
                                + [r.seq for r in results],
                                np.int64, len(rows) + n_specs + len(results))
            return tensor_buffers.concatenate(rows + [batch.restore], np.int32), sizes

    return process


def _dump(graph) -> None:
    directory = os.path.join(os.getcwd(), "sparseflow_dump")
    os.makedirs(directory, exist_ok=True)
    tf.io.write_graph(graph.as_graph_def(), directory,
                      f"insert_func_{next(_dump_counter)}.pbtxt", as_text=True)
