"""Runs several test programs one after another in one process (alone or as each of N ranks
under ``sparseflow launch``), so that the cases of one test pay for TensorFlow's import once
(~4 CPU-seconds a process, most of a small program's run) instead of once per case.

    python -m tests.workers.sequence SPEC.json

SPEC: a JSON list of runs, each ``{"label": str, "module": "tests.workers.x" | "path":
"/.../main.py", "argv": [str, ...], "env": {NAME: value or null}, "cwd": dir, "rename": {FILE:
NEW}}`` (``rename``: files of ``cwd`` moved after the run, so that the next program in the
same directory does not overwrite what the test reads; ``{rank}`` in a name is this
process's rank). Each run gets
what a process of its own would give the program: its argv, its environment (null: unset;
the whole environment as it was before the run comes back after it), its working
directory, a fresh default graph, ``__name__ == "__main__"``; a script's directory first on
``sys.path``, and the modules it imported from that directory dropped afterwards (the next
program imports its own ``config.py``); after it, what the process's exit would do: the
sessions it left alive deleted (their read-ahead threads stopped), then sparseflow
terminated. What a process does not reset is shared, so a sequence holds programs of one
kind (eager execution stays off once a program turns it off; TF2 programs under
``MultiWorkerMirroredStrategy`` cannot share a process at all: a second strategy reuses the
first one's collective instance keys).

After each run, ``SPEC.rank{r}.json`` maps the labels run so far to ``"ok"`` or the failed
run's traceback. Alone, a failed run does not stop the next (each case fails on its own).
As one of several ranks, a rank starts the next run only once every rank reported this
one (a run may read what the one before wrote on every rank, a checkpoint's shards), and a
failed run on any rank ends the process with status 1 (the other ranks would wait for its
collectives).
"""

import json
import os
import runpy
import sys
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

import sparseflow as sf  # noqa: E402
from sparseflow.distributed import ranks  # noqa: E402
from sparseflow.pipeline import exit_sessions  # noqa: E402

PEER_TIMEOUT_S = 600.0


def run_one(run: dict, rank: int = 0) -> None:
    """Runs one program of the sequence as described in the module docstring; raises what
    the program raised (a ``SystemExit`` with status 0 or None is a normal end)."""
    env = dict(os.environ)
    cwd, argv, path = os.getcwd(), sys.argv, list(sys.path)
    before = set(sys.modules)
    directory = os.path.dirname(os.path.abspath(run["path"])) if "path" in run else None
    try:
        for name, value in run.get("env", {}).items():
            _set_env(name, value)
        os.chdir(run.get("cwd", cwd))
        tf.compat.v1.reset_default_graph()
        try:
            if directory is None:
                sys.argv = [run["module"], *run.get("argv", [])]
                runpy.run_module(run["module"], run_name="__main__", alter_sys=True)
            else:
                sys.path.insert(0, directory)
                sys.argv = [run["path"], *run.get("argv", [])]
                runpy.run_path(run["path"], run_name="__main__")
        except SystemExit as end:
            if end.code not in (None, 0):
                raise
        for name, new in run.get("rename", {}).items():
            os.replace(name.format(rank=rank), new.format(rank=rank))
    finally:
        exit_sessions.delete_live_sessions()   # the order of the exit hooks
        sf.terminate_config_initializer()
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        sys.argv, sys.path[:] = argv, path
        if directory is not None:   # the program's own modules (config, model, ...)
            for name in set(sys.modules) - before:
                module_file = getattr(sys.modules[name], "__file__", None) or ""
                if os.path.abspath(module_file).startswith(directory + os.sep):
                    del sys.modules[name]


def _set_env(name: str, value) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = str(value)


def _peers_done(spec_path: str, label: str, size: int) -> bool:
    """Waits until every rank's status file lists ``label`` (up to PEER_TIMEOUT_S); returns
    whether every rank's run succeeded."""
    deadline = time.monotonic() + PEER_TIMEOUT_S
    pending = set(range(size))
    while pending and time.monotonic() < deadline:
        for rank in sorted(pending):
            try:
                with open(f"{spec_path}.rank{rank}.json") as f:
                    reported = json.load(f).get(label)
            except (FileNotFoundError, json.JSONDecodeError):
                reported = None
            if reported is not None and reported != "ok":
                return False
            if reported == "ok":
                pending.discard(rank)
        time.sleep(0.05)
    return not pending


def main(spec_path: str) -> int:
    """Runs the sequence in ``spec_path``; returns the process's exit status."""
    with open(spec_path) as f:
        runs = json.load(f)
    found = ranks.detect()
    status_path = f"{spec_path}.rank{found.rank}.json"
    status = {}
    for run in runs:
        try:
            run_one(run, found.rank)
            status[run["label"]] = "ok"
        except BaseException:   # noqa: BLE001 - reported per run, below
            status[run["label"]] = traceback.format_exc()
            print(f"sequence: run {run['label']!r} failed:\n{status[run['label']]}",
                  file=sys.stderr, flush=True)
        with open(status_path + ".tmp", "w") as f:
            json.dump(status, f)
        os.replace(status_path + ".tmp", status_path)
        if found.size > 1 and (status[run["label"]] != "ok"
                               or not _peers_done(spec_path, run["label"], found.size)):
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
