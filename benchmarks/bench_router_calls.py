"""The multi-rank key router's calls, one by one: microseconds per call of
``KeyRouter.route``, ``process``, ``gather`` and ``update`` on one rank of 2.

Two workloads: ``layer``, one table of 2,048 Zipf keys (one Keras layer's share of
``bench_ranks.py``'s global batch of 4,096 on a rank: the Keras face calls each of the four
once per layer and step), and ``embedding``, 26 such tables in one router (one ``tf2.Embedding``
or Session-face step). The other rank is simulated: it sends what this one sends, so the
owner receives every key twice. The router is called directly, with no TensorFlow around it;
each workload runs in a fresh process, ``--rounds`` times, alternating.

``--baseline DIR`` also measures another checkout in the same rounds:

    git worktree add /tmp/before COMMIT   # the commit before the change
    .venv/bin/python benchmarks/bench_router_calls.py [--rounds 5] [--baseline /tmp/before]
        [--write]
"""

from __future__ import annotations

import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import report  # noqa: E402

WORKLOADS = {"layer": 1, "embedding": 26}   # tables
KEYS, RANKS, WARMUP, CALLS = 2048, 2, 50, 300
STAGES = ("route", "process", "gather", "update")


def worker(workload: str, code: str) -> dict:
    """One process: ``CALLS`` steps of the router's four calls after ``WARMUP``, with
    sparseflow from the checkout ``code``; microseconds per call of each."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.path.insert(0, code)
    import numpy as np
    import tensorflow as tf

    import sparseflow
    from sparseflow import tf2
    from sparseflow.distributed.routing import KeyRouter

    if not sparseflow.__file__.startswith(code + os.sep):
        raise RuntimeError(f"sparseflow came from {sparseflow.__file__}, not {code}")
    n_tables = WORKLOADS[workload]
    init = tf.compat.v1.truncated_normal_initializer(stddev=0.05)
    embedding = tf2.Embedding({f"f{t}": tf2.FeatureConfig(tf2.TableConfig(
        200_000, 16, init, combiner="sum", name=f"t{t}")) for t in range(n_tables)},
        tf2.Adam(0.01))
    tables = list(embedding.tables.values())
    router = KeyRouter(tables, list(range(n_tables)), [1] * n_tables, RANKS)
    rng = np.random.default_rng(0)
    steps = [[(rng.zipf(1.2, KEYS) % 1_000_003).astype(np.int64) for _ in range(n_tables)]
             for _ in range(WARMUP + CALLS)]

    def step(keys):
        send, counts, *_ = router.route(keys)
        received = np.stack([send[0]] * RANKS)   # every rank sent this rank what it sends
        token = router.process(received, np.stack([counts[0]] * RANKS), None, True)
        reply = router.gather(token)
        router.update(token, np.zeros_like(reply))

    for keys in steps[:WARMUP]:
        step(keys)
    router.seconds = {stage: 0.0 for stage in router.seconds}
    begin = time.perf_counter()
    for keys in steps[WARMUP:]:
        step(keys)
    total = time.perf_counter() - begin
    out = {stage: 1e6 * router.seconds[stage] / CALLS for stage in STAGES}
    out["step"] = 1e6 * total / CALLS
    return out


def main() -> None:
    args = report.command_line(__doc__.splitlines()[0], worker, 2, rounds=5,
                               add_arguments=report.add_baseline_argument)
    if args is None:
        return
    codes = report.checkouts(ROOT, args.baseline)
    load_start, started = os.getloadavg()[0], time.monotonic()
    runs = {(c, w): [] for c in codes for w in WORKLOADS}
    for r in range(args.rounds):
        for c, code in report.in_turn(codes, r):
            for workload in WORKLOADS:
                runs[c, workload].append(report.checkout_result(__file__, [workload, code],
                                                                code))
                x = runs[c, workload][-1]
                print(f"round {r + 1} {c} {workload}: " + ", ".join(
                    f"{s} {x[s]:.0f} us" for s in (*STAGES, "step")), flush=True)
    rows = []
    for w in WORKLOADS:
        for c in codes:
            med = {s: statistics.median(x[s] for x in runs[c, w]) for s in (*STAGES, "step")}
            rows.append(f"| {w} | {c} | " + " | ".join(f"{med[s]:.0f}" for s in STAGES)
                        + f" | {med['step']:.0f} |")
    ratios = []
    if len(codes) == 2:
        this, base = codes
        for w in WORKLOADS:
            per = {s: [b[s] / t[s] for t, b in zip(runs[this, w], runs[base, w])]
                   for s in (*STAGES, "step")}
            ratios.append(f"| {w} | " + " | ".join(
                f"{statistics.median(per[s]):.2f}" for s in STAGES)
                + f" | **{statistics.median(per['step']):.2f}** |")
    section = [
        "## Key router calls, one by one (multi-rank owner and sender)",
        "",
        *report.baseline_header("bench_router_calls.py", f"--rounds {args.rounds}",
                                args.baseline, started, load_start),
        "",
        f"Workload: `KeyRouter` called directly on one rank of {RANKS} (the other rank "
        f"simulated: it sends what this one sends): `layer` is one table of {KEYS:,} Zipf "
        "keys (one Keras layer's share of `bench_ranks.py`'s global batch on a rank), "
        f"`embedding` is 26 such tables in one router. {CALLS} steps after {WARMUP}, each "
        "workload a fresh process, median over rounds. Microseconds per call:",
        "",
        "| workload | code | route | process | gather | update | all four |",
        "|---|---|---:|---:|---:|---:|---:|",
        *rows,
    ]
    if ratios:
        section += [
            "",
            "Baseline / this checkout, per round, median (above 1: this checkout is faster):",
            "",
            "| workload | route | process | gather | update | all four |",
            "|---|---:|---:|---:|---:|---:|",
            *ratios,
        ]
    report.publish("\n".join(section), args.write)


if __name__ == "__main__":
    main()
