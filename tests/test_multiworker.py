"""Multi-worker training end to end: worker processes on loopback (``sparseflow train
--workers N`` and workers started with their own TF_CONFIG) against one worker on the same
global batches. Every worker runs the job's one trainer (``jobs/runner.py``) on the sharded
layer the Session API uses over ranks.

The job mixes what sharding must keep exact: a table whose keys need 2 occurrences to be
admitted, a table with eviction on a timestamp column, a multi-hot feature with padding, two
features sharing a table with different ``faae_coefficient``s, and tables of different dims.
"""

import dataclasses
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparseflow.distributed.cluster import local_tf_config
from sparseflow.distributed.launch import free_ports
from sparseflow.distributed.sharding import owner_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH, STEPS = 128, 16
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")


def write_data(directory) -> str:
    rng = np.random.default_rng(7)
    n = BATCH * 24
    c1 = (rng.zipf(1.3, n) % 3000).astype(np.int64) - 1500      # negative keys too
    c2 = (rng.zipf(1.5, (n, 3)) % 800).astype(np.int64)
    c2[rng.random((n, 3)) < 0.3] = -1                             # padding
    c3 = (rng.zipf(1.4, n) % 500).astype(np.int64) * 7919
    c4 = rng.integers(0, 40, n).astype(np.int64)
    ts = np.arange(n, dtype=np.int64) // 8 + 1000
    y = ((c1 % 3 == 0) ^ (rng.random(n) < 0.2)).astype(np.float32)
    table = pa.table({"label": y, "I1": rng.random(n).astype(np.float32),
                      "C1": c1, "C2": pa.array(list(c2), pa.list_(pa.int64())), "C3": c3,
                      "C4": c4, "ts": ts})
    path = os.path.join(directory, "train.parquet")
    pq.write_table(table, path)
    pq.write_table(table.slice(0, BATCH * 4), os.path.join(directory, "eval.parquet"))
    return path


def write_config(directory, out, extra: str = "") -> str:
    data = write_data(directory)
    text = f"""
name: sharded
data:
  source: parquet
  train: [{data}]
  eval: [{os.path.join(directory, "eval.parquet")}]
columns:
  labels: [label]
  dense: [I1]
  sparse: {{C1: {{}}, C2: {{length: 3}}, C3: {{}}, C4: {{}}}}
  timestamp: ts
tables:
  defaults: {{dim: 8, vocabulary_size: 6000}}
  t1: {{access_threshold: 2, eviction_threshold: 20}}
  t2: {{dim: 4}}
  t3: {{}}
features:
  C1: {{table: t1}}
  C2: {{table: t2, combiner: sum}}
  C3: {{table: t3}}
  C4: {{table: t3, faae_coefficient: 2}}
optimizer:
  sparse: {{name: lazy_adam, learning_rate: 0.02}}
  dense: {{name: adam, learning_rate: 0.01}}
model: {{name: dcn_v2, cross_layers: 1, deep_mlp: [16], low_rank: 4}}
schedule: {{batch_size: {BATCH}, max_steps: {STEPS}, log_every: 1, save_every: 4,
           eval_steps: 2, eviction: {{every_steps: 4}}}}
output: {{dir: {out}}}
distributed: {{timeout_seconds: 15}}
{extra}"""
    path = os.path.join(directory, "job.yaml")
    with open(path, "w") as f:
        f.write(text)
    return path


def sparseflow(*args, env=None, timeout=240):
    return subprocess.run([sys.executable, "-m", "sparseflow", *args], cwd=ROOT,
                          env=env or ENV, capture_output=True, text=True, timeout=timeout)


def summary(out) -> dict:
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f)


def shard_states(out, step) -> list[dict]:
    """Per worker of the checkpoint at ``step``: {table: TableState} (its shard; worker r > 0
    saves under ``model-rank<r>-<step>``)."""
    from sparseflow.checkpoint.saver import read_shard_states

    ckpt = os.path.join(out, "checkpoints")
    n = 1 + len(glob.glob(os.path.join(ckpt, f"model-rank*-{step}.index")))
    return [read_shard_states(os.path.join(ckpt, f"model-{step}" if r == 0
                                            else f"model-rank{r}-{step}")) for r in range(n)]


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory):
    """The reference: one worker, the whole of every global batch."""
    d = tmp_path_factory.mktemp("one")
    out = str(d / "out")
    config = write_config(str(d), out)
    done = sparseflow("train", config, "--workers", "1")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return config, out, summary(out)


def test_two_workers_train_exactly_like_one(one_worker, tmp_path):
    _, _, reference = one_worker
    out = str(tmp_path / "out")
    config = write_config(str(tmp_path), out)
    done = sparseflow("train", config, "--workers", "2")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    two = summary(out)
    assert two["workers"] == 2 and two["steps"] == STEPS
    np.testing.assert_allclose(two["losses"], reference["losses"], rtol=0, atol=1e-5)
    assert abs(two["eval"]["auc"] - reference["eval"]["auc"]) < 1e-5
    for name, stats in reference["tables"].items():   # summed over the shards
        for key in ("keys_held", "keys_evicted", "keys_counted_not_admitted"):
            assert two["tables"][name][key] == stats[key], (name, key)
    assert reference["tables"]["t1"]["keys_evicted"] > 0          # eviction ran
    assert reference["tables"]["t1"]["keys_counted_not_admitted"] > 0   # admission waited
    assert two["bytes_sent_per_step"] > 0 == reference["bytes_sent_per_step"]
    import tensorflow as tf

    tags = {v.tag for f in glob.glob(os.path.join(out, "events.out.tfevents.*"))
            for e in tf.compat.v1.train.summary_iterator(f) for v in e.summary.value}
    assert {"train/loss", "train/steps_per_sec", "eval/auc", "tables/t1/keys_held",
            "tables/t1/keys_evicted"} <= tags, tags

    # Each key lives on exactly one worker, its owner, with the one worker's row.
    ref = shard_states(one_worker[1], STEPS)[0]
    shards = shard_states(out, STEPS)
    assert len(shards) == 2
    for name, whole in ref.items():
        keys = np.concatenate([s[name].keys for s in shards])
        assert np.unique(keys).shape[0] == keys.shape[0], name
        for r, s in enumerate(shards):
            assert (owner_of(s[name].keys, 2) == r).all(), (name, r)
        assert set(keys.tolist()) == set(whole.keys.tolist()), name
        values = np.concatenate([s[name].values for s in shards])
        counts = np.concatenate([s[name].counts for s in shards])
        order, ref_order = np.argsort(keys), np.argsort(whole.keys)
        np.testing.assert_allclose(values[order], whole.values[ref_order], atol=1e-5)
        np.testing.assert_array_equal(counts[order], whole.counts[ref_order])

    # eval and export read the sharded checkpoint (merged once into a single-process one).
    evaluated = sparseflow("eval", config, "--checkpoint", out)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert f"eval loss {two['eval']['loss']:.4f}  auc/label {two['eval']['auc']:.4f}" in \
        evaluated.stdout
    served_dir = str(tmp_path / "served")
    exported = sparseflow("export", config, "--checkpoint", out, "--out", served_dir)
    assert exported.returncode == 0, exported.stderr[-3000:]

    rows = pq.read_table(os.path.join(str(tmp_path), "eval.parquet")).slice(0, 2 * BATCH)
    features = {"C1": rows["C1"].to_numpy(), "C3": rows["C3"].to_numpy(),
                "C4": rows["C4"].to_numpy(), "C2": np.stack(rows["C2"].to_numpy(False)),
                "dense": rows["I1"].to_numpy()[:, None]}
    p = tf.saved_model.load(served_dir).signatures["serving_default"](
        **{k: tf.constant(v) for k, v in features.items()})["probabilities"].numpy()[:, 0]
    y = rows["label"].to_numpy()
    served_loss = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
    assert abs(served_loss - two["eval"]["loss"]) < 1e-4


def test_one_worker_checkpoint_continues_on_two_and_two_on_one(one_worker, tmp_path):
    _, _, reference = one_worker
    out = str(tmp_path / "out")
    config = write_config(str(tmp_path), out)
    half = sparseflow("train", config, "--workers", "1", "--set", "schedule.max_steps=8")
    assert half.returncode == 0, half.stderr[-3000:]
    rest = sparseflow("train", config, "--workers", "2", "--set", "schedule.max_steps=12")
    assert rest.returncode == 0, rest.stdout[-3000:] + rest.stderr[-3000:]
    assert "resumed from" in rest.stdout and "step 8)" in rest.stdout
    np.testing.assert_allclose(summary(out)["losses"], reference["losses"][8:12], atol=1e-5)
    last = sparseflow("train", config, "--workers", "1")      # 2 -> 1
    assert last.returncode == 0, last.stderr[-3000:]
    np.testing.assert_allclose(summary(out)["losses"], reference["losses"][12:], atol=1e-5)
    assert abs(summary(out)["eval"]["auc"] - reference["eval"]["auc"]) < 1e-5


def test_the_mixed_owner_rule_shards_by_it_and_resumes_on_one_worker(one_worker, tmp_path):
    """``distributed.hash: mix``: each worker holds the keys the mixed hash gives it, the
    run trains like one worker, and its checkpoint (recording the rule) resumes on one."""
    _, _, reference = one_worker
    out = str(tmp_path / "out")
    config = write_config(str(tmp_path), out)
    mix = ["--set", "distributed.hash=mix"]
    first = sparseflow("train", config, "--workers", "2", "--set", "schedule.max_steps=8",
                       *mix)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    for r, shard in enumerate(shard_states(out, 8)):
        for name, state in shard.items():
            assert (owner_of(state.keys, 2, "mix") == r).all(), (name, r)
    np.testing.assert_allclose(summary(out)["losses"], reference["losses"][:8], atol=1e-5)
    rest = sparseflow("train", config, "--workers", "1", *mix)
    assert rest.returncode == 0, rest.stderr[-3000:]
    np.testing.assert_allclose(summary(out)["losses"], reference["losses"][8:], atol=1e-5)
    assert abs(summary(out)["eval"]["auc"] - reference["eval"]["auc"]) < 1e-5


def test_a_killed_worker_stops_the_other_with_a_clear_error_and_training_resumes(
        one_worker, tmp_path):
    _, _, reference = one_worker
    out = str(tmp_path / "out")
    config = write_config(str(tmp_path), out)
    ports = free_ports(2)
    procs = [subprocess.Popen(
        [sys.executable, "-m", "sparseflow", "train", config, "--no-progress"], cwd=ROOT,
        env=dict(ENV, TF_CONFIG=local_tf_config(ports, i)), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True) for i in range(2)]
    try:
        for line in procs[1].stdout:          # worker 1 past the checkpoint of step 8
            if "step 10/" in line:
                break
        procs[1].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        output, _ = procs[0].communicate(timeout=90)
        waited = time.monotonic() - killed
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert procs[0].returncode == 1, output[-3000:]
    assert waited < 15 + 30, waited   # bounded by the collective timeout, not a hang
    assert ("error: Rank 0 of 2: a collective among the ranks did not complete, so another "
            "rank died, hung or left (collectives wait 15 s") in output
    # The newest checkpoint both workers completed when one died: step 8, or a later one
    # when the workers ran on before the kill landed (a loaded machine).
    saved = re.search(r"The last checkpoint every rank completed: (\S+)-(\d+) ", output)
    assert saved, output[-3000:]
    k = int(saved.group(2))
    assert k >= 8 and k % 4 == 0, k
    assert os.path.exists(os.path.join(out, "checkpoints", f"model-rank1-{k}.index"))
    resumed = sparseflow("train", config, "--workers", "2")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout and f"(step {k})" in resumed.stdout
    np.testing.assert_allclose(summary(out)["losses"], reference["losses"][k:], atol=1e-5)


def test_sketch_admission_counts_survive_a_sharded_checkpoint(tmp_path):
    """t1 counts keys not yet admitted in a count-min sketch, which the shards' checkpoints
    hold: two workers stopped at step 8 and restarted admit, count and train exactly like
    two workers that never stopped."""
    sketch = ["--set", "tables.t1.admission_counter=sketch",
              "--set", "schedule.eviction.every_steps=0"]   # an eviction clears the sketch
    whole, parts = str(tmp_path / "whole"), str(tmp_path / "parts")
    config = write_config(str(tmp_path), whole)
    done = sparseflow("train", config, "--workers", "2", "--set", "schedule.max_steps=12",
                      *sketch)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for steps in (8, 12):
        run = sparseflow("train", config, "--workers", "2", "--out", parts,
                         "--set", f"schedule.max_steps={steps}", *sketch)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "resumed from" in run.stdout and "step 8)" in run.stdout
    np.testing.assert_allclose(summary(parts)["losses"], summary(whole)["losses"][8:],
                               rtol=0, atol=1e-6)
    expected, got = shard_states(whole, 12), shard_states(parts, 12)
    saved = shard_states(parts, 8)
    assert all(s["t1"].sketch is not None and s["t1"].sketch.total > 0 for s in saved)
    for r, (a, b) in enumerate(zip(expected, got)):
        for name in a:   # rows are handed out afresh on restore: compare by key
            x, y = a[name], b[name]
            i, j = np.argsort(x.keys), np.argsort(y.keys)
            where = f"worker {r} table {name}"
            np.testing.assert_array_equal(y.keys[j], x.keys[i], err_msg=where)
            np.testing.assert_array_equal(y.counts[j], x.counts[i], err_msg=where)
            np.testing.assert_array_equal(y.last_seen[j], x.last_seen[i], err_msg=where)
            np.testing.assert_allclose(y.values[j], x.values[i], atol=1e-6, err_msg=where)
            np.testing.assert_array_equal(np.sort(y.counted_keys), np.sort(x.counted_keys),
                                          err_msg=where)
        np.testing.assert_array_equal(b["t1"].sketch.counters, a["t1"].sketch.counters)


def test_one_sharded_worker_trains_like_the_session_trainer(tmp_path):
    """The sharded step against an independent path: the Session graph of ``sparseflow
    train`` (sparse_lookup, the Rec SDK optimizers), same batches and seed. Eviction off:
    the Session pipeline processes batches ahead, so its eviction clock runs ahead."""
    import tensorflow as tf

    import sparseflow as sf
    from sparseflow.jobs.runner import job_graph
    from sparseflow.jobs.schema import load_config

    out = str(tmp_path / "out")
    config = write_config(str(tmp_path), out)
    off = ["schedule.eviction.every_steps=0", "schedule.max_steps=10"]
    done = sparseflow("train", config, "--workers", "1", *[a for o in off for a in ("--set", o)])
    assert done.returncode == 0, done.stderr[-3000:]
    cfg = load_config(config, off)
    session_losses = []
    try:
        with job_graph(cfg, training=True, evaluation=False) as job, \
                tf.compat.v1.Session(graph=job.graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(job.train_iterator.initializer)
            for _ in range(10):
                loss, _ = sess.run([job.train.loss, job.train_op])
                session_losses.append(float(loss))
    finally:
        sf.terminate_config_initializer()
    np.testing.assert_allclose(summary(out)["losses"], session_losses, rtol=0, atol=1e-5)


def test_eviction_on_a_time_interval_runs_per_shard(one_worker, tmp_path):
    """``every_seconds`` (EvictHook's evict_time_interval): so short that every step is due,
    two workers evict after every step exactly as one worker with ``every_steps: 1``."""
    out1, out2 = str(tmp_path / "one"), str(tmp_path / "two")
    config = write_config(str(tmp_path), out1)
    steps = ["--set", "schedule.max_steps=8", "--set", "schedule.save_every=0"]
    one = sparseflow("train", config, "--workers", "1", *steps,
                     "--set", "schedule.eviction.every_steps=1")
    assert one.returncode == 0, one.stderr[-3000:]
    two = sparseflow("train", config, "--workers", "2", "--out", out2, *steps,
                     "--set", "schedule.eviction.every_steps=0",
                     "--set", "schedule.eviction.every_seconds=0.000001")
    assert two.returncode == 0, two.stdout[-3000:] + two.stderr[-3000:]
    assert two.stderr.count("sparseflow eviction: table t1 removed") == 8   # worker 0's
    a, b = summary(out1), summary(out2)
    np.testing.assert_allclose(b["losses"], a["losses"], atol=1e-5)
    assert b["tables"]["t1"]["keys_evicted"] == a["tables"]["t1"]["keys_evicted"] > 0

    # The Session trainer reads the same key (its prefetching pipeline moves the eviction
    # clock ahead nondeterministically, so count the evictions, not the keys).
    import io

    import sparseflow as sf
    from sparseflow.jobs import runner
    from sparseflow.jobs.schema import load_config

    runs = []
    for i, seconds in enumerate(("0.000001", "3600")):
        cfg = load_config(config, ["schedule.max_steps=8", "schedule.save_every=0",
                                   f"output.dir={tmp_path / f'session{i}'}",
                                   "schedule.eviction.every_steps=0",
                                   f"schedule.eviction.every_seconds={seconds}"])
        try:
            runs.append(runner.train(cfg, stream=io.StringIO())["tables"]["t1"])
        finally:
            sf.terminate_config_initializer()
    assert runs[0]["evictions"] == 8 and runs[0]["keys_evicted"] > 0
    assert runs[1]["evictions"] == 0


def test_usage_errors_name_what_is_wrong(tmp_path):
    out = str(tmp_path / "out")
    config = write_config(str(tmp_path), out)
    bad = sparseflow("train", config, "--workers", "0")
    assert bad.returncode == 2 and "--workers must be in [1, 64], got 0" in bad.stderr
    odd = sparseflow("train", config, "--workers", "3")
    assert odd.returncode == 1
    assert "schedule.batch_size (128) must be a multiple of the number of workers (3)" in (
        odd.stdout + odd.stderr + _worker_logs(out))
    broken = sparseflow("train", config, env=dict(ENV, TF_CONFIG="{not json"))
    assert broken.returncode == 1 and "TF_CONFIG must be JSON like" in broken.stderr
    both = sparseflow("train", config, "--workers", "2",
                      env=dict(ENV, TF_CONFIG=local_tf_config([1, 2], 0)))
    assert both.returncode == 2 and "unset one of them" in both.stderr
    small = sparseflow("train", config, "--workers", "1", "--set",
                       "distributed.send_count=1")
    assert small.returncode == 1 and "Traceback" not in small.stderr
    assert ("error: training stopped after step 0: SendCountOverflowError: Table `t3`: a "
            "batch sends") in small.stderr and "more than distributed.send_count=1" in \
        small.stderr


def test_a_checkpoint_of_another_model_is_refused_naming_it(tmp_path):
    out = str(tmp_path / "out")
    config = write_config(str(tmp_path), out)
    assert sparseflow("train", config, "--workers", "1",
                      "--set", "schedule.max_steps=2").returncode == 0
    for workers in (["--workers", "1"], ["--no-progress"]):
        changed = sparseflow("train", config, *workers, "--set", "schedule.max_steps=4",
                             "--set", "model.deep_mlp=[8]")
        assert changed.returncode == 1
        assert "does not hold this job's dense model" in changed.stderr, changed.stderr[-2000:]
        assert "Traceback" not in changed.stderr


def test_a_checkpoint_of_the_earlier_multi_worker_trainer_resumes(tmp_path):
    """Earlier versions' multi-worker trainer wrote ``step-N/`` (``world.json``, a shard per
    worker, the dense model apart): training resumes from one (converted once into a
    one-process checkpoint) on one worker and goes on as if never stopped (with plain SGD on
    the dense model: the dense optimizer's state is not carried over); over several workers
    it is refused, saying how to resume it."""
    import tensorflow as tf

    import sparseflow as sf
    from sparseflow.checkpoint import sparse_format as fmt
    from sparseflow.checkpoint.saver import read_sparse_states
    from sparseflow.jobs.graph import job_graph
    from sparseflow.jobs.schema import load_config

    out = str(tmp_path / "out")
    config = write_config(str(tmp_path), out, "")
    sgd = ["--set", "optimizer.dense.name=sgd"]
    whole = sparseflow("train", config, "--workers", "1", "--out", str(tmp_path / "whole"),
                       *sgd)
    assert whole.returncode == 0, whole.stderr[-3000:]
    reference = summary(str(tmp_path / "whole"))
    eight = sparseflow("train", config, "--workers", "1", "--set", "schedule.max_steps=8",
                       "--set", "schedule.save_every=0", *sgd)
    assert eight.returncode == 0, eight.stderr[-3000:]
    ckpt = os.path.join(out, "checkpoints")
    prefix = os.path.join(ckpt, "model-8")
    # The same state in the earlier layout, split over 2 workers by key mod 2.
    step_dir = os.path.join(ckpt, "step-000000008")
    cfg = load_config(config)
    entries = [{}, {}]
    for name, state in read_sparse_states(prefix).items():
        owners, counted = owner_of(state.keys, 2), owner_of(state.counted_keys, 2)
        entry = cfg.table(name)
        for r in range(2):
            mine = dataclasses.replace(
                state, keys=state.keys[owners == r], counts=state.counts[owners == r],
                last_seen=state.last_seen[owners == r], values=state.values[owners == r],
                counted_keys=state.counted_keys[counted == r],
                counted_counts=state.counted_counts[counted == r])
            entries[r][name] = fmt.write_table_state(
                os.path.join(step_dir, f"worker-{r}-of-2"), name, mine, entry.dim,
                {"dim": entry.dim, "capacity": entry.vocabulary_size,
                 "access_threshold": -1, "eviction_threshold": -1})
    for r in range(2):
        fmt.write_manifest(os.path.join(step_dir, f"worker-{r}-of-2"), entries[r])
    try:
        with job_graph(cfg, training=False, evaluation=False) as job, \
                tf.compat.v1.Session(graph=job.graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            job.saver.restore(sess, prefix)
            tf.compat.v1.train.Checkpoint(model=job.model).write(
                os.path.join(step_dir, "dense", "ckpt"), session=sess)
    finally:
        sf.terminate_config_initializer()
    with open(os.path.join(step_dir, "world.json"), "w") as f:
        json.dump({"step": 8, "world_size": 2, "hash": "mod",
                   "tables": [t.name for t in cfg.tables]}, f)
    for name in os.listdir(ckpt):   # only the earlier layout is left
        if name != "step-000000008":
            path = os.path.join(ckpt, name)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)

    refused = sparseflow("train", config, "--workers", "2", *sgd)
    assert refused.returncode == 1
    assert "run `sparseflow train` with --workers 1 once" in refused.stdout + refused.stderr
    resumed = sparseflow("train", config, "--workers", "1", *sgd)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout and "(step 8)" in resumed.stdout
    np.testing.assert_allclose(summary(out)["losses"], reference["losses"][8:], atol=1e-5)


def _worker_logs(out) -> str:
    return "".join(open(p).read() for p in glob.glob(os.path.join(out, "workers", "*.log")))
