"""Programs in the shapes of Rec SDK's four model examples (examples/{dlrm,DCNv2,mmoe,WideDeep}/
main_mxrec.py): their mx_rec calls in their order, on generated Criteo-like TFRecords, run
unchanged, one after another in one subprocess (``tests/workers/sequence.py``: each with its
own environment, directory and modules; the first in a fresh process). Each must exit 0 and
its training loss must fall.

Non-mx_rec modules the examples import, which our programs leave out: Ascend's TF adapter
(``from npu_bridge.npu_init import *``, for ``npu_plugin.set_device_sat_mode``,
``util.set_iteration_per_loop``, ``hccl_ops`` and, in DCNv2, ``tf`` itself; its config.py
also imports ``npu_bridge.estimator.npu.npu_config.NPURunConfig``), sklearn
(``roc_auc_score``), easydict (their model.py) and, in the 2025 versions, ``rec_sdk_common``.
sparseflow ships no npu_bridge and depends on none of the others; ``hccl_ops`` comes from
``mx_rec.util.tf_version_adapter``. Each program's docstring lists what else differs from its
example.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

from tests.rank_runs import read_json, run_sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAMS = os.path.join(ROOT, "tests", "rec_sdk_programs")
LINE_PER_SAMPLE = 8          # samples per TFRecord record, as in Rec SDK's Criteo files
TRAIN_STEPS, EVAL_STEPS = 40, 5

# The record layout each program parses: labels, sparse ids and dense values per sample.
FORMATS = {
    "dlrm": dict(labels=1, fields=26, dense=13, dense_dtype=np.float32, batch_size=256),
    "dcnv2": dict(labels=1, fields=26, dense=13, dense_dtype=np.float32, batch_size=256),
    "mmoe": dict(labels=2, fields=29, dense=11, dense_dtype=np.float32, batch_size=256),
    "wide_deep": dict(labels=1, fields=26, dense=13, dense_dtype=np.int64, batch_size=256),
}


def write_criteo_like(path, labels, fields, dense, dense_dtype, batch_size, seed=0):
    """Writes ``path/train`` (TRAIN_STEPS batches) and ``path/test`` (EVAL_STEPS batches) as
    TFRecord files of LINE_PER_SAMPLE samples per record; returns the training ids (int64
    [samples, fields]) and dense values ([samples, dense]). Field f's ids are f * 1000 + a
    popularity-skewed id in [0, 300); each id has a hidden weight, and the labels follow the
    weights of a sample's ids, so a model that learns the embeddings lowers its loss. Dense
    values are in [0, 20), plus 100_000 + 100 * column when they are integers (WideDeep looks
    them up as ids: they must not collide with the sparse ids)."""
    world = np.random.default_rng(seed)
    weight = world.normal(size=fields * 1000)
    popularity = 1.0 / np.arange(1, 301)
    popularity /= popularity.sum()
    for part, batches in (("train", TRAIN_STEPS), ("test", EVAL_STEPS)):
        os.makedirs(os.path.join(path, part), exist_ok=True)
        rng = np.random.default_rng([seed, batches])
        samples = batches * batch_size
        ids = rng.choice(300, (samples, fields), p=popularity) + np.arange(fields) * 1000
        score = weight[ids].sum(axis=1) / np.sqrt(fields)
        label = np.stack([rng.random(samples) < 1 / (1 + np.exp(-2.0 * score * sign))
                          for sign in (1.0, -1.0)[:labels]], axis=1).astype(np.int64)
        values = rng.integers(0, 20, (samples, dense))
        if dense_dtype == np.int64:
            values = values + 100_000 + 100 * np.arange(dense)
        values = values.astype(dense_dtype)
        with tf.io.TFRecordWriter(os.path.join(path, part, "part-0.tfrecord")) as writer:
            for start in range(0, samples, LINE_PER_SAMPLE):
                rows = slice(start, start + LINE_PER_SAMPLE)
                dense_feature = (tf.train.Feature(float_list=tf.train.FloatList(
                    value=values[rows].ravel())) if dense_dtype == np.float32 else
                    tf.train.Feature(int64_list=tf.train.Int64List(value=values[rows].ravel())))
                example = tf.train.Example(features=tf.train.Features(feature={
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(
                        value=label[rows].ravel())),
                    "sparse_feature": tf.train.Feature(int64_list=tf.train.Int64List(
                        value=ids[rows].ravel())),
                    "dense_feature": dense_feature}))
                writer.write(example.SerializeToString())
        if part == "train":
            train = (ids, values)
    return train


def admitted_keys(keys, lookups, threshold):
    """Keys that own a row once every training batch went through Rec SDK's admission: all
    of them with admission off (threshold None), else those whose count (occurrences times
    the lookups that read them, faae_coefficient 1) reached the threshold."""
    unique, occurrences = np.unique(keys, return_counts=True)
    if threshold is None:
        return unique.shape[0]
    return int(np.count_nonzero(occurrences * lookups >= threshold))


# (program, switches): each program once, plus the FAAE path (timestamps, admission threshold
# 3, MonitoredTrainingSession with EvictHook) and every cache mode across the runs.
RUNS = [
    ("dlrm", {"CACHE_MODE": "HBM"}),
    ("dlrm", {"CACHE_MODE": "DDR", "USE_FAAE": "1", "USE_DYNAMIC": "1"}),
    ("dcnv2", {"CACHE_MODE": "SSD", "USE_MULTI_LOOKUP": "1"}),
    ("mmoe", {"CACHE_MODE": "HBM", "USE_DYNAMIC": "1"}),
    ("wide_deep", {"CACHE_MODE": "DDR", "USE_MULTI_LOOKUP": "1"}),
]


IDS = [f"{n}-" + "-".join(f"{k}={v}" for k, v in s.items()) for n, s in RUNS]


@pytest.fixture(scope="module")
def program_runs(tmp_path_factory):
    """Writes each run's data and runs the programs in one process: id -> (its results.json
    as a dict, the training ids, the dense values)."""
    runs, data = [], {}
    for label, (name, switches) in zip(IDS, RUNS):
        cwd = tmp_path_factory.mktemp(name)
        data[label] = (cwd, *write_criteo_like(str(cwd / "data"), **FORMATS[name]))
        runs.append({"label": label, "path": os.path.join(PROGRAMS, name, "main.py"),
                     "cwd": str(cwd), "env": dict(TF_CPP_MIN_LOG_LEVEL="3",
                                                  DATA_PATH=str(cwd / "data"), **switches)})
    statuses = run_sequence(runs, None, tmp_path_factory.mktemp("sequence"))
    return statuses, data


@pytest.mark.parametrize("label,name,switches", [(i, *r) for i, r in zip(IDS, RUNS)],
                         ids=IDS)
def test_model_program_trains(program_runs, label, name, switches):
    """Exit 0, the training loss falls, both evaluations ran, and each table holds the keys
    Rec SDK's admission gives on the training data (every key without FAAE; with FAAE, count
    >= 3; the EvictHook's 120 s timer cannot find a key 180 s older than the newest batch in
    a run this short)."""
    statuses, data = program_runs
    cwd, ids, dense = data[label]
    results = read_json(statuses, label, cwd / "results.json")
    losses = np.array(results["train_loss"])
    assert losses.shape == (TRAIN_STEPS,)
    assert losses[-10:].mean() < losses[:10].mean(), losses
    assert len(results["eval_loss"]) == 2 and np.all(np.isfinite(results["eval_loss"]))

    keys = np.concatenate([dense, ids], axis=1) if name == "wide_deep" else ids
    lookups = 2 if switches.get("USE_MULTI_LOOKUP") == "1" else 1
    threshold = 3 if switches.get("USE_FAAE") == "1" else None
    expected = admitted_keys(keys, lookups, threshold)
    tables = ["wide_embeddings", "deep_embeddings"] if name == "wide_deep" else [
        "sparse_embeddings"]
    assert sorted(results["table_size"]) == sorted(tables)
    for table in tables:
        assert results["table_size"][table] == expected, table
        assert results["table_size"][table] <= results["table_capacity"][table]
