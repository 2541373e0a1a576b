"""The end-to-end benchmark's profile instruments the kernels that (d) really calls
(benchmarks/e2e_profile.py), so its per-part times are not silently zero or a crash; it tells
sparseflow's compiled ops from its numpy functions by their op types, and its report
(benchmarks/e2e.py) says of each only what holds for its kind."""

import os
import sys

import numpy as np
import pytest
import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "benchmarks"))

import e2e  # noqa: E402
import e2e_profile as P  # noqa: E402
import e2e_variants as ev  # noqa: E402

from sparseflow.ops.op_shards import op_shards  # noqa: E402
from sparseflow.pipeline import key_processor  # noqa: E402

N_TABLES = len(ev.FEATURES)


def _sparseflow_nodes(op_types: dict) -> dict:
    """{sparseflow node name (``FUNCTIONS``): its graph node's name} of a built graph."""
    out = {}
    for name in op_types:
        for fn in P.FUNCTIONS:
            if name.rsplit("/", 1)[-1] == fn:
                out[fn] = name
    return out


def _expected_category(fn: str, op_type: str) -> str:
    as_numpy, as_op = P.NODE_CATEGORIES[fn]
    return as_numpy if op_type in ("PyFunc", "PyFuncStateless", "EagerPyFunc") else as_op


def test_the_profile_times_the_batch_dedup_and_the_key_processors_of_a_real_step():
    data = ev.make_data(4)
    timers = P.Timers()
    build = P.instrumented_sparseflow(timers)
    original = key_processor.dedup_batch
    graph = tf.Graph()
    built = None
    try:
        with graph.as_default():
            built = build(data, 20_000)   # rows enough for the 4 batches' new keys
            with tf.compat.v1.Session(graph=graph) as sess:
                sess.run(built.init_ops)
                sess.run(built.iterator_init, feed_dict=built.feed)
                for _ in range(2):
                    sess.run(built.train_op)
    finally:
        if built is not None:
            built.close()
        build.restore()
    assert key_processor.dedup_batch is original   # restored
    # One dedup per batch processed (the prefetch may have read ahead), 26 tables each.
    batches = timers.calls[P.DEDUP]
    assert batches >= 2
    assert timers.calls[P.PROCESS] == N_TABLES * batches
    assert np.isfinite(timers.total[P.DEDUP]) and timers.total[P.DEDUP] > 0
    # process_unique counts each table's keys (single-hot: the batch's rows) and its unique
    # rows: the rows a compiled op works on.
    assert timers.items[P.PROCESS] == N_TABLES * ev.BATCH * batches
    assert 0 < timers.items2[P.PROCESS] < timers.items[P.PROCESS]
    # The builder recorded the graph's op types: the fixed-capacity tables' gather and its
    # gradient are compiled ops, so no Python kernel runs in them.
    nodes = _sparseflow_nodes(build.op_types)
    assert set(nodes) == set(P.FUNCTIONS)
    assert P.category(nodes[P.GATHER_FN], "", build.op_types) == P.GATHER_OP
    assert P.category(nodes[P.GRAD_FN], "", build.op_types) == P.GRAD_OP
    assert timers.calls[P.EXPAND] == 0 and timers.calls[P.RELEASE] == 0
    # The update: its wrapped kernel runs once per step exactly when it is a numpy function.
    update_type = build.op_types[nodes[P.UPDATE_FN]]
    as_numpy = P.category(nodes[P.UPDATE_FN], "", build.op_types) == P.UPDATE_PY
    assert as_numpy == (update_type in P.NUMPY_FUNCTION_TYPES)
    assert timers.calls[P.UPDATE] == (2 if as_numpy else 0)
    assert (timers.calls[P.DRAIN] > 0) == as_numpy


def test_a_traced_step_puts_the_compiled_gather_node_and_its_rows_in_the_kernels():
    data = ev.make_data(6)
    timers = P.Timers()
    build = P.instrumented_sparseflow(timers)
    steps = 2
    try:
        r = ev.run_graph(build, data, 20_000, 1, steps, trace_every=1, keep_traces=True,
                         hook=lambda sess, built: timers.reset())
    finally:
        build.restore()
    ms, cnt, _, _ = P.breakdown(r, "IteratorGetNext", build.op_types)
    # The 26 tables are split over a few ops of each kind (ops/op_shards.py).
    shards = len(op_shards([1] * N_TABLES))
    assert cnt[P.GATHER_OP] == shards and ms[P.GATHER_OP] > 0
    assert cnt[P.GRAD_OP] == shards and ms[P.GRAD_OP] > 0
    assert P.GATHER_PY not in cnt and P.GRAD_PY not in cnt
    nodes = _sparseflow_nodes(build.op_types)
    update_cat = _expected_category(P.UPDATE_FN, build.op_types[nodes[P.UPDATE_FN]])
    assert cnt[update_cat] == shards
    types = P.node_op_types(build.op_types)
    assert types[P.GATHER_OP] == ["SparseflowGatherTables"]
    assert types[P.GRAD_OP] == ["SparseflowSumTables"]

    batches = timers.calls[P.PROCESS] / N_TABLES
    wrapped = {lab: {"ms": timers.total[lab] * 1e3 / steps, "calls": timers.calls[lab] / steps,
                     "items": timers.items[lab] / steps, "items2": timers.items2[lab] / steps}
               for lab in P.WRAPPED}
    wrapped[P.PROCESS] = {"ms": timers.total[P.PROCESS] * 1e3 / batches, "calls": N_TABLES,
                          "items": timers.items[P.PROCESS] / batches,
                          "items2": timers.items2[P.PROCESS] / batches}
    kernels = P.node_kernels(wrapped, ms, cnt)
    # The compiled gather's kernel is its node; its rows are the batch's.
    gather = kernels[P.GATHER_FN]
    assert gather["ms"] == ms[P.GATHER_OP] and gather["calls"] == shards
    assert gather["keys"] == N_TABLES * ev.BATCH
    assert 0 < gather["unique"] == wrapped[P.PROCESS]["items2"] < gather["keys"]
    assert kernels[P.GRAD_FN]["ms"] == ms[P.GRAD_OP]
    assert kernels[P.GRAD_FN]["unique"] == gather["unique"]


def test_a_sparseflow_node_is_a_numpy_function_or_a_compiled_op_by_its_op_type():
    types = {"lookup/sparseflow_gather": "PyFunc",
             "lookup/sparseflow_gather_1": "SparseflowGatherTables",
             "gradients/lookup/IdentityN_grad/sparseflow_gather_grad": "EagerPyFunc",
             "sparse_adam/sparseflow_update": "SparseflowUpdateTables",
             "lookup/strided_slice": "StridedSlice"}
    assert P.category("lookup/sparseflow_gather", "x", types) == P.GATHER_PY
    assert P.category("lookup/sparseflow_gather_1", "x", types) == P.GATHER_OP
    assert P.category("gradients/lookup/IdentityN_grad/sparseflow_gather_grad", "x",
                      types) == P.GRAD_PY
    assert P.category("sparse_adam/sparseflow_update", "x", types) == P.UPDATE_OP
    assert P.category("lookup/strided_slice", "x", types) == P.LOOKUP_FWD
    assert P.GATHER_OP.endswith("compiled op") and P.GATHER_PY.endswith("numpy function")
    assert P.node_op_types(types) == {P.GATHER_PY: ["PyFunc"],
                                      P.GATHER_OP: ["SparseflowGatherTables"],
                                      P.GRAD_PY: ["EagerPyFunc"],
                                      P.UPDATE_OP: ["SparseflowUpdateTables"]}
    with pytest.raises(ValueError, match="sparseflow_update"):   # not guessed
        P.category("other/sparseflow_update", "x", types)


def _wrapped(gather_numpy: bool, update_numpy: bool) -> dict:
    """Per-step wrapped calls of a (d) step whose gather and update are of those kinds."""
    def rec(ms=0.0, calls=0.0, items=0.0, items2=0.0):
        return {"ms": ms, "calls": calls, "items": items, "items2": items2}

    keys = N_TABLES * ev.BATCH
    out = {lab: rec() for lab in P.WRAPPED}
    out[P.PROCESS] = rec(4.0, N_TABLES, keys, 950)   # per batch: keys, unique rows
    out[P.DEDUP] = rec(1.0, 1, keys)
    if gather_numpy:
        out[P.EXPAND] = rec(0.6, 1, 900, keys)       # unique rows read, keys written
        out[P.RELEASE] = rec(0.1, N_TABLES)
    if update_numpy:
        out[P.UPDATE] = rec(2.0, 1, 920)             # unique rows updated
        out[P.DRAIN] = rec(0.3, N_TABLES)
    return out


def test_a_compiled_node_is_its_kernel_with_the_batch_s_rows_a_numpy_one_its_wrapped_call():
    ms = {P.GATHER_OP: 1.0, P.GRAD_OP: 0.5, P.UPDATE_PY: 3.0}
    nodes = {P.GATHER_OP: 1, P.GRAD_OP: 1, P.UPDATE_PY: 1}
    k = P.node_kernels(_wrapped(False, True), ms, nodes)
    assert k[P.GATHER_FN] == {"ms": 1.0, "calls": 1, "unique": 950, "keys": N_TABLES * ev.BATCH}
    assert k[P.GRAD_FN] == {"ms": 0.5, "calls": 1, "unique": 950, "keys": N_TABLES * ev.BATCH}
    assert k[P.UPDATE_FN]["ms"] == 2.0 and k[P.UPDATE_FN]["unique"] == 920

    ms = {P.GATHER_PY: 1.5, P.GRAD_OP: 0.5, P.UPDATE_OP: 1.2}
    nodes = {P.GATHER_PY: 1, P.GRAD_OP: 1, P.UPDATE_OP: 1}
    k = P.node_kernels(_wrapped(True, False), ms, nodes)
    assert k[P.GATHER_FN] == {"ms": 0.6, "calls": 1, "unique": 900, "keys": N_TABLES * ev.BATCH}
    assert k[P.UPDATE_FN] == {"ms": 1.2, "calls": 1, "unique": 950, "keys": N_TABLES * ev.BATCH}


_OP_TYPES = {P.GATHER_FN: "SparseflowGatherTables", P.GRAD_FN: "SparseflowSumTables",
             P.UPDATE_FN: "SparseflowUpdateTables"}


def _profile(gather_numpy: bool, update_numpy: bool) -> dict:
    """A profile as ``run_profile`` returns it, made up, with (d)'s gather and update of
    those kinds (the gradient a compiled op)."""
    model = {P.INPUT: 0.1, P.MODEL_FWD: 5.0, P.MODEL_BWD: 8.0, P.DENSE_ADAM: 1.0}
    d_cats = {**model, P.LOOKUP_FWD: 0.5, P.LOOKUP_BWD: 0.4, P.SPARSE_OTHER: 0.2}
    d_nodes = {c: 10 for c in d_cats}
    op_types = {}
    for fn, numpy_fn, node_ms in ((P.GATHER_FN, gather_numpy, 1.5), (P.GRAD_FN, False, 0.5),
                                  (P.UPDATE_FN, update_numpy, 3.0)):
        cat = P.NODE_CATEGORIES[fn][0 if numpy_fn else 1]
        d_cats[cat], d_nodes[cat] = node_ms, 1
        op_types[cat] = ["PyFunc"] if numpy_fn else [_OP_TYPES[fn]]
    wrapped = _wrapped(gather_numpy, update_numpy)
    md = {"extra_n": 0, "extra_ms": 0.0, "a_only_n": 0, "a_only_ms": 0.0, "shared_n": 100,
          "shared_ms": 14.0, "shared_a_ms": 13.5}
    prof = {"a_cats": model, "c_cats": {**model, P.SPARSE_OTHER: 2.0}, "d_cats": d_cats,
            "a_nodes": {c: 10 for c in model}, "c_nodes": {c: 10 for c in model},
            "d_nodes": d_nodes, "d_op_types": op_types, "kernels": wrapped,
            "node_kernels": P.node_kernels(wrapped, d_cats, d_nodes), "d_top": {},
            "a_traced_ms": 20.0, "c_traced_ms": 25.0, "d_traced_ms": 30.0, "traced_steps": 4,
            "a_ms": 18.0, "c_ms": 22.0, "d_ms": 26.0, "d_prefilled_ms": 24.0,
            "d_parallel_ms": 25.0, "a_wait": 0.01, "c_wait": 0.01, "d_wait": 0.02,
            "d_parallel_wait": 0.02, "source_ms": 0.5, "source_cpu_ms": 0.5,
            "pipeline_ms": 6.0, "pipeline_cpu_ms": 7.0, "pipeline_parallel_ms": 3.0,
            "pipeline_parallel_cpu_ms": 8.0, "d_model": md, "c_model": md, "rounds": {},
            "n_tables": N_TABLES, "cpus": 8}
    return prof


def _report(prof) -> tuple[str, str]:
    return e2e.render_profile(prof), e2e.render_findings(prof, {"per": {}, "ratios": {}}, 10**5)


def test_the_report_shows_a_compiled_gather_as_its_kernel_and_no_numpy_overhead_for_it():
    table, findings = _report(_profile(gather_numpy=False, update_numpy=True))
    assert "| `sparseflow_gather` compiled op (1 per step in (d)) | 0 | 0 | 1.50 |" in table
    assert "| `sparseflow_update` numpy function (1 per step in (d)) |" in table
    # The compiled gather: one row, its node as its kernel, the batch's rows; no call inside.
    assert ("| `sparseflow_gather` compiled op (`SparseflowGatherTables`), its kernel | 1 | "
            f"950 unique rows -> {N_TABLES * ev.BATCH:,} keys | 1.50 |") in table
    assert "expand_tables" not in table
    assert "| &nbsp;&nbsp;`KeyProcessor.release`" not in table
    assert "Not called in the traced steps: `KeyProcessor.release` (the compiled gather" in table
    # The numpy update: its calls inside and the rest of its node (3.0 - 2.0 - 0.3).
    assert "| &nbsp;&nbsp;`KeyProcessor.updated` | 26 |  | 0.30 |" in table
    assert "| &nbsp;&nbsp;rest of the node | | | 0.70 |" in table
    # The findings: the overhead is the update's alone, and names its Python only.
    assert ("numpy_function overhead: 0.70 ms beyond the timed calls inside the sparseflow "
            "numpy function (`sparseflow_update`; 1 node per step)") in findings
    assert "`gather_all`" not in findings
    assert "`apply` (`sparseflow/optimizers/base.py`)" in findings
    assert "the gather 1.50 (compiled op `SparseflowGatherTables`: its node; 950 unique" in findings
    assert "the lazy Adam update 2.00 (`_update_tables` in its numpy function;" in findings


def test_the_report_of_a_step_of_compiled_ops_only_claims_no_numpy_function():
    table, findings = _report(_profile(gather_numpy=False, update_numpy=False))
    assert "numpy function" not in table and "numpy_function" not in table
    assert "rest of the node" not in table
    assert "Not called in the traced steps: `KeyProcessor.release` (" in table
    assert "), `KeyProcessor.updated`." in table   # uncalled too, without a reason given
    assert "numpy_function" not in findings
    assert "No numpy function runs in the step: each node's time is its kernel's." in findings
    assert "the lazy Adam update 3.00 (compiled op `SparseflowUpdateTables`: its node;" in findings


def test_the_report_of_numpy_functions_shows_the_calls_inside_them():
    table, findings = _report(_profile(gather_numpy=True, update_numpy=True))
    assert "| `sparseflow_gather` numpy function (`PyFunc`) | 1 | | 1.50 |" in table
    assert (f"| &nbsp;&nbsp;`bk.expand_tables` | 1 | 900 unique rows -> "
            f"{N_TABLES * ev.BATCH:,} keys | 0.60 |") in table
    assert "| &nbsp;&nbsp;`KeyProcessor.release` | 26 |  | 0.10 |" in table
    assert "Not called" not in table
    # Both numpy functions' rest: 1.5 - 0.6 - 0.1 and 3.0 - 2.0 - 0.3.
    assert ("numpy_function overhead: 1.50 ms beyond the timed calls inside the sparseflow "
            "numpy functions (`sparseflow_gather`, `sparseflow_update`; 2 nodes per step)"
            ) in findings
    assert "`gather_all` (`sparseflow/lookup.py`) and `apply`" in findings
