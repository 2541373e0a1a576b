"""``sparseflow.jobs.data.make_dataset`` over every source, checked batch by batch.

Small Parquet / CSV / Criteo TSV / TFRecord files with known rows (nulls, negative and hex
values, strings, multi-hot lists) are written to tmp_path; the expected batches are computed
from those Python rows by plain loops (string keys by TensorFlow's
``to_hash_bucket_fast(s, 2**63 - 1)``, hex keys by ``int(s, 16)``). Then: exact batch sizes and
remainder dropping, repeat, seeded shuffling, graph mode, error messages, and the generator's
shapes, determinism and statistics.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from sparseflow.jobs.data import Rebatcher, batch_signature, make_dataset
from sparseflow.jobs.schema import (ColumnsConfig, CsvOptions, DataConfig, GeneratorOptions,
                                    SparseColumn)

MOD = 2**63 - 1
CRITEO_DENSE = tuple(f"I{i}" for i in range(1, 14))
CRITEO_SPARSE = tuple(SparseColumn(f"C{i}") for i in range(1, 27))


def strhash(s):
    if s is None or s == "":
        return -1
    return int(tf.strings.to_hash_bucket_fast([s], MOD).numpy()[0])


def hexkey(s):
    if s is None or s == "":
        return -1
    v = int(s, 16)
    return v - 2**64 if v >= 2**63 else v


def log1p0(x):
    return math.log1p(max(x, 0.0)) if x is not None else 0.0


def collect(ds, limit=None):
    out = []
    for i, batch in enumerate(ds):
        if limit is not None and i == limit:
            break
        out.append({k: v.numpy() for k, v in batch.items()})
    return out


def rows_of(batches, key):
    return [row for b in batches for row in b[key].tolist()]


# --- a table with every kind of column -----------------------------------------------------

ROWS = [
    # label, I1,   C_int, C_hex,      C_str,      tags,           genres,           ts
    (1.0, 3, 11, "68fd1e64", "apple", [1, 2, 3], ["Drama", "War"], 100),
    (0.0, None, None, None, None, None, None, 101),
    (0.0, -5, 13, "", "", [], [], 102),
    (1.0, 0, 14, "FFFFFFFF", "kiwi", [4], ["Comedy"], 103),
    (0.0, 7, 15, "0", "apple", [5, None, 6, 7], ["Drama", None], 104),
    (1.0, 1000, 16, "00ab", "pear", [8, 9], ["Horror", "Drama", "War"], 105),
    (0.0, 2, 17, "7fffffff", "fig", [10], None, 106),
    (1.0, 4, 18, "deadbeef", "kiwi", [11, 12], ["Sci-Fi"], 107),
    (0.0, 5, 19, "1", "plum", [13], ["War"], 108),
    (1.0, 6, 20, "2", "lime", [], ["Drama"], 109),
]
NAMES = ("label", "I1", "C_int", "C_hex", "C_str", "tags", "genres", "ts")


def full_columns(**kw):
    base = dict(labels=("label",), dense=("I1",), dense_transform="log1p",
                sparse=(SparseColumn("C_int"), SparseColumn("C_hex", encoding="hex"),
                        SparseColumn("C_str", encoding="string"), SparseColumn("tags", length=3),
                        SparseColumn("genres", length=2, encoding="string")),
                timestamp="ts")
    base.update(kw)
    return ColumnsConfig(**base)


def expected_rows(rows):
    """The batch entries of each row, computed from the Python values."""
    out = []
    for label, i1, c_int, c_hex, c_str, tags, genres, ts in rows:
        def pad(values, length, encode):
            keys = [] if values is None else [-1 if v is None else encode(v) for v in values]
            keys = keys[:length]
            return keys + [-1] * (length - len(keys))
        out.append({"labels": [label], "dense": [pytest.approx(log1p0(i1), rel=1e-6)],
                    "C_int": -1 if c_int is None else c_int, "C_hex": hexkey(c_hex),
                    "C_str": strhash(c_str), "tags": pad(tags, 3, int),
                    "genres": pad(genres, 2, strhash), "ts": ts})
    return out


def check_batches(batches, rows, batch_size):
    expect = expected_rows(rows)
    assert len(batches) == len(rows) // batch_size
    for b, batch in enumerate(batches):
        assert set(batch) == {"labels", "dense", "C_int", "C_hex", "C_str", "tags", "genres",
                              "ts"}
        for key, value in batch.items():
            assert value.shape[0] == batch_size, key
        for i in range(batch_size):
            want = expect[b * batch_size + i]
            for key in want:
                assert batch[key][i].tolist() == want[key], (b, i, key)


def arrow_table(rows):
    cols = list(zip(*rows))
    return pa.table({
        "label": pa.array(cols[0], pa.float64()), "I1": pa.array(cols[1], pa.int32()),
        "C_int": pa.array(cols[2], pa.int64()), "C_hex": pa.array(cols[3], pa.string()),
        "C_str": pa.array(cols[4], pa.large_string()),
        "tags": pa.array(cols[5], pa.list_(pa.int64())),
        "genres": pa.array(cols[6], pa.list_(pa.string())), "ts": pa.array(cols[7], pa.int64()),
        "unused": pa.array(range(len(rows)))})


def parquet_data(tmp_path, rows=ROWS, **kw):
    folder = tmp_path / "pq"
    folder.mkdir(exist_ok=True)
    # Two files, small row groups: batches cross record-batch and file boundaries.
    pq.write_table(arrow_table(rows[:7]), folder / "part-0.parquet", row_group_size=3)
    pq.write_table(arrow_table(rows[7:]), folder / "part-1.parquet", row_group_size=2)
    (folder / "_SUCCESS").write_text("")
    return DataConfig(source="parquet", train=(str(folder),), **kw)


# --- Parquet -------------------------------------------------------------------------------

@pytest.mark.parametrize("batch_size", [1, 3, 4, 10])
def test_parquet_batches_exact(tmp_path, batch_size):
    data = parquet_data(tmp_path)
    batches = collect(make_dataset(data, full_columns(), "train", batch_size=batch_size))
    check_batches(batches, ROWS, batch_size)


def test_rebatcher_hands_a_blocks_whole_batches_over_as_one_run_of_views():
    """The generator crosses into TensorFlow once per run, not per batch: a block's whole
    batches are one [m, B] view of it; rows left over join the next block's first rows."""
    first = {"x": np.arange(10), "y": np.arange(20).reshape(10, 2)}
    second = {"x": np.arange(10, 23), "y": np.arange(20, 46).reshape(13, 2)}
    batcher = Rebatcher(4)
    runs = list(batcher.push(first))
    assert [r["x"].shape for r in runs] == [(2, 4)]
    assert np.shares_memory(runs[0]["x"], first["x"]) and runs[0]["y"].shape == (2, 4, 2)
    more = list(batcher.push(second))
    assert [r["x"].shape for r in more] == [(1, 4), (2, 4)]
    batches = [b for r in runs + more for b in r["x"]]
    np.testing.assert_array_equal(np.concatenate(batches), np.arange(20))
    np.testing.assert_array_equal(np.concatenate([b for r in runs + more for b in r["y"]]),
                                  np.arange(40).reshape(20, 2))
    assert list(batcher.finish()) == []   # 3 rows left: dropped
    # A large block (a generated split) crosses in runs of at most run_rows rows.
    capped = Rebatcher(4, run_rows=9)
    sizes = [r["x"].shape[0] for r in capped.push({"x": np.arange(30)})]
    assert sizes == [2, 2, 2, 1]
    np.testing.assert_array_equal(
        np.concatenate([r["x"].reshape(-1) for r in Rebatcher(4, run_rows=9).push(
            {"x": np.arange(30)})]), np.arange(28))


def test_parquet_glob_file_list_and_order(tmp_path):
    parquet_data(tmp_path)
    folder = tmp_path / "pq"
    data = DataConfig(source="parquet", train=(str(folder / "part-1.parquet"),
                                               str(folder / "part-0*")))
    batches = collect(make_dataset(data, full_columns(), "train", batch_size=2))
    check_batches(batches, ROWS[7:] + ROWS[:7], 2)


def test_single_hot_from_list_column_and_int_from_strings(tmp_path):
    data = parquet_data(tmp_path)
    cols = ColumnsConfig(labels=("label",), sparse=(SparseColumn("tags"),))
    batches = collect(make_dataset(data, cols, "train", batch_size=5))
    assert set(batches[0]) == {"labels", "tags"}
    assert rows_of(batches, "tags") == [r[5][0] if r[5] else -1 for r in ROWS]


def test_no_shuffle_without_buffer_and_eval_never_shuffles(tmp_path):
    data = parquet_data(tmp_path, eval=(str(tmp_path / "pq"),), shuffle_buffer=4)
    cols = ColumnsConfig(labels=("label",), sparse=(SparseColumn("C_int"),))
    evaluation = collect(make_dataset(data, cols, "eval", batch_size=2, seed=5))
    assert rows_of(evaluation, "C_int") == [-1 if r[2] is None else r[2] for r in ROWS]


# --- CSV / Criteo TSV ----------------------------------------------------------------------

def csv_text(rows, delimiter, header):
    def cell(v):
        return "" if v is None else str(v)
    lines = [delimiter.join(("label", "I1", "C_int", "C_hex", "C_str", "ts"))] if header else []
    for r in rows:
        lines.append(delimiter.join(cell(v) for v in (r[0], r[1], r[2], r[3], r[4], r[7])))
    return "\n".join(lines) + "\n"


CSV_COLUMNS = ColumnsConfig(labels=("label",), dense=("I1",), dense_transform="none",
                            sparse=(SparseColumn("C_int"), SparseColumn("C_hex", encoding="hex"),
                                    SparseColumn("C_str", encoding="string")),
                            timestamp="ts")


@pytest.mark.parametrize("delimiter", [",", ";"])
def test_csv_batches_exact(tmp_path, delimiter):
    path = tmp_path / "a.csv"
    path.write_text(csv_text(ROWS, delimiter, True))
    data = DataConfig(source="csv", train=(str(path),), csv=CsvOptions(delimiter=delimiter))
    batches = collect(make_dataset(data, CSV_COLUMNS, "train", batch_size=4))
    assert len(batches) == 2
    rows = ROWS[:8]
    assert rows_of(batches, "labels") == [[r[0]] for r in rows]
    assert rows_of(batches, "dense") == [[0.0 if r[1] is None else float(r[1])] for r in rows]
    assert rows_of(batches, "C_int") == [-1 if r[2] is None else r[2] for r in rows]
    assert rows_of(batches, "C_hex") == [hexkey(r[3]) for r in rows]
    assert rows_of(batches, "C_str") == [strhash(r[4]) for r in rows]
    assert rows_of(batches, "ts") == [r[7] for r in rows]


def test_csv_without_header_uses_f_names(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text(csv_text(ROWS, ",", False))
    data = DataConfig(source="csv", train=(str(path),), csv=CsvOptions(header=False))
    cols = ColumnsConfig(labels=("f0",), sparse=(SparseColumn("f2"),))
    batches = collect(make_dataset(data, cols, "train", batch_size=5))
    assert rows_of(batches, "f2") == [-1 if r[2] is None else r[2] for r in ROWS]


def criteo_line(rng, i):
    label = int(rng.random() < 0.3)
    dense = ["" if rng.random() < 0.2 else str(int(rng.integers(-3, 5000))) for _ in range(13)]
    cats = ["" if rng.random() < 0.15 else f"{int(rng.integers(0, 2**32)):08x}"
            for _ in range(26)]
    return [str(label)] + dense + cats


def test_criteo_tsv_batches_exact(tmp_path):
    rng = np.random.default_rng(0)
    lines = [criteo_line(rng, i) for i in range(23)]
    path = tmp_path / "day_0.txt"
    path.write_text("".join("\t".join(f) + "\n" for f in lines))
    data = DataConfig(source="criteo_tsv", train=(str(path),))
    cols = ColumnsConfig(labels=("label",), dense=CRITEO_DENSE, dense_transform="log1p",
                         sparse=tuple(SparseColumn(f"C{i}", encoding="hex")
                                      for i in range(1, 27)))
    batches = collect(make_dataset(data, cols, "train", batch_size=8))
    assert len(batches) == 2 and set(batches[0]) == {"labels", "dense",
                                                    *(f"C{i}" for i in range(1, 27))}
    for i, f in enumerate(lines[:16]):
        b, r = divmod(i, 8)
        assert batches[b]["labels"][r].tolist() == [float(f[0])]
        want = [log1p0(None if v == "" else float(v)) for v in f[1:14]]
        np.testing.assert_allclose(batches[b]["dense"][r], want, rtol=1e-6)
        assert [int(batches[b][f"C{j}"][r]) for j in range(1, 27)] == [hexkey(v) for v in f[14:]]


# --- TFRecord ------------------------------------------------------------------------------

def example(row):
    label, i1, c_int, c_hex, c_str, tags, genres, ts = row
    f = {"label": tf.train.Feature(float_list=tf.train.FloatList(value=[label])),
         "ts": tf.train.Feature(int64_list=tf.train.Int64List(value=[ts]))}
    if i1 is not None:
        f["I1"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[i1]))
    if c_int is not None:
        f["C_int"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[c_int]))
    if c_str is not None:
        f["C_str"] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[c_str.encode()]))
    if c_hex is not None:
        f["C_hex"] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[c_hex.encode()]))
    # A TFRecord list has no null entries: drop them; a missing list is an empty one.
    f["tags"] = tf.train.Feature(int64_list=tf.train.Int64List(
        value=[v for v in (tags or []) if v is not None]))
    f["genres"] = tf.train.Feature(bytes_list=tf.train.BytesList(
        value=[g.encode() for g in (genres or []) if g is not None]))
    return tf.train.Example(features=tf.train.Features(feature=f)).SerializeToString()


def tfrecord_rows():
    return [(r[0], r[1], r[2], r[3], r[4],
             None if r[5] is None else [v for v in r[5] if v is not None],
             None if r[6] is None else [g for g in r[6] if g is not None], r[7]) for r in ROWS]


def write_tfrecord(path, rows):
    with tf.io.TFRecordWriter(str(path)) as w:
        for r in rows:
            w.write(example(r))


@pytest.mark.parametrize("batch_size", [2, 3])
def test_tfrecord_batches_exact(tmp_path, batch_size):
    write_tfrecord(tmp_path / "a.tfrecord", ROWS[:6])
    write_tfrecord(tmp_path / "b.tfrecord", ROWS[6:])
    data = DataConfig(source="tfrecord", train=(str(tmp_path / "*.tfrecord"),))
    batches = collect(make_dataset(data, full_columns(), "train", batch_size=batch_size))
    check_batches(batches, tfrecord_rows(), batch_size)


def test_tfrecord_and_parquet_give_the_same_keys(tmp_path):
    write_tfrecord(tmp_path / "a.tfrecord", ROWS)
    pq.write_table(arrow_table(tfrecord_rows()), tmp_path / "a.parquet")
    cols = full_columns()
    a = collect(make_dataset(DataConfig(source="tfrecord", train=(str(tmp_path / "a.tfrecord"),)),
                             cols, "train", batch_size=5))
    b = collect(make_dataset(DataConfig(source="parquet", train=(str(tmp_path / "a.parquet"),)),
                             cols, "train", batch_size=5))
    for x, y in zip(a, b):
        for key in x:
            np.testing.assert_array_equal(x[key], y[key])


# --- batch sizes, repeat, shuffling --------------------------------------------------------

def numbered(tmp_path, n):
    path = tmp_path / f"n{n}.parquet"
    pq.write_table(pa.table({"label": pa.array([float(i % 2) for i in range(n)]),
                             "id": pa.array(range(n), pa.int64())}), path, row_group_size=7)
    return str(path)


ID_COLUMNS = ColumnsConfig(labels=("label",), sparse=(SparseColumn("id"),))


def test_remainder_dropped_and_sizes_exact(tmp_path):
    data = DataConfig(source="parquet", train=(numbered(tmp_path, 10),))
    batches = collect(make_dataset(data, ID_COLUMNS, "train", batch_size=4))
    assert [b["id"].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert collect(make_dataset(data, ID_COLUMNS, "train", batch_size=11)) == []


def test_repeat_runs_through_epochs(tmp_path):
    data = DataConfig(source="parquet", train=(numbered(tmp_path, 10),))
    batches = collect(make_dataset(data, ID_COLUMNS, "train", batch_size=4, repeat=True),
                      limit=6)
    assert rows_of(batches, "id") == [i % 10 for i in range(24)]


def test_repeat_of_empty_split_ends(tmp_path):
    path = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"label": pa.array([], pa.float64()),
                             "id": pa.array([], pa.int64())}), path)
    data = DataConfig(source="parquet", train=(str(path),))
    assert collect(make_dataset(data, ID_COLUMNS, "train", batch_size=2, repeat=True)) == []


def test_shuffle_is_seeded_and_covers_every_row(tmp_path):
    data = DataConfig(source="parquet", train=(numbered(tmp_path, 100),), shuffle_buffer=30)

    def ids(seed):
        return rows_of(collect(make_dataset(data, ID_COLUMNS, "train", batch_size=10,
                                            seed=seed)), "id")
    a, b, c = ids(1), ids(1), ids(2)
    assert a == b and a != c
    assert sorted(a) == list(range(100)) and a != list(range(100))
    # A buffer of 30 rows: a row cannot come out before the buffer could have held it.
    assert all(pos >= row - 30 - 10 for pos, row in enumerate(a))


def test_shuffle_with_repeat_keeps_epoch_counts(tmp_path):
    data = DataConfig(source="parquet", train=(numbered(tmp_path, 20),), shuffle_buffer=8)
    ids = rows_of(collect(make_dataset(data, ID_COLUMNS, "train", batch_size=5, repeat=True),
                          limit=12), "id")
    assert len(ids) == 60 and set(np.bincount(ids, minlength=20)) <= {2, 3, 4}


def test_tfrecord_shuffle_seeded(tmp_path):
    write_tfrecord(tmp_path / "a.tfrecord", ROWS * 3)
    data = DataConfig(source="tfrecord", train=(str(tmp_path / "a.tfrecord"),),
                      shuffle_buffer=12)
    cols = ColumnsConfig(labels=("label",), sparse=(SparseColumn("ts"),))

    def ts(seed):
        return rows_of(collect(make_dataset(data, cols, "train", batch_size=6, seed=seed)), "ts")
    assert ts(3) == ts(3) and sorted(ts(3)) == sorted(r[7] for r in ROWS * 3)
    assert ts(3) != [r[7] for r in ROWS * 3]


# --- graph mode and signature --------------------------------------------------------------

@pytest.mark.parametrize("source", ["parquet", "tfrecord", "generator"])
def test_graph_mode_matches_eager(tmp_path, source):
    if source == "parquet":
        data, cols = parquet_data(tmp_path), full_columns()
    elif source == "tfrecord":
        write_tfrecord(tmp_path / "a.tfrecord", ROWS)
        data = DataConfig(source="tfrecord", train=(str(tmp_path / "a.tfrecord"),))
        cols = full_columns()
    else:
        data = DataConfig(source="generator", generator=GeneratorOptions(train_rows=1000,
                                                                         eval_rows=0))
        cols = ColumnsConfig(labels=("label",), dense=CRITEO_DENSE, sparse=CRITEO_SPARSE)
    eager = collect(make_dataset(data, cols, "train", batch_size=3), limit=3)
    graph = tf.Graph()
    with graph.as_default():
        ds = make_dataset(data, cols, "train", batch_size=3)
        assert ds.element_spec == batch_signature(cols, 3)
        iterator = tf.compat.v1.data.make_initializable_iterator(ds)
        nxt = iterator.get_next()
        with tf.compat.v1.Session(graph=graph) as sess:
            for _ in range(2):   # a re-initialized iterator restarts the split
                sess.run(iterator.initializer)
                got = [sess.run(nxt) for _ in range(3)]
                for x, y in zip(eager, got):
                    assert set(x) == set(y)
                    for key in x:
                        np.testing.assert_array_equal(x[key], y[key])


def test_batch_signature_shapes():
    spec = batch_signature(full_columns(), 8)
    assert {k: (v.shape.as_list(), v.dtype) for k, v in spec.items()} == {
        "labels": ([8, 1], tf.float32), "dense": ([8, 1], tf.float32),
        "C_int": ([8], tf.int64), "C_hex": ([8], tf.int64), "C_str": ([8], tf.int64),
        "tags": ([8, 3], tf.int64), "genres": ([8, 2], tf.int64), "ts": ([8], tf.int64)}
    no_dense = ColumnsConfig(labels=("a", "b"), sparse=(SparseColumn("x"),))
    assert set(batch_signature(no_dense, 2)) == {"labels", "x"}
    with pytest.raises(ValueError, match="`batch_size`"):
        batch_signature(no_dense, 0)
    with pytest.raises(ValueError, match="'dense'"):
        batch_signature(ColumnsConfig(labels=("a",), sparse=(SparseColumn("dense"),)), 2)


# --- errors --------------------------------------------------------------------------------

def test_unknown_column_names_file_column_and_columns(tmp_path):
    data = parquet_data(tmp_path)
    cols = ColumnsConfig(labels=("label",), sparse=(SparseColumn("C_nope"),))
    with pytest.raises(ValueError, match=r"part-0\.parquet.*'C_nope'.*it has label, I1, C_int"):
        make_dataset(data, cols, "train", batch_size=2)


def test_unknown_column_in_csv_tsv_tfrecord_and_generator(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text(csv_text(ROWS, ",", True))
    bad = ColumnsConfig(labels=("label",), sparse=(SparseColumn("zz"),))
    with pytest.raises(ValueError, match=r"a\.csv: column 'zz' not found; it has label, I1"):
        make_dataset(DataConfig(source="csv", train=(str(path),)), bad, "train", batch_size=2)
    tsv = tmp_path / "c.txt"
    tsv.write_text("\t".join(criteo_line(np.random.default_rng(1), 0)) + "\n")
    with pytest.raises(ValueError, match=r"c\.txt: column 'zz' not found; it has label, I1"):
        make_dataset(DataConfig(source="criteo_tsv", train=(str(tsv),)), bad, "train",
                     batch_size=2)
    write_tfrecord(tmp_path / "a.tfrecord", ROWS)
    with pytest.raises(ValueError, match=r"a\.tfrecord: column 'zz' not found; it has C_hex"):
        make_dataset(DataConfig(source="tfrecord", train=(str(tmp_path / "a.tfrecord"),)), bad,
                     "train", batch_size=2)
    with pytest.raises(ValueError, match=r"generator \(kind criteo\): column 'zz' not found"):
        make_dataset(DataConfig(source="generator"), bad, "train", batch_size=2)


def test_malformed_files_name_the_file(tmp_path):
    fake = tmp_path / "fake.parquet"
    fake.write_text("not parquet at all\n")
    cols = ColumnsConfig(labels=("label",))
    with pytest.raises(ValueError, match=r"fake\.parquet: cannot read as Parquet"):
        make_dataset(DataConfig(source="parquet", train=(str(fake),)), cols, "train",
                     batch_size=2)
    ragged = tmp_path / "ragged.csv"
    ragged.write_text("label,x\n1,2\n0,3,4\n")
    with pytest.raises(ValueError, match=r"ragged\.csv: cannot read as csv"):
        make_dataset(DataConfig(source="csv", train=(str(ragged),)), cols, "train",
                     batch_size=2)
    junk = tmp_path / "junk.tfrecord"
    junk.write_bytes(b"\x00\x01garbage" * 10)
    with pytest.raises(ValueError, match=r"junk\.tfrecord: cannot read as TFRecord"):
        make_dataset(DataConfig(source="tfrecord", train=(str(junk),)), cols, "train",
                     batch_size=2)


def test_bad_values_name_the_file_and_column(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("label,h\n1,ff\n0,xyz\n")
    cols = ColumnsConfig(labels=("label",), sparse=(SparseColumn("h", encoding="hex"),))
    ds = make_dataset(DataConfig(source="csv", train=(str(path),)), cols, "train", batch_size=2)
    with pytest.raises(tf.errors.OpError, match=r"a\.csv: column 'h' \(encoding hex\).*'xyz'"):
        collect(ds)
    pq.write_table(pa.table({"label": [1.0], "s": ["x"]}), tmp_path / "s.parquet")
    cols = ColumnsConfig(labels=("s",))
    ds = make_dataset(DataConfig(source="parquet", train=(str(tmp_path / "s.parquet"),)), cols,
                      "train", batch_size=1)
    with pytest.raises(tf.errors.OpError, match=r"s\.parquet: column 's' has type string"):
        collect(ds)


def test_eval_split_missing(tmp_path):
    cols = ColumnsConfig(labels=("label",))
    with pytest.raises(ValueError, match=r"`split`: 'eval'.*data\.eval is not set"):
        make_dataset(parquet_data(tmp_path), cols, "eval", batch_size=2)
    gen = DataConfig(source="generator", generator=GeneratorOptions(eval_rows=0))
    with pytest.raises(ValueError, match=r"`split`: 'eval'.*eval_rows is 0"):
        make_dataset(gen, cols, "eval", batch_size=2)
    with pytest.raises(ValueError, match=r"`split`: 'test'"):
        make_dataset(gen, cols, "test", batch_size=2)


def test_missing_path_and_empty_glob(tmp_path):
    cols = ColumnsConfig(labels=("label",))
    with pytest.raises(ValueError, match=r"`data\.train`: no such file or directory"):
        make_dataset(DataConfig(source="csv", train=(str(tmp_path / "nope.csv"),)), cols,
                     "train", batch_size=2)
    with pytest.raises(ValueError, match=r"`data\.train`: .*matches no files"):
        make_dataset(DataConfig(source="csv", train=(str(tmp_path / "*.csv"),)), cols,
                     "train", batch_size=2)


# --- generator -----------------------------------------------------------------------------

GEN = GeneratorOptions(train_rows=65536, eval_rows=8192, seed=11)
GEN_COLUMNS = ColumnsConfig(labels=("label",), dense=CRITEO_DENSE, sparse=CRITEO_SPARSE)


def test_generator_shapes_and_determinism():
    data = DataConfig(source="generator", generator=GEN)
    a = collect(make_dataset(data, GEN_COLUMNS, "train", batch_size=4096), limit=2)
    b = collect(make_dataset(data, GEN_COLUMNS, "train", batch_size=4096), limit=2)
    assert len(a) == 2 and set(a[0]) == {"labels", "dense", *(f"C{i}" for i in range(1, 27))}
    assert a[0]["labels"].shape == (4096, 1) and a[0]["dense"].shape == (4096, 13)
    assert a[0]["C1"].shape == (4096,) and a[0]["C1"].dtype == np.int64
    for x, y in zip(a, b):
        for key in x:
            np.testing.assert_array_equal(x[key], y[key])
    e = collect(make_dataset(data, GEN_COLUMNS, "eval", batch_size=4096))
    assert len(e) == 2 and not np.array_equal(e[0]["C3"], a[0]["C3"])
    other = DataConfig(source="generator", generator=GeneratorOptions(
        train_rows=65536, eval_rows=8192, seed=12))
    c = collect(make_dataset(other, GEN_COLUMNS, "train", batch_size=4096), limit=1)
    assert not np.array_equal(c[0]["C3"], a[0]["C3"])
    # A column's values do not depend on which other columns are read.
    few = ColumnsConfig(labels=("label",), sparse=(SparseColumn("C3"),))
    d = collect(make_dataset(data, few, "train", batch_size=4096), limit=1)
    np.testing.assert_array_equal(d[0]["C3"], a[0]["C3"])
    np.testing.assert_array_equal(d[0]["labels"], a[0]["labels"])


def test_generator_statistics():
    data = DataConfig(source="generator", generator=GEN)
    batches = collect(make_dataset(data, GEN_COLUMNS, "train", batch_size=4096), limit=4)
    for batch in batches:
        keys = [batch[f"C{i}"] for i in range(1, 27)]
        unique = sum(len(set(k.tolist())) for k in keys) / (4096 * 26)
        assert 0.25 <= unique <= 0.35, unique
        assert all((k != -1).all() for k in keys)
    labels = np.concatenate([b["labels"] for b in batches])
    assert set(np.unique(labels).tolist()) == {0.0, 1.0}
    assert 0.20 <= labels.mean() <= 0.30
    raw = collect(make_dataset(data, GEN_COLUMNS, "train", batch_size=4096), limit=1)[0]["dense"]
    assert (raw >= 0).all() and (raw == np.floor(raw)).all()
    assert raw.max() > 1000 * np.median(raw) + 1          # heavy tailed
    logged = ColumnsConfig(labels=("label",), dense=CRITEO_DENSE, dense_transform="log1p")
    log = collect(make_dataset(data, logged, "train", batch_size=4096), limit=1)[0]["dense"]
    np.testing.assert_allclose(log, np.log1p(raw), rtol=1e-6)
    # Cardinality cap: a capped feature has at most cap distinct keys.
    capped = DataConfig(source="generator", generator=GeneratorOptions(
        train_rows=20000, eval_rows=0, cardinality_cap=50))
    cols = ColumnsConfig(labels=("label",), sparse=(SparseColumn("C3"),))
    keys = rows_of(collect(make_dataset(capped, cols, "train", batch_size=20000)), "C3")
    assert 40 <= len(set(keys)) <= 50


def test_generator_labels_are_learnable():
    # Keys seen often have a consistent click rate: the per-key mean label of frequent C6 keys
    # (24 values) spreads far beyond what independent labels would give.
    data = DataConfig(source="generator", generator=GEN)
    cols = ColumnsConfig(labels=("label",), sparse=(SparseColumn("C6"),))
    batch = collect(make_dataset(data, cols, "train", batch_size=65536))[0]
    labels, keys = batch["labels"][:, 0], batch["C6"]
    rates = [labels[keys == k].mean() for k in np.unique(keys) if (keys == k).sum() > 1000]
    assert len(rates) >= 5 and max(rates) - min(rates) > 0.1


def test_generator_multi_hot_and_unknown_kind():
    data = DataConfig(source="generator", generator=GeneratorOptions(train_rows=64, eval_rows=0))
    cols = ColumnsConfig(labels=("label",), sparse=(SparseColumn("C1", length=3),))
    batch = collect(make_dataset(data, cols, "train", batch_size=8), limit=1)[0]
    assert batch["C1"].shape == (8, 3) and (batch["C1"][:, 1:] == -1).all()
    bad = DataConfig(source="generator", generator=GeneratorOptions(kind="avazu"))
    with pytest.raises(ValueError, match=r"`data\.generator\.kind`: 'avazu'"):
        make_dataset(bad, cols, "train", batch_size=8)


def test_unknown_source_rejected():
    with pytest.raises(ValueError, match=r"`data\.source`: 'hdf5'"):
        make_dataset(DataConfig(source="hdf5"), ColumnsConfig(labels=("label",)), "train",
                     batch_size=2)


def test_nothing_written_next_to_the_data(tmp_path):
    data = parquet_data(tmp_path)
    before = sorted(os.listdir(tmp_path / "pq"))
    collect(make_dataset(data, full_columns(), "train", batch_size=3))
    assert sorted(os.listdir(tmp_path / "pq")) == before


def test_bad_arguments_name_the_argument(tmp_path):
    data = DataConfig(source="generator", generator=GeneratorOptions(train_rows=64, eval_rows=0))
    cols = ColumnsConfig(labels=("label",))
    with pytest.raises(ValueError, match=r"`seed` must be an int >= 0. Received: -1"):
        make_dataset(data, cols, "train", batch_size=8, seed=-1)
    with pytest.raises(ValueError, match=r"`batch_size` must be an int >= 1. Received: 0"):
        make_dataset(data, cols, "train", batch_size=0)
    with pytest.raises(ValueError, match=r"`columns.sparse.x.encoding`: 'base64'"):
        make_dataset(data, ColumnsConfig(labels=("label",), sparse=(
            SparseColumn("x", encoding="base64"),)), "train", batch_size=8)
