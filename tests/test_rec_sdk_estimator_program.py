"""A program in the shape of Rec SDK's little_demo_estimator runs unchanged on sparseflow.

Our program (tests/rec_sdk_programs/little_demo_estimator) has the demo's modules and makes the
demo's calls in the demo's order: ``init(...)``, FeatureSpecs built in ``input_fn``,
``create_table`` and ``sparse_lookup`` inside ``model_fn``, ``NPURunConfig`` with the NPU-only
options, ``NPUEstimator``, ``npu_hooks_append``, ``GraphModifierHook`` / ``EvictHook``, then
``train``, ``tf.estimator.train_and_evaluate`` or ``predict``, and ``export_saved_model``. It
imports only ``mx_rec``, its own ``tf_adapter.py`` (which takes the names from
``npu_device.compat.v1.npu_init`` on TF 2, as the demo's does), TensorFlow and numpy, and runs
here as a subprocess in each mode of the demo's run.sh, in both graph modes.

Each run must exit 0 and its results.json must show: the loss falling; checkpoints at the steps
the schedule gives; an evaluation of each checkpoint but the first, over ``eval_steps`` batches
with a finite loss; after training, every distinct key of the training batches owning a row
(with admission on: the keys whose count reached the threshold, recomputed here in numpy);
evaluation and prediction adding no key (their tables hold what the checkpoint they restored
holds). A predict run (in another process than the training's) must read the evaluation
stream, yield one batch per generated batch and reproduce the last evaluation's losses; the
exported SavedModel, loaded by plain TensorFlow in a process without sparseflow, must predict
what ``predict`` predicted. The seven training runs run one after another in one process, the
three predict runs in a second (``tests/workers/sequence.py``), each program in a directory of
its own; the first of each runs in a fresh process.
"""

import importlib.util
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.rank_runs import read_json, run_sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(ROOT, "tests", "rec_sdk_programs", "little_demo_estimator")

# run.sh's switches (USE_DETERMINISTIC: a seeded graph, for a reproducible loss curve); each
# case below overrides some.
DEFAULTS = {"USE_DYNAMIC": "1", "USE_DYNAMIC_EXPANSION": "0", "USE_MULTI_LOOKUP": "1",
            "MULTI_LOOKUP_TIMES": "2", "USE_MODIFY_GRAPH": "1", "USE_TIMESTAMP": "0",
            "USE_ONE_SHOT": "0", "USE_EXPORT_SAVED_MODEL": "0", "USE_DETERMINISTIC": "1",
            "CACHE_MODE": "HBM"}

# The program's defaults (main.py's arguments).
MAX_STEPS, TRAIN_STEPS, EVAL_STEPS, DATA_STEPS = 40, 20, 5, 40

# (id, run mode, switches, program arguments, batches to predict in a second process or None)
CASES = [
    ("train-featurespec-static", "train",
     {"USE_MODIFY_GRAPH": "0", "USE_DYNAMIC": "0"}, ["--save_checkpoints_steps", "15"], 7),
    ("train-modifygraph", "train", {}, [], 5),
    ("train_and_evaluate-featurespec-export", "train_and_evaluate",
     {"USE_MODIFY_GRAPH": "0", "USE_EXPORT_SAVED_MODEL": "1"}, [], 6),
    ("train_and_evaluate-modifygraph", "train_and_evaluate", {}, [], None),
    ("train_and_evaluate-featurespec-timestamp", "train_and_evaluate",
     {"USE_MODIFY_GRAPH": "0", "USE_TIMESTAMP": "1"}, [], None),
    ("train_and_evaluate-modifygraph-timestamp-oneshot", "train_and_evaluate",
     {"USE_TIMESTAMP": "1", "USE_ONE_SHOT": "1"}, [], None),
    ("train_and_evaluate-modifygraph-expansion-onelookup", "train_and_evaluate",
     {"USE_DYNAMIC_EXPANSION": "1", "USE_MULTI_LOOKUP": "0"}, [], None),
]


def _demo_module(name):
    """One of the program's modules, loaded under a name of its own (no sys.path change)."""
    spec = importlib.util.spec_from_file_location(f"little_demo_estimator_{name}",
                                                  os.path.join(DEMO, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GENERATOR = _demo_module("random_data_generator")   # numpy only


def program_run(label, cwd, mode, switches, args=(), mode_variable="RUN_MODE", rename=None):
    """One run of main.py in ``cwd`` with the switches, for :func:`run_sequence`
    (``rename``: the files it wrote that are kept under another name)."""
    env = dict(TF_CPP_MIN_LOG_LEVEL="3", RUN_MODE=None, USE_MODE=None,
               **dict(DEFAULTS, **switches))
    env[mode_variable] = mode
    return {"label": label, "path": os.path.join(DEMO, "main.py"), "argv": list(args),
            "env": env, "cwd": str(cwd), "rename": rename or {}}


# --- what the tables must hold, in numpy ----------------------------------------------------

def stream(results, seed, batches):
    return [GENERATOR.make_batch(results["data"], seed, i) for i in range(batches)]


def reference_sizes(results, batches):
    """Keys owning a row after training on ``batches``, per table. With admission on, a key is
    admitted once its count (occurrences x the lookups of its table: the user table is looked
    up 1 + multi_lookup_times times) reaches the access threshold; otherwise every key is."""
    threshold = results["access_threshold"] if results["use_timestamp"] else None
    lookups = {"user_table": 1 + results["multi_lookup_times"], "item_table": 1}
    sizes = {}
    for table, feature in (("user_table", "user_ids"), ("item_table", "item_ids")):
        keys, counts = np.unique(np.concatenate([b[feature].ravel() for b in batches]),
                                 return_counts=True)
        if threshold is None:
            sizes[table] = int(keys.size)
        else:
            sizes[table] = int(np.sum(counts * lookups[table] >= threshold))
    return sizes


def test_reference_sizes_count_occurrences_times_lookups():
    batches = [{"user_ids": np.array([[1, 1], [2, 3]]), "item_ids": np.array([[7, 7, 7, 8]])},
               {"user_ids": np.array([[2, 4]]), "item_ids": np.array([[7, 9]])}]
    plain = {"access_threshold": 4, "use_timestamp": False, "multi_lookup_times": 2}
    assert reference_sizes(plain, batches) == {"user_table": 4, "item_table": 3}
    # threshold 4: user keys 1 and 2 (2 occurrences x 3 lookups), item key 7 (4 x 1).
    admission = dict(plain, use_timestamp=True)
    assert reference_sizes(admission, batches) == {"user_table": 2, "item_table": 1}
    assert reference_sizes(dict(admission, multi_lookup_times=0),
                           batches) == {"user_table": 0, "item_table": 1}


# --- checks ---------------------------------------------------------------------------------

def checkpoint_steps(model_dir):
    """Steps of the complete checkpoints in model_dir (dense index and sparse directory)."""
    steps = set()
    for name in os.listdir(model_dir):
        if name.startswith("model.ckpt-") and name.endswith(".index"):
            step = int(name[len("model.ckpt-"):-len(".index")])
            if os.path.isdir(os.path.join(model_dir, f"sparse-model.ckpt-{step}")):
                steps.add(step)
    return sorted(steps)


def check_model_fn_calls(results, expected):
    """model_fn ran once per graph, in these modes, each time creating both tables."""
    assert [call["mode"] for call in results["model_fn"]] == expected
    for call in results["model_fn"]:
        assert call["tables"] == ["user_table", "item_table"]


def check_training(results, tmp_path, mode, switches, args):
    train_batches = stream(results, results["train_seed"], DATA_STEPS)
    (train,) = results["train"]
    assert train["global_step"] == MAX_STEPS
    # Graph modification rewrote the training iterator of the training graph, and the
    # evaluation iterator of each evaluation graph; FeatureSpec mode rewrote none.
    modify_graph = switches.get("USE_MODIFY_GRAPH", DEFAULTS["USE_MODIFY_GRAPH"]) == "1"
    assert train["rewritten_channels"] == (["train"] if modify_graph else [])
    for evaluation in results["eval"]:
        assert evaluation["rewritten_channels"] == (["eval"] if modify_graph else [])
    losses = np.array(train["loss"])
    assert losses.shape == (MAX_STEPS,)
    assert np.all(np.isfinite(losses))
    assert losses[-10:].mean() < losses[:10].mean() - 0.02, losses.round(3).tolist()
    # The data ends with the last step: every batch was processed, none ahead.
    assert train["table_size"] == reference_sizes(results, train_batches)

    model_dir = tmp_path / "_rank"
    if mode == "train":
        every = int(args[args.index("--save_checkpoints_steps") + 1]) if args else MAX_STEPS
        assert results["args"]["save_checkpoints_steps"] == every
        expected = sorted(set(range(0, MAX_STEPS, every)) | {MAX_STEPS})
        assert checkpoint_steps(model_dir) == expected
        assert results["eval"] == []
        check_model_fn_calls(results, ["train"])
        return

    # train_and_evaluate: a checkpoint every train_steps, each but the first evaluated.
    assert checkpoint_steps(model_dir) == [0, TRAIN_STEPS, MAX_STEPS]
    assert [e["global_step"] for e in results["eval"]] == [TRAIN_STEPS, MAX_STEPS]
    for evaluation in results["eval"]:
        # A one-shot iterator too: input_fn builds a new one for each evaluation.
        assert len(evaluation["loss"]) == EVAL_STEPS
        assert np.all(np.isfinite(evaluation["loss"]))
        # Evaluation restores the checkpoint's keys and adds none.
        step = evaluation["global_step"]
        assert evaluation["table_size"] == reference_sizes(results, train_batches[:step]), step
    last = results["train_and_evaluate"]
    assert last["global_step"] == MAX_STEPS
    np.testing.assert_allclose(last["loss"], np.mean(results["eval"][-1]["loss"]), rtol=1e-5)
    calls = ["train", "eval", "eval"]
    if switches.get("USE_EXPORT_SAVED_MODEL") == "1":
        calls.append("infer")   # export_saved_model: model_fn in PREDICT on the placeholders
        export_dir = results["export_dir"]
        assert os.path.dirname(export_dir) == str(tmp_path / "model_path")
        assert os.path.isfile(os.path.join(export_dir, "saved_model.pb"))
    check_model_fn_calls(results, calls)
    if switches.get("USE_TIMESTAMP") == "1":
        # Admission held keys back (the check above is against the admitted keys).
        assert train["table_size"] != reference_sizes(dict(results, use_timestamp=False),
                                                      train_batches)


def check_prediction(trained, predicted, tmp_path, batches):
    assert predicted["mode"] == "predict"
    check_model_fn_calls(predicted, ["infer"])
    (record,) = predicted["predict"]
    assert record["global_step"] == MAX_STEPS     # the latest checkpoint, restored
    # With graph modification, prediction's lookups (is_train=False) read the evaluation
    # channel: its iterator is the one rewritten.
    assert record["rewritten_channels"] == (["eval"] if predicted["modify_graph"] else [])
    assert record["table_size"] == trained["train"][0]["table_size"]   # no key added
    assert predicted["predictions"] == {"batches": batches,
                                        "shape": [batches, predicted["data"]["batch_size"]]}
    out = np.load(tmp_path / "predictions.npz")
    for task in ("task_1", "task_2"):
        assert np.all((out[task] > 0) & (out[task] < 1))
    # Prediction reads the evaluation stream from its first batch.
    eval_batches = stream(predicted, predicted["eval_seed"], batches)
    np.testing.assert_array_equal(out["label"], [b["label_0"] for b in eval_batches])
    if trained["eval"]:
        # The restored model reproduces the last evaluation on the batches both read.
        np.testing.assert_allclose(record["loss"][:EVAL_STEPS], trained["eval"][-1]["loss"],
                                   rtol=1e-5)
    return out, eval_batches


SERVE = textwrap.dedent("""
    import sys
    import numpy as np
    import tensorflow as tf

    export_dir, inputs_file, outputs_file = sys.argv[1:]
    inputs = np.load(inputs_file)
    serve = tf.saved_model.load(export_dir).signatures["predictor"]
    outputs = {"task_1": [], "task_2": []}
    for i in range(inputs["user_ids"].shape[0]):
        out = serve(user_ids=tf.constant(inputs["user_ids"][i]),
                    item_ids=tf.constant(inputs["item_ids"][i]),
                    label_0=tf.constant(inputs["label_0"][i]),
                    label_1=tf.constant(inputs["label_1"][i]))
        for key in outputs:
            outputs[key].append(out[key].numpy())
    assert not any(m.split(".")[0] in ("sparseflow", "mx_rec", "tf_adapter", "npu_device")
                   for m in sys.modules), sorted(m for m in sys.modules if "sparseflow" in m)
    np.savez(outputs_file, **outputs)
""")


def check_saved_model(export_dir, predictions, eval_batches, tmp_path):
    """The SavedModel, in plain TensorFlow without sparseflow, predicts what predict did."""
    inputs = tmp_path / "serving_inputs.npz"
    np.savez(inputs, **{key: np.stack([b[key] for b in eval_batches])
                        for key in ("user_ids", "item_ids", "label_0", "label_1")})
    outputs = tmp_path / "serving_outputs.npz"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("PYTHONPATH", None)
    done = subprocess.run([sys.executable, "-c", SERVE, export_dir, str(inputs), str(outputs)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    served = np.load(outputs)
    for task in ("task_1", "task_2"):
        np.testing.assert_allclose(served[task], predictions[task], rtol=1e-5, atol=1e-6)


def _mode_variable(mode):
    # run.sh exports USE_MODE; the demo's config reads RUN_MODE: the program takes either.
    return "USE_MODE" if mode == "train_and_evaluate" else "RUN_MODE"


@pytest.fixture(scope="module")
def program_runs(tmp_path_factory):
    """Every case's training run (one process), then the predict runs (a second one): case
    -> (its directory, label -> status). As in the demo, a run with USE_EXPORT_SAVED_MODEL=1
    deletes the model first, whatever its mode: predict without it."""
    cwds = {case[0]: tmp_path_factory.mktemp(case[0]) for case in CASES}
    statuses = run_sequence(
        [program_run(f"train {name}", cwds[name], mode, switches, args, _mode_variable(mode),
                     {"results.json": "train-results.json"})
         for name, mode, switches, args, _ in CASES],
        None, tmp_path_factory.mktemp("train"))
    statuses.update(run_sequence(
        [program_run(f"predict {name}", cwds[name], "predict",
                     dict(switches, USE_EXPORT_SAVED_MODEL="0"),
                     ["--max_data_generate_steps", str(batches)])
         for name, _, switches, _, batches in CASES if batches is not None],
        None, tmp_path_factory.mktemp("predict")))
    return cwds, statuses


@pytest.mark.parametrize("name,mode,switches,args,predict_batches", CASES,
                         ids=[case[0] for case in CASES])
def test_little_demo_estimator(program_runs, name, mode, switches, args, predict_batches):
    cwds, statuses = program_runs
    tmp_path = cwds[name]
    trained = read_json(statuses, f"train {name}", tmp_path / "train-results.json")
    assert trained["mode"] == mode
    check_training(trained, tmp_path, mode, switches, args)
    if predict_batches is None:
        return

    predicted = read_json(statuses, f"predict {name}", tmp_path / "results.json")
    predictions, eval_batches = check_prediction(trained, predicted, tmp_path, predict_batches)
    if switches.get("USE_EXPORT_SAVED_MODEL") == "1":
        check_saved_model(trained["export_dir"], predictions, eval_batches, tmp_path)


def test_cases_cover_the_demo_modes():
    """Each run mode in both graph modes, predict after training in both, admission and
    eviction in both, and both values of every other switch."""
    runs = [(mode, dict(DEFAULTS, **switches), batches)
            for _, mode, switches, _, batches in CASES]
    for mode in ("train", "train_and_evaluate"):
        assert {s["USE_MODIFY_GRAPH"] for m, s, _ in runs if m == mode} == {"0", "1"}
    assert {s["USE_MODIFY_GRAPH"] for _, s, b in runs if b} == {"0", "1"}
    for switch in ("USE_TIMESTAMP", "USE_DYNAMIC_EXPANSION", "USE_ONE_SHOT",
                   "USE_EXPORT_SAVED_MODEL", "USE_DYNAMIC", "USE_MULTI_LOOKUP"):
        assert {s[switch] for _, s, _ in runs} == {"0", "1"}, switch
    assert {s["USE_MODIFY_GRAPH"] for _, s, _ in runs if s["USE_TIMESTAMP"] == "1"} == {"0", "1"}
    assert all(b for _, s, b in runs if s["USE_EXPORT_SAVED_MODEL"] == "1")
