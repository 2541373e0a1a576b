"""Rec SDK programs run unchanged on sparseflow (one process): our program in the shape of Rec
SDK's little demo (tests/rec_sdk_programs/little_demo, imports only ``mx_rec``, TensorFlow and
numpy) runs as a subprocess in every mode of the demo's run.sh.

Each run must exit 0, its loss must fall, its evaluations and saves must run, and after every
step each table's ``size()`` must be what Rec SDK's semantics give on the same generated data
(recomputed here in plain numpy, ``admitted_sizes``): a key is admitted on the batch in which
its count (``faae_coefficient`` x occurrences, summed over the lookups of the table) reaches the
access threshold, a ``set_threshold`` applies from the batch processed after it ran. The demo
installs no EvictHook, so, as in Rec SDK, no eviction runs and sizes never shrink.

Nine training runs combine the switches so that every value of every switch appears at least
once; three of them are followed by a predict run (in another process than the training's)
that restores the last checkpoint and must reproduce the training run's last evaluation. The
nine training runs run one after another in one process, as do the three predict runs
(``tests/workers/sequence.py``: TensorFlow's import, most of a run's time, is paid twice
instead of twelve times); the first of each runs in a fresh process.
"""

import importlib.util
import os

import numpy as np
import pytest

from tests.rank_runs import read_json, run_sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(ROOT, "tests", "rec_sdk_programs", "little_demo")

# run.sh's defaults (Rec SDK's little demo), which each mode below overrides.
DEFAULTS = {"CACHE_MODE": "HBM", "USE_DYNAMIC": "1", "USE_MODIFY_GRAPH": "0",
            "USE_TIMESTAMP": "0", "USE_ONE_SHOT": "0", "USE_MULTI_LOOKUP": "1",
            "MULTI_LOOKUP_TIMES": "2", "USE_DYNAMIC_EXPANSION": "0",
            "APPLY_GRADIENTS_STRATEGY": "sum_same_id_gradients_and_apply"}

# (id, switches, then predict in a second process)
MODES = [
    ("hbm-featurespec", {}, True),
    ("ddr-featurespec-static-timestamp",
     {"CACHE_MODE": "DDR", "USE_DYNAMIC": "0", "USE_TIMESTAMP": "1"}, True),
    ("ssd-modifygraph-timestamp",
     {"CACHE_MODE": "SSD", "USE_MODIFY_GRAPH": "1", "USE_TIMESTAMP": "1",
      "USE_MULTI_LOOKUP": "0"}, True),
    ("hbm-featurespec-oneshot-multi3",
     {"USE_ONE_SHOT": "1", "MULTI_LOOKUP_TIMES": "3"}, False),
    ("hbm-modifygraph-static-oneshot",
     {"USE_DYNAMIC": "0", "USE_MODIFY_GRAPH": "1", "USE_ONE_SHOT": "1",
      "USE_MULTI_LOOKUP": "0"}, False),
    ("hbm-modifygraph-expansion-direct",
     {"USE_MODIFY_GRAPH": "1", "USE_DYNAMIC_EXPANSION": "1",
      "APPLY_GRADIENTS_STRATEGY": "direct_apply"}, False),
    ("hbm-featurespec-expansion-sumsame-timestamp",
     {"USE_DYNAMIC_EXPANSION": "1", "USE_TIMESTAMP": "1", "USE_MULTI_LOOKUP": "0",
      "APPLY_GRADIENTS_STRATEGY": "sum_same_id_gradients_and_apply"}, False),
    ("ssd-featurespec-timestamp-multi3",
     {"CACHE_MODE": "SSD", "USE_TIMESTAMP": "1", "MULTI_LOOKUP_TIMES": "3"}, False),
    ("ddr-modifygraph-multi3",
     {"CACHE_MODE": "DDR", "USE_MODIFY_GRAPH": "1", "MULTI_LOOKUP_TIMES": "3"}, False),
]

# The demo's schedule (main.py / run_mode.py).
STEPS, EVAL_EVERY, EVAL_STEPS, SAVE_EVERY = 40, 20, 5, 20
THRESHOLD_STEP, NEW_THRESHOLD = EVAL_EVERY // 2, 60
# The demo's specs: faae_coefficient per table.
COEFFICIENT = {"user_table": 1, "item_table": 4}
FEATURE = {"user_table": "user_ids", "item_table": "item_ids"}


def _demo_module(name):
    """One of the demo's modules, loaded under a name of its own (no sys.path change)."""
    spec = importlib.util.spec_from_file_location(f"little_demo_{name}",
                                                  os.path.join(DEMO, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _generator():
    """The demo's own data generator (numpy only), to regenerate the batches a run used."""
    return _demo_module("random_data_generator")


def demo_run(label, cwd, mode, switches, rename=None):
    """One run of main.py in ``cwd`` with the switches, for :func:`run_sequence`
    (``rename``: the files it wrote that are kept under another name)."""
    env = dict(TF_CPP_MIN_LOG_LEVEL="3", USE_MODE=mode, **dict(DEFAULTS, **switches))
    return {"label": label, "path": os.path.join(DEMO, "main.py"), "env": env,
            "cwd": str(cwd), "rename": rename or {}}


# --- Rec SDK's admission semantics, in plain numpy ------------------------------------------

def admitted_sizes(batches, coefficient, lookups, thresholds):
    """Keys that own a row after each batch, under Rec SDK's feature admission.

    Args:
      batches: list of int64 arrays, the table's keys of each training batch (one lookup's).
      coefficient: the table's ``faae_coefficient``.
      lookups: how many lookups read those keys (each occurrence counts once per lookup).
      thresholds: per batch, the access threshold in force, or None (admission off).

    Returns:
      int array, the table's key count after each batch.
    """
    counts, admitted, sizes = {}, set(), []
    for keys, threshold in zip(batches, thresholds):
        unique, occurrences = np.unique(keys, return_counts=True)
        for key, occ in zip(unique.tolist(), occurrences.tolist()):
            if key in admitted:
                continue
            counts[key] = counts.get(key, 0) + coefficient * occ * lookups
            if threshold is None or counts[key] >= threshold:
                admitted.add(key)
        sizes.append(len(admitted))
    return np.array(sizes)


def test_admitted_sizes_counts_occurrences_times_coefficient_and_lookups():
    batches = [np.array([5, 5, 7]), np.array([7, 9]), np.array([9, 11, 11])]
    # threshold 2, coefficient 1, one lookup: 5 (twice) at once, 7 on its second batch...
    np.testing.assert_array_equal(admitted_sizes(batches, 1, 1, [2, 2, 2]), [1, 2, 4])
    # ...coefficient 4: every key at first sight; two lookups: likewise.
    np.testing.assert_array_equal(admitted_sizes(batches, 4, 1, [2, 2, 2]), [2, 3, 4])
    np.testing.assert_array_equal(admitted_sizes(batches, 1, 2, [2, 2, 2]), [2, 3, 4])
    # A threshold raised before the last batch holds 9 and 11 back; None admits all.
    np.testing.assert_array_equal(admitted_sizes(batches, 1, 1, [2, 2, 60]), [1, 2, 2])
    np.testing.assert_array_equal(admitted_sizes(batches, 1, 1, [None] * 3), [2, 3, 4])


def reference_sizes(results, table, switch_batch):
    """A table's reference sizes after each training batch, the user table's threshold
    changing to NEW_THRESHOLD from batch ``switch_batch`` (0-based; >= STEPS: never)."""
    generator = _generator()
    batches = [generator.make_batch(results["data"], results["train_seed"], i)[FEATURE[table]]
               for i in range(results["train_batches"])]
    lookups = 1 + results["multi_lookup_times"] if table == "user_table" else 1
    base = results["access_threshold"] if results["use_timestamp"] else None
    thresholds = [NEW_THRESHOLD if table == "user_table" and results["set_threshold"]
                  and i >= switch_batch else base for i in range(len(batches))]
    return admitted_sizes(batches, COEFFICIENT[table], lookups, thresholds)


def check_table_sizes(results, table):
    """After step i the pipeline has processed batches 1..i at least, and may be processing
    later ones (it reads ahead; ``size()`` may be read in the middle of a batch): the size
    must lie between the reference after batch i and the reference after the last batch,
    and after the last step (no batch left) be exactly the reference's last. With
    set_threshold at step S, the first batch under the new threshold is one processed after
    step S: any of S+1 ... (never); one of them must explain every step."""
    sizes = np.array(results["table_size"][table])
    assert sizes.shape == (STEPS,)
    assert np.all(np.diff(sizes) >= 0), f"{table} shrank without an eviction: {sizes}"
    assert np.all(sizes <= np.array(results["table_capacity"][table]))
    switches = range(THRESHOLD_STEP, STEPS + 1) if results["set_threshold"] else [STEPS]
    explained = []
    for switch_batch in switches:
        reference = reference_sizes(results, table, switch_batch)
        # sizes never shrink (above), so sizes <= the last size == the reference's last.
        if sizes[-1] == reference[-1] and np.all(sizes >= reference):
            explained.append(switch_batch)
    assert explained, (f"{table}: sizes {sizes.tolist()} match no reference; without a "
                       f"threshold change: {reference_sizes(results, table, STEPS).tolist()}")


@pytest.fixture(scope="module")
def demo_runs(tmp_path_factory):
    """Every mode's training run (one process), then the predict runs (a second one):
    mode -> (its directory, label -> status)."""
    cwds = {name: tmp_path_factory.mktemp(name) for name, _, _ in MODES}
    statuses = run_sequence([demo_run(f"train {name}", cwds[name], "train", switches,
                                      {"results.json": "train-results.json"})
                             for name, switches, _ in MODES],
                            None, tmp_path_factory.mktemp("train"))
    statuses.update(run_sequence([demo_run(f"predict {name}", cwds[name], "predict", switches)
                                  for name, switches, predict in MODES if predict],
                                 None, tmp_path_factory.mktemp("predict")))
    return cwds, statuses


@pytest.mark.parametrize("name,switches,predict", MODES, ids=[m[0] for m in MODES])
def test_little_demo_mode(demo_runs, name, switches, predict):
    cwds, statuses = demo_runs
    tmp_path = cwds[name]
    results = read_json(statuses, f"train {name}", tmp_path / "train-results.json")

    losses = np.array(results["train_loss"])
    assert losses.shape == (STEPS, 2)
    assert losses[-10:, 0].mean() < losses[:10, 0].mean(), losses[:, 0]

    # Evaluations at steps 20 and 40. A one-shot iterator is never re-initialized: the first
    # evaluation reads the evaluation batches, the second finds none left.
    assert len(results["eval_loss"]) == STEPS // EVAL_EVERY
    lengths = [len(e) for e in results["eval_loss"]]
    assert lengths == ([EVAL_STEPS, 0] if switches.get("USE_ONE_SHOT") == "1"
                       else [EVAL_STEPS, EVAL_STEPS])
    assert np.all(np.isfinite(np.array(results["eval_loss"][0])))

    assert results["saved"] == [20, 40]
    for step in results["saved"]:
        assert os.path.isdir(tmp_path / "saved-model" / f"sparse-model-0-{step}")
        assert os.path.isfile(tmp_path / "saved-model" / f"model-0-{step}.index")

    if results["use_timestamp"]:
        assert results["set_threshold"] == {"step": THRESHOLD_STEP, "value": NEW_THRESHOLD,
                                            "table": "user_table"}
    else:
        assert results["set_threshold"] is None
    for table in ("user_table", "item_table"):
        check_table_sizes(results, table)

    if predict:
        predicted = read_json(statuses, f"predict {name}", tmp_path / "results.json")
        assert predicted["restored"] == 40
        assert predicted["train_loss"] == []
        assert len(predicted["eval_loss"]) == 1
        # The restored model reads the evaluation batches as the trained one did at step 40.
        np.testing.assert_allclose(predicted["eval_loss"][0], results["eval_loss"][-1],
                                   rtol=1e-5)


def test_little_demo_fast_tier_holds_two_batches_but_not_the_read_ahead():
    """The demo's DDR and SSD sizes hold the unique keys of any two consecutive training
    batches of either table (Rec SDK's requirement) but not those of every batch the
    prefetch(100) reads ahead, so the SSD runs above need the pipeline to wait for room (as do
    the DDR runs where the fast tier is device rows over host memory, with a GPU; on CPU, DDR
    keeps every row in host memory)."""
    cfg = _demo_module("config").Config()
    sizes = cfg.cache_mode_dict()
    generator = _generator()
    for batch_size in (128, 64):   # 64: MULTI_LOOKUP_TIMES=3
        params = dict(cfg.data_params(), batch_size=batch_size)
        batches = [generator.make_batch(params, cfg.train_seed, i) for i in range(STEPS)]
        for feature in ("user_ids", "item_ids"):
            keys = [b[feature] for b in batches]
            two = max(np.unique(np.concatenate(keys[i:i + 2])).shape[0]
                      for i in range(STEPS - 1))
            every = np.unique(np.concatenate(keys)).shape[0]
            for mode in ("DDR", "SSD"):
                fast = sizes[mode]["device_vocabulary_size"] + (
                    sizes[mode]["host_vocabulary_size"] if mode == "SSD" else 0)
                assert two <= fast < every, (mode, feature, batch_size, two, fast, every)


def test_modes_cover_every_value_of_every_switch():
    """The mode list covers run.sh: each switch value at least once, one-shot in both graph
    modes, train then predict for every cache mode."""
    runs = [dict(DEFAULTS, **switches) for _, switches, _ in MODES]
    values = {"CACHE_MODE": {"HBM", "DDR", "SSD"}, "USE_DYNAMIC": {"0", "1"},
              "USE_MODIFY_GRAPH": {"0", "1"}, "USE_TIMESTAMP": {"0", "1"},
              "USE_ONE_SHOT": {"0", "1"}, "USE_MULTI_LOOKUP": {"0", "1"},
              "USE_DYNAMIC_EXPANSION": {"0", "1"}}
    for switch, wanted in values.items():
        assert {run[switch] for run in runs} == wanted, switch
    assert {r["MULTI_LOOKUP_TIMES"] for r in runs if r["USE_MULTI_LOOKUP"] == "1"} == {"2", "3"}
    assert {r["APPLY_GRADIENTS_STRATEGY"] for r in runs
            if r["USE_DYNAMIC_EXPANSION"] == "1"} == {"direct_apply",
                                                       "sum_same_id_gradients_and_apply"}
    assert {r["USE_MODIFY_GRAPH"] for r in runs if r["USE_ONE_SHOT"] == "1"} == {"0", "1"}
    assert {dict(DEFAULTS, **s)["CACHE_MODE"] for _, s, p in MODES if p} == {"HBM", "DDR",
                                                                              "SSD"}
