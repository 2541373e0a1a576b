"""The Estimator on several ranks: every rank given the same model_dir trains one model over
a table sharded by key, equal to one process on the same global batches, and a model_dir
resumes on another number of ranks (tests/workers/estimator_ranks.py). The file's seven runs
share three launches (``tests/workers/sequence.py``): one process trains; then two ranks
train, resume the one process's model_dir and save on a time interval; then one process
resumes the two ranks' model_dir and exports both."""

import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from sparseflow.checkpoint.saver import read_shard_states, read_sparse_states
from tests.rank_runs import require_ok, run_sequence

WORKER = "tests.workers.estimator_ranks"


def _run(label, model_dir, *flags) -> dict:
    return {"label": label, "module": WORKER, "argv": [model_dir, 12, *flags]}


def _at_step_6(source, model_dir) -> None:
    """``model_dir``: ``source`` as it was after step 6 (its later checkpoints left out)."""
    shutil.copytree(source, model_dir, ignore=shutil.ignore_patterns("*-12*", "*rank1",
                                                                      "events*"))
    for state in ("checkpoint", "checkpoint-rank1"):
        if os.path.exists(model_dir / state):
            text = (model_dir / state).read_text().replace("-12\"", "-6\"")
            (model_dir / state).write_text(text)


def _model(model_dir, step: int, ranks: int) -> dict:
    """The checkpoint at ``step``: its dense head and every shard's table merged by key."""
    prefixes = [os.path.join(model_dir, f"model.ckpt-{step}")] + [
        os.path.join(model_dir, f"model.ckpt-rank{r}-{step}") for r in range(1, ranks)]
    shards = [read_shard_states(p)["t"] for p in prefixes]
    for rank, shard in enumerate(shards):
        assert (shard.keys % ranks == rank).all()
    # What one process reads (to restore, evaluate or export): every shard, merged.
    whole = read_sparse_states(prefixes[0])["t"]
    assert sorted(whole.keys.tolist()) == sorted(np.concatenate([s.keys for s in shards]).tolist())
    keys = np.concatenate([s.keys for s in shards])
    order = np.argsort(keys)
    return {"w": tf.train.load_variable(prefixes[0], "w"), "keys": keys[order],
            "values": np.concatenate([s.values for s in shards])[order],
            "counts": np.concatenate([s.counts for s in shards])[order],
            "counted": np.sort(np.concatenate([s.counted_keys for s in shards])),
            "steps": [s.optimizer_steps for s in shards]}


def _assert_same(ours: dict, reference: dict) -> None:
    np.testing.assert_array_equal(ours["keys"], reference["keys"])
    np.testing.assert_array_equal(ours["counts"], reference["counts"])
    np.testing.assert_array_equal(ours["counted"], reference["counted"])
    np.testing.assert_allclose(ours["values"], reference["values"], rtol=0, atol=1e-5)
    np.testing.assert_allclose(ours["w"], reference["w"], rtol=0, atol=1e-5)
    assert ours["steps"] == reference["steps"] * len(ours["steps"])   # every shard


@pytest.fixture(scope="module")
def all_runs(tmp_path_factory):
    """Every run of the file (see the module docstring): (directories by label, label ->
    status). "one" and "two": one process and two ranks training 12 steps from scratch
    (checkpoints every 6) and evaluating; "None->2" / "2->None": the other's model_dir after
    step 6 trained on to 12; "save-secs": two ranks saving every second; "export one" /
    "export two": one process exporting each model_dir."""
    base = tmp_path_factory.mktemp("estimator")
    dirs = {label: base / label.replace(" ", "-").replace(">", "")
            for label in ("one", "two", "None->2", "2->None", "save-secs", "export one",
                          "export two")}
    statuses = run_sequence([_run("one", dirs["one"], "--evaluate")], None, base / "one-seq")
    if statuses["one"] == "ok":   # else "None->2" fails on its missing model_dir
        _at_step_6(dirs["one"], dirs["None->2"])
    dirs["save-secs"].mkdir()
    statuses.update(run_sequence([_run("two", dirs["two"], "--evaluate"),
                                  _run("None->2", dirs["None->2"]),
                                  _run("save-secs", dirs["save-secs"], "--save-secs")], 2,
                                 base / "two-seq"))
    if statuses["two"] == "ok":
        _at_step_6(dirs["two"], dirs["2->None"])
    statuses.update(run_sequence([_run("2->None", dirs["2->None"]),
                                  _run("export one", dirs["one"], "--export",
                                       dirs["export one"]),
                                  _run("export two", dirs["two"], "--export",
                                       dirs["export two"])], None, base / "last-seq"))
    return dirs, statuses


def _ok(all_runs, *labels) -> list:
    """The directories of the runs ``labels``; fails the test if one of them failed."""
    dirs, statuses = all_runs
    for label in labels:
        require_ok(statuses, label)
    return [dirs[label] for label in labels]


@pytest.fixture
def runs(all_runs):
    """One process and two ranks, each training 12 steps from scratch (checkpoints every 6)."""
    return _ok(all_runs, "one", "two")


def test_two_ranks_train_the_model_one_process_trains(runs):
    one, two = runs
    reference = _model(one, 12, 1)
    assert len(reference["keys"]) > 100 and len(reference["counted"]) > 0
    _assert_same(_model(two, 12, 2), reference)
    # Each rank saved its own shard and state file; rank 1's events went to a directory
    # of its own.
    assert os.path.exists(two / "checkpoint-rank1") and os.path.isdir(two / "rank1")


def test_every_rank_evaluates_all_the_data_as_one_process_does(runs):
    import json

    one, two = runs
    with open(one / "eval-rank0.json") as f:
        reference = json.load(f)
    assert set(reference) == {"loss", "auc", "accuracy", "global_step"}
    assert 0.5 < reference["auc"] < 1.0
    for rank in range(2):
        with open(two / f"eval-rank{rank}.json") as f:
            ours = json.load(f)
        assert ours.keys() == reference.keys()
        for name, value in reference.items():
            assert ours[name] == pytest.approx(value, abs=1e-5), name


@pytest.mark.parametrize("first,then", [(None, 2), (2, None)])
def test_a_model_dir_resumes_on_another_number_of_ranks(runs, all_runs, first, then):
    # The model_dir as it was after step 6, then trained on to 12 on the other ranks.
    one, _ = runs
    (model_dir,) = _ok(all_runs, f"{first}->{then}")
    _assert_same(_model(model_dir, 12, then or 1), _model(one, 12, 1))


def test_one_process_exports_every_shard_of_a_two_rank_model_dir(all_runs):
    """export_saved_model from the model_dir two ranks trained (one shard each) serves what
    the one-process model serves: every key, from both shards."""
    from tests.workers.estimator_ranks import data

    served = []
    for out in _ok(all_runs, "export one", "export two"):
        model = tf.saved_model.load((out / "path.txt").read_text())
        features, _ = data(seed=9, steps=4)
        served.append(model.signatures["serving_default"](
            ids=tf.constant(features["ids"]), more=tf.constant(features["more"]))["prob"].numpy())
    one, two = served
    np.testing.assert_allclose(two, one, rtol=0, atol=1e-5)
    assert np.std(one) > 0.01   # the rows matter: keys of both shards were found


def test_ranks_save_on_a_time_interval_at_the_same_steps(runs, all_runs):
    """``save_checkpoints_secs`` (RunConfig's default is 600) over ranks whose clocks
    disagree (rank 1's steps are slower): every rank saves after the same steps, as a save
    takes part in collectives, and training is that of one process."""
    one, _ = runs
    (tmp_path,) = _ok(all_runs, "save-secs")
    steps = {}
    for rank, pattern in enumerate(("model.ckpt-*.index", "model.ckpt-rank1-*.index")):
        names = [p.name for p in tmp_path.glob(pattern)]
        steps[rank] = sorted(int(n.split("-")[-1].split(".")[0]) for n in names
                             if rank == 1 or "rank" not in n)
    assert steps[0] == steps[1], steps
    assert any(0 < s < 12 for s in steps[0]), steps       # saved on the interval, not only
    assert steps[0][-1] == 12                               # at the start and the end
    _assert_same(_model(tmp_path, 12, 2), _model(one, 12, 1))
