"""``sparseflow launch -n N script.py``: ranks told by environment, output prefixed by rank,
every rank ended when one fails, and sparseflow's one-process faces refusing to run as one
of several ranks."""

import os
import subprocess
import sys
import textwrap
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")


def launch(tmp_path, body, *args, n=2, grace=None, timeout=120):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    cmd = [sys.executable, "-m", "sparseflow", "launch", "-n", str(n)]
    if grace is not None:
        cmd += ["--grace", str(grace)]
    return subprocess.run(cmd + [str(script), *args], capture_output=True, text=True, env=ENV,
                          cwd=str(tmp_path), timeout=timeout)


def test_each_rank_is_told_its_place_and_its_output_is_prefixed(tmp_path):
    done = launch(tmp_path, """
        import json, os, sys
        from sparseflow.distributed.ranks import detect
        r = detect()
        print(f"rank {r.rank} of {r.size} args {sys.argv[1:]}")
        print("cluster", len(json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"]))
        """, "--flag", "x", n=3)
    assert done.returncode == 0, done.stderr
    lines = sorted(done.stdout.splitlines())
    assert lines == sorted([f"[rank {r}] rank {r} of 3 args ['--flag', 'x']" for r in range(3)]
                           + [f"[rank {r}] cluster 3" for r in range(3)])
    assert "started 3 ranks" in done.stderr


def test_a_failed_rank_ends_the_others_and_the_job(tmp_path):
    start = time.monotonic()
    done = launch(tmp_path, """
        import os, sys, time
        if os.environ["SPARSEFLOW_RANK"] == "1":
            print("rank 1 gives up", flush=True)
            sys.exit(3)
        time.sleep(120)
        """, grace=1)
    assert done.returncode == 3
    assert time.monotonic() - start < 60
    assert "[rank 1] rank 1 gives up" in done.stdout
    assert "rank 1 exited with status 3" in done.stderr
    assert "killing rank 0" in done.stderr and "rank 1 failed with status 3" in done.stderr


def test_a_face_without_its_strategy_refuses_to_run_as_one_of_several_ranks(tmp_path):
    done = launch(tmp_path, """
        from sparseflow import tf2
        tf2.Embedding({"f": tf2.FeatureConfig(tf2.TableConfig(10, 4, name="t"))}, tf2.SGD(0.1))
        print("trained alone")
        """)
    assert done.returncode == 1
    assert "trained alone" not in done.stdout
    assert ("this process is rank 1 of 2 (SPARSEFLOW_RANK=1, SPARSEFLOW_WORLD_SIZE=2 (set by "
            "sparseflow launch))") in done.stdout
    assert "MultiWorkerMirroredStrategy" in done.stdout


def test_usage_errors(tmp_path):
    bad = subprocess.run([sys.executable, "-m", "sparseflow", "launch", "-n", "0", "x.py"],
                         capture_output=True, text=True, env=ENV, cwd=str(tmp_path))
    assert bad.returncode == 2 and "-n/--ranks must be an int in [1, 64]. Received: 0" in bad.stderr
    missing = subprocess.run([sys.executable, "-m", "sparseflow", "launch", "-n", "2",
                              "nowhere.py"], capture_output=True, text=True, env=ENV,
                             cwd=str(tmp_path))
    assert missing.returncode == 2 and "'nowhere.py' (not found)" in missing.stderr


def test_a_module_runs_on_every_rank_with_its_arguments(tmp_path):
    (tmp_path / "rank_echo.py").write_text(
        "import os, sys\nprint(os.environ['SPARSEFLOW_RANK'], sys.argv[1:])\n")
    done = subprocess.run([sys.executable, "-m", "sparseflow", "launch", "-n", "2", "-m",
                           "rank_echo", "a", "--b"], capture_output=True, text=True,
                          env=dict(ENV, PYTHONPATH=str(tmp_path)), cwd=str(tmp_path),
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "[rank 0] 0 ['a', '--b']" in done.stdout and "[rank 1] 1 ['a', '--b']" in done.stdout


def test_each_rank_gets_its_share_of_the_cpus_for_tensorflows_pools(tmp_path):
    """Ranks sharing a machine size TensorFlow's pools to their share of the CPUs (their idle
    pool threads otherwise spin on the cores the other rank computes on); a variable the
    user set is theirs."""
    body = """
        import os
        print(os.environ.get("TF_NUM_INTRAOP_THREADS"), os.environ.get("TF_NUM_INTEROP_THREADS"))
        """
    share = max(1, len(os.sched_getaffinity(0)) // 2)
    done = launch(tmp_path, body)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == [f"[rank {r}] {share} {share}" for r in (0, 1)]
    script = tmp_path / "script.py"
    done = subprocess.run([sys.executable, "-m", "sparseflow", "launch", "-n", "2", str(script)],
                          capture_output=True, text=True, cwd=str(tmp_path), timeout=120,
                          env=dict(ENV, TF_NUM_INTEROP_THREADS="7"))
    assert sorted(done.stdout.splitlines()) == [f"[rank {r}] {share} 7" for r in (0, 1)]


def test_local_rank_threads_splits_the_cpus_and_leaves_what_is_set():
    from sparseflow.distributed.cluster import local_rank_threads

    both = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")
    assert local_rank_threads(2, {}, cpus=2) == dict.fromkeys(both, "1")
    assert local_rank_threads(3, {}, cpus=16) == dict.fromkeys(both, "5")
    assert local_rank_threads(8, {}, cpus=2) == dict.fromkeys(both, "1")   # at least one
    assert local_rank_threads(1, {}, cpus=4) == dict.fromkeys(both, "4")
    assert local_rank_threads(2, {"TF_NUM_INTRAOP_THREADS": "3"}, cpus=8) == {
        "TF_NUM_INTEROP_THREADS": "4"}
    assert local_rank_threads(2, {"TF_NUM_INTRAOP_THREADS": " "}, cpus=8) == dict.fromkeys(
        both, "4")   # empty is unset


def test_local_rank_cpus_gives_each_rank_its_own_block():
    from sparseflow.distributed.cluster import local_rank_cpus

    assert [local_rank_cpus(2, r, {}, cpus=[0, 1]) for r in (0, 1)] == [[0], [1]]
    assert [local_rank_cpus(2, r, {}, cpus=[4, 5, 6, 7, 8]) for r in (0, 1)] == [[4, 5],
                                                                                 [6, 7]]
    assert [local_rank_cpus(3, r, {}, cpus=list(range(16))) for r in range(3)] == [
        [0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10, 11, 12, 13, 14]]
    assert local_rank_cpus(1, 0, {}, cpus=[0, 1]) is None       # alone: every CPU
    assert local_rank_cpus(8, 3, {}, cpus=[0, 1]) is None       # more ranks than CPUs
    for off in ("0", "false", "No", " off "):
        assert local_rank_cpus(2, 0, {"SPARSEFLOW_BIND_CPUS": off}, cpus=[0, 1]) is None
    assert local_rank_cpus(2, 1, {"SPARSEFLOW_BIND_CPUS": "1"}, cpus=[0, 1]) == [1]


def test_each_rank_is_bound_to_its_own_cpus_unless_turned_off(tmp_path):
    """Two ranks on a machine with at least 2 CPUs run on disjoint blocks of them (a rank
    that waits in a collective does not migrate onto its peer's core); SPARSEFLOW_BIND_CPUS=0
    leaves both on every CPU."""
    body = """
        import os
        print(sorted(os.sched_getaffinity(0)))
        """
    mine = sorted(os.sched_getaffinity(0))
    done = launch(tmp_path, body)
    assert done.returncode == 0, done.stderr
    seen = dict(line.split("] ", 1) for line in done.stdout.splitlines())
    if len(mine) >= 2:
        share = len(mine) // 2
        assert seen == {"[rank 0": str(mine[:share]), "[rank 1": str(mine[share:2 * share])}
    else:
        assert seen == {"[rank 0": str(mine), "[rank 1": str(mine)}
    script = tmp_path / "script.py"
    done = subprocess.run([sys.executable, "-m", "sparseflow", "launch", "-n", "2", str(script)],
                          capture_output=True, text=True, cwd=str(tmp_path), timeout=120,
                          env=dict(ENV, SPARSEFLOW_BIND_CPUS="0"))
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == [f"[rank {r}] {mine}" for r in (0, 1)]


def test_train_workers_get_their_share_of_the_cpus(monkeypatch, tmp_path):
    """``sparseflow train --workers N`` starts its workers with the same pool sizes, each
    bound to its block of CPUs where there are enough of them."""
    import io

    from sparseflow.distributed import launch as launcher

    started, binds = [], []

    class Finished:
        returncode = 0

        def __init__(self, argv, env, preexec_fn=None, **_):
            started.append(env)
            binds.append(preexec_fn)

        def poll(self):
            return 0

        def wait(self):
            return 0

        def kill(self):
            pass

    monkeypatch.setattr(launcher.subprocess, "Popen", Finished)
    monkeypatch.delenv("TF_NUM_INTRAOP_THREADS", raising=False)
    monkeypatch.delenv("TF_NUM_INTEROP_THREADS", raising=False)
    launcher._run(["train", "job.yaml"], [1234, 1235, 1236], str(tmp_path), 1.0, io.StringIO())
    share = str(max(1, len(os.sched_getaffinity(0)) // 3))
    assert [(e["TF_NUM_INTRAOP_THREADS"], e["TF_NUM_INTEROP_THREADS"]) for e in started] == [
        (share, share)] * 3
    bound = len(os.sched_getaffinity(0)) >= 3
    assert [fn is not None for fn in binds] == [bound] * 3
