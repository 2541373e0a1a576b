"""The YAML job's input against the Session API's: CPU and wall time per batch of the tf.data
pipeline alone, on e2e.py's workload.

On a 2-core machine the input pipeline's CPU is taken from the training step, so every
millisecond the YAML job's reader spends per batch beyond (d)'s in-memory source shows up in
``d_yaml/d`` (BENCHMARKS.md, end-to-end section). This isolates it: each run builds the
variant's graph (``e2e_variants.build_sparseflow`` for ``d``, ``build_yaml_job`` over a Parquet
copy of the same batches for ``d_yaml``) and fetches only its ``IteratorGetNext``, so the
pipeline (source, unpacking, the insert function's key processing) is all that runs. Each run
is a fresh process; the variants alternate.

``--baseline DIR`` also runs sparseflow (and e2e_variants) from another checkout in the same
rounds, to measure a change against the code before it:

    git worktree add /tmp/before COMMIT   # the commit before the change
    .venv/bin/python benchmarks/bench_job_input.py [--rounds 5] [--baseline /tmp/before] [--write]
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import report  # noqa: E402

VARIANTS = ("d", "d_yaml")
WARMUP, BATCHES = 5, 70
CAP = 1_000_000


def worker(variant: str, parquet: str, code: str) -> dict:
    """One process: ``BATCHES`` batches of ``variant``'s pipeline after ``WARMUP``, with
    sparseflow and the e2e modules from the checkout ``code``."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.path[:0] = [os.path.join(code, "benchmarks"), code]   # ahead of this script's folder
    import e2e_profile
    import e2e_variants as ev
    import tensorflow as tf

    import sparseflow
    if not sparseflow.__file__.startswith(code + os.sep):
        raise RuntimeError(f"sparseflow came from {sparseflow.__file__}, not {code}")

    tf.compat.v1.disable_eager_execution()
    data = ev.make_data(WARMUP + BATCHES + 8)
    if variant == "d":
        wall, cpu = e2e_profile.iterate_only(ev.build_sparseflow, data, CAP, WARMUP, BATCHES)
    else:
        if not os.path.exists(parquet):
            ev.write_parquet(data, parquet)
        wall, cpu = e2e_profile.iterate_only(ev.build_yaml_job, data, CAP, WARMUP, BATCHES,
                                             parquet=parquet)
    return {"wall_ms": wall, "cpu_ms": cpu}


def main() -> None:
    args = report.command_line(__doc__.splitlines()[0], worker, 3, rounds=5,
                               add_arguments=report.add_baseline_argument)
    if args is None:
        return
    codes = report.checkouts(ROOT, args.baseline)
    load_start, started = os.getloadavg()[0], time.monotonic()
    runs = {(c, v): [] for c in codes for v in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        parquet = os.path.join(tmp, "e2e.parquet")
        for r in range(args.rounds):
            for c, code in codes.items():
                for variant in (VARIANTS if r % 2 == 0 else VARIANTS[::-1]):
                    runs[c, variant].append(
                        report.checkout_result(__file__, [variant, parquet, code], code))
                    x = runs[c, variant][-1]
                    print(f"round {r + 1} {c} {variant}: wall {x['wall_ms']:.2f} ms, cpu "
                          f"{x['cpu_ms']:.2f} ms per batch", flush=True)
    rows, extras = [], []
    for c in codes:
        for v in VARIANTS:
            rs = runs[c, v]
            rows.append(f"| {c} | {v} | {statistics.median(r['cpu_ms'] for r in rs):.2f} | "
                        + ", ".join(f"{r['cpu_ms']:.2f}" for r in rs)
                        + f" | {statistics.median(r['wall_ms'] for r in rs):.2f} |")
        extra = [y["cpu_ms"] - x["cpu_ms"] for x, y in zip(runs[c, "d"], runs[c, "d_yaml"])]
        extras.append(f"| {c} | **{statistics.median(extra):+.2f}** | "
                      + ", ".join(f"{e:+.2f}" for e in extra) + " |")
    section = "\n".join([
        "## YAML job's input against the Session API's: CPU per batch",
        "",
        *report.baseline_header("bench_job_input.py", f"--rounds {args.rounds}",
                                args.baseline, started, load_start),
        "",
        "Workload: e2e.py's (d) and d_yaml graphs (26 Criteo-shaped tables, admission and "
        f"timestamps on, batch 4096), fetching only `IteratorGetNext`: the input pipeline "
        f"alone, {BATCHES} batches after {WARMUP}, each run a fresh process, alternating; "
        "CPU = the process's CPU time over all threads.",
        "",
        "| code | variant | CPU ms per batch (median) | per round | wall ms per batch (median) |",
        "|---|---|---:|---|---:|",
        *rows,
        "",
        "| code | the YAML job's input over (d)'s, CPU ms per batch (median) | per round |",
        "|---|---:|---|",
        *extras,
    ])
    report.publish(section, args.write)


if __name__ == "__main__":
    main()
