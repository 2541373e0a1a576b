"""The cost of the Python boundary: one kernel as a numpy function and as a compiled op.

The same numba kernel as a ``tf.numpy_function`` and as a compiled op (registered through
TensorFlow's C API), in a Session graph. Two workloads (``--workload``):

- ``sum``: one batch's gradient sum (``sparseflow.ops.batch_ops.sum_tables``) in the e2e
  step's shape (below);
- ``route``: one Keras layer's routing of its ids on 2 ranks (``ops/route_ops.py``): one
  table, 2,048 Zipf keys (a rank's half of the ranks benchmark's global batch of 4,096),
  ``KeyRouter.route`` in a numpy function (what ``tf2/sharding.py`` ran before) against
  ``SparseflowRouteKeys``.

The ``sum`` workload: the e2e step's shape (``benchmarks/e2e.py``): 26 tables, one single-hot feature
each, 4096 keys per feature, ~1,100 unique rows per table, dim 16. Each Session.run executes
``--chain`` sums one after another (control dependencies), so a call's time is the run's over
the chain, without Session.run's own cost. Both forms run twice per round, interleaved:

- alone: nothing else runs in the process;
- beside Python: a thread runs pure Python throughout (as the input pipeline's numpy
  function does between its kernels), so a numpy function must win the GIL to start and to
  return, while the compiled op never takes it.

The numpy function form is what ``sparseflow/lookup.py`` ran before the compiled op: the
same kernel (``batch_kernels.sum_tables``) into an aligned output. Both forms' sums are
checked equal before anything is timed.

Run: .venv/bin/python benchmarks/bench_op_boundary.py [--workload sum|route] [--rounds N]
[--write]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from report import machine_line, replace_section  # noqa: E402

from sparseflow import tensor_buffers  # noqa: E402
from sparseflow.ops import batch_kernels as bk  # noqa: E402
from sparseflow.ops import batch_ops  # noqa: E402

N_TABLES, KEYS, UNIQUE, DIM = 26, 4096, 1100, 16


def _batch(rng):
    """The flat parts (each table's unique rows, then each feature's restore vector), their
    sizes, the members' layout and one gradient per feature."""
    rows = [np.arange(UNIQUE, dtype=np.int32) for _ in range(N_TABLES)]
    restores = [rng.integers(0, UNIQUE, KEYS).astype(np.int32) for _ in range(N_TABLES)]
    parts = rows + restores
    flat = np.concatenate(parts)
    sizes = np.array([p.shape[0] for p in parts], np.int32)
    member_rows = np.arange(N_TABLES, dtype=np.int64)
    member_restore = np.arange(N_TABLES, 2 * N_TABLES, dtype=np.int64)
    grads = [rng.normal(size=(KEYS, DIM)).astype(np.float32) for _ in range(N_TABLES)]
    return flat, sizes, member_rows, member_restore, len(parts), grads


def _numpy_sum(member_rows, member_restore, n_parts):
    def total(flat, sizes, *grads):
        starts, ends = bk.part_bounds(sizes, n_parts)
        out = tensor_buffers.zeros((int(sum(sizes[w] for w in member_rows)), DIM), np.float32)
        bk.sum_tables(bk.as_tuple(np.asarray(g, np.float32) for g in grads), flat, starts,
                      ends, member_rows, member_restore, out)
        return out
    return total


def _sum_forms(batch):
    """The ``sum`` workload: its inputs as arrays, and the two forms, each a function of
    the inputs' tensors returning the output tensor."""
    flat, sizes, member_rows, member_restore, n_parts, grads = batch
    total = _numpy_sum(member_rows, member_restore, n_parts)

    def op(flat_t, sizes_t, *grad_ts):
        return batch_ops.sum_tables(flat_t, sizes_t, member_rows, member_restore, n_parts,
                                    list(grad_ts))

    def numpy_function(flat_t, sizes_t, *grad_ts):
        return tf.numpy_function(total, [flat_t, sizes_t, *grad_ts], tf.float32,
                                 stateful=True)

    return [flat, sizes, *grads], {"op": op, "numpy_function": numpy_function}


ROUTE_KEYS, ROUTE_RANKS = 2048, 2


def _route_forms(rng):
    """The ``route`` workload: one table's keys, and the two forms (outputs: the send
    buffer; the op's other outputs are checked equal too, by :func:`_route_check`)."""
    from sparseflow import tf2
    from sparseflow.distributed.routing import KeyRouter
    from sparseflow.ops import route_ops

    embedding = tf2.Embedding({"ids": tf2.FeatureConfig(tf2.TableConfig(
        200_000, DIM, tf.compat.v1.truncated_normal_initializer(stddev=0.05), name="t"))},
        tf2.Adam(0.01))
    # As tf2/sharding.py builds it: its next rows are made resident in process, not route.
    router = KeyRouter(list(embedding.tables.values()), [0], [1], ROUTE_RANKS,
                       commit_in_process=True)
    config = router.route_config()
    keys = (rng.zipf(1.2, ROUTE_KEYS) % 1_000_003).astype(np.int64)

    def op(keys_t):
        return route_ops.route_keys_op(config, [keys_t])

    def numpy_function(keys_t):
        return tf.numpy_function(lambda k: router.route([k]), [keys_t],
                                 [tf.int64, tf.int32, tf.int32, tf.int32, tf.int64],
                                 stateful=True)

    _route_forms.keep = embedding   # the router's tables live as long as the graphs
    return [keys], {"op": op, "numpy_function": numpy_function}


WORKLOADS = {"sum": lambda rng: _sum_forms(_batch(rng)), "route": _route_forms}


def build(form, inputs: list, chain: int):
    """A graph whose one fetch runs ``chain`` calls of ``form`` one after another; returns
    (graph, fetch, the last call's outputs)."""
    graph = tf.Graph()
    with graph.as_default():
        # Variables, not constants: Grappler would fold a stateless op over constants into
        # a constant before the first run (the training step's inputs come from its batch).
        tensors = [tf.Variable(x).read_value() for x in inputs]
        previous = []
        outs = []
        for _ in range(chain):
            with tf.control_dependencies(tf.nest.flatten(previous)):
                out = form(*tensors)
            previous = out
            outs.append(out)
        fetch = tf.group(tf.nest.flatten(outs))
    return graph, fetch, outs[-1]


class PythonBeside:
    """A thread running pure Python (holding the GIL between the interpreter's switches)
    while the block runs."""

    def __enter__(self):
        self._stop = False

        def spin():
            x = 0
            while not self._stop:
                x += 1
        self._thread = threading.Thread(target=spin, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop = True
        self._thread.join()


def per_call_us(session, fetch, chain: int, runs: int) -> float:
    session.run(fetch)   # warm-up: first allocations, numba dispatch
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        session.run(fetch)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / chain * 1e6


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="sum")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--chain", type=int, default=20)
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("--write", action="store_true", help="write BENCHMARKS.md's section")
    a = p.parse_args(argv)
    inputs, forms = WORKLOADS[a.workload](np.random.default_rng(0))
    built = {kind: build(forms[kind], inputs, a.chain) for kind in ("numpy_function", "op")}
    sessions = {}
    # Without Grappler: its dependency optimizer drops a chain of stateless ops whose
    # outputs nothing reads (the training step's sums feed the update).
    config = tf.compat.v1.ConfigProto()
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    for kind, (graph, _, _) in built.items():
        sessions[kind] = tf.compat.v1.Session(graph=graph, config=config)
        with graph.as_default():
            sessions[kind].run(tf.compat.v1.global_variables_initializer())
    ref, got = (sessions[k].run(built[k][2]) for k in ("numpy_function", "op"))
    for r, g in zip(tf.nest.flatten(ref), tf.nest.flatten(got), strict=True):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)

    results = {(kind, beside): [] for kind in built for beside in (False, True)}
    for r in range(a.rounds):
        for beside in (False, True):
            for kind in ("numpy_function", "op"):
                _, fetch, _ = built[kind]
                if beside:
                    with PythonBeside():
                        us = per_call_us(sessions[kind], fetch, a.chain, a.runs)
                else:
                    us = per_call_us(sessions[kind], fetch, a.chain, a.runs)
                results[(kind, beside)].append(us)
        print(f"round {r + 1}: " + ", ".join(
            f"{k}{' beside Python' if b else ''} {v[-1]:.0f} us"
            for (k, b), v in results.items()), flush=True)
    med = {key: statistics.median(v) for key, v in results.items()}
    ratio = {b: statistics.median(n / o for n, o in zip(results[("numpy_function", b)],
                                                        results[("op", b)]))
             for b in (False, True)}
    lines = [*_intro(a), "",
        f"Machine: {machine_line(tensorflow=tf.__version__, numpy=np.__version__)}. Load "
        f"average at the end: {os.getloadavg()[0]:.2f}.",
        "",
        f"Per call: a Session.run of {a.chain} chained calls over {a.chain}, median of "
        f"{a.runs} runs, then the median over {a.rounds} interleaved rounds; \"beside "
        "Python\" runs a thread of pure Python throughout, as the input pipeline's numpy "
        "function runs Python between its kernels.",
        "",
        "| form | alone, us per call | beside Python, us per call |",
        "|---|---:|---:|",
        f"| `tf.numpy_function` | {med[('numpy_function', False)]:.0f} | "
        f"{med[('numpy_function', True)]:.0f} |",
        f"| compiled op | {med[('op', False)]:.0f} | {med[('op', True)]:.0f} |",
        f"| numpy function / compiled op (median of the rounds' ratios) | "
        f"**{ratio[False]:.2f}** | **{ratio[True]:.2f}** |",
        "",
        "Per round (us per call, numpy function / op): " + "; ".join(
            f"{n:.0f}/{o:.0f} alone, {nb:.0f}/{ob:.0f} beside" for n, o, nb, ob in zip(
                results[("numpy_function", False)], results[("op", False)],
                results[("numpy_function", True)], results[("op", True)])) + ".",
    ]
    text = "\n".join(lines)
    print(text)
    if a.write:
        replace_section(text)
    return 0


def _intro(a) -> list:
    """The section's heading, command and workload."""
    if a.workload == "sum":
        return [
            "## Compiled op against numpy function: the gradient sum's boundary", "",
            "Command: `.venv/bin/python benchmarks/bench_op_boundary.py --write` (about a "
            "minute).", "",
            f"One batch's gradient sum in the e2e step's shape ({N_TABLES} tables, {KEYS} keys "
            f"per feature, {UNIQUE} unique rows per table, dim {DIM}): the same numba kernel "
            "(`batch_kernels.sum_tables`) as a `tf.numpy_function` (what `sparseflow/lookup.py` "
            "ran before) and as the compiled op `SparseflowSumTables` (`ops/batch_ops.py`, "
            "registered through TensorFlow's C API, `ops/tf_capi.py`)."]
    return [
        "## Compiled op against numpy function: the TF2 faces' routing", "",
        "Command: `.venv/bin/python benchmarks/bench_op_boundary.py --workload route "
        "--write` (under a minute).", "",
        f"One Keras layer's routing of its ids on {ROUTE_RANKS} ranks (one table, "
        f"{ROUTE_KEYS:,} Zipf keys: a rank's half of `bench_ranks.py`'s global batch): the "
        "same kernel (`shard_kernels.route_keys`) as `KeyRouter.route` in a "
        "`tf.numpy_function` (what `tf2/sharding.py` ran before) and as the compiled op "
        "`SparseflowRouteKeys` (`ops/route_ops.py`); every output checked equal first."]


if __name__ == "__main__":
    sys.exit(main())
