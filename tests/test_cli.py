"""The YAML job runner and the ``sparseflow`` command: shipped configs, training, resume,
evaluation, export, progress output and TensorBoard summaries."""

from __future__ import annotations

import io
import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import sparseflow as sf
from sparseflow import cli
from sparseflow.jobs import runner
from sparseflow.jobs.data import make_dataset
from sparseflow.jobs.export import export
from sparseflow.jobs.progress import format_table
from sparseflow.jobs.schema import ConfigError, load_config, parse_config
from tests.test_progress import read_until_closed

REPO = pathlib.Path(__file__).resolve().parents[1]
SHIPPED = sorted((REPO / "configs").glob("*.yaml"))


def tiny_job(tmp_path, model: str, *, steps: int = 12, extra: str = "") -> str:
    """A small generated-data job (6 features, batch 256) for ``model``, written to a file."""
    models = {
        "dlrm": "{name: dlrm, bottom_mlp: [16, 8], top_mlp: [32]}",
        "dcn_v2": "{name: dcn_v2, cross_layers: 2, deep_mlp: [32], low_rank: 4}",
        "wide_deep": "{name: wide_deep, deep_mlp: [32], wide_features: [C1_wide, C2_wide]}",
    }
    wide = ""
    wide_table = ""
    if model == "wide_deep":
        wide = ("  C1_wide: {table: wide, index_key: C1}\n"
                "  C2_wide: {table: wide, index_key: C2}\n")
        wide_table = "  wide: {dim: 1, vocabulary_size: 4000, initializer: {name: zeros}}\n"
    features = "".join(f"  C{i}: {{table: C{i}}}\n" for i in range(1, 7))
    text = f"""
name: tiny_{model}
data:
  source: generator
  generator: {{kind: criteo, train_rows: 16384, eval_rows: 2048, seed: 5,
              cardinality_cap: 2000}}
columns:
  labels: [label]
  dense: [I1, I2, I3, I4]
  dense_transform: log1p
  sparse: {{C1: {{}}, C2: {{}}, C3: {{}}, C4: {{}}, C5: {{}}, C6: {{}}}}
tables:
  defaults: {{dim: 8, vocabulary_size: 2100, access_threshold: 1}}
  C1: {{}}
  C2: {{}}
  C3: {{}}
  C4: {{}}
  C5: {{}}
  C6: {{}}
{wide_table}features:
{features}{wide}optimizer:
  sparse: {{name: lazy_adam, learning_rate: 0.01}}
  dense: {{name: adam, learning_rate: 0.003}}
model: {models[model]}
schedule: {{batch_size: 256, max_steps: {steps}, log_every: 4, eval_steps: 4}}
output: {{dir: {tmp_path / "out"}}}
{extra}"""
    path = tmp_path / f"{model}.yaml"
    path.write_text(text)
    return str(path)


def first_eval_batch_probabilities(cfg, checkpoint_dir) -> np.ndarray:
    """The eval graph's probabilities on the first eval batch, restored from the checkpoint."""
    with runner.job_graph(cfg, training=False, evaluation=True) as job, \
            tf.compat.v1.Session(graph=job.graph) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        job.saver.restore(sess, runner.resolve_checkpoint(str(checkpoint_dir)))
        sess.run(job.eval_iterator.initializer)
        return sess.run(job.eval.probabilities)


@pytest.fixture(autouse=True)
def _fresh_runtime():
    sf.terminate_config_initializer()
    yield
    sf.terminate_config_initializer()


# -- shipped configs -------------------------------------------------------------------------

@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_config_validates(path, capsys):
    assert cli.main(["validate", str(path)]) == 0
    assert f"{path}: valid" in capsys.readouterr().out


def test_the_three_configs_the_docs_promise_are_shipped():
    assert {p.name for p in SHIPPED} >= {"demo.yaml", "criteo_dlrm.yaml",
                                         "movielens_widedeep.yaml"}


def test_demo_yaml_trains_and_beats_a_constant_predictor(tmp_path):
    cfg = load_config(str(REPO / "configs/demo.yaml"), [
        "schedule.max_steps=60", "schedule.eval_every=0", "schedule.batch_size=2048",
        "data.generator.train_rows=122880", "data.generator.eval_rows=16384",
        f"output.dir={tmp_path}"])
    summary = runner.train(cfg, stream=io.StringIO())
    assert summary["steps"] == 60
    # A constant predictor's AUC is 0.5; the generated labels are learnable from the keys.
    assert summary["eval"]["auc"] > 0.6, summary["eval"]
    assert summary["eval"]["batches"] == 8
    held = sum(t["keys_held"] for t in summary["tables"].values())
    assert held > 0


def test_movielens_widedeep_yaml_trains_and_evicts_by_real_timestamps(tmp_path, movielens_cache):
    cfg = load_config(str(REPO / "configs/movielens_widedeep.yaml"), [
        "schedule.max_steps=150", "schedule.eval_every=0", f"output.dir={tmp_path}",
        f"data.movielens.cache_dir={movielens_cache}"])
    summary = runner.train(cfg, stream=io.StringIO())
    assert summary["steps"] == 150
    assert summary["eval"]["auc"] > 0.6, summary["eval"]
    # 150 batches of 256 time-ordered ratings span weeks: users and items unseen for 30 days
    # are evicted, and only from the two tables with an eviction threshold.
    tables = summary["tables"]
    assert tables["user"]["keys_evicted"] > 0 and tables["item"]["keys_evicted"] > 0
    assert tables["profile"]["keys_evicted"] == 0 and tables["wide"]["keys_evicted"] == 0


# -- each built-in model, from YAML ---------------------------------------------------------

@pytest.mark.parametrize("model", ["dlrm", "dcn_v2", "wide_deep"])
def test_each_built_in_model_trains_from_yaml(tmp_path, model):
    out = io.StringIO()
    summary = runner.train(load_config(tiny_job(tmp_path, model, steps=64),
                                       ["schedule.log_every=16"]), stream=out, tty=False)
    assert summary["steps"] == 64
    losses = [float(line.split("loss ")[1]) for line in out.getvalue().splitlines()
              if line.startswith("step ") and "/64" in line]
    assert len(losses) == 4               # one line per log_every=16 steps
    assert losses[-1] < losses[0]         # it learns ...
    assert summary["eval"]["auc"] > 0.6   # ... beyond a constant predictor's 0.5


# -- resume, evaluate, export ---------------------------------------------------------------

def test_train_resumes_from_the_newest_checkpoint(tmp_path):
    path = tiny_job(tmp_path, "dlrm", steps=8)
    first = runner.train(load_config(path), stream=io.StringIO())
    assert first["steps"] == 8 and first["checkpoint"].endswith("model-8")
    out = io.StringIO()
    second = runner.train(load_config(path, ["schedule.max_steps=12"]), stream=out)
    assert "resumed from" in out.getvalue()
    assert second["steps"] == 12 and second["steps_this_run"] == 4
    # Keys the first run saved are still there after the restore. (Its live `keys_held`
    # may count more: keys that batches read ahead of the model admitted, which a checkpoint
    # leaves out.)
    from sparseflow.checkpoint.saver import sparse_path
    from sparseflow.checkpoint.sparse_format import read_manifest

    saved = read_manifest(sparse_path(first["checkpoint"]))["tables"]
    for name, stats in first["tables"].items():
        assert 0 < saved[name]["admitted_rows"] <= stats["keys_held"]
        assert second["tables"][name]["keys_held"] >= saved[name]["admitted_rows"]


def test_a_resumed_run_continues_on_the_next_batches_like_the_uninterrupted_run(tmp_path):
    """Stopped after 4 steps and resumed to 8, a job must read batches 5 to 8 — not the first
    4 again — and so end with the tables of the run that was never stopped."""
    from sparseflow.checkpoint.saver import sparse_path
    from sparseflow.checkpoint.sparse_format import read_manifest, read_table_state

    def tables(summary):
        directory = sparse_path(summary["checkpoint"])
        manifest = read_manifest(directory)["tables"]
        out = {}
        for name, entry in manifest.items():
            state = read_table_state(directory, name, entry)
            order = np.argsort(state.keys)
            out[name] = (state.keys[order], state.values[order], state.counts[order])
        return out

    once = tmp_path / "once"
    once.mkdir()
    whole = runner.train(load_config(tiny_job(once, "dlrm", steps=8)), stream=io.StringIO())
    twice = tmp_path / "twice"
    twice.mkdir()
    path = tiny_job(twice, "dlrm", steps=8)
    runner.train(load_config(path, ["schedule.max_steps=4"]), stream=io.StringIO())
    resumed = runner.train(load_config(path), stream=io.StringIO())
    assert resumed["steps"] == 8 and resumed["steps_this_run"] == 4
    expected, got = tables(whole), tables(resumed)
    assert sorted(got) == sorted(expected)
    for name, (keys, values, counts) in expected.items():
        np.testing.assert_array_equal(got[name][0], keys)
        np.testing.assert_array_equal(got[name][2], counts)
        np.testing.assert_allclose(got[name][1], values, rtol=1e-5, atol=1e-6)


def test_eval_of_a_checkpoint_matches_the_end_of_training(tmp_path):
    path = tiny_job(tmp_path, "dlrm", steps=8)
    summary = runner.train(load_config(path), stream=io.StringIO())
    metrics = runner.evaluate(load_config(path), str(tmp_path / "out"), stream=io.StringIO())
    assert metrics["batches"] == summary["eval"]["batches"]
    np.testing.assert_allclose(metrics["loss"], summary["eval"]["loss"], rtol=1e-5)
    np.testing.assert_allclose(metrics["auc"], summary["eval"]["auc"], rtol=1e-6)


def test_eval_without_a_checkpoint_names_the_argument(tmp_path):
    path = tiny_job(tmp_path, "dlrm")
    with pytest.raises(ValueError, match="`checkpoint`"):
        runner.evaluate(load_config(path), str(tmp_path / "nothing"))


@pytest.mark.parametrize("model", ["dlrm", "wide_deep"])
def test_exported_saved_model_predicts_as_the_eval_graph(tmp_path, model):
    path = tiny_job(tmp_path, model, steps=8)
    cfg = load_config(path)
    runner.train(cfg, stream=io.StringIO())
    saved = export(cfg, str(tmp_path / "out"), str(tmp_path / "saved"))

    expected = first_eval_batch_probabilities(cfg, tmp_path / "out")
    # The same raw batch, straight from the data pipeline, into the SavedModel.
    batch = next(iter(make_dataset(cfg.data, cfg.columns, "eval",
                                   batch_size=cfg.schedule.batch_size, seed=cfg.schedule.seed)))
    features = {c.name: batch[c.name] for c in cfg.columns.sparse}
    # The pipeline applied log1p to the dense features; the SavedModel takes raw values.
    features["dense"] = tf.math.expm1(batch["dense"])
    served = tf.saved_model.load(saved).signatures["serving_default"](**features)
    np.testing.assert_allclose(served["probabilities"].numpy(), expected, rtol=1e-4, atol=1e-5)


def test_export_refuses_a_non_empty_directory(tmp_path):
    path = tiny_job(tmp_path, "dlrm", steps=4)
    cfg = load_config(path)
    runner.train(cfg, stream=io.StringIO())
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "file").write_text("keep me")
    with pytest.raises(ValueError, match="`out`"):
        export(cfg, str(tmp_path / "out"), str(tmp_path / "busy"))
    assert (tmp_path / "busy" / "file").read_text() == "keep me"


# -- output: summaries, progress, summary table ---------------------------------------------

def test_tensorboard_summaries_and_summary_json(tmp_path):
    path = tiny_job(tmp_path, "dlrm", steps=8)
    runner.train(load_config(path, ["schedule.eval_every=4"]), stream=io.StringIO())
    out = tmp_path / "out"
    tags = set()
    for event_file in out.glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(event_file)):
            tags.update(v.tag for v in event.summary.value)
    assert {"train/loss", "train/steps_per_sec", "eval/loss", "eval/auc",
            "tables/C1/keys_held", "tables/C1/keys_evicted",
            "tables/C1/keys_waiting_admission"} <= tags
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 8 and set(summary["tables"]) == {f"C{i}" for i in range(1, 7)}
    assert json.loads((out / "config.json").read_text())["name"] == "tiny_dlrm"


def test_input_wait_is_measured_on_traced_steps(tmp_path):
    path = tiny_job(tmp_path, "dlrm", steps=30)
    summary = runner.train(load_config(path), stream=io.StringIO())
    assert summary["input_wait_share"] is not None
    assert 0.0 <= summary["input_wait_share"] <= 1.0


class Terminal(io.StringIO):
    """An in-memory stream that says it is a terminal."""

    def isatty(self):
        return True


def summary_lines(name: str) -> list[str]:
    """The first lines of the summary the demo prints after training."""
    return [f"== {name} ==", "metric", "steps", "samples this run", "throughput (samples/s)",
            "train loss (last window)", "eval loss", "eval auc/label", "checkpoint"]


def test_training_on_a_terminal_draws_a_bar_then_prints_the_summary(tmp_path):
    term = Terminal()
    runner.train(load_config(tiny_job(tmp_path, "dlrm", steps=8)), stream=term)
    text = term.getvalue()
    _, _, rest = text.rpartition("\r")
    frames = text.split("\r")
    assert any(f.startswith("step: ") and "|" in f and "/8 [" in f and "step/s" in f
               for f in frames)
    final = rest.splitlines()[0]   # the bar's last frame, left on screen
    assert final.startswith("step: 100%|") and "8/8 [" in final and "loss " in final
    lines = rest.splitlines()[1:]
    assert lines[0].startswith("step 8: eval loss")
    heads = [line.split("  ")[0] for line in lines]
    for expected in summary_lines("tiny_dlrm"):
        assert any(h.startswith(expected) for h in heads), (expected, lines)
    assert any(line.startswith("table ") and "keys held" in line for line in lines)


def test_the_demo_command_on_a_pseudo_terminal_shows_a_bar_and_the_summary(tmp_path):
    """``make demo`` runs ``sparseflow train CONFIG`` on the user's terminal."""
    import fcntl
    import pty
    import struct
    import termios

    path = tiny_job(tmp_path, "dlrm", steps=6)
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "sparseflow", "train", path], cwd=REPO,
                            stdout=slave, stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    output = read_until_closed(master)
    assert proc.wait(timeout=300) == 0
    text = output.decode().replace("\r\n", "\n")   # the terminal's newlines
    frames = [f for line in text.split("\n") for f in line.split("\r")]
    assert any(f.startswith("step: 100%|") and "6/6 [" in f and "step/s" in f for f in frames)
    assert max(len(f) for f in frames if "%|" in f) <= 100    # bars fit the terminal
    lines = text.split("\n")
    for expected in summary_lines("tiny_dlrm"):
        assert any(line.startswith(expected) for line in lines), (expected, text[-2000:])


def test_a_log_gets_periodic_lines_with_the_rate(tmp_path):
    out = io.StringIO()
    runner.train(load_config(tiny_job(tmp_path, "dlrm", steps=8)), stream=out)
    steps = [line for line in out.getvalue().splitlines() if line.startswith("step ")]
    assert [line.split(" [")[0] for line in steps[:2]] == ["step 4/8", "step 8/8"]
    for line in steps[:2]:
        assert re.fullmatch(r"step \d/8 \[\d\d:\d\d<\d\d:\d\d, +[\d.]+(step/s|s/step)\]"
                            r"  loss \d\.\d{4}", line), line
    assert "\r" not in out.getvalue()


def test_one_worker_of_the_sharded_layer_trains_like_one_process(tmp_path):
    """``--workers 1``: the job's one trainer on the sharded layer with a world of one rank
    (keys processed at their owner in the step): without eviction, the same steps as the
    one process, and the world is gone after it."""
    from sparseflow.distributed import graph_world

    path = tiny_job(tmp_path, "dlrm", steps=8)
    plain = runner.train(load_config(path, [f"output.dir={tmp_path / 'one'}"]),
                         stream=io.StringIO())
    out = io.StringIO()
    with graph_world.one_rank():
        sharded = runner.train(load_config(path, [f"output.dir={tmp_path / 'sharded'}"]),
                               stream=out)
    assert graph_world.current() is None
    assert sharded["workers"] == 1 and plain["workers"] == 1
    assert sharded["bytes_sent_per_step"] == 0.0
    np.testing.assert_allclose(sharded["losses"], plain["losses"], rtol=0, atol=1e-5)
    assert [line.split(" [")[0] for line in out.getvalue().splitlines()
            if line.startswith("step ") and "/8 [" in line] == ["step 4/8", "step 8/8"]


def test_format_table_aligns_columns():
    text = format_table(("name", "n"), [("a", 5), ("long name", 12345)])
    assert text.splitlines() == ["name            n", "---------  ------",
                                 "a               5", "long name  12,345"]


# -- the command line -----------------------------------------------------------------------

def test_cli_train_eval_export(tmp_path, capsys):
    path = tiny_job(tmp_path, "dlrm", steps=6)
    assert cli.main(["train", path, "--no-progress", "--set", "schedule.log_every=3"]) == 0
    out = capsys.readouterr().out
    assert "step 3/6" in out and "== tiny_dlrm ==" in out and "eval auc" in out
    assert cli.main(["eval", path, "--checkpoint", str(tmp_path / "out")]) == 0
    assert "eval loss" in capsys.readouterr().out
    assert cli.main(["export", path, "--checkpoint", str(tmp_path / "out"),
                     "--out", str(tmp_path / "served")]) == 0
    assert (tmp_path / "served" / "saved_model.pb").exists()


def test_cli_train_out_overrides_the_output_dir(tmp_path):
    path = tiny_job(tmp_path, "dlrm", steps=2)
    assert cli.main(["train", path, "--no-progress", "--out", str(tmp_path / "elsewhere")]) == 0
    assert (tmp_path / "elsewhere" / "summary.json").exists()
    assert not (tmp_path / "out").exists()


def test_cli_reports_config_errors_with_file_and_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    text = pathlib.Path(tiny_job(tmp_path, "dlrm")).read_text()
    bad.write_text(text.replace("dim: 8,", 'dim: "8x",'))
    assert cli.main(["validate", str(bad)]) == 2
    line = next(i for i, s in enumerate(text.splitlines(), 1) if "defaults: {dim: 8" in s)
    err = capsys.readouterr().err
    assert f"{bad}:{line} tables." in err and ".dim: " in err and '"8x"' in err, err


def test_cli_reports_a_bad_override(tmp_path, capsys):
    path = tiny_job(tmp_path, "dlrm")
    assert cli.main(["validate", path, "--set", "schedule.max_steps=abc"]) == 2
    assert "--set schedule.max_steps" in capsys.readouterr().err


def test_cli_missing_file(tmp_path, capsys):
    assert cli.main(["validate", str(tmp_path / "none.yaml")]) == 2
    assert "none.yaml" in capsys.readouterr().err


def _stats_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(4)
    item = (rng.zipf(1.3, 3000) % 500).astype(np.int64)
    tags = [[f"t{j}" for j in rng.integers(0, 30, rng.integers(0, 3))] for _ in range(3000)]
    ts = np.repeat(np.arange(30, dtype=np.int64) * 100, 100)
    (tmp_path / "data").mkdir()
    table = pa.table({"item": item, "tags": pa.array(tags, pa.list_(pa.string())), "ts": ts,
                      "label": np.zeros(3000, np.float32)})
    pq.write_table(table.slice(0, 1500), tmp_path / "data" / "a.parquet")
    pq.write_table(table.slice(1500), tmp_path / "data" / "b.parquet")
    return item, tags, ts


def test_cli_stats_over_parquet_writes_json_and_markdown(tmp_path, capsys):
    item, tags, ts = _stats_parquet(tmp_path)
    out = tmp_path / "stats"
    assert cli.main(["stats", str(tmp_path / "data"), "--sparse", "item,tags", "--timestamp",
                     "ts", "--eviction-window", "500", "--max-threshold", "3", "--dim", "8",
                     "--optimizer", "adagrad", "--workers", "2", "--suggest", "20K",
                     "--out", str(out)]) == 0
    doc = json.loads((out / "stats.json").read_text())
    assert (doc["schema"], doc["version"]) == ("sparseflow.feature_stats", 1)
    keys, counts = np.unique(item, return_counts=True)
    f = doc["features"]["item"]
    assert (f["rows"], f["total_keys"], f["distinct_keys"]) == (3000, 3000, keys.shape[0])
    assert [t["keys_kept"] for t in f["thresholds"]] == [int((counts >= t).sum())
                                                         for t in (1, 2, 3)]
    assert f["memory"]["bytes_at_threshold"]["2"] == int((counts >= 2).sum()) * 8 * 2 * 4
    alive = {k for k, t in zip(item.tolist(), ts.tolist()) if ts.max() - t < 500}
    assert f["eviction"]["keys_alive"] == len(alive)
    assert doc["features"]["tags"]["distinct_keys"] == len({t for row in tags for t in row})
    assert "item" in (out / "stats.md").read_text()
    assert (out / "stats.html").read_text().count("<svg") == 4   # 2 plots per feature
    import yaml
    fragment = yaml.safe_load((out / "suggested_tables.yaml").read_text())
    assert sum(t["vocabulary_size"] * 8 * 2 * 4 for t in fragment["tables"].values()) <= 20480
    captured = capsys.readouterr()
    assert "wrote" in captured.out
    # progress on stderr, one line per file (a log, not a terminal)
    assert re.search(r"^files 2/2 \[.*file.*\]  3,000 rows$", captured.err, re.M), captured.err


def test_cli_stats_takes_columns_from_a_job_config(tmp_path, capsys):
    item, _, _ = _stats_parquet(tmp_path)
    config = tmp_path / "job.yaml"
    config.write_text(f"""
data: {{source: parquet, train: {tmp_path / 'data'}, eval: {tmp_path / 'data'}}}
columns: {{labels: label, sparse: {{item: {{}}, tags: {{encoding: string, length: 2}}}}}}
tables: {{defaults: {{dim: 12, vocabulary_size: 1000}}, item: {{}}, tags: {{}}}}
features: {{item: {{}}, tags: {{}}}}
optimizer: {{sparse: {{name: lazy_adam, learning_rate: 0.01}},
            dense: {{name: sgd, learning_rate: 0.01}}}}
model: {{name: wide_deep, deep_mlp: [4]}}
schedule: {{batch_size: 64, max_steps: 1}}
output: {{dir: {tmp_path / 'run'}}}
""")
    out = tmp_path / "stats"
    assert cli.main(["stats", "--config", str(config), "--out", str(out)]) == 0
    doc = json.loads((out / "stats.json").read_text())
    assert sorted(doc["features"]) == ["item", "tags"]
    memory = doc["features"]["item"]["memory"]
    assert (memory["dim"], memory["optimizer"]) == (12, "adam")
    assert doc["features"]["item"]["distinct_keys"] == np.unique(item).shape[0]


def test_cli_stats_on_a_local_dask_cluster(tmp_path, capsys):
    item, _, _ = _stats_parquet(tmp_path)
    out = tmp_path / "stats"
    assert cli.main(["stats", str(tmp_path / "data"), "--sparse", "item", "--dask", "local:2",
                     "--out", str(out)]) == 0
    doc = json.loads((out / "stats.json").read_text())
    assert doc["features"]["item"]["distinct_keys"] == np.unique(item).shape[0]
    assert cli.main(["stats", str(tmp_path / "data"), "--sparse", "item", "--dask",
                     "local:x"]) == 2
    assert "local:N needs N >= 1" in capsys.readouterr().err


def test_cli_stats_usage_errors(tmp_path, capsys):
    assert cli.main(["stats", str(tmp_path)]) == 2
    assert "needs DATA and --sparse" in capsys.readouterr().err
    _stats_parquet(tmp_path)
    assert cli.main(["stats", str(tmp_path / "data"), "--sparse", "nope"]) == 2
    assert "nope" in capsys.readouterr().err


def test_the_console_script_is_installed():
    # `pip install -e .` puts `sparseflow` next to the interpreter.
    script = pathlib.Path(sys.executable).parent / "sparseflow"
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0
    assert "validate" in result.stdout and "export" in result.stdout


def test_parse_config_is_the_same_job_as_the_file(tmp_path):
    path = tiny_job(tmp_path, "dlrm")
    assert parse_config(pathlib.Path(path).read_text(), file=path) == load_config(path)


def test_parquet_job_with_string_tokens_trains_and_serves_raw_strings(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(3)
    n = 4096
    cities = np.array([f"city-{i}" for i in range(50)])
    city = cities[rng.integers(0, 50, n)]
    tags = [[f"t{j}" for j in rng.choice(20, rng.integers(0, 4), replace=False)]
            for _ in range(n)]
    item = rng.integers(0, 300, n).astype(np.int64) * 7919
    label = (rng.random(n) < 0.3).astype(np.float32)
    price = rng.exponential(10.0, n).astype(np.float32)
    table = pa.table({"label": label, "price": price, "item": item, "city": city,
                      "tags": pa.array(tags, pa.list_(pa.string()))})
    for part, rows in (("train", slice(0, 3584)), ("eval", slice(3584, n))):
        (tmp_path / part).mkdir()
        pq.write_table(table.slice(rows.start, rows.stop - rows.start),
                       tmp_path / part / "part-0.parquet")
    config = tmp_path / "job.yaml"
    config.write_text(f"""
data: {{source: parquet, train: {tmp_path / 'train'}, eval: {tmp_path / 'eval'}}}
columns:
  labels: label
  dense: [price]
  dense_transform: log1p
  sparse:
    item: {{}}
    city: {{encoding: string}}
    tags: {{encoding: string, length: 3}}
tables:
  defaults: {{dim: 4, vocabulary_size: 400}}
  item: {{}}
  city: {{}}
  tags: {{}}
features:
  item: {{}}
  city: {{}}
  tags: {{combiner: sqrtn}}
optimizer:
  sparse: {{name: adagrad, learning_rate: 0.05}}
  dense: {{name: sgd, learning_rate: 0.05}}
model: {{name: dcn_v2, cross_layers: 1, deep_mlp: [8], structure: parallel}}
schedule: {{batch_size: 128, max_steps: 20}}
output: {{dir: {tmp_path / 'out'}}}
""")
    cfg = load_config(str(config))
    runner.train(cfg, stream=io.StringIO())
    saved = export(cfg, str(tmp_path / "out"), str(tmp_path / "served"))
    expected = first_eval_batch_probabilities(cfg, tmp_path / "out")
    rows = slice(3584, 3584 + 128)   # the first eval batch, as raw values
    padded_tags = [(t + ["", "", ""])[:3] for t in tags[rows]]
    served = tf.saved_model.load(saved).signatures["serving_default"](
        item=tf.constant(item[rows]), city=tf.constant(city[rows]),
        tags=tf.constant(padded_tags), dense=tf.constant(price[rows, None]))
    np.testing.assert_allclose(served["probabilities"].numpy(), expected, rtol=1e-4, atol=1e-5)


def test_a_parallel_map_only_when_asked_and_where_it_cannot_change_results(tmp_path):
    from sparseflow.jobs.graph import map_parallelism

    path = tiny_job(tmp_path, "dlrm")
    assert map_parallelism(load_config(path)) is None          # sequential by default
    assert map_parallelism(load_config(path, ["data.parallel_map=true"])) == tf.data.AUTOTUNE
    with pytest.raises(ConfigError) as info:                   # a threshold above 1: refused
        load_config(path, ["data.parallel_map=true", "tables.C3.access_threshold=2"])
    message = str(info.value)
    assert "data.parallel_map" in message and "table C3 has 2" in message
    assert "access_threshold <= 1" in message
    # Without the parallel map, a threshold above 1 is fine.
    counted = load_config(path, ["tables.C3.access_threshold=2"])
    assert map_parallelism(counted) is None
    # A config built in code that skips the schema's check is refused all the same.
    import dataclasses
    forced = dataclasses.replace(counted, data=dataclasses.replace(counted.data,
                                                                   parallel_map=True))
    with pytest.raises(ValueError, match="parallel_map=True needs every table's "
                                         "access_threshold <= 1.*table C3 has 2"):
        map_parallelism(forced)


def test_parallel_map_job_trains_exactly_as_a_sequential_one(tmp_path):
    def losses(out):
        return [line.split("loss ")[1] for line in out.getvalue().splitlines()
                if line.startswith("step ") and "/16" in line]

    path = tiny_job(tmp_path, "dlrm", steps=16)
    parallel_out, sequential_out = io.StringIO(), io.StringIO()
    parallel = runner.train(
        load_config(path, [f"output.dir={tmp_path / 'p'}", "schedule.log_every=2",
                           "data.parallel_map=true"]),
        stream=parallel_out, tty=False)
    sequential = runner.train(
        load_config(path, [f"output.dir={tmp_path / 's'}", "schedule.log_every=2"]),
        stream=sequential_out, tty=False)
    # Every training step's loss, to the last printed digit. (Evaluation after training can
    # differ in the 6th digit: batches the pipeline read ahead, never trained on, admitted
    # keys, and how far it reads ahead depends on timing — with either map.)
    assert len(losses(parallel_out)) == 8
    assert losses(parallel_out) == losses(sequential_out)
    assert parallel["train_loss"] == sequential["train_loss"]   # the last window, unrounded


def test_train_reports_argument_errors_and_starts_workers_without_loading_tensorflow(tmp_path):
    """``train``'s argument errors come before TensorFlow loads (3-4 s), and the process that
    starts ``--workers N`` never loads it (each worker does)."""
    path = tiny_job(tmp_path, "dlrm", steps=2)
    program = (
        "import json, sys\n"
        "from sparseflow import cli\n"
        "import sparseflow.distributed.launch as launch\n"
        "launch.launch = lambda argv, n, out, **kw: print('LAUNCH', json.dumps([argv, n, out]))"
        " or 0\n"
        "rc = cli.main(sys.argv[1:])\n"
        "print('RESULT', rc, 'tensorflow' in sys.modules)\n")

    def run(*args, **env):
        done = subprocess.run([sys.executable, "-c", program, *args], cwd=REPO,
                              env=dict(os.environ, **env), capture_output=True, text=True,
                              timeout=120)
        return done.stdout.splitlines()[-1], done.stdout + done.stderr

    result, output = run("train", path, "--workers", "0")
    assert result == "RESULT 2 False" and "--workers must be in [1, 64], got 0" in output
    result, output = run("train", path, "--workers", "2",
                         TF_CONFIG=json.dumps({"cluster": {"worker": ["localhost:1"]},
                                               "task": {"type": "worker", "index": 0}}))
    assert result == "RESULT 2 False" and "unset one of them" in output
    result, output = run("train", path, "--workers", "2", "--out", str(tmp_path / "out"))
    assert result == "RESULT 0 False", output
    argv, n, out = json.loads(output.split("LAUNCH ", 1)[1].splitlines()[0])
    assert n == 2 and out == str(tmp_path / "out")
    assert argv[:3] == ["train", path, "--no-progress"]
