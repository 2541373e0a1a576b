"""``sparseflow.stats.html`` (the self-contained HTML report) and ``sparseflow.stats.suggest``
(thresholds and vocabulary sizes for a memory budget, and their YAML fragment).

Documents come from :func:`compute_stats` over a small generated Parquet file (a Zipf column
whose name needs escaping, a uniform column, a timestamp column) and from per-key counts given
directly (:func:`doc_from_counts`, through :func:`report.feature_section`), so that the
suggestion rule can be checked against numbers worked out by hand.
"""

from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ET

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from sparseflow import synthetic
from sparseflow.stats import compute_stats, report
from sparseflow.stats.html import render_html
from sparseflow.stats.suggest import parse_budget, render_yaml_fragment, suggest

ODD = 'a<&>"b\''   # a feature name that must be escaped


def doc_from_counts(features: dict, max_threshold: int = 8) -> dict:
    """A stats document from per-key counts: name -> counts, or (counts, options) with
    options among dim, optimizer, eviction (the eviction dict)."""
    sections = {}
    for name, spec in features.items():
        counts, options = (spec if isinstance(spec, tuple) else (spec, {}))
        counts = np.asarray(counts, np.int64)
        total = int(counts.sum())
        bucket_keys = np.zeros(64, np.int64)
        bucket_traffic = np.zeros(64, np.int64)
        for c in counts.tolist():
            bucket_keys[c.bit_length() - 1] += 1
            bucket_traffic[c.bit_length() - 1] += c
        kept_keys = [0] + [int((counts >= t).sum()) for t in range(1, max_threshold + 1)]
        kept_traffic = [0] + [int(counts[counts >= t].sum()) for t in range(1, max_threshold + 1)]
        order = np.argsort(-counts, kind="stable")[:5]
        sections[name] = report.feature_section(
            encoding="int", multi_hot=False, rows=total, null_rows=0, empty_rows=0,
            total_keys=total, distinct_keys=counts.size, bucket_keys=bucket_keys,
            bucket_traffic=bucket_traffic, top_keys=order, top_counts=counts[order],
            kept_keys=kept_keys, kept_traffic=kept_traffic, eviction=options.get("eviction"),
            dim=options.get("dim", 8), optimizer=options.get("optimizer", "adam"))
    return report.build_document({"format": "parquet", "mode": "exact", "paths": [],
                                  "files": [], "rows": 0, "timestamp": None}, sections)


@pytest.fixture(scope="module")
def parquet_doc(tmp_path_factory):
    root = tmp_path_factory.mktemp("report_data")
    rng = np.random.default_rng(7)
    n = 4000
    table = pa.table({ODD: synthetic.zipf_ranks(rng, 2000, 1.1, n).astype(np.int64),
                      "uniform": rng.integers(0, 1500, n),
                      "ts": np.arange(n, dtype=np.int64)})
    pq.write_table(table, root / "part-0.parquet")
    return compute_stats(str(root), [ODD, "uniform"], timestamp="ts", eviction_window=1000,
                         max_threshold=6, top_k=5)


@pytest.fixture(scope="module")
def mixed_doc():
    rng = np.random.default_rng(3)
    zipf = np.bincount(synthetic.zipf_ranks(rng, 3000, 1.05, 20000))
    return doc_from_counts({
        "zipf": zipf[zipf > 0],
        "flat": (rng.integers(1, 12, 900), {"dim": 16, "optimizer": "sgd"}),
        "tiny": ([40, 30, 5], {"dim": 4, "optimizer": "adagrad"}),
        "heavy": (rng.integers(1, 4, 2500), {"dim": 32}),
    })


def row_bytes(doc, name):
    mem = doc["features"][name]["memory"]
    return mem["dim"] * (1 + mem["slots"]) * 4


def full_bytes(doc, headroom=1.2):
    return sum(math.ceil(f["distinct_keys"] * headroom) * row_bytes(doc, n)
               for n, f in doc["features"].items())


# --- HTML ----------------------------------------------------------------------------------

def svgs(page: str) -> list[str]:
    return re.findall(r"<svg\b.*?</svg>", page, re.S)


def test_html_is_self_contained_and_well_formed(parquet_doc):
    page = render_html(parquet_doc)
    assert page.startswith("<!DOCTYPE html>")
    lower = page.lower()
    for banned in ("http://", "https://", "<script", "<link", "src=", "@import", "url("):
        assert banned not in lower, banned
    assert "<style>" in page
    ET.fromstring(page.replace("<!DOCTYPE html>", "", 1))   # the whole page is well-formed


def test_html_has_two_accessible_svgs_per_feature(parquet_doc):
    page = render_html(parquet_doc)
    charts = svgs(page)
    assert len(charts) == 2 * len(parquet_doc["features"])
    for i in range(len(parquet_doc["features"])):
        for kind in ("freq", "keep"):
            assert page.count(f'id="feature-{i}-{kind}"') == 1
    for chart in charts:
        svg = ET.fromstring(chart)
        assert svg.get("role") == "img"
        ids = svg.get("aria-labelledby").split()
        found = {el.get("id"): el for el in svg.iter() if el.get("id")}
        assert [found[i].tag for i in ids] == ["title", "desc"]
        labels = ["".join(t.itertext()) for t in svg.iter("text")
                  if t.get("class") == "axis-label"]
        assert len(labels) == 2 and all(labels)              # x and y axis labels
        if svg.get("id").endswith("-freq"):
            assert "times a key was seen" in labels[0] and "log scale" in labels[1]
        else:
            assert "admission threshold" in labels[0] and "%" in labels[1]
        assert svg.find(".//path") is not None                  # the curves


def test_html_escapes_document_text(parquet_doc):
    page = render_html(parquet_doc)
    assert ODD not in page
    assert "a&lt;&amp;&gt;&quot;b&#x27;" in page
    for chart in svgs(page)[:2]:                              # the odd feature's own plots
        title = ET.fromstring(chart).find("title").text
        assert title.startswith(ODD)


def test_html_numbers_and_suggestion_mark(parquet_doc):
    f = parquet_doc["features"]["uniform"]
    s = suggest(parquet_doc, full_bytes(parquet_doc) // 3)
    page = render_html(parquet_doc, s)
    assert f"{f['distinct_keys']:,}" in page and f"{f['total_keys']:,}" in page
    chosen = s["tables"]["uniform"]["access_threshold"]
    keep = ET.fromstring(svgs(page)[3])
    assert f"suggested: {chosen}" in {"".join(t.itertext()) for t in keep.iter("text")}
    assert page.count('class="chosen"') == len(parquet_doc["features"])


def test_html_edge_features_and_many_features():
    doc = doc_from_counts({"empty": [], "one": [3], **{f"f{i}": [i + 1, 1, 2] for i in range(99)},
                           "wide": 2 ** np.arange(40)}, max_threshold=1)
    page = render_html(doc)
    assert len(svgs(page)) == 2 * 102
    assert "no keys" in page
    for chart in svgs(page):
        ET.fromstring(chart)
    ET.fromstring(page.replace("<!DOCTYPE html>", "", 1))


def test_html_refuses_other_documents():
    with pytest.raises(ValueError, match="schema"):
        render_html({"schema": "other"})


# --- suggest -------------------------------------------------------------------------------

def table_bytes(doc, suggestion):
    return sum(t["vocabulary_size"] * row_bytes(doc, name)
               for name, t in suggestion["tables"].items())


def test_everything_fits_at_threshold_one(mixed_doc):
    s = suggest(mixed_doc, full_bytes(mixed_doc))
    for name, t in s["tables"].items():
        f = mixed_doc["features"][name]
        assert t["access_threshold"] == 1
        assert t["vocabulary_size"] == math.ceil(f["distinct_keys"] * 1.2)
        assert t["traffic_kept_share"] == 1.0 and t["meets_min_traffic_share"]
        assert "eviction_threshold" not in t
    assert s["total_bytes"] == full_bytes(mixed_doc) == table_bytes(mixed_doc, s)
    s = suggest(mixed_doc, 10**15, headroom=1)
    assert {n: t["vocabulary_size"] for n, t in s["tables"].items()} == \
        {n: f["distinct_keys"] for n, f in mixed_doc["features"].items()}


def test_budget_respected_and_monotone(mixed_doc):
    full = full_bytes(mixed_doc)
    least = sum(max(1, math.ceil(f["thresholds"][-1]["keys_kept"] * 1.2)) * row_bytes(mixed_doc, n)
                for n, f in mixed_doc["features"].items())
    previous = None
    for budget in np.linspace(least, full * 1.1, 60).round().astype(int).tolist():
        s = suggest(mixed_doc, budget)
        assert s["total_bytes"] == table_bytes(mixed_doc, s) <= budget
        for name, t in s["tables"].items():
            f = mixed_doc["features"][name]
            row = f["thresholds"][t["access_threshold"] - 1]
            assert t["keys_kept"] == row["keys_kept"]
            assert t["vocabulary_size"] == max(1, math.ceil(row["keys_kept"] * 1.2))
            assert t["bytes"] == t["vocabulary_size"] * row_bytes(mixed_doc, name)
        thresholds = {n: t["access_threshold"] for n, t in s["tables"].items()}
        if previous is not None:
            assert all(thresholds[n] <= previous[n] for n in thresholds), (budget, thresholds)
        previous = thresholds
    assert set(previous.values()) == {1}


def test_cheapest_move_first_and_min_traffic_share_last():
    # "rare": 200 keys seen once (2% of its traffic) beside 10 keys seen 980 times.
    # "common": 100 keys seen once (50% of its traffic) and 50 keys seen twice.
    doc = doc_from_counts({"rare": [1] * 200 + [980] * 10, "common": [1] * 100 + [2] * 50},
                          max_threshold=3)
    rb = row_bytes(doc, "rare")
    full = full_bytes(doc, headroom=1)
    # One move is needed; raising "rare" loses 200 occurrences per 200 rows, raising
    # "common" loses 100 per 100: a tie per byte, broken by order -> "rare".
    s = suggest(doc, full - 1, headroom=1, min_traffic_share=0.0)
    assert [s["tables"][n]["access_threshold"] for n in ("rare", "common")] == [2, 1]
    # "common" at 2 would keep only 50% of its traffic: with min share 0.9, "rare" goes first.
    s = suggest(doc, full - 100 * rb, headroom=1, min_traffic_share=0.9)
    assert [s["tables"][n]["access_threshold"] for n in ("rare", "common")] == [2, 1]
    assert s["tables"]["rare"]["meets_min_traffic_share"]
    # Not enough: "common" must go below the min share too.
    s = suggest(doc, full - 250 * rb, headroom=1, min_traffic_share=0.9)
    assert s["tables"]["common"]["access_threshold"] == 2
    assert not s["tables"]["common"]["meets_min_traffic_share"]
    assert s["total_bytes"] <= full - 250 * rb


def test_eviction_threshold_is_the_window(parquet_doc):
    s = suggest(parquet_doc, full_bytes(parquet_doc))
    for name, t in s["tables"].items():
        e = parquet_doc["features"][name]["eviction"]
        assert t["eviction_threshold"] == e["window"] == 1000
        assert t["keys_alive"] == e["keys_alive"]
    again = suggest(json.loads(json.dumps(parquet_doc)), full_bytes(parquet_doc))
    assert again == s


def config_part(suggestion):
    keys = ("vocabulary_size", "access_threshold", "eviction_threshold")
    return {name: {k: t[k] for k in keys if k in t} for name, t in suggestion["tables"].items()}


@pytest.mark.parametrize("budget_share", [1.0, 0.5, 0.2])
def test_yaml_fragment_round_trips(parquet_doc, budget_share):
    s = suggest(parquet_doc, int(full_bytes(parquet_doc) * budget_share))
    text = render_yaml_fragment(s)
    assert yaml.safe_load(text) == {"tables": config_part(s)}
    assert f"{s['total_bytes']} bytes" in text
    assert sum(line.lstrip().startswith("#") for line in text.splitlines()) >= 3


def test_yaml_fragment_quotes_odd_table_names():
    names = [ODD, "null", "yes", "1", "x: y", "#c", "- z", "tab\there", "line\nbreak", "é",
             "C1", "user_id.v2"]
    doc = doc_from_counts({n: [5, 1, 1] for n in names}, max_threshold=2)
    s = suggest(doc, 10**9)
    text = render_yaml_fragment(s)
    assert yaml.safe_load(text) == {"tables": config_part(s)}
    assert "\n  C1:" in text and "\n  user_id.v2:" in text   # plain names stay plain


@pytest.mark.parametrize("budget", [0, -1, 0.0, float("nan"), float("inf"), "1GB", None, True,
                                    [1]])
def test_bad_budget_raises(mixed_doc, budget):
    with pytest.raises(ValueError, match=r"memory_budget_bytes.*" + re.escape(repr(budget))):
        suggest(mixed_doc, budget)


def test_budget_below_the_highest_threshold_raises(mixed_doc):
    with pytest.raises(ValueError, match=r"`memory_budget_bytes` \(1000\).*max-threshold"):
        suggest(mixed_doc, 1000)


@pytest.mark.parametrize("kwargs, name", [
    (dict(min_traffic_share=1.5), "min_traffic_share"),
    (dict(min_traffic_share=-0.1), "min_traffic_share"),
    (dict(headroom=0.9), "headroom"),
    (dict(headroom=float("nan")), "headroom"),
])
def test_bad_options_raise(mixed_doc, kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        suggest(mixed_doc, 10**9, **kwargs)


def test_parse_budget():
    assert parse_budget("8GiB") == 8 * 2**30
    assert parse_budget("512M") == 512 * 2**20
    assert parse_budget("1.5 kb") == 1500
    assert parse_budget("1e9") == 10**9
    assert parse_budget(4096) == 4096
    for bad in ("", "abc", "0", "0.5", "-5", "5 parsecs", float("inf")):
        with pytest.raises(ValueError, match="memory_budget"):
            parse_budget(bad)
