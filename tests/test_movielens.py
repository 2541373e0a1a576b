"""MovieLens-100K from the recbole 1.2.1 wheel, and the ``movielens`` job source.

The wheel (about 2 MB) is downloaded from PyPI once per test session into a temporary cache
directory (copied from ``~/.cache/sparseflow`` when it is already there). Expected values are
computed from the wheel's raw tab-separated text by plain Python.
"""

from __future__ import annotations

import os
import subprocess
import zipfile

import numpy as np
import pytest
import tensorflow as tf

from sparseflow.datasets import load_movielens_100k
from sparseflow.datasets import movielens
from sparseflow.jobs.data import make_dataset
from sparseflow.jobs.schema import ColumnsConfig, DataConfig, MovielensOptions, SparseColumn

MOD = 2**63 - 1


@pytest.fixture(scope="session")
def cache_dir(movielens_cache):
    return movielens_cache


@pytest.fixture(scope="session")
def table(cache_dir):
    return load_movielens_100k(cache_dir)


@pytest.fixture(scope="session")
def raw(cache_dir):
    """The atomic files as lists of field lists (header dropped)."""
    with zipfile.ZipFile(os.path.join(cache_dir, movielens.WHEEL)) as zf:
        def rows(kind):
            text = zf.read(f"recbole/dataset_example/ml-100k/ml-100k.{kind}").decode()
            return [line.split("\t") for line in text.splitlines()[1:] if line]
        return {kind: rows(kind) for kind in ("inter", "user", "item")}


def test_table_contents(table, raw):
    inter = raw["inter"]
    assert table.num_rows == len(inter) == 100000
    assert table.column_names == ["label", "user_id", "item_id", "age", "gender", "occupation",
                                  "zip_code", "release_year", "genres", "timestamp", "rating"]
    assert len(set(table.column("user_id").to_pylist())) == 943
    assert len(set(table.column("item_id").to_pylist())) == 1682
    labels = table.column("label").to_pylist()
    assert labels == [1.0 if float(r[2]) >= 4 else 0.0 for r in inter]
    assert sum(labels) / len(labels) == pytest.approx(0.55375)
    assert table.column("timestamp").to_pylist() == [int(float(r[3])) for r in inter]
    users = {r[0]: r for r in raw["user"]}
    items = {r[0]: r for r in raw["item"]}
    for i in (0, 1, 777, 99999):
        row = table.slice(i, 1).to_pylist()[0]
        user, item = users[inter[i][0]], items[inter[i][1]]
        assert (row["user_id"], row["item_id"]) == (inter[i][0], inter[i][1])
        assert (row["age"], row["gender"], row["occupation"], row["zip_code"]) == \
            (int(user[1]), user[2], user[3], user[4])
        assert row["release_year"] == int(item[2]) and row["genres"] == item[3].split(" ")
        assert row["rating"] == float(inter[i][2])


def test_cached_wheel_is_reused(cache_dir, monkeypatch):
    def no_download(*args, **kwargs):
        raise AssertionError("downloaded although the wheel is cached")
    monkeypatch.setattr(subprocess, "run", no_download)
    assert load_movielens_100k(cache_dir).num_rows == 100000


def test_download_failure_says_what_to_run(tmp_path, monkeypatch):
    def failing(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, stdout="", stderr="No network")
    monkeypatch.setattr(subprocess, "run", failing)
    with pytest.raises(RuntimeError, match=r"No network.*pip download --no-deps recbole==1\.2\.1 "
                                           r"-d .*fresh"):
        load_movielens_100k(str(tmp_path / "fresh"))


def strhash(values):
    return tf.strings.to_hash_bucket_fast(values, MOD).numpy().tolist()


COLUMNS = ColumnsConfig(labels=("label",), dense=("age",),
                        sparse=(SparseColumn("user_id", encoding="string"),
                                SparseColumn("item_id", encoding="int"),
                                SparseColumn("genres", length=3, encoding="string")),
                        timestamp="timestamp")


def movielens_data(cache_dir, **kw):
    return DataConfig(source="movielens", movielens=MovielensOptions(
        cache_dir=cache_dir, eval_fraction=kw.pop("eval_fraction", 0.1)), **kw)


def collect(ds):
    return [{k: v.numpy() for k, v in b.items()} for b in ds]


def test_time_split(cache_dir, table, raw):
    data = movielens_data(cache_dir)
    train = collect(make_dataset(data, COLUMNS, "train", batch_size=1000))
    evaluation = collect(make_dataset(data, COLUMNS, "eval", batch_size=1000))
    assert len(train) == 90 and len(evaluation) == 10
    ts_train = np.concatenate([b["timestamp"] for b in train])
    ts_eval = np.concatenate([b["timestamp"] for b in evaluation])
    assert (np.diff(ts_train) >= 0).all() and (np.diff(ts_eval) >= 0).all()
    assert ts_train.max() <= ts_eval.min()
    everything = sorted(int(float(r[3])) for r in raw["inter"])
    assert ts_train.tolist() == everything[:90000] and ts_eval.tolist() == everything[90000:]
    # The keys of the first batch, rebuilt from the raw rows in time order.
    order = sorted(range(len(raw["inter"])), key=lambda i: int(float(raw["inter"][i][3])))
    first = [raw["inter"][i] for i in order[:1000]]
    items = {r[0]: r for r in raw["item"]}
    users = {r[0]: r for r in raw["user"]}
    assert train[0]["user_id"].tolist() == strhash([r[0] for r in first])
    assert train[0]["item_id"].tolist() == [int(r[1]) for r in first]
    genres = [items[r[1]][3].split(" ") for r in first]
    padded = [(strhash(g) + [-1, -1, -1])[:3] for g in genres]
    assert train[0]["genres"].tolist() == padded
    assert train[0]["dense"][:, 0].tolist() == [float(users[r[0]][1]) for r in first]
    assert train[0]["labels"][:, 0].tolist() == [float(float(r[2]) >= 4) for r in first]


def test_shuffled_train_and_ordered_eval(cache_dir):
    data = movielens_data(cache_dir, shuffle_buffer=5000)
    cols = ColumnsConfig(labels=("label",), timestamp="timestamp")
    train = collect(make_dataset(data, cols, "train", batch_size=10000, seed=1))
    ts = np.concatenate([b["timestamp"] for b in train])
    assert len(ts) == 90000 and not (np.diff(ts) >= 0).all()
    evaluation = collect(make_dataset(data, cols, "eval", batch_size=10000))
    assert (np.diff(evaluation[0]["timestamp"]) >= 0).all()


def test_no_eval_split_and_unknown_column(cache_dir):
    with pytest.raises(ValueError, match=r"`split`: 'eval'.*eval_fraction is 0"):
        make_dataset(movielens_data(cache_dir, eval_fraction=0.0), COLUMNS, "eval",
                     batch_size=10)
    bad = ColumnsConfig(labels=("label",), sparse=(SparseColumn("title"),))
    with pytest.raises(ValueError, match=r"MovieLens-100K .*'title' not found; it has label, "
                                         r"user_id"):
        make_dataset(movielens_data(cache_dir), bad, "train", batch_size=10)
