"""Starting the pipeline, and the Rec SDK helpers around it."""

from __future__ import annotations

import tensorflow as tf

from sparseflow import runtime as _runtime
from sparseflow.pipeline import exit_sessions


def start_asc_pipeline() -> None:
    """Checks the wiring of tables, feature specs and lookups, and starts key processing.

    Call it after the graph (tables, insert functions, lookups, optimizers) is built and before
    the first batch is drawn. It allocates each host table's rows with its optimizer's slots,
    and builds the ops that read and write each device table's variables from the host
    (checkpoints, export).

    Raises:
      NotInitializedError: ``init`` was not called.
      ValueError: no table exists, a feature spec names no table, training specs of one table
        disagree on thresholds, int64 keys feed an int32 table, or (``use_dynamic=False``) a
        spec has no ``send_count``.
      RuntimeError: the pipeline was already started.
    """
    rt = _runtime.current("start_asc_pipeline")
    with rt.lock:
        if rt.pipeline_started:
            raise RuntimeError("start_asc_pipeline() was already called for this init().")
        if not rt.tables:
            raise ValueError("start_asc_pipeline() found no table: call create_table(...) "
                             "first.")
        for plan in rt.insert_plans:
            for table_name, specs in plan.tables.items():
                table = rt.tables.get(table_name)
                if table is None:
                    raise ValueError(
                        f"FeatureSpec `{specs[0].name}` has table_name={table_name!r}, which "
                        f"names no table. Tables: {sorted(rt.tables)}")
                if plan.is_training:
                    table.set_admission(specs[0], f"FeatureSpec `{specs[0].name}`")
                    if specs[0].thresholds[1] >= 0 and plan.timestamp is None:
                        raise ValueError(
                            f"FeatureSpec `{specs[0].name}` sets eviction_threshold="
                            f"{specs[0].eviction_threshold} for table `{table_name}`, but its "
                            f"insert function has no timestamp spec: eviction needs "
                            f"FeatureSpec(..., is_timestamp=True) in the same tgt_key_specs.")
                for spec in specs:
                    dtype = plan.key_dtypes.get(spec.unique_name)
                    if dtype == tf.int64 and table.key_dtype == tf.int32:
                        raise ValueError(
                            f"FeatureSpec `{spec.name}` feeds int64 keys to table "
                            f"`{table_name}` created with key_dtype=tf.int32: keys outside the "
                            f"int32 range would be stored as other keys. Cast the feature to "
                            f"int32 in the dataset, or create the table with tf.int64.")
                if not rt.config.use_dynamic:
                    for spec in specs:
                        if spec.unique_name not in table.send_counts:
                            raise ValueError(
                                f"init(use_dynamic=False) pads each table's unique keys to "
                                f"send_count, but FeatureSpec `{spec.name}` of table "
                                f"`{table_name}` was never looked up with "
                                f"sparse_lookup(..., send_count=N).")
        _merge_tiered_lookups(rt.tables)
        for table in rt.tables.values():
            table.prepare()
        rt.pipeline_started = True
    # A session left alive to the end must not be deleted during interpreter finalization,
    # where the pipeline's threads can no longer finish (exit_sessions.py).
    exit_sessions.install()


def _merge_tiered_lookups(tables: dict) -> None:
    """Merges each batch's tiered device lookups trained together (``tiered_lookup.py``), in
    every graph holding a tiered device table's variables; before ``prepare`` builds their
    swaps."""
    graphs = {t.rows.device_rows.graph for t in tables.values()
              if t.rows_on == "device" and t.tiers is not None
              and t.rows.device_rows is not None}
    if graphs:
        from sparseflow.tiered_lookup import merge_batch_lookups  # builds on lookup.py

        for graph in graphs:
            merge_batch_lookups(graph, tables)


def get_dense_and_sparse_variable():
    """Returns (dense trainable variables, sparse tables).

    The tables stand in for Rec SDK's hash-table variables: ``tf.gradients(loss, tables)``
    yields one ``IndexedSlices`` per table, to pass with the tables to a sparse optimizer's
    ``apply_gradients``.

    Raises:
      NotInitializedError: ``init`` was not called.
    """
    rt = _runtime.current("get_dense_and_sparse_variable")
    return tf.compat.v1.trainable_variables(), list(rt.tables.values())
