"""Suggested admission thresholds and vocabulary sizes for a memory budget (``--suggest``).

The rule (:func:`suggest`), for a feature-stats document and a budget of B bytes:

* A table's memory at admission threshold t is ``vocabulary_size(t) x dim x (1 + optimizer
  slots) x 4`` bytes, with ``vocabulary_size(t) = max(1, ceil(keys_kept(t) x headroom))``
  (``keys_kept(t)``: keys seen at least t times; dim and slots from the document's
  ``memory`` entry).
* Every table starts at ``access_threshold`` 1 (every key admitted). While the total exceeds
  B, one table moves up to its next threshold that frees memory: the move that loses the
  fewest key occurrences (traffic) per byte freed. Moves that would take a table below
  ``min_traffic_share`` of its own traffic are made only when no other move is left. Ties go
  to the table listed first.
* The moves do not depend on B, so a bigger budget stops earlier in the same sequence and
  never gets a higher threshold; when everything fits at threshold 1, every threshold is 1.
  Thresholds are integers, so the total can end well under B when the last move freed a lot.
* With an ``eviction`` entry (a timestamp column and a window W), ``eviction_threshold`` is W:
  the training job then evicts the keys not seen within W, as the entry counted them. The
  vocabulary is still sized for every key admitted over the data (eviction only lowers it).
* A budget that the tables exceed even at the highest threshold in the document is an error
  (it names the bytes needed there).

:func:`render_yaml_fragment` writes the result as a ``tables:`` block of a job config, with
comments giving each table's memory and traffic kept, and the total.
"""

from __future__ import annotations

import heapq
import math
import re
from fractions import Fraction

import numpy as np
import yaml

from sparseflow.embed.limits import EVICTION_THRESHOLD_MAX, MAX_VOCABULARY_SIZE
from sparseflow.stats import report

_UNITS = {"": 1, "b": 1, "k": 2**10, "kib": 2**10, "kb": 10**3, "m": 2**20, "mib": 2**20,
          "mb": 10**6, "g": 2**30, "gib": 2**30, "gb": 10**9, "t": 2**40, "tib": 2**40,
          "tb": 10**12}


def _is_real(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


def _check_real(name: str, value, low: float, high: float | None = None,
                low_open: bool = False) -> float:
    ok = _is_real(value) and math.isfinite(float(value))
    if ok:
        v = float(value)
        ok = (v > low if low_open else v >= low) and (high is None or v <= high)
    if not ok:
        bound = (f"> {low}" if low_open else f">= {low}") if high is None else f"in [{low}, {high}]"
        raise ValueError(f"Argument `{name}` must be a finite number {bound}. "
                         f"Received: {value!r}")
    return float(value)


def parse_budget(text) -> int:
    """A memory budget from text: a number of bytes with an optional unit.

    ``K``/``KiB``, ``M``/``MiB``, ``G``/``GiB``, ``T``/``TiB`` are powers of 1024; ``KB``,
    ``MB``, ``GB``, ``TB`` powers of 1000 (case-insensitive; ``1.5GiB``, ``512M``, ``1e9``).

    Returns:
      The bytes, an int >= 1 (rounded down).

    Raises:
      ValueError: not a positive number of bytes (the message names ``memory_budget``).
    """
    if _is_real(text):
        value = _check_real("memory_budget", text, 0.0, low_open=True)
        if value < 1:
            raise ValueError(f"Argument `memory_budget` must be at least 1 byte. "
                             f"Received: {text!r}")
        return int(value)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(f"Argument `memory_budget` must be a number of bytes with an optional "
                         f"unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB; K, M, G, T = KiB, ...), "
                         f"e.g. 8GiB. Received: {text!r}")
    value = float(m.group(1)) * _UNITS[unit]
    if not math.isfinite(value) or value < 1:
        raise ValueError(f"Argument `memory_budget` must be at least 1 byte. "
                         f"Received: {text!r}")
    return int(value)


def _vocabulary(keys: int, headroom: Fraction) -> int:
    return max(1, math.ceil(keys * headroom))


class _Table:
    """One feature's options: thresholds, vocabulary sizes, bytes and kept traffic."""

    def __init__(self, name: str, f: dict, headroom: Fraction):
        self.name = name
        mem = f["memory"]
        self.dim = int(mem["dim"])
        self.optimizer = mem.get("optimizer")
        self.slots = int(mem["slots"])
        self.row_bytes = self.dim * (1 + self.slots) * report.BYTES_PER_VALUE
        rows = sorted(f["thresholds"], key=lambda r: r["threshold"])
        if not rows:
            raise ValueError(f"Feature `{name}` of the document has no `thresholds`.")
        self.thresholds = [int(r["threshold"]) for r in rows]
        self.keys = [int(r["keys_kept"]) for r in rows]
        self.share = [float(r["traffic_kept_share"]) for r in rows]
        self.total_keys = int(f["total_keys"])
        # Occurrences kept, back as exact ints (the share is kept / total_keys).
        self.traffic = [round(s * self.total_keys) for s in self.share]
        self.distinct_keys = int(f["distinct_keys"])
        self.vocab = [_vocabulary(k, headroom) for k in self.keys]
        self.bytes = [v * self.row_bytes for v in self.vocab]
        self.eviction = f.get("eviction")
        self.at = 0   # index into thresholds

    def next_move(self, min_share: float):
        """(tier, traffic lost per byte freed, target index) of the next move, or None."""
        i = self.at
        j = next((j for j in range(i + 1, len(self.thresholds))
                  if self.bytes[j] < self.bytes[i]), None)
        if j is None:
            return None
        lost = max(0, self.traffic[i] - self.traffic[j])
        freed = self.bytes[i] - self.bytes[j]
        tier = 1 if self.share[j] < min_share and self.total_keys else 0
        return tier, Fraction(lost, freed), j


def suggest(doc: dict, memory_budget_bytes, min_traffic_share: float = 0.95,
            headroom: float = 1.2) -> dict:
    """Per table an ``access_threshold`` and ``vocabulary_size`` (and an ``eviction_threshold``
    when the document has an eviction entry) that fit ``memory_budget_bytes`` together.

    The rule is in the module docstring. Tables are the document's features, by name (the
    table names of a job without a ``features`` section).

    Args:
      doc: a feature-stats document (:func:`sparseflow.stats.compute_stats`, or its JSON).
      memory_budget_bytes: bytes for all the tables' rows (weights and optimizer slots), a
        finite number > 0.
      min_traffic_share: in [0, 1]: raising a table's threshold so that it keeps less than
        this share of its traffic is the last resort.
      headroom: >= 1: vocabulary_size = ceil(keys kept x headroom).

    Returns:
      ``{"memory_budget_bytes", "min_traffic_share", "headroom", "total_bytes",
      "traffic_kept_share", "tables": {name: {"access_threshold", "vocabulary_size",
      ["eviction_threshold"], "bytes", "keys_kept", "distinct_keys", "traffic_kept_share",
      "meets_min_traffic_share", "dim", "optimizer", ["keys_alive"]}}}``; ``total_bytes`` <=
      the budget; ``traffic_kept_share`` is over all tables' key occurrences.

    Raises:
      ValueError: ``doc`` is not a stats document of this version or has no features; an
        argument out of range; a budget below the tables' memory at the highest threshold
        the document reports.
    """
    report.check_document(doc)
    budget = _check_real("memory_budget_bytes", memory_budget_bytes, 0.0, low_open=True)
    min_share = _check_real("min_traffic_share", min_traffic_share, 0.0, 1.0)
    _check_real("headroom", headroom, 1.0)
    if not doc["features"]:
        raise ValueError("The stats document has no features to suggest tables for.")
    head = Fraction(str(float(headroom)))
    tables = [_Table(name, f, head) for name, f in doc["features"].items()]

    least = sum(t.bytes[-1] for t in tables)
    if least > budget:
        highest = max(t.thresholds[-1] for t in tables)
        raise ValueError(
            f"Argument `memory_budget_bytes` ({memory_budget_bytes!r}) is below the "
            f"{least} bytes ({report.format_bytes(least)}) the tables need at their highest reported "
            f"access_threshold ({highest}), with headroom {headroom}. Raise the budget, or "
            f"rerun the stats with a larger --max-threshold.")

    total = sum(t.bytes[0] for t in tables)
    heap = []

    def push(k: int) -> None:
        move = tables[k].next_move(min_share)
        if move is not None:
            tier, cost, j = move
            heapq.heappush(heap, (tier, cost, k, tables[k].at, j))

    for k in range(len(tables)):
        push(k)
    while total > budget:
        _, _, k, at, j = heapq.heappop(heap)   # never empty: everything at the top fits
        t = tables[k]
        if t.at != at:
            continue
        total -= t.bytes[at] - t.bytes[j]
        t.at = j
        push(k)

    out_tables = {}
    kept = occurrences = 0
    for t in tables:
        i = t.at
        entry = {"access_threshold": t.thresholds[i], "vocabulary_size": t.vocab[i]}
        if t.eviction is not None:
            entry["eviction_threshold"] = int(t.eviction["window"])
        entry.update({
            "bytes": t.bytes[i], "keys_kept": t.keys[i], "distinct_keys": t.distinct_keys,
            "traffic_kept_share": t.share[i],
            "meets_min_traffic_share": t.share[i] >= min_share or t.total_keys == 0,
            "dim": t.dim, "optimizer": t.optimizer,
        })
        if t.eviction is not None:
            entry["keys_alive"] = int(t.eviction["keys_alive"])
        out_tables[t.name] = entry
        kept += t.traffic[i]
        occurrences += t.total_keys
    return {"memory_budget_bytes": memory_budget_bytes, "min_traffic_share": min_share,
            "headroom": float(headroom), "total_bytes": int(total),
            "traffic_kept_share": kept / occurrences if occurrences else 0.0,
            "tables": out_tables}


def _key(name: str) -> str:
    """``name`` as a YAML mapping key: plain when that reads back as the same string."""
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*", name):
        try:
            if yaml.safe_load(name) == name:
                return name
        except yaml.YAMLError:
            pass
    return '"' + "".join(c if c.isascii() and c.isprintable() and c not in '"\\'
                         else ("\\" + c if c in '"\\' else f"\\u{ord(c):04x}" if ord(c) < 65536
                               else f"\\U{ord(c):08x}") for c in name) + '"'


def _comment(text: str) -> str:
    """One-line comment text (no line breaks)."""
    return " ".join(str(text).split())


def render_yaml_fragment(suggestion: dict) -> str:
    """The suggestion as a job-config fragment: a ``tables:`` block (``vocabulary_size``,
    ``access_threshold`` and, with eviction, ``eviction_threshold`` per table) with comments
    giving each table's memory, keys and traffic kept, and the total. ``yaml.safe_load`` reads
    it as ``{"tables": {name: {...}}}``.

    Args:
      suggestion: from :func:`suggest`.

    Returns:
      The YAML text (ends with a newline).
    """
    tables = suggestion["tables"]
    budget = suggestion["memory_budget_bytes"]
    lines = [
        "# Suggested by `sparseflow stats --suggest` for a memory budget of "
        f"{report.format_bytes(budget)} ({budget} bytes),",
        f"# headroom {suggestion['headroom']:g}, min traffic share "
        f"{100 * suggestion['min_traffic_share']:g}%. Table memory = vocabulary_size x dim x "
        "(1 + optimizer slots) x 4 bytes.",
        f"# Total: {report.format_bytes(suggestion['total_bytes'])} ({suggestion['total_bytes']} bytes) of "
        f"the budget; traffic kept: {suggestion['traffic_kept_share']:.2%} of all key "
        "occurrences.",
    ]
    if any("eviction_threshold" in t for t in tables.values()):
        lines.append("# eviction_threshold needs columns.timestamp and "
                     "schedule.eviction.every_steps > 0.")
    low = [n for n, t in tables.items() if not t["meets_min_traffic_share"]]
    if low:
        lines.append(_comment(f"# Below the min traffic share to fit the budget: "
                              f"{', '.join(_key(n) for n in low)}."))
    lines.append("tables:")
    for name, t in tables.items():
        lines.append(f"  {_key(name)}:   " + _comment(
            f"# {report.format_bytes(t['bytes'])}, {t['traffic_kept_share']:.2%} of traffic kept, "
            f"{t['keys_kept']:,} of {t['distinct_keys']:,} keys (dim {t['dim']}, "
            f"{t['optimizer']})"))
        note = (f"   # above the config limit {MAX_VOCABULARY_SIZE}: split it over host/ssd "
                "tiers" if t["vocabulary_size"] > MAX_VOCABULARY_SIZE else "")
        lines.append(f"    vocabulary_size: {t['vocabulary_size']}{note}")
        lines.append(f"    access_threshold: {t['access_threshold']}")
        if "eviction_threshold" in t:
            note = f"   # {t['keys_alive']:,} keys seen within the window at the data's end"
            if t["eviction_threshold"] > EVICTION_THRESHOLD_MAX:
                note += (f"; above the config limit {EVICTION_THRESHOLD_MAX}: use coarser "
                         "timestamps")
            lines.append(f"    eviction_threshold: {t['eviction_threshold']}{note}")
    return "\n".join(lines) + "\n"
