"""The feature-statistics document: its versioned JSON schema and a Markdown summary.

Document (``version`` 1)::

    {"schema": "sparseflow.feature_stats", "version": 1,
     "source": {"format", "mode", "paths", "files", "rows", "timestamp"},
     "features": {name: feature, ...}}

Each feature (see :func:`feature_section`)::

    encoding, multi_hot                       how the column was read
    rows, null_rows, empty_rows               rows read; null (or empty-string) rows; multi-hot
                                              rows with no keys
    null_or_empty_share                       (null_rows + empty_rows) / rows
    total_keys, distinct_keys                 key occurrences (multi-hot aware); distinct keys
    singleton_keys, singleton_share           keys seen once; their share of distinct keys
    histogram   [{min_count: 2^i, max_count: 2^(i+1) - 1, keys, traffic}]
                                              per log2 bucket of per-key count, i = 0 up to the
                                              highest non-empty bucket; traffic = occurrences
    top_keys    [{key, count}]                most frequent keys, count desc then key asc
    thresholds  [{threshold: t, keys_kept, traffic_kept_share}] for t = 1..N: keys with
                                              count >= t; their occurrences / total_keys
    eviction    {window, clock, keys_alive}   only with a timestamp column and a window: keys
                                              with clock - last_seen < window
    memory      {dim, optimizer, slots, bytes_at_threshold: {"t": keys_kept(t) * dim *
                                              (1 + slots) * 4}}

Shares are 0.0 when their denominator is 0. Keys of ``bytes_at_threshold`` are strings (JSON
object keys), so a document round-trips through ``json.dumps`` / ``json.loads`` unchanged.
"""

from __future__ import annotations

import numpy as np

SCHEMA = "sparseflow.feature_stats"
VERSION = 1
BYTES_PER_VALUE = 4   # float32 weights and slots
OPTIMIZER_SLOTS = {"sgd": 0, "adagrad": 1, "adam": 2, "ftrl": 2}


def optimizer_slots(optimizer: str) -> int:
    """Per-row slots (values stored besides the weights) of ``optimizer``.

    Args:
      optimizer: ``sgd`` | ``adagrad`` | ``adam`` | ``ftrl``.

    Returns:
      0, 1, 2 or 2.

    Raises:
      ValueError: an unknown optimizer.
    """
    if optimizer not in OPTIMIZER_SLOTS:
        raise ValueError(f"Invalid `optimizer`: {optimizer!r}, use one of "
                         f"{', '.join(OPTIMIZER_SLOTS)}.")
    return OPTIMIZER_SLOTS[optimizer]


def _share(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


def feature_section(*, encoding: str, multi_hot: bool, rows: int, null_rows: int,
                    empty_rows: int, total_keys: int, distinct_keys: int, bucket_keys,
                    bucket_traffic, top_keys, top_counts, kept_keys, kept_traffic,
                    eviction: dict | None, dim: int, optimizer: str) -> dict:
    """One feature's entry of the document (plain Python ints, floats, lists and dicts).

    Args:
      encoding: how keys were read (``int``, ``string``, ``hex``).
      multi_hot: whether the column holds lists.
      rows, null_rows, empty_rows, total_keys, distinct_keys: the counts (ints).
      bucket_keys, bucket_traffic: int arrays [64], keys and occurrences per log2 bucket.
      top_keys, top_counts: int arrays [k], already in order (count desc, key asc).
      kept_keys, kept_traffic: int arrays [N + 1], keys with count >= t and their occurrences
        at index t (index 0 ignored).
      eviction: ``{"window", "clock", "keys_alive"}`` or None (left out of the entry).
      dim: embedding dimension, >= 1.
      optimizer: see :func:`optimizer_slots`.

    Returns:
      The feature dict described in the module docstring.

    Raises:
      ValueError: an unknown optimizer, ``dim`` < 1.
    """
    if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool) or dim < 1:
        raise ValueError(f"Argument `dim` must be an int >= 1. Received: {dim!r}")
    slots = optimizer_slots(optimizer)
    bucket_keys = np.asarray(bucket_keys)
    nonempty = np.flatnonzero(bucket_keys)
    top = int(nonempty[-1]) + 1 if nonempty.size else 0
    histogram = [{"min_count": 2**i, "max_count": 2**(i + 1) - 1, "keys": int(bucket_keys[i]),
                  "traffic": int(bucket_traffic[i])} for i in range(top)]
    singletons = int(bucket_keys[0]) if bucket_keys.size else 0
    n_thresholds = len(kept_keys) - 1
    thresholds = [{"threshold": t, "keys_kept": int(kept_keys[t]),
                   "traffic_kept_share": _share(int(kept_traffic[t]), total_keys)}
                  for t in range(1, n_thresholds + 1)]
    row_bytes = int(dim) * (1 + slots) * BYTES_PER_VALUE
    section = {
        "encoding": encoding,
        "multi_hot": bool(multi_hot),
        "rows": int(rows),
        "null_rows": int(null_rows),
        "empty_rows": int(empty_rows),
        "null_or_empty_share": _share(int(null_rows) + int(empty_rows), int(rows)),
        "total_keys": int(total_keys),
        "distinct_keys": int(distinct_keys),
        "singleton_keys": singletons,
        "singleton_share": _share(singletons, int(distinct_keys)),
        "histogram": histogram,
        "top_keys": [{"key": int(k), "count": int(c)} for k, c in zip(top_keys, top_counts)],
        "thresholds": thresholds,
    }
    if eviction is not None:
        section["eviction"] = {k: int(eviction[k]) for k in ("window", "clock", "keys_alive")}
    section["memory"] = {
        "dim": int(dim), "optimizer": optimizer, "slots": slots,
        "bytes_at_threshold": {str(t): int(kept_keys[t]) * row_bytes
                               for t in range(1, n_thresholds + 1)},
    }
    return section


def build_document(source: dict, features: dict) -> dict:
    """The whole document: schema, version, ``source`` and ``features`` (in the given order).

    Args:
      source: what was read (see the module docstring); copied.
      features: name -> :func:`feature_section` dict.

    Returns:
      ``{"schema", "version", "source", "features"}``.
    """
    return {"schema": SCHEMA, "version": VERSION, "source": dict(source),
            "features": dict(features)}


def check_document(doc) -> None:
    """Raises ValueError unless ``doc`` is a feature-stats document of a version this code
    reads (``schema`` and ``version`` keys, ``features`` a dict)."""
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ValueError(f"Not a {SCHEMA} document: its `schema` is "
                         f"{doc.get('schema') if isinstance(doc, dict) else type(doc).__name__!r}.")
    if doc.get("version") != VERSION:
        raise ValueError(f"{SCHEMA} version {doc.get('version')!r} is not supported; this "
                         f"code reads version {VERSION}.")
    if not isinstance(doc.get("features"), dict):
        raise ValueError(f"{SCHEMA} document has no `features` object.")


def _num(x) -> str:
    return f"{x:,}" if isinstance(x, int) else f"{x:.4f}"


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def render_markdown(doc: dict) -> str:
    """A Markdown summary of a document: the source, then per feature a table of the main
    numbers, its admission thresholds with memory, and its top keys.

    Args:
      doc: a document from :func:`build_document` (or loaded from its JSON).

    Returns:
      The Markdown text (ends with a newline).

    Raises:
      ValueError: ``doc`` is not a document of this schema and version.
    """
    check_document(doc)
    src = doc.get("source", {})
    lines = ["# Feature statistics", ""]
    files = src.get("files", [])
    lines.append(f"{len(files)} {src.get('format', '')} file{'s' if len(files) != 1 else ''}, "
                 f"{_num(src.get('rows', 0))} rows, {src.get('mode', 'exact')} counting"
                 + (f", timestamp column `{src['timestamp']}`" if src.get("timestamp") else "")
                 + ".")
    for name, f in doc["features"].items():
        lines += ["", f"## `{name}`", ""]
        lines += ["| metric | value |", "|---|---:|"]
        rows = [("encoding", f"{f['encoding']}{' (multi-hot)' if f['multi_hot'] else ''}"),
                ("rows", _num(f["rows"])), ("null rows", _num(f["null_rows"])),
                ("empty rows", _num(f["empty_rows"])),
                ("null or empty share", _num(f["null_or_empty_share"])),
                ("total keys", _num(f["total_keys"])),
                ("distinct keys", _num(f["distinct_keys"])),
                ("keys seen once", _num(f["singleton_keys"])),
                ("share of keys seen once", _num(f["singleton_share"]))]
        if "eviction" in f:
            e = f["eviction"]
            rows.append((f"keys alive (window {e['window']}, clock {e['clock']})",
                         _num(e["keys_alive"])))
        lines += [f"| {k} | {v} |" for k, v in rows]
        mem = f["memory"]
        lines += ["", (f"Admission thresholds (memory at dim {mem['dim']}, {mem['optimizer']}: "
                       f"{mem['slots']} slot{'s' if mem['slots'] != 1 else ''}):"), "",
                  "| threshold | keys kept | traffic kept | table memory |",
                  "|---:|---:|---:|---:|"]
        for t in f["thresholds"]:
            lines.append(f"| {t['threshold']} | {_num(t['keys_kept'])} | "
                         f"{t['traffic_kept_share']:.2%} | "
                         f"{_bytes(mem['bytes_at_threshold'][str(t['threshold'])])} |")
        if f["top_keys"]:
            lines += ["", "| top key | count |", "|---:|---:|"]
            lines += [f"| {k['key']} | {_num(k['count'])} |" for k in f["top_keys"]]
    return "\n".join(lines) + "\n"


def format_bytes(n) -> str:
    """``n`` bytes for people: ``512 B``, ``1.5 KiB``, ``3.2 GiB`` (binary units)."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
