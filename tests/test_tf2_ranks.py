"""sparseflow.tf2.Embedding and the Keras layers on several ranks under
tf.distribute.MultiWorkerMirroredStrategy: one model over tables sharded by key, equal to one
process on the same global batches (tests/workers/tf2_ranks.py).

The one-process runs of the three faces of one kind (saving; refused and resumed restores)
run one after another in one process (``tests/workers/sequence.py``; the first in a fresh
one): a TF2 run is ~5 s of start-up and tracing before its first step. The two-rank runs
each have a launch of their own: ``MultiWorkerMirroredStrategy`` numbers its collectives
from the same instance keys in every strategy, so two strategies in one process confuse
TensorFlow's collective executor ("Collective instance 100 expected type 0 ... but got type
1").
"""

import os

import numpy as np
import pytest

from tests.rank_runs import require_ok, run_ranks, run_sequence

STEPS = 12
FACES = {(): "embedding", ("--keras",): "keras-layer", ("--keras-group",): "keras-group"}


def _run(out_dir, ranks: int | None, *flags) -> list:
    os.makedirs(out_dir, exist_ok=True)
    run_ranks(["tests.workers.tf2_ranks", out_dir, STEPS, *flags], ranks)
    return [np.load(os.path.join(out_dir, f"rank{r}.npz")) for r in range(ranks or 1)]


def _one_process_runs(tmp_path_factory, cases: dict) -> dict:
    """Runs the worker alone for STEPS steps with each case's arguments (label -> (out_dir,
    *args)), one after another in one process: label -> "ok" or its traceback."""
    runs = []
    for label, (out, *args) in cases.items():
        os.makedirs(out, exist_ok=True)
        runs.append({"label": label, "module": "tests.workers.tf2_ranks",
                     "argv": [out, STEPS, *args]})
    return run_sequence(runs, None, tmp_path_factory.mktemp("sequence"))


def _results(out_dir, statuses, label) -> list:
    """The one-process run ``label``'s results (a list of one npz); fails the test when the
    run failed."""
    require_ok(statuses, label)
    return [np.load(os.path.join(out_dir, "rank0.npz"))]


@pytest.fixture(scope="module")
def saving_run(tmp_path_factory):
    """``saving_run(ranks, flags)``: (its directory, its ranks' results) of the worker run
    with ``flags`` on ``ranks`` (None: one process), every rank saving after step 6 to
    ``DIR/ckpt-rank{r}``; run once per module (the one-process runs of every face together,
    at the first call). A launch costs ~10 s of start-up and tracing, and the tests of a face
    compare against the same runs (saving does not change training: the restores below
    train on exactly)."""
    runs = {}

    def get(ranks, flags):
        if ranks is None and (None, flags) not in runs:
            outs = {face: tmp_path_factory.mktemp("saving") for face in FACES}
            statuses = _one_process_runs(tmp_path_factory, {
                FACES[face]: (outs[face], *face, "--save-at", "6", "--save-to",
                              outs[face] / "ckpt") for face in FACES})
            for face in FACES:   # each face's failure fails its own tests only
                runs[None, face] = outs[face], statuses
        if ranks is None:
            out, statuses = runs[None, flags]
            return out, _results(out, statuses, FACES[flags])
        if (ranks, flags) not in runs:
            out = tmp_path_factory.mktemp("saving")
            runs[ranks, flags] = out, _run(out, ranks, *flags, "--save-at", "6", "--save-to",
                                           out / "ckpt")
        return runs[ranks, flags]
    return get


@pytest.mark.parametrize("flags", [(), ("--keras",), ("--keras-group",)],
                         ids=["embedding", "keras-layer", "keras-group"])
def test_two_ranks_under_multi_worker_mirrored_strategy_train_like_one(saving_run, flags):
    _, (one,) = saving_run(None, flags)
    _, two = saving_run(2, flags)
    assert one["losses"][-1] < one["losses"][0]
    for shard in two:
        np.testing.assert_allclose(shard["losses"], one["losses"], rtol=0, atol=1e-5)
        np.testing.assert_allclose(shard["w"], one["w"], rtol=0, atol=1e-5)
    for table in ("a", "b"):
        keys = [shard[f"{table}/keys"] for shard in two]
        for rank, owned in enumerate(keys):
            assert (owned % 2 == rank).all()
        merged = np.concatenate(keys)
        order = np.argsort(merged)
        np.testing.assert_array_equal(merged[order], one[f"{table}/keys"])
        for name in ("weights", "momentum", "velocity", "counts", "last_seen"):
            ours = np.concatenate([shard[f"{table}/{name}"] for shard in two])[order]
            np.testing.assert_allclose(ours, one[f"{table}/{name}"], rtol=0, atol=1e-5,
                                       err_msg=f"{table}/{name}")
        for shard in two:
            assert int(shard[f"{table}/steps"]) == int(one[f"{table}/steps"]) == STEPS
    # A timeout on each collective op made TensorFlow start a thread per op run that slept
    # out the timeout (300 s): thousands of threads a minute, until the pids ran out.
    for shard in two:
        after_second, at_end = (int(n) for n in shard["threads"])
        assert at_end - after_second < STEPS - 2, shard["threads"]
        # Every start reported to the collective watchdog was matched by its end: a
        # collective left pending would abort an idle rank once the timeout passed.
        assert int(shard["pending"]) == 0
    # Table a admits on the counts of both ranks' batches: some keys stay counted only.
    assert len(one["a/counted"]) > 0
    np.testing.assert_array_equal(
        np.sort(np.concatenate([shard["a/counted"] for shard in two])), one["a/counted"])


@pytest.fixture(scope="module")
def restored_alone(tmp_path_factory, saving_run):
    """For every face, one process restores rank 1's shard of the two ranks' checkpoint of
    step 6 (refused), then the two shards merged (``merge_checkpoint_shards``,
    ``merge_weight_shards``): the six runs in one process. Returns (directories by face,
    label -> status)."""
    import shutil

    from sparseflow.keras import merge_weight_shards
    from sparseflow.tf2 import merge_checkpoint_shards

    dirs, cases = {}, {}
    for flags, face in FACES.items():
        dirs[face] = tmp_path_factory.mktemp(f"restored-{face}")
        sharded, _ = saving_run(2, flags)
        cases[f"refused {face}"] = (dirs[face] / "refused", *flags, "--restore",
                                    sharded / "ckpt-rank1", "--start", "6")
        merged = dirs[face] / "merged" / "ckpt"
        shards = [sharded / "ckpt-rank1", sharded / "ckpt-rank0"]   # any order
        if flags == ("--keras-group",):   # the checkpoint holds the head only: rank 0's
            merged.parent.mkdir()
            for path in sharded.glob("ckpt-rank0.*"):
                shutil.copy(path, f"{merged}{path.name[len('ckpt-rank0'):]}")
        else:
            assert merge_checkpoint_shards(shards, merged) == str(merged)
        if flags:
            merge_weight_shards([f"{p}-layer.weights.h5" for p in shards],
                                f"{merged}-layer.weights.h5")
        cases[f"resumed {face}"] = (dirs[face] / "resumed", *flags, "--restore", merged,
                                    "--start", "6")
    return dirs, _one_process_runs(tmp_path_factory, cases)


@pytest.mark.parametrize("flags", [(), ("--keras",), ("--keras-group",)],
                         ids=["embedding", "keras-layer", "keras-group"])
def test_checkpoints_move_between_one_process_and_two_ranks(tmp_path, saving_run,
                                                            restored_alone, flags):
    """One process saves after step 6; two ranks restore it (each keeping the keys it owns)
    and train on exactly as the process did. Two ranks save after step 6: one rank's shard
    restored by one process is refused, naming both worlds, rather than read as the whole
    table; the two shards merged (``merge_checkpoint_shards``, ``merge_weight_shards``)
    resume in one process exactly as the process that never stopped."""
    saved_one, (one,) = saving_run(None, flags)
    two = _run(tmp_path / "two", 2, *flags, "--restore", saved_one / "ckpt-rank0", "--start",
               "6")
    for shard in two:
        np.testing.assert_allclose(shard["losses"], one["losses"][6:], rtol=0, atol=1e-5)
    for table in ("a", "b"):
        merged = np.concatenate([shard[f"{table}/keys"] for shard in two])
        order = np.argsort(merged)
        np.testing.assert_array_equal(merged[order], one[f"{table}/keys"])
        ours = np.concatenate([shard[f"{table}/weights"] for shard in two])[order]
        np.testing.assert_allclose(ours, one[f"{table}/weights"], rtol=0, atol=1e-5)
    dirs, statuses = restored_alone
    face = FACES[flags]
    refused = statuses[f"refused {face}"]
    assert refused != "ok" and not refused.startswith(("DID NOT RUN", "EXITED")), refused
    source = {(): "the checkpoint of Embedding `sparseflow_embedding`",
              ("--keras",): "the saved layer `b`",
              ("--keras-group",): "the saved layer `ab`"}[flags]
    assert f"{source} is rank 1's shard of 2 ranks; this is rank 0 of 1" in refused, refused
    (resumed,) = _results(dirs[face] / "resumed", statuses, f"resumed {face}")
    np.testing.assert_allclose(resumed["losses"], one["losses"][6:], rtol=0, atol=1e-5)
    for table in ("a", "b"):
        np.testing.assert_array_equal(resumed[f"{table}/keys"], one[f"{table}/keys"])
        for name in ("weights", "momentum", "velocity", "counts", "last_seen", "counted"):
            np.testing.assert_allclose(resumed[f"{table}/{name}"], one[f"{table}/{name}"],
                                       rtol=0, atol=1e-5, err_msg=f"{table}/{name}")


def test_a_killed_rank_ends_the_other_naming_the_last_checkpoint_every_rank_wrote(tmp_path,
                                                                                saving_run):
    """Rank 1 dies before step 9, after every rank saved its checkpoint of step 6: rank 0's
    step fails in its collective after SPARSEFLOW_COLLECTIVE_TIMEOUT, and its error ends
    with which rank it is and the checkpoint every rank completed, from which a rerun
    trains on exactly."""
    import time

    begin = time.monotonic()
    done = run_ranks(["tests.workers.tf2_ranks", tmp_path, STEPS, "--save-at", "6",
                      "--save-to", tmp_path / "ckpt", "--die-at", "9"], 2, check=False,
                     grace=60, SPARSEFLOW_COLLECTIVE_TIMEOUT="10")
    assert done.returncode == 7, done.stdout[-3000:]
    assert time.monotonic() - begin < 120
    assert ("[rank 0] sparseflow: rank 0 of 2: a collective among the ranks did not "
            "complete, so another rank died, hung or left (collectives wait 10 s, "
            "SPARSEFLOW_COLLECTIVE_TIMEOUT). The last checkpoint every rank completed: "
            f"{tmp_path / 'ckpt'}-rank0 (this rank's file of it") in done.stdout, \
        done.stdout[-3000:]
    # Every rank restores its own file of that checkpoint and trains on as one process.
    _, (one,) = saving_run(None, ())
    resumed = _run(tmp_path / "resumed", 2, "--restore", f"{tmp_path / 'ckpt'}-rank{{rank}}",
                   "--start", "6")
    for shard in resumed:
        np.testing.assert_allclose(shard["losses"], one["losses"][6:], rtol=0, atol=1e-5)


def test_the_tf2_exchange_waits_the_configured_collective_timeout(monkeypatch):
    import tensorflow as tf

    from sparseflow.table import host_table
    from sparseflow.tf2.sharding import Tf2Sharding

    table = host_table("t", 4, tf.zeros_initializer(), 10, access_threshold=-1,
                       eviction_threshold=None, optimizer=None, size_hint="vocabulary_size")
    monkeypatch.setenv("SPARSEFLOW_COLLECTIVE_TIMEOUT", "7")
    assert Tf2Sharding(0, 2).bind([table], [0]).exchange.timeout_seconds == 7.0
    monkeypatch.setenv("SPARSEFLOW_COLLECTIVE_TIMEOUT", "never")
    with pytest.raises(ValueError, match="SPARSEFLOW_COLLECTIVE_TIMEOUT must be a number"):
        Tf2Sharding(0, 2).bind([table], [0])
