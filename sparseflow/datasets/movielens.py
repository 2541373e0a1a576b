"""MovieLens-100K, read out of the ``recbole`` 1.2.1 wheel that PyPI serves.

The ratings may not be redistributed, so nothing is stored in the repository: the wheel (about
2 MB) is downloaded once into a cache directory outside it (``pip download --no-deps``) and the
tab-separated atomic files ``recbole/dataset_example/ml-100k/ml-100k.{inter,user,item}`` are
read out of the zip.
"""

from __future__ import annotations

import functools
import io
import os
import subprocess
import sys
import zipfile

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

WHEEL = "recbole-1.2.1-py3-none-any.whl"
REQUIREMENT = "recbole==1.2.1"
_MEMBER = "recbole/dataset_example/ml-100k/ml-100k.{}"


def wheel_path(cache_dir: str = "~/.cache/sparseflow") -> str:
    """The cached wheel's path, downloading it first when it is missing.

    Raises:
      RuntimeError: pip could not download it (the message gives the command to run by hand).
    """
    cache_dir = os.path.abspath(os.path.expanduser(str(cache_dir)))
    path = os.path.join(cache_dir, WHEEL)
    if os.path.isfile(path):
        return path
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", REQUIREMENT, "-d", cache_dir]
    try:
        os.makedirs(cache_dir, exist_ok=True)
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        detail = (done.stderr or done.stdout).strip().splitlines()[-3:]
    except OSError as err:
        done, detail = None, [str(err)]
    if done is None or done.returncode != 0 or not os.path.isfile(path):
        raise RuntimeError(
            f"Could not download MovieLens-100K (the {REQUIREMENT} wheel) into {cache_dir!r}: "
            f"{' '.join(detail) or 'no output'}. Run by hand: "
            f"{sys.executable} -m pip download --no-deps {REQUIREMENT} -d {cache_dir}")
    return path


def _read(zf: zipfile.ZipFile, kind: str) -> pa.Table:
    """One atomic file; ``name:type`` headers become ``name``; every column read as a string."""
    raw = zf.read(_MEMBER.format(kind))
    header = raw[:raw.index(b"\n")].decode().split("\t")
    names = [h.split(":")[0] for h in header]
    return pcsv.read_csv(
        io.BytesIO(raw),
        read_options=pcsv.ReadOptions(column_names=names, skip_rows=1),
        parse_options=pcsv.ParseOptions(delimiter="\t", quote_char=False),
        convert_options=pcsv.ConvertOptions(column_types={n: pa.string() for n in names},
                                            strings_can_be_null=True))


def _join(keys: pa.Array, table: pa.Table, key: str, what: str) -> pa.Table:
    idx = pc.index_in(keys, value_set=table.column(key))
    if idx.null_count:
        raise RuntimeError(f"MovieLens-100K: {idx.null_count} ratings name an unknown {what}.")
    return table.take(idx)


def _integers(strings) -> pa.ChunkedArray:
    """int64, null where the string is not all digits (the item file has 'unkonwn' and 'V')."""
    digits = pc.match_substring_regex(strings, r"^[0-9]+$")
    return pc.cast(pc.if_else(digits, strings, pa.scalar(None, pa.string())), pa.int64())


def load_movielens_100k(cache_dir: str = "~/.cache/sparseflow") -> pa.Table:
    """MovieLens-100K ratings joined with user and item features, in the file's row order.

    Args:
      cache_dir: where the recbole wheel is cached (``~`` expanded); downloaded when missing.

    Returns:
      A table of 100 000 rows with columns ``label`` (float32, 1.0 where rating >= 4),
      ``user_id``, ``item_id`` (strings), ``age`` (int64), ``gender``, ``occupation``,
      ``zip_code`` (strings), ``release_year`` (int64, null for the two items without a year),
      ``genres`` (list of strings), ``timestamp`` (int64 seconds) and ``rating`` (float32).

    Raises:
      RuntimeError: the wheel cannot be downloaded or read.
    """
    return _load(wheel_path(cache_dir))


@functools.lru_cache(maxsize=1)
def _load(path: str) -> pa.Table:
    try:
        with zipfile.ZipFile(path) as zf:
            inter, user, item = (_read(zf, kind) for kind in ("inter", "user", "item"))
    except (zipfile.BadZipFile, KeyError, pa.ArrowException) as err:
        raise RuntimeError(f"{path}: not a recbole 1.2.1 wheel with MovieLens-100K ({err}); "
                           f"delete it to download it again.") from None
    users = _join(inter.column("user_id"), user, "user_id", "user")
    items = _join(inter.column("item_id"), item, "item_id", "item")
    rating = pc.cast(inter.column("rating"), pa.float32())
    timestamp = pc.cast(pc.cast(inter.column("timestamp"), pa.float64()), pa.int64())
    label = pc.cast(pc.greater_equal(rating, pa.scalar(4.0, pa.float32())), pa.float32())
    genres = pc.split_pattern(items.column("class"), " ")
    return pa.table({
        "label": label,
        "user_id": inter.column("user_id"),
        "item_id": inter.column("item_id"),
        "age": pc.cast(users.column("age"), pa.int64()),
        "gender": users.column("gender"),
        "occupation": users.column("occupation"),
        "zip_code": users.column("zip_code"),
        "release_year": _integers(items.column("release_year")),
        "genres": genres,
        "timestamp": timestamp,
        "rating": rating,
    })


def time_split(table: pa.Table, eval_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Row indices of a time-ordered split: the latest ``eval_fraction`` of rows are eval.

    Args:
      table: with an int64 ``timestamp`` column, n rows.
      eval_fraction: in [0, 1).

    Returns:
      ``(train, eval)`` int64 row indices, each sorted by timestamp (ties in row order);
      ``round(n * eval_fraction)`` rows are eval.
    """
    ts = table.column("timestamp").to_numpy()
    order = np.argsort(ts, kind="stable")
    n_eval = int(round(len(order) * float(eval_fraction)))
    return order[:len(order) - n_eval], order[len(order) - n_eval:]
