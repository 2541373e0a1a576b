"""An error while the input pipeline reads ahead (a tiered table whose fast tier cannot hold
a batch raises CacheFullError in its gather's numpy function, while a parallel map and a
prefetch buffer hold further batches) ends the process promptly with the error, from a Rec SDK Session script and from ``sparseflow train``, and the
trainer releases the failed run's session (and with it the input pipeline) before the error
leaves it.

The subprocess time limits are hang guards only, not timing assertions."""

import io
import os
import re
import signal
import subprocess
import sys

import pytest
import tensorflow as tf

import sparseflow as sf
from sparseflow.jobs import runner
from sparseflow.jobs.schema import load_config
from sparseflow.pipeline.exit_sessions import live_objects

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
HANG_GUARD_SECONDS = 120


def _run(args):
    """Runs ``python ARGS`` in its own process group; fails the test (killing the group)
    if it has not exited within the hang guard."""
    proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=HANG_GUARD_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"still running after {HANG_GUARD_SECONDS} s (hang guard):\n"
                    f"{(out + err)[-3000:]}")
    return proc.returncode, out, err


def _job(tmp_path, fast_rows: int) -> str:
    """A YAML job whose table C3 keeps ``fast_rows`` device rows over a host tier; its
    batches hold 558-620 distinct C3 keys (603, 599, then 616 in the first three; a parallel
    map and a prefetch keep several in flight)."""
    path = tmp_path / "job.yaml"
    path.write_text(f"""
name: full_fast_tier
data:
  source: generator
  generator: {{kind: criteo, train_rows: 40960, eval_rows: 0, seed: 1,
              cardinality_cap: 100000}}
columns:
  labels: [label]
  dense: [I1, I2]
  sparse: {{C1: {{}}, C3: {{}}}}
tables:
  defaults: {{dim: 8}}
  C1: {{vocabulary_size: 2000}}
  C3: {{vocabulary_size: {fast_rows}, host_vocabulary_size: 100000, rows_on: device}}
optimizer:
  sparse: {{name: lazy_adam, learning_rate: 0.01}}
  dense: {{name: adam, learning_rate: 0.01}}
model: {{name: dlrm, bottom_mlp: [8], top_mlp: [16]}}
schedule: {{batch_size: 1024, max_steps: 40, log_every: 5, save_every: 0}}
output: {{dir: {tmp_path / "out"}}}
""")
    return str(path)


@pytest.mark.parametrize("fast_rows", [16, 610])   # the first batch, or the third, fails
def test_sparseflow_train_stops_with_the_pipelines_error(tmp_path, fast_rows):
    code, out, err = _run(["-m", "sparseflow", "train", _job(tmp_path, fast_rows),
                           "--no-progress"])
    assert code == 1, (out + err)[-3000:]
    assert re.search(r"^error: training stopped after step \d+: CacheFullError: Table `C3`: "
                     r"a batch has \d+ distinct rows \(\d+ of them not in the fast tier\), "
                     rf"more than its {fast_rows} slots \(device_vocabulary_size={fast_rows}, "
                     r"host_vocabulary_size=100000\)", err, re.M), err[-3000:]
    assert "Traceback" not in err


def test_a_session_script_exits_with_the_pipelines_error(tmp_path):
    code, out, err = _run(["-m", "tests.workers.full_fast_tier", "1012"])
    assert code == 1, (out + err)[-3000:]
    assert re.search(r"CacheFullError: Table `t`: a batch has \d+ distinct rows \(\d+ of them "
                     r"not in the fast tier\), more than its 1012 slots", err), err[-3000:]


def test_a_failed_run_releases_its_session_before_the_error_leaves(tmp_path):
    def live_sessions():
        # _session: the C session, set to None when TensorFlow deletes it.
        return {id(o) for o in live_objects(tf.compat.v1.Session) if o._session is not None}

    before = live_sessions()
    try:
        with pytest.raises((ValueError, tf.errors.OpError), match=r"CacheFullError") as info:
            runner.train(load_config(_job(tmp_path, 16)), stream=io.StringIO())
        # ``info`` holds the error and its traceback (the trainer's frames), as an uncaught
        # error does until interpreter shutdown: the session must not live on through them.
        assert live_sessions() <= before
        assert info.traceback   # still held
    finally:
        sf.terminate_config_initializer()
