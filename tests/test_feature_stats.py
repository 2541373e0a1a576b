"""``sparseflow.stats``: exact feature statistics of Parquet data against an independent count.

The data is generated with known shapes (a Zipf single-hot int32 column with nulls, a multi-hot
list<int64> column with null lists, empty lists and null elements, a string column with nulls
and empty strings, an int64 column of extreme keys: int64 min/max, -1, 0, negatives, keys
scattered over all of int64; a timestamp column with nulls), written to three Parquet files and
read back in small record batches. The reference works from the generated Python values with
``np.unique(..., return_counts=True)`` and plain Python; every number of the JSON document must
match it exactly.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparseflow import synthetic
from sparseflow.jobs import readers as job_readers
from sparseflow.ops import text_kernels
from sparseflow.stats import FeatureCounter, compute_stats, report, write_outputs
from sparseflow.stats.counts import top_entries

I64 = np.iinfo(np.int64)
SLOTS = {"sgd": 0, "adagrad": 1, "adam": 2, "ftrl": 2}
EXTREME = np.array([I64.min, I64.max, -1, 0, 1, -2, I64.min + 1, I64.max - 1, -2**40, 2**62 + 3],
                   np.int64)


# --- generated data --------------------------------------------------------------------------

def _zipf_ranks(rng, card, exponent, n):
    return synthetic.zipf_ranks(rng, card, exponent, n)


def make_rows(seed: int, n: int, first_row: int) -> dict[str, list]:
    """Per-row Python values of every column (None: null)."""
    rng = np.random.default_rng(seed)
    zipf = _zipf_ranks(rng, 5000, 1.1, n).astype(np.int64) * 7 - 300   # negatives too
    zipf_null = rng.random(n) < 0.05
    lengths = rng.integers(0, 6, n)
    multi_null = rng.random(n) < 0.07
    multi_keys = _zipf_ranks(rng, 800, 1.05, int(lengths.sum())) - 50
    elem_null = rng.random(int(lengths.sum())) < 0.03
    tokens = _zipf_ranks(rng, 300, 1.2, n)
    kind = rng.random(n)
    pool = rng.random(n) < 0.3
    wide = np.where(pool, EXTREME[rng.integers(0, EXTREME.size, n)],
                    synthetic.scatter_keys(_zipf_ranks(rng, 3000, 1.0, n), salt=3))
    ts = first_row + np.arange(n) + rng.integers(-20, 20, n)
    ts_null = rng.random(n) < 0.04

    multi, p = [], 0
    for i in range(n):
        row = [None if elem_null[p + j] else int(multi_keys[p + j]) for j in range(lengths[i])]
        p += lengths[i]
        multi.append(None if multi_null[i] else row)
    return {
        "zipf": [None if zipf_null[i] else int(zipf[i]) for i in range(n)],
        "multi": multi,
        "name": [None if kind[i] < 0.05 else "" if kind[i] < 0.08 else f"tok{tokens[i]}"
                 for i in range(n)],
        "wide": [int(k) for k in wide],
        "ts": [None if ts_null[i] else int(ts[i]) for i in range(n)],
    }


SCHEMA = pa.schema([("zipf", pa.int32()), ("multi", pa.list_(pa.int64())),
                    ("name", pa.string()), ("wide", pa.int64()), ("ts", pa.int64())])


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """(directory, per-column lists of every row in file order) of three Parquet files."""
    root = tmp_path_factory.mktemp("stats_data")
    every = {name: [] for name in SCHEMA.names}
    first = 0
    for i, n in enumerate((2500, 3100, 1900)):
        rows = make_rows(100 + i, n, first)
        first += n
        pq.write_table(pa.table(rows, schema=SCHEMA), root / f"part-{i}.parquet",
                       row_group_size=800)
        for name in every:
            every[name] += rows[name]
    return root, every


# --- the independent reference -----------------------------------------------------------------

def string_key(token: str) -> int:
    return int(text_kernels.hash_string_keys(pa.array([token]))[0])


def reference(values, times, *, encoding, multi_hot, top_k, max_threshold, window, clock, dim,
              optimizer):
    """The expected feature entry, from per-row values (None = null) and per-row times."""
    null_rows = empty_rows = 0
    occurrences, occurrence_times = [], []
    for v, t in zip(values, times):
        if multi_hot:
            if v is None:
                null_rows += 1
                continue
            v = [x for x in v if x is not None and x != ""]
            empty_rows += not v
        elif v is None or v == "":
            null_rows += 1
            continue
        else:
            v = [v]
        for x in v:
            occurrences.append(string_key(x) if encoding == "string" else x)
            occurrence_times.append(0 if t is None else t)   # a null time reads 0
    occ = np.array(occurrences, np.int64)
    keys, inverse, counts = np.unique(occ, return_inverse=True, return_counts=True)
    total = int(counts.sum())
    distinct = len(keys)
    singles = int((counts == 1).sum())

    buckets = {}
    for c in counts.tolist():
        b = c.bit_length() - 1
        k, w = buckets.get(b, (0, 0))
        buckets[b] = (k + 1, w + c)
    histogram = [{"min_count": 2**b, "max_count": 2**(b + 1) - 1,
                  "keys": buckets.get(b, (0, 0))[0], "traffic": buckets.get(b, (0, 0))[1]}
                 for b in range(max(buckets) + 1 if buckets else 0)]
    top = sorted(zip((-counts).tolist(), keys.tolist()))[:top_k]
    thresholds = [{"threshold": t, "keys_kept": int((counts >= t).sum()),
                   "traffic_kept_share": (int(counts[counts >= t].sum()) / total if total
                                          else 0.0)}
                  for t in range(1, max_threshold + 1)]
    expected = {
        "encoding": encoding, "multi_hot": multi_hot, "rows": len(values),
        "null_rows": null_rows, "empty_rows": empty_rows,
        "null_or_empty_share": (null_rows + empty_rows) / len(values),
        "total_keys": total, "distinct_keys": distinct, "singleton_keys": singles,
        "singleton_share": singles / distinct if distinct else 0.0,
        "histogram": histogram,
        "top_keys": [{"key": k, "count": -c} for c, k in top],
        "thresholds": thresholds,
    }
    if window is not None:
        last = np.full(distinct, I64.min, np.int64)
        np.maximum.at(last, inverse, np.array(occurrence_times, np.int64))
        alive = sum(1 for t in last.tolist() if clock - t < window)
        expected["eviction"] = {"window": window, "clock": clock, "keys_alive": alive}
    row_bytes = dim * (1 + SLOTS[optimizer]) * 4
    expected["memory"] = {"dim": dim, "optimizer": optimizer, "slots": SLOTS[optimizer],
                          "bytes_at_threshold": {str(t["threshold"]): t["keys_kept"] * row_bytes
                                                 for t in thresholds}}
    return expected


KINDS = {"zipf": ("int", False), "multi": ("int", True), "name": ("string", False),
         "wide": ("int", False)}


# --- tests ---------------------------------------------------------------------------------

@pytest.mark.parametrize("options", [
    dict(top_k=15, max_threshold=12, eviction_window=900, dim=16, optimizer="adam"),
    dict(top_k=0, max_threshold=1, eviction_window=None, dim=3, optimizer="sgd"),
])
def test_every_number_matches_the_reference(dataset, monkeypatch, options):
    root, every = dataset
    monkeypatch.setattr(job_readers, "READ_ROWS", 700)   # many record batches per file
    window = options["eviction_window"]
    doc = compute_stats(str(root), list(KINDS), timestamp="ts" if window else None, **options)
    assert doc["schema"] == "sparseflow.feature_stats" and doc["version"] == 1
    clock = max(0 if t is None else t for t in every["ts"])
    files = sorted(str(p) for p in root.iterdir())
    assert doc["source"] == {"format": "parquet", "mode": "exact", "paths": [str(root)],
                             "files": files, "rows": len(every["ts"]),
                             "timestamp": "ts" if window else None,
                             "clock": clock if window else None}
    assert list(doc["features"]) == list(KINDS)
    for name, (encoding, multi_hot) in KINDS.items():
        expected = reference(every[name], every["ts"], encoding=encoding, multi_hot=multi_hot,
                             top_k=options["top_k"], max_threshold=options["max_threshold"],
                             window=window, clock=clock, dim=options["dim"],
                             optimizer=options["optimizer"])
        assert doc["features"][name] == expected, name


def test_data_shapes_are_exercised(dataset):
    """The generated data has what the reference comparison is meant to cover."""
    root, _ = dataset
    doc = compute_stats(sorted(str(p) for p in root.glob("*.parquet")), "wide,multi,name",
                        top_k=len(EXTREME) + 50)
    wide = {e["key"] for e in doc["features"]["wide"]["top_keys"]}
    assert set(EXTREME.tolist()) <= wide
    multi = doc["features"]["multi"]
    assert multi["null_rows"] > 0 and multi["empty_rows"] > 0
    assert any(k["key"] < 0 for k in multi["top_keys"])
    assert doc["features"]["name"]["null_rows"] > 0
    assert doc["features"]["wide"]["singleton_keys"] > 0


def test_json_round_trip_and_outputs(dataset, tmp_path):
    root, _ = dataset
    doc = compute_stats(root / "part-1.parquet", ["zipf", "multi"], timestamp="ts",
                        eviction_window=50, top_k=5, max_threshold=4, optimizer="ftrl")
    assert json.loads(json.dumps(doc)) == doc
    paths = write_outputs(doc, tmp_path / "out")
    with open(paths["json"]) as f:
        assert json.load(f) == doc
    with open(paths["markdown"]) as f:
        md = f.read()
    assert md.startswith("# Feature statistics")
    assert "## `zipf`" in md and "## `multi`" in md and "keys alive" in md
    assert md == report.render_markdown(json.loads(json.dumps(doc)))
    with pytest.raises(ValueError, match="version"):
        report.render_markdown({**doc, "version": 99})


def _batches(keys_per_row, times=None):
    """FeatureCounter.update arguments for one multi-hot batch given as per-row lists."""
    lengths = np.array([len(r) for r in keys_per_row], np.int64)
    keys = np.array([k for r in keys_per_row for k in r], np.int64)
    ts = None if times is None else np.repeat(np.asarray(times, np.int64), lengths)
    return keys, lengths, ts


def test_merge_equals_one_pass():
    rng = np.random.default_rng(7)
    rows = [list(synthetic.scatter_keys(_zipf_ranks(rng, 4000, 1.05, int(m)), salt=1))
            + list(EXTREME[rng.integers(0, EXTREME.size, int(m) % 2)])
            for m in rng.integers(0, 4, 6000)]
    times = rng.integers(-10**12, 10**12, len(rows))
    whole = FeatureCounter(timed=True, expected_keys=0)
    parts = [FeatureCounter(timed=True, expected_keys=0) for _ in range(3)]
    for lo in range(0, len(rows), 500):
        args = _batches(rows[lo:lo + 500], times[lo:lo + 500])
        whole.update(*args, null_rows=1)
        parts[lo // 500 % 3].update(*args, null_rows=1)
    merged = FeatureCounter(timed=True)
    for part in parts:
        merged.merge(part)
    options = dict(top_k=30, max_threshold=6, eviction_window=10**11, dim=8, optimizer="adagrad")
    assert merged.result(**options) == whole.result(**options)
    assert merged.clock == whole.clock == int(times.max())
    # Entries agree key by key, latest timestamps included.
    a = whole.entries()
    b = merged.entries()
    oa, ob = np.argsort(a[0]), np.argsort(b[0])
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x[oa], y[ob])


def test_counter_any_int64_key_and_bounded_table():
    """No reserved key value; the table stays within one growth step of the load limit."""
    keys = np.concatenate([EXTREME, EXTREME, EXTREME[:3], np.arange(-5000, 5000)])
    counter = FeatureCounter(expected_keys=0)
    for chunk in np.array_split(keys, 7):
        counter.update(chunk)
    got = dict(zip(*[a.tolist() for a in counter.entries()[:2]]))
    uniq, counts = np.unique(keys, return_counts=True)
    assert got == dict(zip(uniq.tolist(), counts.tolist()))
    assert counter.distinct_keys == uniq.size and counter.total_keys == keys.size
    assert counter.capacity <= 1.5 * uniq.size / 0.75 + 16
    assert counter.nbytes == counter.capacity * 16
    k, c = top_entries(uniq, counts, 4)
    assert k.tolist() == [-1, I64.min, -2, 0] and c.tolist() == [4, 3, 3, 3]


def test_counter_refuses_bad_input():
    counter = FeatureCounter()
    with pytest.raises(ValueError, match="row_lengths"):
        counter.update(np.arange(3), row_lengths=np.array([1, 1]))
    with pytest.raises(ValueError, match="untimed"):
        counter.update(np.arange(3), timestamps=np.arange(3))
    with pytest.raises(ValueError, match="1-D integer"):
        counter.update(np.ones(3))
    with pytest.raises(ValueError, match="timestamps"):
        FeatureCounter(timed=True).update(np.arange(3))
    with pytest.raises(ValueError, match="eviction_window"):
        counter.result(eviction_window=10)
    with pytest.raises(ValueError, match="timed"):
        counter.merge(FeatureCounter(timed=True))
    with pytest.raises(ValueError, match="optimizer"):
        counter.result(optimizer="rmsprop")


def test_lists_of_strings_and_arrow_timestamps(tmp_path):
    rows = [["a", "b", None], None, [], ["", "a"], ["c"]]
    stamps = pa.array([1000, 5000, None, 9000, 2000], pa.timestamp("ms"))
    table = pa.table({"tags": pa.array(rows, pa.large_list(pa.string())), "when": stamps})
    pq.write_table(table, tmp_path / "t.parquet")
    doc = compute_stats(tmp_path / "t.parquet", ["tags"], timestamp="when", eviction_window=7500,
                        top_k=2, max_threshold=2)
    f = doc["features"]["tags"]
    a, b, c = (string_key(t) for t in "abc")
    assert (f["encoding"], f["multi_hot"]) == ("string", True)
    assert (f["rows"], f["null_rows"], f["empty_rows"], f["total_keys"], f["distinct_keys"]) == \
        (5, 1, 1, 4, 3)
    assert f["top_keys"][0] == {"key": a, "count": 2}
    assert f["top_keys"][1] == {"key": min(b, c), "count": 1}
    # clock 9000: "a" last seen at 9000, "c" at 2000 (within 7500), "b" at 1000 (not).
    assert f["eviction"] == {"window": 7500, "clock": 9000, "keys_alive": 2}


def test_unknown_column_names_it_and_the_available_ones(dataset):
    root, _ = dataset
    with pytest.raises(ValueError, match=r"part-0\.parquet: column 'nope' not found; it has "
                                         r"zipf, multi, name, wide, ts"):
        compute_stats(root, ["zipf", "nope"])
    with pytest.raises(ValueError, match="'when' not found"):
        compute_stats(root, ["zipf"], timestamp="when", eviction_window=3)


def test_malformed_files_give_clear_errors(dataset, tmp_path):
    root, _ = dataset
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 this is not parquet at all" * 10)
    with pytest.raises(ValueError, match=r"bad\.parquet: cannot read as Parquet"):
        compute_stats([root / "part-0.parquet", bad], ["zipf"])
    empty = tmp_path / "empty.parquet"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match=r"empty\.parquet: cannot read as Parquet"):
        compute_stats(empty, ["zipf"])
    with pytest.raises(ValueError, match="no such file"):
        compute_stats(tmp_path / "missing.parquet", ["zipf"])
    floats = tmp_path / "floats.parquet"
    pq.write_table(pa.table({"x": [1.5, 2.0], "m": pa.array([{"a": 1}, {"a": 2}])}), floats)
    with pytest.raises(ValueError, match=r"floats\.parquet: column 'x'"):
        compute_stats(floats, ["x"])
    with pytest.raises(ValueError, match=r"column 'm' has type struct"):
        compute_stats(floats, ["m"])


def test_option_errors(dataset):
    root, _ = dataset
    with pytest.raises(ValueError, match="needs a `timestamp`"):
        compute_stats(root, ["zipf"], eviction_window=10)
    with pytest.raises(ValueError, match="optimizer"):
        compute_stats(root, ["zipf"], optimizer="lamb")
    with pytest.raises(ValueError, match="max_threshold"):
        compute_stats(root, ["zipf"], max_threshold=0)
    with pytest.raises(ValueError, match="more than once"):
        compute_stats(root, ["zipf", "zipf"])


def test_criteo_tsv_and_csv_sources_count_as_numpy(tmp_path):
    from sparseflow.stats.job import compute_stats

    rng = np.random.default_rng(11)
    n = 2000
    c1 = rng.zipf(1.4, n) % 300
    c2 = rng.integers(0, 50, n)
    lines = []
    for i in range(n):
        dense = "\t".join(str(int(v)) for v in rng.integers(0, 9, 13))
        cats = ["" if (j == 1 and i % 10 == 0) else format(int(v), "08x")
                for j, v in enumerate([c1[i], c2[i]] + [7] * 24)]
        lines.append("\t".join(["1", dense, *cats]))
    (tmp_path / "day_0").write_text("\n".join(lines[:1200]) + "\n")
    (tmp_path / "day_1").write_text("\n".join(lines[1200:]) + "\n")
    doc = compute_stats([str(tmp_path / "day_0"), str(tmp_path / "day_1")], "C1,C2",
                        max_threshold=3, fmt="criteo_tsv")
    assert doc["source"]["format"] == "criteo_tsv"
    for name, values, nulls in (("C1", c1, np.zeros(n, bool)),
                                ("C2", c2, np.arange(n) % 10 == 0)):
        f = doc["features"][name]
        keys, counts = np.unique(values[~nulls], return_counts=True)
        assert (f["rows"], f["null_rows"], f["total_keys"], f["distinct_keys"]) == (
            n, int(nulls.sum()), int((~nulls).sum()), keys.shape[0])
        assert [t["keys_kept"] for t in f["thresholds"]] == [int((counts >= t).sum())
                                                             for t in (1, 2, 3)]
        assert f["singleton_keys"] == int((counts == 1).sum())
    csv = tmp_path / "plain.csv"
    csv.write_text("user;ts\n" + "\n".join(f"{u};{t}" for u, t in zip(c1, range(n))) + "\n")
    doc = compute_stats(str(csv), ["user"], timestamp="ts", eviction_window=100, fmt="csv",
                        delimiter=";")
    f = doc["features"]["user"]
    assert f["distinct_keys"] == np.unique(c1).shape[0]
    assert f["eviction"]["keys_alive"] == np.unique(c1[n - 100:]).shape[0]
    with pytest.raises(ValueError, match=r"plain.csv: no column 'nope'; its columns: user, ts"):
        compute_stats(str(csv), ["nope"], fmt="csv", delimiter=";")
    with pytest.raises(ValueError, match=r"Argument `fmt` must be one of"):
        compute_stats(str(csv), ["user"], fmt="json")


def test_files_counted_in_parallel_give_the_same_document(dataset, monkeypatch):
    root, _ = dataset
    monkeypatch.setattr(job_readers, "READ_ROWS", 700)
    one = compute_stats(str(root), list(KINDS), timestamp="ts", eviction_window=50,
                        max_threshold=4)
    calls = []
    two = compute_stats(str(root), list(KINDS), timestamp="ts", eviction_window=50,
                        max_threshold=4, workers=2,
                        progress=lambda done, total, rows: calls.append((done, total, rows)))
    assert two == one
    assert [(d, t) for d, t, _ in calls] == [(1, 3), (2, 3), (3, 3)]
    assert calls[-1][2] == one["source"]["rows"]
    with pytest.raises(ValueError, match=r"Argument `workers` must be an int >= 1"):
        compute_stats(str(root), list(KINDS), workers=0)


def test_tfrecord_source_counts_as_numpy(tmp_path):
    import tensorflow as tf

    rng = np.random.default_rng(12)
    rows = [list(rng.integers(-5, 40, rng.integers(0, 4))) for _ in range(700)]
    words = [f"w{int(v)}" for v in rng.zipf(1.5, 700) % 60]
    path = tmp_path / "part.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i, (ids, word) in enumerate(zip(rows, words)):
            feature = {"word": tf.train.Feature(bytes_list=tf.train.BytesList(
                value=[word.encode()])), "ts": tf.train.Feature(
                int64_list=tf.train.Int64List(value=[i]))}
            if ids:   # an Example may lack the feature: an empty row
                feature["ids"] = tf.train.Feature(int64_list=tf.train.Int64List(value=ids))
            writer.write(tf.train.Example(features=tf.train.Features(
                feature=feature)).SerializeToString())
    doc = compute_stats(str(path), ["ids", "word"], timestamp="ts", eviction_window=100,
                        max_threshold=3, fmt="tfrecord")
    flat = np.array([k for r in rows for k in r])
    keys, counts = np.unique(flat, return_counts=True)
    f = doc["features"]["ids"]
    assert (f["rows"], f["empty_rows"], f["total_keys"], f["distinct_keys"]) == (
        700, sum(1 for r in rows if not r), flat.shape[0], keys.shape[0])
    assert [t["keys_kept"] for t in f["thresholds"]] == [int((counts >= t).sum())
                                                         for t in (1, 2, 3)]
    assert doc["features"]["word"]["distinct_keys"] == len(set(words))
    assert doc["features"]["word"]["eviction"]["keys_alive"] == len(set(words[600:]))
    with pytest.raises(ValueError, match=r"column 'nope'"):
        compute_stats(str(path), ["nope"], fmt="tfrecord")


def test_the_approximate_mode_is_within_its_documented_error(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(21)
    for part in range(2):   # ~120k distinct keys: past the sample, so estimates are used
        keys = (rng.zipf(1.1, 400_000) * 2654435761 % 2**40).astype(np.int64)
        pq.write_table(pa.table({"k": keys}), tmp_path / f"p{part}.parquet")
    exact = compute_stats(str(tmp_path), ["k"], max_threshold=5)
    approx = compute_stats(str(tmp_path), ["k"], max_threshold=5, mode="approximate",
                           workers=2)
    e, a = exact["features"]["k"], approx["features"]["k"]
    assert approx["source"]["mode"] == "approximate" and a["mode"] == "approximate"
    assert e["distinct_keys"] > 100_000
    assert abs(a["distinct_keys"] / e["distinct_keys"] - 1) < 3 * a["error"][
        "hll_relative_std_error"]
    for got, want in zip(a["thresholds"], e["thresholds"]):
        assert abs(got["keys_kept"] / want["keys_kept"] - 1) < 0.05
        assert abs(got["traffic_kept_share"] - want["traffic_kept_share"]) < 0.01
    assert [k["key"] for k in a["top_keys"][:10]] == [k["key"] for k in e["top_keys"][:10]]
    assert (a["rows"], a["total_keys"]) == (e["rows"], e["total_keys"])   # exact always
    with pytest.raises(ValueError, match=r"Argument `mode` must be 'exact' or 'approximate'"):
        compute_stats(str(tmp_path), ["k"], mode="fast")


def test_a_dask_cluster_of_two_workers_gives_the_same_document(dataset):
    from dask.distributed import Client, LocalCluster

    root, _ = dataset
    local = compute_stats(str(root), list(KINDS), timestamp="ts", eviction_window=50,
                          max_threshold=4)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        assert len(client.scheduler_info()["workers"]) == 2
        calls = []
        distributed = compute_stats(str(root), list(KINDS), timestamp="ts",
                                    eviction_window=50, max_threshold=4, dask_client=client,
                                    progress=lambda *a: calls.append(a))
    assert distributed == local
    assert [c[:2] for c in calls] == [(1, 3), (2, 3), (3, 3)]
