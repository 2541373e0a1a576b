"""What every benchmark shares: the machine it ran on, and its section of BENCHMARKS.md.

Benchmarks run as scripts (``python benchmarks/bench_x.py``), so they import this module as
``report``.
"""

from __future__ import annotations

import os
import pathlib
import platform
import re
import time
from typing import Any, NamedTuple

BENCHMARKS_MD = pathlib.Path(__file__).resolve().parent.parent / "BENCHMARKS.md"


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, or "unknown CPU"."""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def machine_line(**versions: str) -> str:
    """One line naming cores, CPU, Python and the given library versions."""
    parts = [f"{len(os.sched_getaffinity(0))} cores", cpu_model(),
             f"Python {platform.python_version()}"]
    parts += [f"{name} {version}" for name, version in versions.items()]
    return ", ".join(parts)


def replace_section(section: str, path: os.PathLike | str = BENCHMARKS_MD) -> None:
    """Writes ``section`` (starting with its ``## `` heading line) into ``path``
    (BENCHMARKS.md), replacing the section of the same heading or appending it."""
    path = pathlib.Path(path)
    heading = section.splitlines()[0]
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    pattern = re.compile(rf"^{re.escape(heading)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section.rstrip("\n") + "\n\n", text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n"
    path.write_text(text.rstrip("\n") + "\n")


def worker_result(script: str, worker_args: list, pythonpath: str, *, cwd: str | None = None,
                  **env: str) -> dict:
    """Runs ``python script --worker *worker_args`` in a fresh process and returns the JSON
    dict its last line of output prints.

    Args:
      script: the benchmark script.
      worker_args: what follows ``--worker``.
      pythonpath: ``PYTHONPATH`` of the process (the checkout whose sparseflow it imports).
      cwd: its working directory (None: this one's).
      **env: further environment variables.

    Raises:
      RuntimeError: the process failed (with the end of its standard error).
    """
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, os.path.abspath(script), "--worker",
                           *map(str, worker_args)], env=dict(os.environ, PYTHONPATH=pythonpath,
                                                             **env),
                          capture_output=True, text=True, cwd=cwd)
    if done.returncode != 0:
        raise RuntimeError(f"{os.path.basename(script)} --worker {' '.join(map(str, worker_args))}"
                           f" failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def checkout_result(script: str, worker_args: list, code: str) -> dict:
    """:func:`worker_result` of ``script`` with the checkout ``code``'s sparseflow: run from
    ``code``, with it on ``PYTHONPATH``, TensorFlow's logs quiet and no GPU (the runs of a
    ``--baseline`` benchmark)."""
    return worker_result(script, worker_args, code, cwd=code, TF_CPP_MIN_LOG_LEVEL="3",
                         CUDA_VISIBLE_DEVICES="")


def in_turn(codes: dict, round_index: int) -> list:
    """``codes``' ``(label, path)`` items in the order a round measures them: as given on
    even rounds, reversed on odd ones, so that neither checkout always runs first."""
    items = list(codes.items())
    return items if round_index % 2 == 0 else items[::-1]


def alternating_rounds(script: str, variants: tuple, args, rounds: int) -> dict:
    """Runs each variant of ``script`` once per round, each in its own process (``script
    --worker VARIANT --batch --warmup --steps``, printing a JSON dict as its last line),
    alternating which goes first; returns {variant: [dict per round]}. Every round of every
    variant must end on the same ``final_loss`` (same graph, same data), else RuntimeError."""
    import numpy as np

    root = os.path.dirname(os.path.dirname(os.path.abspath(script)))
    runs = {v: [] for v in variants}
    for r in range(rounds):
        for variant in (variants if r % 2 == 0 else variants[::-1]):
            runs[variant].append(worker_result(
                script, [variant, "--batch", args.batch, "--warmup", args.warmup, "--steps",
                         args.steps], root))
            print(f"round {r + 1} {variant}: {runs[variant][-1]['samples_per_s']:,.0f} "
                  f"samples/s (final loss {runs[variant][-1]['final_loss']:.6f})", flush=True)
    for results in zip(*runs.values()):
        losses = [x["final_loss"] for x in results]
        if not np.allclose(losses, losses[0], rtol=1e-5):
            raise RuntimeError(f"The variants trained differently: final losses "
                               f"{dict(zip(variants, losses))}.")
    return runs


def command_line(description: str, worker, worker_nargs: int, rounds: int,
                 add_arguments=None):
    """The command line of a benchmark whose runs are fresh processes of its own script:
    ``--rounds``, ``--write``, the hidden ``--worker ARG...`` (what :func:`worker_result`
    passes), and what ``add_arguments(parser)`` adds.

    Args:
      description: the ``--help`` text.
      worker: called as ``worker(*ARGS)`` under ``--worker``; returns a JSON-able dict.
      worker_nargs: how many ARGS ``--worker`` takes.
      rounds: the default ``--rounds``.
      add_arguments: None, or a function adding the benchmark's own arguments.

    Returns:
      The parsed arguments; None when this process was a worker (its result printed as
      one JSON line).

    Raises:
      SystemExit: ``--write`` with fewer than 3 rounds (the result is a median).
    """
    import argparse
    import json

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=rounds)
    if add_arguments is not None:
        add_arguments(parser)
    parser.add_argument("--write", action="store_true", help="record the BENCHMARKS.md section")
    parser.add_argument("--worker", nargs=worker_nargs, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(*args.worker)), flush=True)
        return None
    if args.write and args.rounds < 3:
        parser.error("--write needs --rounds >= 3 (the result is a median)")
    return args


def rounds_parser(description: str, variants: tuple):
    """The command line of a benchmark of ``variants`` run by :func:`alternating_rounds`:
    ``--rounds --steps --warmup --batch --write`` and the hidden ``--worker VARIANT``."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--write", action="store_true", help="record the BENCHMARKS.md section")
    parser.add_argument("--worker", choices=list(variants), help=argparse.SUPPRESS)
    return parser


def compare(runs: dict, numerator: str, denominator: str) -> dict:
    """The per-round and median throughput ratio ``numerator / denominator`` of
    :func:`alternating_rounds`' results, and the Markdown rows of a per-variant table
    (``| variant | samples/s (median) | per round | ms/step (median) |``).

    Returns:
      dict with ``ratios`` (per round), ``ratio`` (their median), ``per_round`` (text) and
      ``rows`` (text, one row per variant).
    """
    import statistics

    ratios = [a["samples_per_s"] / b["samples_per_s"]
              for a, b in zip(runs[numerator], runs[denominator])]
    rows = "\n".join(
        f"| {v} | {statistics.median(r['samples_per_s'] for r in runs[v]):,.0f} | "
        + ", ".join(f"{r['samples_per_s'] / 1e3:.1f}k" for r in runs[v])
        + f" | {statistics.median(r['ms_per_step'] for r in runs[v]):.1f} |"
        for v in (numerator, denominator))
    return {"ratios": ratios, "ratio": statistics.median(ratios),
            "per_round": ", ".join(f"{x:.3f}" for x in ratios), "rows": rows}


def ratio_main(script: str, description: str, numerator: str, denominator: str, worker):
    """The whole command line of a benchmark of two variants and their throughput ratio:
    parses ``rounds_parser``'s arguments; as ``--worker VARIANT`` prints ``worker(variant,
    batch, warmup, steps)`` as JSON and returns None; otherwise runs the rounds
    (``alternating_rounds``) and returns what the caller reports.

    Returns:
      None (a worker), or dict with ``args``, ``result`` (:func:`compare`'s), ``header``
      (the section's Command and Machine lines) for the caller's BENCHMARKS.md section.

    Raises:
      SystemExit: ``--write`` with fewer than 3 rounds (the result is a median).
    """
    import json
    import time

    import numpy as np
    import tensorflow as tf

    variants = (numerator, denominator)
    parser = rounds_parser(description, variants)
    args = parser.parse_args()
    if args.rounds < 3 and args.write:
        parser.error("--write needs --rounds >= 3 (the result is a median)")
    if args.worker:
        print(json.dumps(worker(args.worker, args.batch, args.warmup, args.steps)))
        return None
    load_start, started = os.getloadavg()[0], time.monotonic()
    runs = alternating_rounds(script, variants, args, args.rounds)
    minutes = (time.monotonic() - started) / 60
    name = os.path.basename(script)
    header = (f"Command: `.venv/bin/python benchmarks/{name} --rounds {args.rounds} --steps "
              f"{args.steps} --write` ({minutes:.0f} min: {args.rounds} rounds, each variant "
              f"in its own process, the order alternating; without `--write` it only "
              f"prints).\n\nMachine: {machine_line(TF=tf.__version__, numpy=np.__version__)}. "
              f"Load average {load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the "
              f"end (other jobs share the machine).")
    return {"args": args, "result": compare(runs, numerator, denominator), "header": header}


def add_baseline_argument(parser) -> None:
    """Adds ``--baseline DIR``: another checkout measured in the same rounds."""
    parser.add_argument("--baseline", help="another checkout (e.g. the commit before a "
                        "change), measured in the same rounds")


def checkouts(root: str, baseline: str | None) -> dict:
    """``{label: path}`` of the checkouts a ``--baseline`` benchmark measures: ``root`` as
    "this checkout", then ``baseline`` (if given) labelled with its short commit."""
    import subprocess

    codes = {"this checkout": root}
    if baseline:
        done = subprocess.run(["git", "-C", baseline, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True)
        codes[f"baseline ({done.stdout.strip() or baseline})"] = os.path.abspath(baseline)
    return codes


def baseline_header(script: str, flags: str, baseline: str | None, started: float,
                    load_start: float) -> list[str]:
    """The Command and Machine lines of a ``--baseline`` benchmark's section: the command
    (``flags``, then ``--baseline DIR`` when one was measured), its minutes since
    ``started`` (``time.monotonic()``), and the load average at the start and now."""
    import numpy as np
    import tensorflow as tf

    with_baseline = " --baseline DIR" if baseline else ""
    return [
        f"Command: `.venv/bin/python benchmarks/{script} {flags}{with_baseline} --write` "
        f"({(time.monotonic() - started) / 60:.0f} min; `--baseline DIR` also measures "
        "another checkout in the same rounds, e.g. a `git worktree` of the commit before a "
        "change).",
        "",
        f"Machine: {machine_line(TF=tf.__version__, numpy=np.__version__)}. Load average "
        f"{load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end.",
    ]


def publish(section: str, write: bool) -> None:
    """Prints a benchmark's BENCHMARKS.md section and, with ``write``, replaces it there."""
    print(section)
    if write:
        replace_section(section)


def rss_mb() -> float:
    """This process's resident memory, MB (``VmRSS``); NaN where /proc does not say."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def listed(values) -> str:
    """Per-round values as the reports print them: ``0.81, 0.84, 0.79``."""
    return ", ".join(f"{v:.2f}" for v in values)


class TimedSteps(NamedTuple):
    """``timed_steps``' result: wall and process CPU seconds of the timed runs, their count, and
    the last run's value."""
    seconds: float
    cpu_seconds: float
    steps: int
    last: Any


def timed_steps(sess, fetch, warmup: int, steps: int) -> TimedSteps:
    """Runs ``sess.run(fetch)`` ``warmup`` times, then ``steps`` times timed.

    Every run asks for the same fetches: a Session builds executors (grappler over the whole
    graph) for each new set of fetches, so a timed window whose last run adds the loss would
    time that build too.

    Raises:
      ValueError: ``steps`` is below 1.
    """
    if steps < 1:
        raise ValueError(f"steps must be at least 1 (got {steps}): the timed runs")
    for _ in range(warmup):
        sess.run(fetch)
    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(steps):
        last = sess.run(fetch)
    return TimedSteps(time.perf_counter() - start, time.process_time() - cpu_start, steps, last)
