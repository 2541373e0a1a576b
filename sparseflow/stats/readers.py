"""Streaming the sparse columns of Parquet files as int64 keys, record batch by record batch.

Files, directories and globs are expanded by :func:`sparseflow.jobs.readers.expand_paths`;
every file is opened and its columns checked up front (errors name the file), then read one
record batch (``sparseflow.jobs.readers.READ_ROWS`` rows) at a time, so memory holds one batch
of keys, not the data.

Keys are read as the training jobs read them (:func:`sparseflow.ops.text_kernels.encode_keys`):
encoding ``int`` for integer columns (any int64 is a key, -1 included), ``string`` for string
columns (``Fingerprint64 mod 2**63 - 1``, the project's string hash), ``hex`` on request. A
column of lists is multi-hot: its lists are flattened, every key counted. What is missing:

* a null value of a single-valued column, or a null list: a *null row*;
* an empty string (string/hex encodings, which read it as -1 like the training jobs): a null
  row when it is the value, dropped when it is a list element;
* a null element inside a list: dropped (a list of only nulls is an *empty row*).

The timestamp column (integers, or Arrow timestamps read as their int64 count of units) gives
every key its row's time; a null timestamp reads as 0, as in the training jobs.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparseflow.jobs import readers as job_readers
from sparseflow.ops import text_kernels


@dataclasses.dataclass(frozen=True)
class ColumnKeys:
    """One column of one record batch, ready for :meth:`FeatureCounter.update`.

    Attributes:
      keys: int64 [n], the keys of the non-null rows (lists flattened, missing values dropped).
      row_lengths: int64 [r], keys per non-null row (multi-hot columns), or None.
      null_rows: rows whose value is null (or an empty string).
      timestamps: int64 [n], each key's row time, or None without a timestamp column.
    """

    keys: np.ndarray
    row_lengths: np.ndarray | None
    null_rows: int
    timestamps: np.ndarray | None


@dataclasses.dataclass(frozen=True)
class Batch:
    """One record batch: ``num_rows``, ``path`` (its file), ``timestamps`` (int64 [num_rows] or
    None) and ``columns`` (name -> :class:`ColumnKeys`)."""

    path: str
    num_rows: int
    timestamps: np.ndarray | None
    columns: dict


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _is_stringish(t: pa.DataType) -> bool:
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t) or pa.types.is_string_view(t)
            or pa.types.is_binary_view(t))


def column_kind(t: pa.DataType) -> tuple[str | None, bool]:
    """(default encoding, multi-hot) of a sparse column of Arrow type ``t``.

    Returns:
      (``int`` for integers / floats / decimals / nulls, ``string`` for strings and binaries,
      None for anything else; whether ``t`` is a list type).
    """
    multi = _is_list(t)
    v = t.value_type if multi else t
    if pa.types.is_dictionary(v):
        v = v.value_type
    if (pa.types.is_integer(v) or pa.types.is_floating(v) or pa.types.is_decimal(v)
            or pa.types.is_null(v)):
        return "int", multi
    if _is_stringish(v):
        return "string", multi
    return None, multi


def column_keys(array: pa.Array, encoding: str, multi_hot: bool,
                row_times: np.ndarray | None = None) -> ColumnKeys:
    """The keys of one Arrow column (see the module docstring for what is missing).

    Args:
      array: pyarrow array of n rows: values, or lists of values when ``multi_hot``.
      encoding: ``int`` | ``hex`` | ``string`` (see :func:`text_kernels.encode_keys`).
      multi_hot: ``array`` holds lists.
      row_times: int64 [n], each row's time, or None.

    Returns:
      A :class:`ColumnKeys`.

    Raises:
      ValueError / TypeError: values that ``encoding`` cannot read (from ``encode_keys``).
    """
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    n = len(array)
    if not multi_hot:
        if encoding == "int":
            valid = array.drop_null() if array.null_count else array
            keys = text_kernels.encode_keys(valid, "int")
            mask = None if not array.null_count else \
                array.is_valid().to_numpy(zero_copy_only=False)
        else:
            keys = text_kernels.encode_keys(array, encoding)
            mask = keys != -1
            if mask.all():
                mask = None
            else:
                keys = keys[mask]
        times = None
        if row_times is not None:
            times = row_times if mask is None else row_times[mask]
        return ColumnKeys(keys, None, n - keys.shape[0], times)

    values = pc.list_flatten(array)
    keys = text_kernels.encode_keys(values, encoding)
    if encoding == "int":
        drop = values.null_count > 0
        keep = values.is_valid().to_numpy(zero_copy_only=False) if drop else None
    else:
        keep = keys != -1
        drop = not keep.all()
    null_rows = array.null_count
    parent = None
    if drop or row_times is not None:
        parent = pc.list_parent_indices(array).to_numpy().astype(np.int64, copy=False)
    if drop:
        keys = keys[keep]
        parent = parent[keep]
        lengths = np.bincount(parent, minlength=n).astype(np.int64)
        if null_rows:
            lengths = lengths[array.is_valid().to_numpy(zero_copy_only=False)]
    else:
        lengths = pc.list_value_length(array)
        if null_rows:
            lengths = lengths.drop_null()
        lengths = lengths.to_numpy().astype(np.int64, copy=False)
    times = row_times[parent] if row_times is not None else None
    return ColumnKeys(keys, lengths, int(null_rows), times)


def timestamp_values(array: pa.Array) -> np.ndarray:
    """int64 [n] times of a timestamp column: integers, or Arrow timestamps as their count of
    units; nulls read 0.

    Raises:
      ValueError: a column of another type.
    """
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    t = array.type
    if not (pa.types.is_integer(t) or pa.types.is_timestamp(t)):
        raise ValueError(f"a timestamp column must hold integers or timestamps; this one has "
                         f"type {t}")
    if t != pa.int64():
        try:
            array = array.cast(pa.int64())
        except pa.ArrowInvalid as err:
            raise ValueError(f"timestamps cannot be read as int64: {err}") from None
    if array.null_count:
        array = pc.fill_null(array, 0)
    return array.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def _describe(kind) -> str:
    what = "integers" if kind[0] == "int" else "strings"
    return f"lists of {what}" if kind[1] else what


def resolve_paths(paths) -> tuple[list[str], list[str]]:
    """(the paths as strings, the files they name: files, directories, globs).

    Raises:
      ValueError: a path that names no file.
    """
    paths = [os.fspath(paths)] if isinstance(paths, (str, os.PathLike)) else \
        [os.fspath(p) for p in paths]
    return paths, job_readers.expand_paths(paths, "paths")


def key_columns_plan(columns, timestamp: str | None) -> job_readers.ColumnPlan:
    """The training jobs' column plan of ``columns`` (and the timestamp), for their column
    checks: the stats sources read no labels or dense features."""
    return job_readers.ColumnPlan(labels=(), dense=(), log1p=False,
                                  single=tuple((c, "int") for c in columns), multi=(),
                                  timestamp=timestamp)


def check_column_names(columns) -> list[str]:
    """``columns`` as a list of distinct names.

    Raises:
      ValueError: not a non-empty list, or a name repeated.
    """
    if isinstance(columns, str) or not columns:
        raise ValueError(f"Argument `columns` must be a non-empty list of column names. "
                         f"Received: {columns!r}")
    columns = [str(c) for c in columns]
    repeated = sorted({c for c in columns if columns.count(c) > 1})
    if repeated:
        raise ValueError(f"Argument `columns` names {', '.join(map(repr, repeated))} more "
                         f"than once.")
    return columns


class ParquetSource:
    """Checked Parquet files whose sparse columns are streamed by :meth:`batches`.

    Attributes:
      paths: the paths as given.
      files: the files they name, in reading order.
      columns: the sparse columns, in the given order.
      timestamp: the timestamp column or None.
      kinds: column -> (encoding, multi_hot).
    """

    def __init__(self, paths, columns, timestamp: str | None = None,
                 encodings: dict | None = None):
        """Opens and checks every file.

        Args:
          paths: a path (str or path-like) or a list of them: Parquet files, directories
            (every file below, names starting with '.' or '_' skipped) and globs.
          columns: sparse column names (a non-empty list of distinct names).
          timestamp: the timestamp column, or None.
          encodings: column -> ``int`` | ``hex`` | ``string``, overriding the default (``int``
            for integer columns, ``string`` for string columns).

        Raises:
          ValueError: no columns or repeated ones; a path that names no file; a file that is
            not Parquet (names it); a column that a file lacks (names the file, the column and
            the columns it has); a column whose type cannot hold keys, or that changes between
            integers and strings or lists and values from one file to the next; an unknown
            encoding or an encoding given for a column not read.
        """
        import pyarrow.dataset as ds

        columns = check_column_names(columns)
        encodings = dict(encodings or {})
        for name, enc in encodings.items():
            if name not in columns:
                raise ValueError(f"Argument `encodings` names {name!r}, not a sparse column "
                                 f"({', '.join(columns)}).")
            if enc not in text_kernels.ENCODINGS:
                raise ValueError(f"Invalid encoding for column {name!r}: {enc!r}, use one of "
                                 f"{', '.join(text_kernels.ENCODINGS)}.")
        self.paths, self.files = resolve_paths(paths)
        self.columns = columns
        self.timestamp = timestamp
        plan = key_columns_plan(columns, timestamp)
        self._read = list(plan.names)
        self.kinds: dict[str, tuple[str, bool]] = {}
        first: dict[str, tuple[str, bool]] = {}   # column -> (default encoding, multi-hot)
        self._fragments = []
        for path in self.files:
            try:
                fragment = next(iter(ds.dataset(path, format="parquet").get_fragments()))
                schema = fragment.physical_schema
            except (pa.ArrowException, OSError, StopIteration) as err:
                raise ValueError(f"{path}: cannot read as Parquet: {err}") from None
            job_readers.check_columns(schema.names, plan, path)
            for name in columns:
                t = schema.field(name).type
                kind = column_kind(t)
                if kind[0] is None:
                    raise ValueError(f"{path}: column {name!r} has type {t}; a sparse column "
                                     f"must hold integers or strings, or lists of them.")
                if first.setdefault(name, kind) != kind:
                    raise ValueError(f"{path}: column {name!r} has type {t}; earlier files "
                                     f"hold {_describe(first[name])}.")
                self.kinds[name] = (encodings.get(name, kind[0]), kind[1])
            if timestamp is not None:
                t = schema.field(timestamp).type
                if not (pa.types.is_integer(t) or pa.types.is_timestamp(t)):
                    raise ValueError(f"{path}: column {timestamp!r}: a timestamp column must "
                                     f"hold integers or timestamps; this one has type {t}.")
            self._fragments.append((path, fragment))

    def batches(self):
        """Yields a :class:`Batch` per non-empty record batch, file by file in order.

        Raises:
          ValueError: a file that cannot be read, or a column whose values its encoding cannot
            read (names the file and the column).
        """
        for path, fragment in self._fragments:
            try:
                for batch in fragment.to_batches(columns=self._read,
                                                 batch_size=job_readers.READ_ROWS):
                    if batch.num_rows:
                        yield self._convert(path, batch)
            except (pa.ArrowException, OSError) as err:
                raise ValueError(f"{path}: cannot read as Parquet: {err}") from None

    def _convert(self, path: str, batch: pa.RecordBatch) -> Batch:
        return to_batch(path, batch, self.columns, self.kinds, self.timestamp)


def to_batch(path: str, batch: pa.RecordBatch, columns, kinds: dict,
             timestamp: str | None) -> Batch:
    """The :class:`Batch` of one Arrow record batch of ``path``: each of ``columns`` read with
    its ``kinds[name]`` (encoding, multi_hot), row times from ``timestamp``.

    Raises:
      ValueError: values a column's encoding cannot read (names the file and the column).
    """
    times = None
    if timestamp is not None:
        try:
            times = timestamp_values(batch.column(timestamp))
        except ValueError as err:
            raise ValueError(f"{path}: column {timestamp!r}: {err}.") from None
    out = {}
    for name in columns:
        encoding, multi = kinds[name]
        try:
            out[name] = column_keys(batch.column(name), encoding, multi, times)
        except (TypeError, ValueError, pa.ArrowException) as err:
            raise ValueError(f"{path}: column {name!r} (encoding {encoding}): {err}") \
                from None
    return Batch(path, batch.num_rows, times, out)


def open_parquet(paths, columns, timestamp: str | None = None,
                 encodings: dict | None = None) -> ParquetSource:
    """Opens and checks Parquet files for streaming; see :class:`ParquetSource`.

    Raises:
      ValueError: as :class:`ParquetSource`.
    """
    return ParquetSource(paths, columns, timestamp, encodings)


class CsvSource:
    """Checked CSV or Criteo TSV files whose sparse columns are streamed by :meth:`batches`
    (the same batches as :class:`ParquetSource`).

    Criteo TSV (``criteo=True``): no header, tab-separated, columns ``label, I1..I13,
    C1..C26``; the ``C`` columns hold hex keys (encoding ``hex`` by default). Plain CSV: a
    header row names the columns, ``delimiter`` separates them; columns are read as int64
    keys unless ``encodings`` says ``hex`` or ``string``. An empty field is missing.

    Attributes: ``paths``, ``files``, ``columns``, ``timestamp``, ``kinds`` (column ->
    (encoding, multi_hot=False)), as :class:`ParquetSource`.
    """

    def __init__(self, paths, columns, timestamp: str | None = None,
                 encodings: dict | None = None, *, criteo: bool = False,
                 delimiter: str = ","):
        """Opens every file and checks its columns.

        Raises:
          ValueError: no columns or repeated ones; a path that names no file; a file that
            cannot be parsed or lacks a column (names the file, the column and the columns it
            has); an unknown encoding.
        """
        import pyarrow.csv as pcsv

        columns = check_column_names(columns)
        encodings = dict(encodings or {})
        for name, enc in encodings.items():
            if enc not in text_kernels.ENCODINGS:
                raise ValueError(f"Invalid encoding for column {name!r}: {enc!r}, use one of "
                                 f"{', '.join(text_kernels.ENCODINGS)}.")
        default = "hex" if criteo else "int"
        self.kinds = {c: (encodings.get(c, default if c.startswith("C") or not criteo
                                        else "int"), False) for c in columns}
        self.paths, self.files = resolve_paths(paths)
        self.columns = columns
        self.timestamp = timestamp
        self._format = "criteo_tsv" if criteo else "csv"
        if criteo:
            read = pcsv.ReadOptions(column_names=list(job_readers.CRITEO_COLUMNS),
                                    block_size=job_readers.CSV_BLOCK_BYTES)
            parse = pcsv.ParseOptions(delimiter="\t", quote_char=False)
        else:
            read = pcsv.ReadOptions(block_size=job_readers.CSV_BLOCK_BYTES)
            parse = pcsv.ParseOptions(delimiter=delimiter)
        types = {c: (pa.int64() if enc == "int" else pa.string())
                 for c, (enc, _) in self.kinds.items()}
        if timestamp is not None:
            types[timestamp] = pa.int64()
        wanted = columns + ([timestamp] if timestamp is not None else [])
        for path in self.files:
            try:
                names = pcsv.open_csv(path, read_options=read, parse_options=parse,
                                      convert_options=pcsv.ConvertOptions(
                                          column_types=types)).schema.names
            except (pa.ArrowException, OSError) as err:
                raise ValueError(f"{path}: cannot read as {self._format}: {err}") from None
            missing = [c for c in wanted if c not in names]
            if missing:
                raise ValueError(f"{path}: no column {missing[0]!r}; its columns: "
                                 f"{', '.join(names)}")
        self._options = (read, parse, pcsv.ConvertOptions(column_types=types,
                                                          include_columns=wanted))

    def batches(self):
        """Yields a :class:`Batch` per non-empty block, file by file in order.

        Raises:
          ValueError: a file that cannot be parsed, or values a column's encoding cannot
            read (names the file and the column).
        """
        import pyarrow.csv as pcsv

        read, parse, convert = self._options
        for path in self.files:
            try:
                reader = pcsv.open_csv(path, read_options=read, parse_options=parse,
                                       convert_options=convert)
                for batch in reader:
                    if batch.num_rows:
                        yield to_batch(path, batch, self.columns, self.kinds,
                                       self.timestamp)
            except (pa.ArrowException, OSError) as err:
                raise ValueError(f"{path}: cannot read as {self._format}: {err}") from None


class TfRecordSource:
    """TFRecord files of ``tf.train.Example`` whose sparse columns are streamed by
    :meth:`batches` (the same batches as :class:`ParquetSource`).

    Every feature of an Example is a list, so every column is read as multi-hot: an Example
    without the feature, or with an empty list, is an empty row. ``int64_list`` features are
    int keys; ``bytes_list`` ones are hashed (``string``) or parsed as hex (``hex``).
    Compression follows the file name (``.gz``, ``.zlib``), as for training jobs.
    """

    def __init__(self, paths, columns, timestamp: str | None = None,
                 encodings: dict | None = None):
        """Reads the first records of every file to check the columns.

        Raises:
          ValueError: no columns or repeated ones; a path that names no file; a file that is
            not TFRecord of ``tf.train.Example``; a column no record of a file has (names the
            file and the columns it has); a float column; an encoding its kind cannot read.
        """
        columns = check_column_names(columns)
        self.paths, self.files = resolve_paths(paths)
        self.columns = columns
        self.timestamp = timestamp
        plan = key_columns_plan(columns, timestamp)
        stored = job_readers.tfrecord_kinds(self.files, plan)
        encodings = dict(encodings or {})
        self.kinds = {}
        for name in columns:
            kind = stored.get(name, "int64_list")
            if kind == "float_list":
                raise ValueError(f"TFRecord column {name!r} is stored as floats; a sparse "
                                 f"column must hold int64 or bytes lists.")
            encoding = encodings.get(name, "int" if kind == "int64_list" else "string")
            if (encoding == "int") != (kind == "int64_list"):
                raise ValueError(f"TFRecord column {name!r} is stored as {kind}; encoding "
                                 f"{encoding} cannot read it.")
            self.kinds[name] = (encoding, True)

    def batches(self):
        """Yields a :class:`Batch` per block of up to ``READ_ROWS`` records, file by file.

        Raises:
          ValueError: a record that cannot be parsed (names the file).
        """
        import tensorflow as tf

        spec = {name: tf.io.VarLenFeature(tf.int64 if enc == "int" else tf.string)
                for name, (enc, _) in self.kinds.items()}
        if self.timestamp is not None:
            spec[self.timestamp] = tf.io.FixedLenFeature([], tf.int64, default_value=0)
        for path in self.files:
            ds = tf.data.TFRecordDataset(path, compression_type=job_readers._compression(path))
            try:
                for records in ds.batch(job_readers.READ_ROWS):
                    parsed = tf.io.parse_example(records, spec)
                    n = int(records.shape[0])
                    arrays = {}
                    for name in self.columns:
                        sp = parsed[name]
                        lengths = np.bincount(sp.indices[:, 0].numpy(), minlength=n)
                        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
                        values = sp.values.numpy()
                        arrays[name] = pa.ListArray.from_arrays(
                            pa.array(offsets), pa.array(values.tolist() if values.dtype == object
                                                        else values))
                    if self.timestamp is not None:
                        arrays[self.timestamp] = pa.array(parsed[self.timestamp].numpy())
                    yield to_batch(path, pa.RecordBatch.from_pydict(arrays), self.columns,
                                   self.kinds, self.timestamp)
            except tf.errors.OpError as err:
                raise ValueError(f"{path}: cannot read as TFRecord of tf.train.Example: "
                                 f"{err.message}") from None


def open_source(paths, columns, timestamp: str | None = None, encodings: dict | None = None,
                fmt: str = "parquet", delimiter: str = ","):
    """Opens Parquet (``fmt="parquet"``), CSV (``"csv"``), Criteo TSV (``"criteo_tsv"``) or
    TFRecord (``"tfrecord"``) files for streaming (:class:`ParquetSource`,
    :class:`CsvSource`, :class:`TfRecordSource`).

    Raises:
      ValueError: an unknown ``fmt``, and the errors of the sources.
    """
    if fmt == "parquet":
        return ParquetSource(paths, columns, timestamp, encodings)
    if fmt in ("csv", "criteo_tsv"):
        return CsvSource(paths, columns, timestamp, encodings, criteo=fmt == "criteo_tsv",
                         delimiter=delimiter)
    if fmt == "tfrecord":
        return TfRecordSource(paths, columns, timestamp, encodings)
    raise ValueError(f"Argument `fmt` must be one of 'parquet', 'csv', 'criteo_tsv', "
                     f"'tfrecord'. Received: {fmt!r}")
