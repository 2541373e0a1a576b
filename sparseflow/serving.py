"""Exporting trained tables for serving: Rec SDK's ``export`` files and a TF2 SavedModel.

``export`` writes, per table, Rec SDK's ``key-emb.npy`` (a pickled ``{key: embedding}`` dict)
plus two plain arrays, ``keys.npy`` and ``embeddings.npy``, that load fast and without pickle.
``export_saved_model`` writes a SavedModel that plain TensorFlow serves with no sparseflow
installed: per table, a ``tf.lookup.StaticHashTable`` maps keys to rows of an embedding variable
whose last row is the serving default.

Both read the tables as they are now: call them after training, not while batches are in flight.
A device table (``rows_on="device"``) is read through a session: pass ``sess=``, or call them
inside ``with tf.compat.v1.Session() as sess:`` (the default session), or after a
``sparseflow.Saver`` saved or restored with a session that is still open.
"""

from __future__ import annotations

import concurrent.futures
import numbers
import os
import shutil
import tempfile
from typing import Any

import numpy as np
import tensorflow as tf

from sparseflow import runtime as _runtime
from sparseflow.table import SparseTable
from sparseflow.validation import check_float, fail

KEY_EMB_FILE = "key-emb.npy"
KEYS_FILE = "keys.npy"
EMBEDDINGS_FILE = "embeddings.npy"
_EXPORT_FILES = frozenset({KEY_EMB_FILE, KEYS_FILE, EMBEDDINGS_FILE})
_SAVED_MODEL_FILE = "saved_model.pb"
# The vocabulary asset: one decimal key per line; a key's line number is its embedding row.
_VOCAB_PREFIX = "vocab_"


def export(table_list=None, path=None, sess=None) -> dict[str, str]:
    """Writes each table's keys and embeddings to files (Rec SDK ``export``).

    For each table, ``<path>/<table_name>/`` receives:

    - ``key-emb.npy``: Rec SDK's format, ``np.save`` of a dict ``{int key: float32 [dim]}``;
      read it with ``np.load(file, allow_pickle=True).item()``.
    - ``keys.npy``: the keys, ``[n]`` int64 (int32 for an int32 table), sorted.
    - ``embeddings.npy``: float32 ``[n, dim]``, row ``i`` belonging to ``keys[i]``.

    A table's directory is written under a temporary name and renamed into place, so readers
    never see a half-written table; an earlier export of the table is replaced.

    Args:
      table_list: None (every table) or a list of tables and/or table names.
      path: directory (str or path-like) to write into, created if missing; default
        ``os.getcwd()/export``.
      sess: the session to read device tables (``rows_on="device"``) through; default: the
        default session, else the one a ``sparseflow.Saver`` last saved or restored with.
        Host tables need none.

    Returns:
      dict mapping each exported table's name to its directory.

    Raises:
      NotInitializedError: ``sparseflow.init()`` is not active.
      RuntimeError: a device table and no open session to read it through.
      TypeError: ``path`` or an entry of ``table_list`` has the wrong type.
      ValueError: ``table_list`` names an unknown table or is empty, no table exists, or a
        table's directory exists and holds files that ``export`` did not write.
    """
    rt = _runtime.current("export")
    tables = _select_tables(rt, table_list)
    path = os.path.join(os.getcwd(), "export") if path is None else _check_path("path", path)
    _ensure_dir("path", path)
    targets = {t.table_name: os.path.join(path, t.table_name) for t in tables}
    for name, target in targets.items():  # check all before writing any
        _check_replaceable(target, _is_export_dir, f"table `{name}`", "export()")
    for table in tables:
        keys, embeddings = _snapshot(table, sess)
        tmp = tempfile.mkdtemp(prefix=f".{table.table_name}.tmp-", dir=path)
        try:
            key_emb = {int(k): e for k, e in zip(keys.tolist(), embeddings)}
            np.save(os.path.join(tmp, KEY_EMB_FILE), key_emb, allow_pickle=True)
            np.save(os.path.join(tmp, KEYS_FILE), keys)
            np.save(os.path.join(tmp, EMBEDDINGS_FILE), embeddings)
            _swap_in(tmp, targets[table.table_name])
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return targets


def export_saved_model(path, table_list=None, serving_default_value=None, sess=None) -> str:
    """Writes a TF2 SavedModel that serves the tables' embeddings by key.

    The model needs only TensorFlow::

        model = tf.saved_model.load(path)
        model.signatures["lookup_user_table"](keys=tf.constant([3, 7], tf.int64))
        # {"embeddings": float32 [2, dim]}
        model.lookup_user_table(keys)        # the same, any rank: float32 keys.shape + [dim]
        model.tables.numpy(), model.dims.numpy(), model.key_dtypes.numpy()

    Per table ``<t>``:

    - signature ``"lookup_<t>"``: input ``keys`` of any rank, int64 (int32 for an int32
      table); output ``{"embeddings": float32 keys.shape + [dim]}``.
    - ``model.lookup_<t>(keys)``: a ``tf.function`` taking int64 or int32 keys of any rank and
      returning the embeddings tensor.

    Keys the table does not hold (never admitted, evicted) read ``serving_default_value``.
    The model-level variables ``tables`` (string ``[T]``), ``dims`` (int64 ``[T]``) and
    ``key_dtypes`` (string ``[T]``, "int64" or "int32") describe the tables.

    Layout: the keys of each table are a vocabulary asset (one key per line, so the model proto
    stays small however many keys there are) loaded into a ``tf.lookup.StaticHashTable``
    (int64 key -> row); the rows are a float32 ``tf.Variable`` ``[n + 1, dim]`` whose last row
    is the serving default. The directory is written under a temporary name and renamed into
    place; an earlier SavedModel at ``path`` is replaced.

    Args:
      path: the SavedModel directory (str or path-like). It must not exist, be empty, or hold a
        SavedModel (which is replaced).
      table_list: None (every table) or a list of tables and/or table names.
      serving_default_value: what unknown keys read: None (zeros), a finite number (every
        component), or a finite array-like of shape ``[dim]`` (every exported table must then
        have that dim).
      sess: the session to read device tables (``rows_on="device"``) through; default: the
        default session, else the one a ``sparseflow.Saver`` last saved or restored with.
        Host tables need none.

    Returns:
      ``path``, as a str.

    Raises:
      NotInitializedError: ``sparseflow.init()`` is not active.
      RuntimeError: a device table and no open session to read it through.
      TypeError: ``path``, ``serving_default_value`` or an entry of ``table_list`` has the
        wrong type.
      ValueError: ``table_list`` names an unknown table or is empty, no table exists,
        ``serving_default_value`` has the wrong shape or is not finite, or ``path`` holds
        something other than a SavedModel.
    """
    rt = _runtime.current("export_saved_model")
    path = _check_path("path", path)
    tables = _select_tables(rt, table_list)
    defaults = {t.table_name: _default_row(serving_default_value, t) for t in tables}
    _check_replaceable(path, _is_saved_model_dir, "the SavedModel", "export_saved_model()")
    parent = os.path.dirname(os.path.abspath(path))
    _ensure_dir("path", parent)
    snapshots = [(t.table_name, t.dim, t.key_dtype, *_snapshot(t, sess)) for t in tables]
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(path))}.tmp-",
                           dir=parent)
    try:
        # Build and save eagerly, in a thread of its own: the caller is usually inside a
        # tf.compat.v1 graph, and the graph stack and execution mode are per thread.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(_save_module, tmp, snapshots, defaults).result()
        _swap_in(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


# -- the SavedModel ---------------------------------------------------------------------------

def _save_module(export_dir: str, snapshots: list, defaults: dict) -> None:
    from tensorflow.python.eager import context  # eager even if the process disabled it

    with context.eager_mode():
        vocab_dir = tempfile.mkdtemp(prefix="sparseflow-vocab-")
        try:
            module, signatures = _build_module(snapshots, defaults, vocab_dir)
            tf.saved_model.save(module, export_dir, signatures=signatures)
        finally:
            shutil.rmtree(vocab_dir, ignore_errors=True)


def _build_module(snapshots: list, defaults: dict, vocab_dir: str):
    """The tf.Module to save and its signatures, from ``(name, dim, key_dtype, keys, emb)``."""
    module = tf.Module(name="sparseflow_serving")
    module.tables = tf.Variable([s[0] for s in snapshots], trainable=False, dtype=tf.string)
    module.dims = tf.Variable([s[1] for s in snapshots], trainable=False, dtype=tf.int64)
    module.key_dtypes = tf.Variable([s[2].name for s in snapshots], trainable=False,
                                    dtype=tf.string)
    module.key_index = {}
    module.embeddings = {}
    signatures = {}
    for i, (name, dim, key_dtype, keys, embeddings) in enumerate(snapshots):
        module.key_index[name] = _key_index(keys, os.path.join(vocab_dir, f"{_VOCAB_PREFIX}{i}"))
        rows = np.concatenate([embeddings, defaults[name][None, :]], axis=0)
        module.embeddings[name] = tf.Variable(rows, trainable=False, name=f"embeddings_{i}")
        lookup = _lookup_function(module.key_index[name], module.embeddings[name], dim)
        for dtype in (tf.int64, tf.int32):   # the concrete functions the saved model keeps
            lookup.get_concrete_function(tf.TensorSpec(None, dtype))
        setattr(module, f"lookup_{name}", lookup)
        signatures[f"lookup_{name}"] = _signature(lookup, key_dtype)
    return module, signatures


def _key_index(keys: np.ndarray, vocab_file: str) -> tf.lookup.StaticHashTable:
    """int64 key -> int64 row (its position in ``keys``); unknown keys -> ``len(keys)``."""
    n = keys.shape[0]
    if n == 0:
        # A static table cannot be empty. Every key must read row 0 (the default row), so map
        # one arbitrary key to 0 as well.
        init = tf.lookup.KeyValueTensorInitializer(tf.zeros([1], tf.int64),
                                                   tf.zeros([1], tf.int64))
    else:
        with open(vocab_file, "w") as f:
            f.write("\n".join(map(str, keys.astype(np.int64).tolist())))
            f.write("\n")
        init = tf.lookup.TextFileInitializer(
            vocab_file, key_dtype=tf.int64, key_index=tf.lookup.TextFileIndex.WHOLE_LINE,
            value_dtype=tf.int64, value_index=tf.lookup.TextFileIndex.LINE_NUMBER, vocab_size=n)
    return tf.lookup.StaticHashTable(init, default_value=n)


def _lookup_function(index: tf.lookup.StaticHashTable, embeddings: tf.Variable, dim: int):
    @tf.function
    def lookup(keys):
        flat = tf.reshape(tf.cast(keys, tf.int64), [-1])
        rows = tf.gather(embeddings, index.lookup(flat))
        return tf.reshape(rows, tf.concat([tf.shape(keys, out_type=tf.int64), [dim]], 0))
    return lookup


def _signature(lookup, key_dtype: tf.DType):
    @tf.function(input_signature=[tf.TensorSpec(None, key_dtype, name="keys")])
    def signature(keys):
        return {"embeddings": lookup(keys)}
    return signature


def _default_row(value: Any, table: SparseTable) -> np.ndarray:
    """``serving_default_value`` as float32 ``[dim]`` for ``table``."""
    dim = table.dim
    if value is None:
        return np.zeros(dim, np.float32)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return np.full(dim, check_float("serving_default_value", value), np.float32)
    allowed = (f"None, a finite number or a finite array of shape [{dim}] "
               f"(the dim of table `{table.table_name}`)")
    try:
        row = np.asarray(value, dtype=np.float32)
    except (TypeError, ValueError, NotImplementedError):  # the last: a graph tensor
        fail("serving_default_value", allowed, value, TypeError)
    if row.shape != (dim,) or not np.all(np.isfinite(row)):
        fail("serving_default_value", allowed, value)
    return row.copy()


# -- shared checks and file handling ---------------------------------------------------------

def _snapshot(table: SparseTable, sess=None) -> tuple[np.ndarray, np.ndarray]:
    """``table.export(sess)``; for a table without keys, empty arrays without touching its
    rows (before ``start_asc_pipeline()`` the row layout is not fixed yet)."""
    if table.size() == 0:
        return (np.zeros(0, table.key_dtype.as_numpy_dtype),
                np.zeros((0, table.dim), np.float32))
    return table.export(sess) if table.rows_on == "device" else table.export()


def _select_tables(rt, table_list) -> list[SparseTable]:
    """The tables ``table_list`` names, in its order without repeats; all when None."""
    if table_list is None:
        tables = list(rt.tables.values())
        if not tables:
            raise ValueError("There are no tables to export: create them with "
                             "sparseflow.create_table() (and train) first.")
        return tables
    if isinstance(table_list, (str, SparseTable)):
        table_list = [table_list]
    allowed = ("None or a non-empty list of tables or names of existing tables (one of "
               + ", ".join(repr(n) for n in rt.tables) + ")")
    if not isinstance(table_list, (list, tuple)):
        fail("table_list", allowed, table_list, TypeError)
    if not table_list:
        fail("table_list", allowed, table_list)
    tables = []
    for entry in table_list:
        if isinstance(entry, SparseTable):
            if rt.tables.get(entry.table_name) is not entry:  # from an earlier init()
                fail("table_list", allowed + "; this table is not from the current "
                     "sparseflow.init()", entry)
            table = entry
        elif isinstance(entry, str):
            table = rt.tables.get(entry)
            if table is None:
                fail("table_list", allowed, entry)
        else:
            fail("table_list", allowed, entry, TypeError)
        if table not in tables:
            tables.append(table)
    return tables


def _check_path(argument: str, path: Any) -> str:
    allowed = "a non-empty str or path-like directory path"
    if not isinstance(path, (str, os.PathLike)):
        fail(argument, allowed, path, TypeError)
    text = os.fspath(path)
    if not isinstance(text, str):   # a bytes path-like
        fail(argument, allowed, path, TypeError)
    if not text:
        fail(argument, allowed, path)
    return text


def _ensure_dir(argument: str, path: str) -> None:
    if os.path.exists(path) and not os.path.isdir(path):
        fail(argument, "a directory path, not a file", path)
    os.makedirs(path, exist_ok=True)


def _is_export_dir(entries: set) -> bool:
    return entries <= _EXPORT_FILES


def _is_saved_model_dir(entries: set) -> bool:
    return not entries or _SAVED_MODEL_FILE in entries


def _check_replaceable(target: str, ours, what: str, api: str) -> None:
    """Raises unless ``target`` is missing or holds only what ``api`` writes."""
    if not os.path.lexists(target):
        return
    if os.path.isdir(target) and not os.path.islink(target) and ours(set(os.listdir(target))):
        return
    raise ValueError(f"Cannot write {what} to {target!r}: it exists and holds files that "
                     f"{api} did not write. Remove it or choose another `path`.")


def _swap_in(tmp: str, target: str) -> None:
    """Renames the finished directory ``tmp`` to ``target``, replacing an earlier one."""
    if not os.path.lexists(target):
        os.rename(tmp, target)
        return
    old = tmp + ".old"
    os.rename(target, old)
    try:
        os.rename(tmp, target)
    except BaseException:
        os.rename(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)
