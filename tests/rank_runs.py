"""Running a test program as one process or as N ranks under ``sparseflow launch``."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_ranks(args: list, ranks: int | None, timeout: float = 300.0, check: bool = True,
              grace: float = 5.0, **extra_env) -> subprocess.CompletedProcess:
    """Runs ``python -m args...`` alone (``ranks`` None) or on ``ranks`` local ranks, in a
    clean rank environment (no inherited TF_CONFIG or launcher variables); with ``check``,
    asserts it succeeded, showing the end of its output. ``grace``: how long the launcher
    lets the other ranks run after one failed."""
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3", **extra_env)
    for name in ("TF_CONFIG", "SPARSEFLOW_RANK", "SPARSEFLOW_WORLD_SIZE"):
        env.pop(name, None)
    command = ([sys.executable, "-m", "sparseflow", "launch", "-n", str(ranks), "--grace",
                f"{grace:g}", "-m"] if ranks else [sys.executable, "-m"]) + [str(a) for a in args]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
    if check:
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return done


def run_sequence(runs: list, ranks: int | None, spec_dir, timeout: float | None = None,
                 **extra_env) -> dict:
    """Runs the programs ``runs`` (``tests.workers.sequence``'s runs) one after another in one
    process (``ranks`` None) or in each of ``ranks`` ranks: a test's cases pay for one
    process start, not one each. Writes the spec in ``spec_dir`` (made if missing).
    ``timeout``: for the whole sequence; default 300 s a run.

    Returns:
      label -> ``"ok"``, or the failed run's traceback (every failed rank's); a run that
      never ran (after a failure over ranks, or a crash), or every run when the process
      exited with an error though no run failed, maps to a message saying so with the end
      of the process's output. See :func:`require_ok`.

    Raises:
      subprocess.TimeoutExpired: the sequence ran past ``timeout``.
    """
    os.makedirs(spec_dir, exist_ok=True)
    spec = os.path.join(str(spec_dir), "sequence.json")
    with open(spec, "w") as f:
        json.dump([dict(run, cwd=str(run.get("cwd", spec_dir)),
                        argv=[str(a) for a in run.get("argv", [])]) for run in runs], f)
    done = run_ranks(["tests.workers.sequence", spec], ranks, check=False,
                     timeout=timeout or 300.0 * len(runs), **extra_env)
    statuses = {}
    for rank in range(ranks or 1):
        try:
            with open(f"{spec}.rank{rank}.json") as f:
                statuses[rank] = json.load(f)
        except FileNotFoundError:
            statuses[rank] = {}
    tail = f"\n--- the sequence's output ---\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    result, failure = {}, None
    for run in runs:
        label = run["label"]
        found = [s[label] for s in statuses.values() if label in s]
        bad = [f"rank {r}: {s[label]}" if ranks else s[label]
               for r, s in statuses.items() if s.get(label, "ok") != "ok"]
        if bad:   # every rank's own error: the first may be a peer's lost collective
            result[label] = "\n".join(bad)
            failure = failure or result[label]
        elif len(found) < len(statuses):   # after a failure over ranks, or a crash
            result[label] = (f"DID NOT RUN: {label}; the first failure:\n{failure or ''}"
                             f"{tail}")
        else:
            result[label] = "ok"
    if done.returncode != 0 and all(v == "ok" for v in result.values()):   # at its exit
        result = {label: f"EXITED {done.returncode} after the runs: {label}{tail}"
                  for label in result}
    return result


def read_json(statuses: dict, label: str, path) -> dict:
    """The JSON file ``path`` that run ``label`` wrote; fails the calling test with the
    run's error when :func:`run_sequence` did not report it ``"ok"``."""
    require_ok(statuses, label)
    with open(path) as f:
        return json.load(f)


def require_ok(statuses: dict, label: str) -> None:
    """Fails the calling test with run ``label``'s error unless :func:`run_sequence` reported
    it ``"ok"``."""
    if statuses[label] != "ok":
        pytest.fail(f"{label} failed:\n{statuses[label]}")
