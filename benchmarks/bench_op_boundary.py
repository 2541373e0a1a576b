"""The cost of the Python boundary: one batch's gradient sum as a ``tf.numpy_function``
against the same sum as a compiled op (``sparseflow.ops.batch_ops.sum_tables``, a numba
kernel registered through TensorFlow's C API), in a Session graph.

Workload: the e2e step's shape (``benchmarks/e2e.py``): 26 tables, one single-hot feature
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

Run: .venv/bin/python benchmarks/bench_op_boundary.py [--rounds N] [--write]
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


def build(kind: str, batch, chain: int):
    """A graph whose one fetch runs ``chain`` sums of ``kind`` ("numpy_function" or "op")
    one after another; returns (graph, fetch, the last sum)."""
    flat, sizes, member_rows, member_restore, n_parts, grads = batch
    graph = tf.Graph()
    with graph.as_default():
        # Variables, not constants: Grappler would fold a stateless op over constants into
        # a constant before the first run (the training step's inputs come from its batch).
        flat_t, sizes_t = (tf.Variable(x).read_value() for x in (flat, sizes))
        grad_ts = [tf.Variable(g).read_value() for g in grads]
        total = _numpy_sum(member_rows, member_restore, n_parts)
        previous = None
        outs = []
        for _ in range(chain):
            with tf.control_dependencies([previous] if previous is not None else []):
                if kind == "op":
                    out = batch_ops.sum_tables(flat_t, sizes_t, member_rows, member_restore,
                                               n_parts, grad_ts)
                else:
                    out = tf.numpy_function(total, [flat_t, sizes_t, *grad_ts], tf.float32,
                                            stateful=True)
            previous = out
            outs.append(out)
        fetch = tf.group(outs)
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
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--chain", type=int, default=20)
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("--write", action="store_true", help="write BENCHMARKS.md's section")
    a = p.parse_args(argv)
    batch = _batch(np.random.default_rng(0))
    built = {kind: build(kind, batch, a.chain) for kind in ("numpy_function", "op")}
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
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)

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
    lines = [
        "## Compiled op against numpy function: the gradient sum's boundary",
        "",
        "Command: `.venv/bin/python benchmarks/bench_op_boundary.py --write` (about a minute).",
        "",
        f"Machine: {machine_line(tensorflow=tf.__version__, numpy=np.__version__)}. Load "
        f"average at the end: {os.getloadavg()[0]:.2f}.",
        "",
        (f"One batch's gradient sum in the e2e step's shape ({N_TABLES} tables, {KEYS} keys "
         f"per feature, {UNIQUE} unique rows per table, dim {DIM}): the same numba kernel "
         "(`batch_kernels.sum_tables`) as a `tf.numpy_function` (what `sparseflow/lookup.py` "
         "ran before) and as the compiled op `SparseflowSumTables` (`ops/batch_ops.py`, "
         "registered through TensorFlow's C API, `ops/tf_capi.py`). Per call: a Session.run "
         f"of {a.chain} chained calls over {a.chain}, median of {a.runs} runs, then the "
         f"median over {a.rounds} interleaved rounds; \"beside Python\" runs a thread of pure "
         "Python throughout, as the input pipeline's numpy function runs Python between its "
         "kernels."),
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


if __name__ == "__main__":
    sys.exit(main())
