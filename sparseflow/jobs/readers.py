"""The data sources of YAML jobs: files (Parquet, CSV, Criteo TSV, TFRecord), the Criteo-shaped
generator and MovieLens-100K.

Every source except TFRecord hands :mod:`sparseflow.jobs.data` *blocks*: dicts of numpy arrays
with any number of rows n, already in the form the model reads (see :func:`arrow_to_block`).
File sources are checked when the dataset is built (each file opened, its columns compared with
the config) and then streamed; the generator and MovieLens build their whole split in memory
once. TFRecord files are parsed by TensorFlow ops (:func:`tfrecord_dataset`).
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import os

import numpy as np
import pyarrow as pa

from sparseflow import synthetic
from sparseflow.ops import text_kernels

SOURCES = ("generator", "parquet", "csv", "criteo_tsv", "tfrecord", "movielens")
CRITEO_COLUMNS = ("label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27)))
READ_ROWS = 65536            # rows per record batch read from Parquet
CSV_BLOCK_BYTES = 1 << 22    # bytes per CSV block (about 25k Criteo rows)
SPLITS = ("train", "eval")


@functools.lru_cache(maxsize=None)
def read_pool() -> pa.MemoryPool:
    """The Arrow memory pool the YAML jobs' Parquet reader decodes into: jemalloc where this
    pyarrow has it and the user has not chosen a default pool (``ARROW_DEFAULT_MEMORY_POOL``),
    else Arrow's default pool.

    Why not the default (mimalloc): in a job's input pipeline, beside TensorFlow, the pages
    mimalloc's arenas freed went back to the kernel and were faulted in again as 2 MB huge
    pages: 26% of the Criteo-shaped job's Parquet input CPU in page faults, 13% zeroing huge
    pages; jemalloc saved 0.5-3 ms of CPU a batch (BENCHMARKS.md, "YAML job's input"). The
    CSV readers and the feature-stats job keep the default pool: reading alone, without
    TensorFlow beside it, jemalloc measured no faster for Parquet and ~10% slower for CSV.

    Returns:
      A ``pyarrow.MemoryPool`` (the same one on every call).
    """
    if "ARROW_DEFAULT_MEMORY_POOL" not in os.environ \
            and "jemalloc" in pa.supported_memory_backends():
        return pa.jemalloc_memory_pool()
    return pa.default_memory_pool()


@dataclasses.dataclass(frozen=True)
class ColumnPlan:
    """The ``columns:`` section, flattened into what readers need (hashable).

    Attributes:
      labels, dense: column names.
      log1p: dense values become ``log(1 + max(x, 0))``.
      single: ``(name, encoding)`` of each single-hot sparse column.
      multi: ``(name, length, encoding)`` of each multi-hot sparse column.
      timestamp: the timestamp column or None.
    """

    labels: tuple[str, ...]
    dense: tuple[str, ...]
    log1p: bool
    single: tuple[tuple[str, str], ...]
    multi: tuple[tuple[str, int, str], ...]
    timestamp: str | None

    @classmethod
    def from_columns(cls, columns) -> "ColumnPlan":
        """Builds the plan from a ``ColumnsConfig``; raises ValueError on clashing names."""
        single = tuple((c.name, c.encoding) for c in columns.sparse if c.length == 1)
        multi = tuple((c.name, int(c.length), c.encoding) for c in columns.sparse if c.length > 1)
        outputs = [c.name for c in columns.sparse] + ([columns.timestamp] if columns.timestamp
                                                      else [])
        for name in outputs:
            if name in ("labels", "dense") or outputs.count(name) > 1:
                raise ValueError(f"Invalid `columns`: {name!r} would name two batch entries; "
                                 f"sparse and timestamp columns need distinct names other than "
                                 f"'labels' and 'dense'.")
        for c in columns.sparse:
            if c.encoding not in text_kernels.ENCODINGS:
                raise ValueError(f"Invalid `columns.sparse.{c.name}.encoding`: {c.encoding!r}, "
                                 f"use one of {', '.join(text_kernels.ENCODINGS)}.")
        return cls(tuple(columns.labels), tuple(columns.dense),
                   columns.dense_transform == "log1p", single, multi, columns.timestamp or None)

    @property
    def names(self) -> tuple[str, ...]:
        """Every column read, each once, in config order."""
        names = [*self.labels, *self.dense, *(n for n, _ in self.single),
                 *(n for n, _, _ in self.multi), *([self.timestamp] if self.timestamp else [])]
        return tuple(dict.fromkeys(names))

    def encoding(self, name: str) -> str | None:
        """The sparse encoding of ``name``, or None when it is not a sparse column."""
        for n, enc in self.single:
            if n == name:
                return enc
        for n, _, enc in self.multi:
            if n == name:
                return enc
        return None


def check_columns(available, plan: ColumnPlan, where: str) -> None:
    """Raises ValueError naming ``where`` if a column of ``plan`` is not in ``available``."""
    missing = [n for n in plan.names if n not in set(available)]
    if missing:
        raise ValueError(f"{where}: column{'s' if len(missing) > 1 else ''} "
                         f"{', '.join(repr(m) for m in missing)} not found; it has "
                         f"{', '.join(available) or 'no columns'}.")


def expand_paths(paths, field: str) -> list[str]:
    """Files named by ``paths``: files, directories (all files below, skipping files and folders
    whose names start with '.' or '_') and globs, in the given order (each directory or glob
    sorted).

    Raises:
      ValueError: no paths, or a path that matches nothing (names ``field``).
    """
    if isinstance(paths, str):
        paths = (paths,)
    files: list[str] = []
    for raw in paths:
        path = os.path.expanduser(str(raw))
        if any(c in path for c in "*?["):
            found = sorted(p for p in glob.glob(path, recursive=True) if os.path.isfile(p))
        elif os.path.isdir(path):
            found = []
            for root, dirs, names in os.walk(path):
                dirs[:] = [d for d in dirs if not d.startswith((".", "_"))]
                found += [os.path.join(root, f) for f in names if not f.startswith((".", "_"))]
            found.sort()
        elif os.path.isfile(path):
            found = [path]
        else:
            raise ValueError(f"`{field}`: no such file or directory: {raw!r}")
        if not found:
            raise ValueError(f"`{field}`: {raw!r} matches no files")
        files.extend(found)
    if not files:
        raise ValueError(f"`{field}` must name at least one file. Received: {list(paths)!r}")
    return files


# --- Arrow -> block ------------------------------------------------------------------------

def _numbers(col, name: str, dtype, fill, where: str) -> np.ndarray:
    t = col.type
    if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
            or pa.types.is_null(t) or pa.types.is_timestamp(t) or pa.types.is_decimal(t)):
        raise ValueError(f"{where}: column {name!r} has type {t}; it must hold numbers.")
    if pa.types.is_null(t):
        return np.full(len(col), fill, dtype)
    if pa.types.is_timestamp(t) or pa.types.is_decimal(t) or pa.types.is_boolean(t):
        col = col.cast(pa.int64() if pa.types.is_timestamp(t) else
                       pa.float64() if pa.types.is_decimal(t) else pa.int8())
    if col.null_count:
        col = col.fill_null(pa.scalar(fill, col.type))
    return np.asarray(col.to_numpy(zero_copy_only=False), dtype)


def arrow_to_block(batch, plan: ColumnPlan, where: str) -> dict[str, np.ndarray]:
    """Converts Arrow rows to a block.

    Args:
      batch: ``pyarrow.RecordBatch`` or ``Table`` with n rows holding ``plan.names``.
      plan: the columns.
      where: the file (or source) named in errors.

    Returns:
      ``labels`` float32 [n, n_labels]; ``dense`` float32 [n, n_dense] (when there are dense
      columns; nulls 0, log1p applied); ``single:<name>`` int64 [n] per single-hot column (one
      contiguous array each: the tf.data side hands every feature its keys without a strided
      copy); ``multi:<name>`` int64 [n, L] per multi-hot column; ``timestamp`` int64 [n]
      (nulls 0). Missing keys are -1.

    Raises:
      ValueError: a column whose values do not fit its role or encoding (names it and ``where``).
    """
    n = batch.num_rows
    block = {"labels": np.stack([_numbers(batch.column(c), c, np.float32, 0, where)
                                 for c in plan.labels], axis=1).reshape(n, len(plan.labels))}
    if plan.dense:
        dense = np.stack([_numbers(batch.column(c), c, np.float32, 0, where)
                          for c in plan.dense], axis=1).reshape(n, len(plan.dense))
        if plan.log1p:
            np.log1p(np.maximum(dense, 0.0, out=dense), out=dense)
        block["dense"] = dense
    for name, encoding in plan.single:
        col = batch.column(name)
        block["single:" + name] = (
            np.ascontiguousarray(_keys(col, name, 1, encoding, where)[:, 0])
            if _is_list(col.type) else _keys(col, name, 0, encoding, where))
    for name, length, encoding in plan.multi:
        block["multi:" + name] = _keys(batch.column(name), name, length, encoding, where)
    if plan.timestamp:
        block["timestamp"] = _numbers(batch.column(plan.timestamp), plan.timestamp, np.int64, 0,
                                      where)
    return block


def _is_list(t) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _keys(col, name: str, length: int, encoding: str, where: str) -> np.ndarray:
    """int64 [n] (length 0) or [n, length] keys of one column."""
    try:
        if length == 0:
            return text_kernels.encode_keys(col, encoding)
        return text_kernels.pad_lists(col, length, encoding=encoding)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: column {name!r} (encoding {encoding}): {err}") from None


# --- Parquet, CSV, Criteo TSV --------------------------------------------------------------

def parquet_blocks(files: list[str], plan: ColumnPlan):
    """Opens and checks every Parquet file; returns a function ``blocks()`` streaming them.

    Raises:
      ValueError: a file that is not Parquet, or lacks a column (names the file).
    """
    import pyarrow.dataset as ds

    fragments = []
    for path in files:
        try:
            fragment = next(iter(ds.dataset(path, format="parquet").get_fragments()))
            schema = fragment.physical_schema
        except (pa.ArrowException, OSError, StopIteration) as err:
            raise ValueError(f"{path}: cannot read as Parquet: {err}") from None
        check_columns(schema.names, plan, path)
        fragments.append((path, fragment))

    def blocks():
        for path, fragment in fragments:
            try:
                batches = fragment.to_batches(columns=list(plan.names), batch_size=READ_ROWS,
                                              memory_pool=read_pool())
                for batch in batches:
                    if batch.num_rows:
                        yield arrow_to_block(batch, plan, path)
            except pa.ArrowException as err:
                raise ValueError(f"{path}: cannot read as Parquet: {err}") from None
    return blocks


def _csv_options(source: str, csv_options, plan: ColumnPlan):
    import pyarrow.csv as pcsv

    if source == "criteo_tsv":
        read = pcsv.ReadOptions(column_names=list(CRITEO_COLUMNS), block_size=CSV_BLOCK_BYTES)
        parse = pcsv.ParseOptions(delimiter="\t", quote_char=False)
    else:
        read = pcsv.ReadOptions(autogenerate_column_names=not csv_options.header,
                                block_size=CSV_BLOCK_BYTES)
        parse = pcsv.ParseOptions(delimiter=csv_options.delimiter)
    types = {n: pa.float64() for n in (*plan.labels, *plan.dense)}
    for name in plan.names:
        encoding = plan.encoding(name)
        if encoding is not None:
            types[name] = pa.int64() if encoding == "int" else pa.string()
    if plan.timestamp:
        types[plan.timestamp] = pa.int64()
    return read, parse, types


def csv_blocks(source: str, files: list[str], csv_options, plan: ColumnPlan):
    """Opens and checks every CSV (or Criteo TSV) file; returns ``blocks()`` streaming them.

    Without a header, columns are named ``f0``, ``f1``, ... (Criteo TSV: label, I1..I13,
    C1..C26). Label and dense columns are read as float64, int-encoded and timestamp columns as
    int64, hex/string-encoded columns as strings; an empty field is missing.

    Raises:
      ValueError: a file that cannot be parsed, or lacks a column (names the file).
    """
    import pyarrow.csv as pcsv

    read, parse, types = _csv_options(source, csv_options, plan)
    for path in files:
        try:
            reader = pcsv.open_csv(path, read_options=read, parse_options=parse,
                                   convert_options=pcsv.ConvertOptions(column_types=types))
            names = reader.schema.names
        except (pa.ArrowException, OSError) as err:
            raise ValueError(f"{path}: cannot read as {source}: {err}") from None
        check_columns(names, plan, path)
    convert = pcsv.ConvertOptions(column_types=types, include_columns=list(plan.names))

    def blocks():
        for path in files:
            try:
                reader = pcsv.open_csv(path, read_options=read, parse_options=parse,
                                       convert_options=convert)
                for batch in reader:
                    if batch.num_rows:
                        yield arrow_to_block(batch, plan, path)
            except (pa.ArrowException, OSError) as err:
                raise ValueError(f"{path}: cannot read as {source}: {err}") from None
    return blocks


# --- generator -----------------------------------------------------------------------------

# Criteo-like dense features: per-feature median and log-scale spread of a log-normal count.
_DENSE_MEDIAN = np.array([1, 3, 5, 4, 2800, 30, 3, 8, 40, 0.5, 2, 0.5, 5], np.float32)
_DENSE_SIGMA = np.array([1.2, 1.5, 1.2, 1.0, 2.0, 1.8, 1.5, 1.2, 1.4, 0.8, 1.2, 1.0, 1.3],
                        np.float32)
# Features whose hidden per-key effects drive the label (0-based: C1, C2, C4, C6, C8, C10, C13,
# C15: small to huge vocabularies), and the bias that puts the CTR near 25%.
_LABEL_FEATURES = (0, 1, 3, 5, 7, 9, 12, 14)
_LABEL_BIAS = -1.3


def generator_block(options, split: str, plan: ColumnPlan) -> dict[str, np.ndarray]:
    """The whole ``split`` of the Criteo-shaped generator as one block (cached, read-only).

    Columns: ``label``, ``I1``..``I13`` (non-negative heavy-tailed counts), ``C1``..``C26``
    (int64 keys; Zipf ranks over Kaggle cardinalities capped at ``options.cardinality_cap``,
    scattered over int64 by :func:`sparseflow.synthetic.scatter_keys`; never missing). The
    label is drawn from ``sigmoid(sum of hidden per-key effects of 8 features + a dense term -
    1.3)`` (CTR about 25%). Each feature, the dense block and the labels have their own stream
    seeded by ``(options.seed, split, feature)``, so train and eval differ and a column's values
    do not depend on which other columns are read. Sparse encodings are ignored (keys are
    already int64).

    Raises:
      ValueError: an unknown ``kind``, or a column the generator does not have.
    """
    if options.kind != "criteo":
        raise ValueError(f"Invalid `data.generator.kind`: {options.kind!r}, use one of criteo.")
    check_columns(CRITEO_COLUMNS, plan, "generator (kind criteo)")
    rows = options.train_rows if split == "train" else options.eval_rows
    return _generate(int(options.seed), int(options.cardinality_cap), int(rows),
                     SPLITS.index(split), plan)


@functools.lru_cache(maxsize=2)
def _generate(seed: int, cap: int, n: int, split: int, plan: ColumnPlan) -> dict:
    z = np.random.default_rng([seed, split, 100]).standard_normal((n, 13), np.float32)
    keys: dict[int, np.ndarray] = {}

    def column(name: str) -> np.ndarray:
        if name == "label":
            return label
        j = int(name[1:]) - 1
        if name[0] == "I":
            return np.floor(_DENSE_MEDIAN[j] * np.exp(_DENSE_SIGMA[j] * z[:, j]))
        if j not in keys:
            rng = np.random.default_rng([seed, split, j])
            card = min(synthetic.CRITEO_CARDINALITIES[j], cap)
            ranks = synthetic.zipf_ranks(rng, card, synthetic.criteo_exponent(card), n)
            keys[j] = synthetic.scatter_keys(ranks, salt=j + 1)
        return keys[j]

    logit = np.full(n, _LABEL_BIAS)
    for j in _LABEL_FEATURES:
        logit += synthetic.key_weight(column(f"C{j + 1}"), salt=1000 + j)
    logit += 0.5 * (z[:, 0] - z[:, 5]) / np.sqrt(2.0)
    label = (np.random.default_rng([seed, split, 101]).random(n)
             < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)

    block = {"labels": np.empty((n, len(plan.labels)), np.float32)}
    for i, name in enumerate(plan.labels):
        block["labels"][:, i] = column(name)
    if plan.dense:
        dense = block["dense"] = np.empty((n, len(plan.dense)), np.float32)
        for i, name in enumerate(plan.dense):
            dense[:, i] = column(name)
        if plan.log1p:
            np.log1p(np.maximum(dense, 0.0, out=dense), out=dense)
    for name, _ in plan.single:
        block["single:" + name] = np.asarray(column(name), np.int64)
    for name, length, _ in plan.multi:
        multi = block["multi:" + name] = np.full((n, length), -1, np.int64)
        multi[:, 0] = column(name)
    if plan.timestamp:
        block["timestamp"] = column(plan.timestamp).astype(np.int64)
    for value in block.values():
        value.flags.writeable = False
    return block


# --- MovieLens -----------------------------------------------------------------------------

def movielens_block(options, split: str, plan: ColumnPlan) -> dict[str, np.ndarray]:
    """One split of MovieLens-100K as a block, in timestamp order.

    The latest ``options.eval_fraction`` of the ratings by timestamp are ``eval``, the rest
    ``train`` (see :func:`sparseflow.datasets.movielens.time_split`). Token columns (user_id,
    item_id, gender, occupation, zip_code, genres) are strings: read them with encoding
    ``string`` (hashed) or, for the all-digit ids, ``int``.

    Raises:
      ValueError: a column MovieLens does not have, or that its encoding cannot read.
      RuntimeError: the data cannot be downloaded (see ``load_movielens_100k``).
    """
    from sparseflow.datasets import movielens

    table = movielens.load_movielens_100k(options.cache_dir)
    where = f"MovieLens-100K ({movielens.wheel_path(options.cache_dir)})"
    check_columns(table.column_names, plan, where)
    train, evaluation = movielens.time_split(table, options.eval_fraction)
    rows = train if split == "train" else evaluation
    return arrow_to_block(table.select(list(plan.names)).take(rows), plan, where)


# --- TFRecord ------------------------------------------------------------------------------

_SAMPLED_RECORDS = 100   # records per file whose features are checked up front


def _compression(path: str) -> str:
    return "GZIP" if path.endswith(".gz") else "ZLIB" if path.endswith(".zlib") else ""


def tfrecord_kinds(files: list[str], plan: ColumnPlan) -> dict[str, str]:
    """Checks the first records of every file; returns each column's stored kind.

    Returns:
      column -> ``float_list`` | ``int64_list`` | ``bytes_list``.

    Raises:
      ValueError: a file that is not TFRecord of ``tf.train.Example``, a column that none of
        its first 100 records has, a column stored as two kinds (names the file).
    """
    import tensorflow as tf
    from google.protobuf.message import DecodeError

    kinds: dict[str, str] = {}
    for path in files:
        seen: dict[str, str] = {}
        try:
            options = tf.io.TFRecordOptions(_compression(path))
            for i, record in enumerate(tf.compat.v1.io.tf_record_iterator(path, options)):
                if i == _SAMPLED_RECORDS:
                    break
                for name, feature in tf.train.Example.FromString(record).features.feature.items():
                    kind = feature.WhichOneof("kind")
                    if kind is not None:
                        seen.setdefault(name, kind)
        except (tf.errors.OpError, DecodeError) as err:
            raise ValueError(f"{path}: cannot read as TFRecord of tf.train.Example: "
                             f"{type(err).__name__}: {err}") from None
        if seen:   # an empty file has nothing to check
            check_columns(sorted(seen), plan, path)
        for name in plan.names:
            kind = seen.get(name)
            if kind and kinds.setdefault(name, kind) != kind:
                raise ValueError(f"{path}: column {name!r} is stored as {kind}, earlier files "
                                 f"store it as {kinds[name]}.")
    return kinds


def tfrecord_dataset(files: list[str], plan: ColumnPlan, kinds: dict[str, str], *,
                     batch_size: int, shuffle_buffer: int, seed: int, repeat: bool):
    """Batches of ``tf.train.Example`` records parsed by TensorFlow ops.

    Labels and dense features: float (or int64) lists, missing -> 0. Sparse: int64 lists
    (encoding int) or bytes lists (encoding string: ``tf.strings.to_hash_bucket_fast(s,
    2**63 - 1)``, the same keys as the Arrow sources; encoding hex: parsed by
    :func:`sparseflow.ops.text_kernels.parse_hex_keys`); single-hot is a FixedLen feature
    (missing -> -1), multi-hot a VarLen feature padded with -1 / truncated to its length.
    Records are shuffled (when ``shuffle_buffer`` > 0) before batching, with ``seed``.

    Returns:
      A ``tf.data.Dataset`` of the packed tuples :mod:`sparseflow.jobs.data` unpacks.

    Raises:
      ValueError: a column stored in a kind its role or encoding cannot read.
    """
    import tensorflow as tf

    compressions = {_compression(f) for f in files}
    if len(compressions) > 1:
        raise ValueError(f"`data` TFRecord files mix compressions ({sorted(compressions)}); "
                         f"use one of none, .gz, .zlib for all.")
    spec = {}
    for name in (*plan.labels, *plan.dense):
        kind = kinds.get(name, "float_list")
        if kind == "bytes_list":
            raise ValueError(f"TFRecord column {name!r} is stored as bytes; labels and dense "
                             f"columns must be float or int64 lists.")
        spec[name] = tf.io.FixedLenFeature([], tf.float32 if kind == "float_list" else tf.int64,
                                           default_value=0)
    for name, length, encoding in [(n, 1, e) for n, e in plan.single] + list(plan.multi):
        want = "int64_list" if encoding == "int" else "bytes_list"
        if kinds.get(name, want) != want:
            raise ValueError(f"TFRecord column {name!r} is stored as {kinds[name]}; encoding "
                             f"{encoding} reads {want}.")
        dtype = tf.int64 if encoding == "int" else tf.string
        spec[name] = tf.io.FixedLenFeature([], dtype, default_value=-1 if encoding == "int"
                                           else "") if length == 1 else tf.io.VarLenFeature(dtype)
    if plan.timestamp:
        spec[plan.timestamp] = tf.io.FixedLenFeature([], tf.int64, default_value=0)

    def keys(values, encoding):
        if encoding == "int":
            return values
        if encoding == "hex":
            hexed = tf.numpy_function(_hex_numpy, [values], tf.int64, stateful=False)
            return tf.reshape(hexed, tf.shape(values))
        hashed = tf.strings.to_hash_bucket_fast(values, text_kernels.HASH_MODULUS)
        return tf.where(tf.equal(values, ""), tf.constant(-1, tf.int64), hashed)

    def parse(serialized):
        f = tf.io.parse_example(serialized, spec)
        out = [tf.stack([tf.cast(f[c], tf.float32) for c in plan.labels], axis=1)]
        if plan.dense:
            dense = tf.stack([tf.cast(f[c], tf.float32) for c in plan.dense], axis=1)
            out.append(tf.math.log1p(tf.maximum(dense, 0.0)) if plan.log1p else dense)
        out += [keys(f[n], e) for n, e in plan.single]
        for name, length, encoding in plan.multi:
            sp = f[name]
            sp = tf.SparseTensor(sp.indices, keys(sp.values, encoding), sp.dense_shape)
            dense_keys = tf.sparse.to_dense(sp, default_value=-1)[:, :length]
            dense_keys = tf.pad(dense_keys, [[0, 0], [0, length - tf.shape(dense_keys)[1]]],
                                constant_values=-1)
            out.append(tf.ensure_shape(dense_keys, [batch_size, length]))
        if plan.timestamp:
            out.append(f[plan.timestamp])
        return tuple(out)

    ds = tf.data.TFRecordDataset(files, compression_type=compressions.pop())
    if repeat:
        ds = ds.repeat()
    if shuffle_buffer > 0:
        ds = ds.shuffle(shuffle_buffer, seed=seed)
    ds = ds.batch(batch_size, drop_remainder=True)
    return ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def _hex_numpy(values: np.ndarray) -> np.ndarray:
    flat = pa.array(values.ravel(), pa.binary())
    return text_kernels.parse_hex_keys(flat).reshape(values.shape)
