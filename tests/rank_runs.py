"""Running a test program as one process or as N ranks under ``sparseflow launch``."""

import os
import subprocess
import sys

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
