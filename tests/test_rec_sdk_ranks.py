"""Rec SDK programs on several ranks: our program in the shape of Rec SDK's little demo runs
unchanged under ``sparseflow launch -n 2`` (as Rec SDK's run.sh runs it under
``horovodrun -np N``) and trains one model over tables sharded by key.

The demo shards its batches by rank (``dataset.shard(rank_size, rank_id)`` on batches), so
global step i trains batches 2i and 2i+1 of the generated stream, one per rank. Its dense
gradients are all-reduced with ``hccl_ops.allreduce(grad, "sum")``.

Each group of runs of one program (the little demo's training runs, its predict runs, the
estimator program's runs, the model programs) runs one after another in one launch of two
ranks (``tests/workers/sequence.py``: each run with its own environment, directory and
modules; the first in fresh processes), so that the ranks pay for TensorFlow's import once
a group instead of once a run.
"""

import os

import numpy as np
import pytest

from tests.rank_runs import read_json, run_sequence

from tests.test_rec_sdk_programs import (COEFFICIENT, EVAL_STEPS, FEATURE, NEW_THRESHOLD,
                                         STEPS, THRESHOLD_STEP, _generator, admitted_sizes,
                                         demo_run as one_process_demo_run)

RANKS = 2


def demo_run(label, cwd, mode, switches):
    """One run of main.py in ``cwd`` with the switches, for :func:`run_sequence` (each
    rank's results-{rank}.json kept as {mode}-results-{rank}.json)."""
    return one_process_demo_run(label, cwd, mode, switches,
                                {"results-{rank}.json": mode + "-results-{rank}.json"})


def read_demo_results(cwd, statuses, label, mode):
    """Each rank's results (list of dict) of a :func:`demo_run`; fails the test with the
    run's traceback when it failed."""
    return [read_json(statuses, label, os.path.join(cwd, f"{mode}-results-{rank}.json"))
            for rank in range(RANKS)]


def merged_reference_sizes(results, table, switch_step):
    """The table's key count (all shards) after each global step: step i admits on the keys
    of batches 2i and 2i+1 together (their counts add up at the owner)."""
    generator = _generator()
    batches = [np.concatenate([generator.make_batch(results["data"], results["train_seed"],
                                                    RANKS * i + r)[FEATURE[table]]
                               for r in range(RANKS)]) for i in range(STEPS)]
    lookups = 1 + results["multi_lookup_times"] if table == "user_table" else 1
    base = results["access_threshold"] if results["use_timestamp"] else None
    thresholds = [NEW_THRESHOLD if table == "user_table" and results["set_threshold"]
                  and i >= switch_step else base for i in range(STEPS)]
    return admitted_sizes(batches, COEFFICIENT[table], lookups, thresholds)


# run.sh's modes: HBM, DDR (a shard's rows all in host memory) and SSD (a shard's rows over
# its own disk tier) caches, dynamic expansion, FeatureSpec mode and automatic graph
# modification, dynamic and static shapes, several lookups of one table. One-shot
# iterators: below.
MODES = {"ddr-featurespec-timestamp": {"CACHE_MODE": "DDR", "USE_TIMESTAMP": "1"},
         "featurespec-static-timestamp-multi3": {"USE_DYNAMIC": "0", "USE_TIMESTAMP": "1",
                                                 "MULTI_LOOKUP_TIMES": "3"},
         "ssd-modifygraph-timestamp-multi": {"CACHE_MODE": "SSD", "USE_MODIFY_GRAPH": "1",
                                             "USE_TIMESTAMP": "1", "USE_MULTI_LOOKUP": "1",
                                             "MULTI_LOOKUP_TIMES": "2"},
         "modifygraph-static": {"USE_DYNAMIC": "0", "USE_MODIFY_GRAPH": "1",
                                "USE_MULTI_LOOKUP": "0"},
         "featurespec-expansion-timestamp": {"USE_DYNAMIC_EXPANSION": "1",
                                             "USE_TIMESTAMP": "1", "USE_MULTI_LOOKUP": "0"},
         "modifygraph-expansion-direct": {"USE_MODIFY_GRAPH": "1", "USE_DYNAMIC_EXPANSION": "1",
                                          "APPLY_GRADIENTS_STRATEGY": "direct_apply"}}


ONE_SHOT_MODES = {"modifygraph-static": {"USE_DYNAMIC": "0", "USE_MODIFY_GRAPH": "1",
                                         "USE_ONE_SHOT": "1", "USE_MULTI_LOOKUP": "0"},
                  "featurespec-multi3": {"USE_ONE_SHOT": "1", "MULTI_LOOKUP_TIMES": "3"}}


@pytest.fixture(scope="module")
def demo_runs(tmp_path_factory):
    """Every mode's training run and the one-shot runs (one launch of two ranks), then every
    mode's predict run (a second launch): (directories by label, label -> status)."""
    cwds = {f"train {m}": tmp_path_factory.mktemp(m) for m in MODES}
    cwds.update({f"one-shot {m}": tmp_path_factory.mktemp(f"one-shot-{m}")
                 for m in ONE_SHOT_MODES})
    statuses = run_sequence(
        [demo_run(f"train {m}", cwds[f"train {m}"], "train", s) for m, s in MODES.items()]
        + [demo_run(f"one-shot {m}", cwds[f"one-shot {m}"], "train", s)
           for m, s in ONE_SHOT_MODES.items()], RANKS, tmp_path_factory.mktemp("train"))
    statuses.update(run_sequence(
        [demo_run(f"predict {m}", cwds[f"train {m}"], "predict", s) for m, s in MODES.items()],
        RANKS, tmp_path_factory.mktemp("predict")))
    return cwds, statuses


@pytest.fixture(params=list(MODES))
def trained(request, demo_runs):
    cwds, statuses = demo_runs
    cwd = cwds[f"train {request.param}"]
    return (cwd, statuses, read_demo_results(cwd, statuses, f"train {request.param}", "train"),
            request.param)


def test_the_ranks_train_one_model_whose_loss_falls(trained):
    _, _, (first, second), _ = trained
    # The losses are each rank's own batch's; the dense variables, all-reduced, stay one.
    for results in (first, second):
        losses = np.array(results["train_loss"])
        assert losses.shape == (STEPS, 2)
        assert losses[-10:, 0].mean() < losses[:10, 0].mean(), losses[:, 0]
        assert results["saved"] == [20, 40]
    assert np.array(first["train_loss"]).tolist() != np.array(second["train_loss"]).tolist()


@pytest.mark.parametrize("table", ["user_table", "item_table"])
def test_the_shards_together_hold_the_keys_admitted_over_both_ranks_batches(trained, table):
    _, _, ranks, _ = trained
    total = np.sum([np.array(r["table_size"][table]) for r in ranks], axis=0)
    # set_threshold ran on every rank at step THRESHOLD_STEP; the owners admit in the
    # step, so the next step is the first under the new threshold.
    reference = merged_reference_sizes(ranks[0], table, THRESHOLD_STEP)
    np.testing.assert_array_equal(total, reference)
    # Each rank holds about half (keys mod 2), not a copy of every key.
    for r in ranks:
        assert 0.3 * total[-1] < r["table_size"][table][-1] < 0.7 * total[-1]


def test_each_rank_saves_its_shard_and_predict_restores_every_shard(trained):
    cwd, statuses, ranks, mode = trained
    for rank in range(RANKS):
        for step in (20, 40):
            assert os.path.isdir(cwd / "saved-model" / f"sparse-model-{rank}-{step}")
    predicted = read_demo_results(cwd, statuses, f"predict {mode}", "predict")
    for before, after in zip(ranks, predicted):
        assert after["restored"] == 40 and after["train_loss"] == []
        np.testing.assert_allclose(after["eval_loss"][0], before["eval_loss"][-1], rtol=1e-5)


@pytest.mark.parametrize("mode", list(ONE_SHOT_MODES))
def test_one_shot_evaluation_ends_its_data_on_every_rank_and_training_goes_on(demo_runs,
                                                                               mode):
    """USE_ONE_SHOT=1: the second evaluation's one-shot iterator is spent, so its first step
    ends the data (OutOfRangeError) on both ranks inside a step holding collectives; the
    save after it, and the training after that, go on (the next collective step once failed
    on TensorFlow's reused step id: tests/test_session_ranks.py)."""
    cwds, statuses = demo_runs
    label = f"one-shot {mode}"
    ranks = read_demo_results(cwds[label], statuses, label, "train")
    for results in ranks:
        assert [len(losses) for losses in results["eval_loss"]] == [EVAL_STEPS, 0]
        assert results["saved"] == [20, 40]
        assert np.array(results["train_loss"]).shape == (STEPS, 2)
    for table in ("user_table", "item_table"):
        total = np.sum([np.array(r["table_size"][table]) for r in ranks], axis=0)
        np.testing.assert_array_equal(total, merged_reference_sizes(ranks[0], table,
                                                                    THRESHOLD_STEP))


# run.sh's train_and_evaluate in FeatureSpec mode, and in graph-modification mode with
# timestamps and one-shot iterators, and with dynamic expansion.
ESTIMATOR_MODES = {"featurespec": {"USE_MODIFY_GRAPH": "0"},
                   "modifygraph-timestamp-oneshot": {"USE_TIMESTAMP": "1", "USE_ONE_SHOT": "1"},
                   "modifygraph-expansion": {"USE_DYNAMIC_EXPANSION": "1",
                                             "USE_MULTI_LOOKUP": "0"}}


@pytest.fixture(scope="module")
def estimator_runs(tmp_path_factory):
    """Every estimator mode's train_and_evaluate run, in one launch of two ranks: (their
    directories by mode, label -> status)."""
    from tests.test_rec_sdk_estimator_program import program_run

    cwds = {mode: tmp_path_factory.mktemp(f"estimator-{mode}") for mode in ESTIMATOR_MODES}
    runs = [program_run(mode, cwds[mode], "train_and_evaluate", switches,
                        mode_variable="USE_MODE") for mode, switches in ESTIMATOR_MODES.items()]
    return cwds, run_sequence(runs, RANKS, tmp_path_factory.mktemp("estimator"))


@pytest.mark.parametrize("mode", list(ESTIMATOR_MODES))
def test_little_demo_estimator_trains_one_model_over_two_ranks(estimator_runs, mode):
    """Our program in the shape of Rec SDK's little_demo_estimator, text unchanged, under
    `sparseflow launch -n 2` (train_and_evaluate, one model_dir for both ranks): the loss
    falls, both ranks save at every schedule step and evaluate each checkpoint, and at the
    end the two shards together hold exactly the keys admitted over both ranks' batches,
    each key in its owner's shard."""
    from sparseflow.checkpoint.saver import read_shard_states
    from tests.test_rec_sdk_estimator_program import (DATA_STEPS, EVAL_STEPS, MAX_STEPS,
                                                      TRAIN_STEPS, reference_sizes, stream)

    cwds, statuses = estimator_runs
    tmp_path = cwds[mode]
    results = read_json(statuses, mode, tmp_path / "results.json")   # the last rank's
    (train,) = results["train"]
    losses = np.array(train["loss"])
    assert losses.shape == (MAX_STEPS,) and np.all(np.isfinite(losses))
    assert losses[-10:].mean() < losses[:10].mean(), losses.round(3).tolist()
    model_dir = tmp_path / "_rank"
    expected = [0, TRAIN_STEPS, MAX_STEPS]
    for prefix in ("model.ckpt-", "model.ckpt-rank1-"):   # rank 0's, rank 1's
        assert sorted(int(p.name[len(prefix):-len(".index")])
                      for p in model_dir.glob(f"{prefix}*.index")
                      if p.name[len(prefix):-len(".index")].isdigit()
                      and (model_dir / f"sparse-{p.name[:-len('.index')]}").is_dir()
                      ) == expected, prefix
    assert [e["global_step"] for e in results["eval"]] == [TRAIN_STEPS, MAX_STEPS]
    for evaluation in results["eval"]:
        assert len(evaluation["loss"]) == EVAL_STEPS
        assert np.all(np.isfinite(evaluation["loss"]))
    shards = [read_shard_states(str(model_dir / f"model.ckpt-{MAX_STEPS}")),
              read_shard_states(str(model_dir / f"model.ckpt-rank1-{MAX_STEPS}"))]
    # Rank r trained batches r, r + 2, ... of the generated stream: together, all of them.
    batches = stream(results, results["train_seed"], RANKS * DATA_STEPS)
    for table, size in reference_sizes(results, batches).items():
        for rank, shard in enumerate(shards):
            assert (shard[table].keys % RANKS == rank).all(), (table, rank)
        assert sum(len(shard[table].keys) for shard in shards) == size, table


MODEL_PROGRAMS = ["dlrm", "dcnv2", "mmoe", "wide_deep"]


@pytest.fixture(scope="module")
def model_runs(tmp_path_factory):
    """Writes each program's data and runs the four programs in one launch of two ranks:
    (name -> (directory, training ids, dense values), label -> status)."""
    from tests.test_rec_sdk_model_programs import FORMATS, PROGRAMS, write_criteo_like

    data, runs = {}, []
    for name in MODEL_PROGRAMS:
        cwd = tmp_path_factory.mktemp(f"model-{name}")
        data[name] = (cwd, *write_criteo_like(str(cwd / "data"), **FORMATS[name]))
        runs.append({"label": name, "path": os.path.join(PROGRAMS, name, "main.py"),
                     "cwd": str(cwd), "env": dict(TF_CPP_MIN_LOG_LEVEL="3", CACHE_MODE="HBM",
                                                  DATA_PATH=str(cwd / "data"))})
    return data, run_sequence(runs, RANKS, tmp_path_factory.mktemp("models"))


@pytest.mark.parametrize("name", MODEL_PROGRAMS)
def test_model_programs_train_one_model_over_two_ranks(model_runs, name):
    """Our dlrm, DCNv2, MMoE and Wide&Deep programs (Rec SDK's examples' shape) run unchanged
    under `sparseflow launch -n 2` in HBM mode: the loss falls and each rank's table holds
    about half of the keys admitted over the data (its shard), not all of them."""
    from tests.test_rec_sdk_model_programs import TRAIN_STEPS, admitted_keys

    data, statuses = model_runs
    tmp_path, ids, dense = data[name]
    results = read_json(statuses, name, tmp_path / "results.json")   # the last rank's
    losses = np.array(results["train_loss"])
    # Each rank reads its part of the data (dataset.shard by rank): half the steps.
    assert losses.shape == (TRAIN_STEPS // RANKS,)
    assert losses[-5:].mean() < losses[:5].mean(), losses
    keys = np.concatenate([dense, ids], axis=1) if name == "wide_deep" else ids
    every_key = admitted_keys(keys, 1, None)
    for table, size in results["table_size"].items():
        assert 0.3 * every_key < size < 0.7 * every_key, (table, size, every_key)
