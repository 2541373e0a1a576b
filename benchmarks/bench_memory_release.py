"""Memory a process keeps after each finished run: e2e.py's (d) built, trained and terminated
several times in one process.

A run's tables (index, last-seen times, marks, row storage) should go when the program drops
them. This builds (d)'s graph (26 Criteo-shaped tables, Session, lazy Adam), trains a few
steps, terminates the runtime and drops the graph, ``--cycles`` times in one fresh process,
and reads the process's resident memory after each cycle (after a garbage collection). The
growth from the second cycle's to the last's, per cycle, is what each run left behind (the
first run's growth is also TensorFlow's and the allocator's first-use caches).
``--baseline DIR`` measures another checkout in the same rounds (e.g. a ``git worktree`` of
the commit before a change).

Command: ``.venv/bin/python benchmarks/bench_memory_release.py --rounds 3 [--baseline DIR]
[--write]``
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import report  # noqa: E402

CAP = 1_000_000
WARMUP, STEPS = 3, 10


def worker(code: str, cycles: str) -> dict:
    """One process: ``cycles`` runs of (d) with sparseflow from the checkout ``code``; the
    resident memory (MB) after each."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.path[:0] = [os.path.join(code, "benchmarks"), code]
    import e2e_variants as ev
    import tensorflow as tf

    import sparseflow
    if not sparseflow.__file__.startswith(code + os.sep):
        raise RuntimeError(f"sparseflow came from {sparseflow.__file__}, not {code}")
    tf.compat.v1.disable_eager_execution()
    data = ev.make_data(WARMUP + STEPS + 8)
    rss = []
    for _ in range(int(cycles)):
        ev.run_graph(ev.build_sparseflow, data, CAP, WARMUP, STEPS, trace_every=0)
        gc.collect()
        rss.append(report.rss_mb())
    return {"rss_mb": rss}


def main() -> None:
    def add_arguments(parser):
        report.add_baseline_argument(parser)
        parser.add_argument("--cycles", type=int, default=5, help="runs per process (>= 3)")

    args = report.command_line(__doc__.splitlines()[0], worker, 2, rounds=3,
                               add_arguments=add_arguments)
    if args is None:
        return
    if args.cycles < 3:
        raise SystemExit("--cycles must be >= 3")
    codes = report.checkouts(ROOT, args.baseline)
    load_start, started = os.getloadavg()[0], time.monotonic()
    runs = {c: [] for c in codes}
    for r in range(args.rounds):
        for c, code in report.in_turn(codes, r):
            rss = report.checkout_result(__file__, [code, args.cycles], code)["rss_mb"]
            runs[c].append(rss)
            print(f"round {r + 1} {c}: RSS after each run " + ", ".join(f"{x:.0f}" for x in rss)
                  + " MB", flush=True)
    rows = []
    for c, rounds in runs.items():
        growth = [(rss[-1] - rss[1]) / (len(rss) - 2) for rss in rounds]
        rows.append(f"| {c} | **{statistics.median(growth):+.0f}** | "
                    + ", ".join(f"{g:+.0f}" for g in growth) + " | "
                    + "; ".join(", ".join(f"{x:.0f}" for x in rss) for rss in rounds) + " |")
    section = "\n".join([
        "## Memory kept after each finished run",
        "",
        *report.baseline_header("bench_memory_release.py",
                                f"--rounds {args.rounds} --cycles {args.cycles}",
                                args.baseline, started, load_start),
        "",
        f"Workload: e2e.py's (d) (26 Criteo-shaped tables of min(cardinality, {CAP:,}) rows, "
        f"Session, lazy Adam, reserved row memory), {WARMUP} + {STEPS} steps, then "
        f"`terminate_config_initializer()` and the graph dropped; {args.cycles} such runs "
        "in one fresh process per round, the resident memory read after each (after "
        "`gc.collect()`). Kept per run: the growth from the second run's to the last's, "
        "per run (the first run's also holds TensorFlow's and the allocator's first-use "
        "caches).",
        "",
        "| code | resident memory kept per run, MB (median) | per round | RSS after each "
        "run, MB, per round |",
        "|---|---:|---|---|",
        *rows,
    ])
    report.publish(section, args.write)


if __name__ == "__main__":
    main()
