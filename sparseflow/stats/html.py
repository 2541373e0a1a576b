"""A self-contained HTML report of a feature-stats document.

:func:`render_html` returns one HTML file: inline CSS, plots as inline SVG drawn here (no
scripts, fonts, images or links to other files; it opens offline). Per feature: a summary
table, a log-log frequency curve (distinct keys and their occurrences per log2 bucket of
per-key count), a keep-vs-threshold curve (share of keys and of traffic kept at admission
thresholds 1..N), the thresholds with their memory, and the top keys. Every text from the
document is escaped; the markup is well-formed XML (the SVGs, and the page as a whole), and
each SVG has a title, a description and labelled axes for screen readers.
"""

from __future__ import annotations

import math
from html import escape

from sparseflow.stats import report

WIDTH, HEIGHT = 560, 300
LEFT, RIGHT, TOP, BOTTOM = 72, 24, 34, 52
PAD = 10   # pixels between the axes and the first / last point
MAX_MARKERS = 40   # more points than this: a line without markers (the tables have the numbers)
KEYS_COLOR, TRAFFIC_COLOR, MARK_COLOR = "#1f5fa8", "#c2410c", "#4b5563"

CSS = """
:root { color-scheme: light; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0;
       color: #111827; background: #f9fafb; }
main { max-width: 1200px; margin: 0 auto; padding: 16px 24px 48px; }
h1 { font-size: 24px; margin: 8px 0; }
h2 { font-size: 19px; margin: 0 0 8px; }
h3 { font-size: 15px; margin: 12px 0 6px; }
code { font: 13px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
section.feature { background: #fff; border: 1px solid #e5e7eb; border-radius: 8px;
                  padding: 16px 20px; margin: 20px 0; }
table { border-collapse: collapse; margin: 4px 0 8px; }
th, td { padding: 3px 10px; border-bottom: 1px solid #e5e7eb; text-align: right;
         font-variant-numeric: tabular-nums; }
th:first-child, td:first-child { text-align: left; }
thead th { background: #f3f4f6; }
.grid { display: flex; flex-wrap: wrap; gap: 8px 32px; align-items: flex-start; }
figure { margin: 8px 0; flex: 1 1 480px; max-width: 600px; }
figure svg { width: 100%; height: auto; display: block; }
figcaption { font-size: 12px; color: #4b5563; }
details { margin: 6px 0; }
summary { cursor: pointer; color: #1f2937; }
.scroll { max-height: 360px; overflow: auto; }
nav ol { columns: 4 180px; padding-left: 24px; }
.muted { color: #6b7280; }
.chosen { background: #fef3c7; }
svg text { font: 11px system-ui, sans-serif; fill: #374151; }
svg .title { font-size: 13px; font-weight: 600; fill: #111827; }
svg .axis-label { font-size: 12px; fill: #111827; }
svg .grid-line { stroke: #e5e7eb; stroke-width: 1; }
svg .axis { stroke: #6b7280; stroke-width: 1; }
svg .mark { paint-order: stroke; stroke: #fff; stroke-width: 3px; font-weight: 600; }
"""


def _e(x) -> str:
    return escape(str(x), quote=True)


def _int(n) -> str:
    return f"{int(n):,}"


def _pct(x) -> str:
    return f"{100 * float(x):.2f}%"


def _compact(v: float) -> str:
    """1, 10, 100, 1k, 10k, ... for decade ticks."""
    for div, suffix in ((10**12, "T"), (10**9, "G"), (10**6, "M"), (10**3, "k")):
        if v >= div:
            return f"{v / div:g}{suffix}"
    return f"{v:g}"


_SUPERSCRIPT = str.maketrans("0123456789", "\u2070\u00b9\u00b2\u00b3\u2074"
                                           "\u2075\u2076\u2077\u2078\u2079")


def _power_of_two(i: int) -> str:
    """2**i as a tick label: digits up to 4096, then 2 with a superscript exponent."""
    return f"{2**i:,}" if i <= 12 else "2" + str(i).translate(_SUPERSCRIPT)


def _nice_ticks(lo: int, hi: int, target: int = 8) -> list[int]:
    """Integer ticks from lo to hi: lo, then multiples of a 1-2-5 step, about ``target``."""
    raw = max(hi - lo, 1) / target
    step = min(s for s in (m * 10**p for p in range(19) for m in (1, 2, 5)) if s >= raw)
    ticks = list(range(int(math.ceil(lo / step) * step), int(hi) + 1, step))
    return ticks if ticks and ticks[0] == lo else [int(lo)] + ticks


def _chart(chart_id: str, title: str, desc: str, x_label: str, y_label: str,
           x_domain: tuple, y_domain: tuple, x_ticks, y_ticks, series, mark=None,
           empty: str | None = None) -> str:
    """One SVG line chart.

    Args:
      x_domain, y_domain: (lo, hi) in plot coordinates (already log-transformed if log).
      x_ticks, y_ticks: [(position, label)].
      series: [(name, color, dash, marker, [(x, y, tooltip) or None for a gap])].
      mark: None or (x, label): a vertical marker line.
      empty: text drawn instead of series (no data).
    """
    pw, ph = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    x0, x1 = x_domain
    y0, y1 = y_domain
    if x1 <= x0:
        x0, x1 = x0 - 0.5, x0 + 0.5
    if y1 <= y0:
        y1 = y0 + 1

    def sx(x):
        return LEFT + PAD + (x - x0) / (x1 - x0) * (pw - 2 * PAD)

    def sy(y):
        return TOP + ph - (y - y0) / (y1 - y0) * ph

    out = [f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" '
           f'role="img" aria-labelledby="{chart_id}-title {chart_id}-desc" '
           f'id="{chart_id}" class="chart">',
           f'<title id="{chart_id}-title">{_e(title)}</title>',
           f'<desc id="{chart_id}-desc">{_e(desc)}</desc>',
           f'<text class="title" x="{LEFT}" y="14">{_e(title)}</text>']
    # Grid and ticks.
    for pos, label in y_ticks:
        y = sy(pos)
        out.append(f'<line class="grid-line" x1="{LEFT}" x2="{LEFT + pw}" y1="{y:.1f}" '
                   f'y2="{y:.1f}"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_e(label)}</text>')
    for pos, label in x_ticks:
        x = sx(pos)
        out.append(f'<line class="axis" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP + ph}" '
                   f'y2="{TOP + ph + 4}"/>')
        out.append(f'<text x="{x:.1f}" y="{TOP + ph + 16}" text-anchor="middle">'
                   f'{_e(label)}</text>')
    out.append(f'<line class="axis" x1="{LEFT}" x2="{LEFT + pw}" y1="{TOP + ph}" '
               f'y2="{TOP + ph}"/>')
    out.append(f'<line class="axis" x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{TOP + ph}"/>')
    out.append(f'<text class="axis-label" x="{LEFT + pw / 2:.1f}" y="{HEIGHT - 8}" '
               f'text-anchor="middle">{_e(x_label)}</text>')
    out.append(f'<text class="axis-label" transform="translate(16 {TOP + ph / 2:.1f}) '
               f'rotate(-90)" text-anchor="middle">{_e(y_label)}</text>')
    if mark is not None:
        mx = sx(mark[0])
        out.append(f'<line x1="{mx:.1f}" x2="{mx:.1f}" y1="{TOP}" y2="{TOP + ph}" '
                   f'stroke="{MARK_COLOR}" stroke-dasharray="2 3"/>')
        right = mx > LEFT + 0.7 * pw
        out.append(f'<text x="{mx - 4 if right else mx + 4:.1f}" y="{TOP + 10}" '
                   f'text-anchor="{"end" if right else "start"}" class="mark">'
                   f'{_e(mark[1])}</text>')
    if empty is not None:
        out.append(f'<text x="{LEFT + pw / 2:.1f}" y="{TOP + ph / 2:.1f}" '
                   f'text-anchor="middle">{_e(empty)}</text>')
    else:
        # Legend, top right.
        lx = LEFT + pw
        for name, color, dash, marker, _ in reversed(series):
            width = 7 * len(name) + 34
            lx -= width
            dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
            out.append(f'<line x1="{lx:.1f}" x2="{lx + 22:.1f}" y1="24" y2="24" '
                       f'stroke="{color}" stroke-width="2"{dash_attr}/>')
            out.append(_marker(marker, lx + 11, 24, color))
            out.append(f'<text x="{lx + 26:.1f}" y="28">{_e(name)}</text>')
        for name, color, dash, marker, points in series:
            path, pen = [], False
            for p in points:
                if p is None:
                    pen = False
                    continue
                path.append(f"{'L' if pen else 'M'}{sx(p[0]):.1f} {sy(p[1]):.1f}")
                pen = True
            dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
            out.append(f'<g aria-label="{_e(name)}">')
            if path:
                out.append(f'<path d="{" ".join(path)}" fill="none" stroke="{color}" '
                           f'stroke-width="2"{dash_attr}/>')
            if sum(p is not None for p in points) <= MAX_MARKERS:
                for p in points:
                    if p is not None:
                        out.append(_marker(marker, sx(p[0]), sy(p[1]), color, p[2]))
            out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)


def _marker(kind: str, x: float, y: float, color: str, tooltip: str | None = None) -> str:
    tip = f"<title>{_e(tooltip)}</title>" if tooltip else ""
    if kind == "square":
        shape = (f'<rect x="{x - 3.5:.1f}" y="{y - 3.5:.1f}" width="7" height="7" '
                 f'fill="{color}"')
    else:
        shape = f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{color}"'
    return shape + (f">{tip}</{'rect' if kind == 'square' else 'circle'}>" if tip else "/>")


def frequency_svg(f: dict, chart_id: str, name: str) -> str:
    """Log-log frequency curve: distinct keys and traffic per log2 bucket of per-key count."""
    hist = f["histogram"]
    title = f"{name}: key frequency (log-log)"
    desc = ("Per log2 bucket of per-key count (keys seen 1, 2-3, 4-7, ... times): the "
            "number of distinct keys in the bucket and the occurrences (traffic) they carry, "
            "both on log scales.")
    top = max([max(b["keys"], b["traffic"]) for b in hist] + [1])
    decades = max(1, math.ceil(math.log10(top)) if top > 1 else 1)
    y_ticks = [(d, _compact(10**d)) for d in range(decades + 1)]
    n = len(hist)
    step = max(1, math.ceil(n / 12))
    x_ticks = [(i, _power_of_two(i)) for i in range(0, n, step)]

    def points(field):
        return [(i, math.log10(b[field]),
                 f"count {_int(b['min_count'])}-{_int(b['max_count'])}: {_int(b['keys'])} keys, "
                 f"{_int(b['traffic'])} occurrences") if b[field] > 0 else None
                for i, b in enumerate(hist)]

    series = [("distinct keys", KEYS_COLOR, None, "circle", points("keys")),
              ("traffic (occurrences)", TRAFFIC_COLOR, "6 3", "square", points("traffic"))]
    return _chart(chart_id, title, desc, "times a key was seen (log2 bucket lower bound)",
                  "keys / occurrences (log scale)", (0, max(n - 1, 0)), (0, decades),
                  x_ticks, y_ticks, series, empty=None if n else "no keys")


def threshold_svg(f: dict, chart_id: str, name: str, chosen: int | None = None) -> str:
    """Keep-vs-threshold curve: share of distinct keys and of traffic kept at thresholds."""
    rows = f["thresholds"]
    distinct = f["distinct_keys"]
    mem = f["memory"]["bytes_at_threshold"]
    title = f"{name}: kept vs admission threshold"
    desc = ("For admission thresholds 1 to N (a key gets a row once seen that many times): "
            "the share of distinct keys kept and the share of traffic (key occurrences) they "
            "carry, in percent.")
    ts = [r["threshold"] for r in rows]
    lo, hi = (min(ts), max(ts)) if ts else (1, 1)
    x_ticks = [(t, str(t)) for t in _nice_ticks(lo, hi)] if ts else []
    y_ticks = [(p, f"{p}%") for p in range(0, 101, 20)]

    def tip(r):
        return (f"threshold {r['threshold']}: {_int(r['keys_kept'])} keys kept "
                f"({_pct(r['keys_kept'] / distinct if distinct else 0)} of distinct), "
                f"{_pct(r['traffic_kept_share'])} of traffic, "
                f"{report.format_bytes(mem.get(str(r['threshold']), 0))}")

    keys = [(r["threshold"], 100 * (r["keys_kept"] / distinct if distinct else 0.0), tip(r))
            for r in rows]
    traffic = [(r["threshold"], 100 * r["traffic_kept_share"], tip(r)) for r in rows]
    series = [("keys kept", KEYS_COLOR, None, "circle", keys),
              ("traffic kept", TRAFFIC_COLOR, "6 3", "square", traffic)]
    mark = (chosen, f"suggested: {chosen}") if chosen is not None else None
    return _chart(chart_id, title, desc, "admission threshold (times seen before a row is given)",
                  "kept (% of keys / % of traffic)", (lo, hi), (0, 100), x_ticks, y_ticks,
                  series, mark=mark, empty=None if distinct else "no keys")


def _table(header, rows, cls: str | None = None, row_classes=None) -> str:
    out = [f'<table class="{cls}">' if cls else "<table>", "<thead><tr>"]
    out += [f'<th scope="col">{_e(h)}</th>' for h in header]
    out.append("</tr></thead><tbody>")
    for i, row in enumerate(rows):
        rc = row_classes[i] if row_classes else None
        out.append((f'<tr class="{rc}">' if rc else "<tr>")
                   + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _summary_rows(f: dict) -> list:
    mem = f["memory"]
    at1 = mem["bytes_at_threshold"].get("1", 0)
    rows = [("encoding", f"{f['encoding']}{' (multi-hot)' if f['multi_hot'] else ''}"),
            ("rows", _int(f["rows"])),
            ("null rows", _int(f["null_rows"])),
            ("empty rows", _int(f["empty_rows"])),
            ("null or empty share", _pct(f["null_or_empty_share"])),
            ("total keys (occurrences)", _int(f["total_keys"])),
            ("distinct keys", _int(f["distinct_keys"])),
            ("keys seen once", _int(f["singleton_keys"])),
            ("share of keys seen once", _pct(f["singleton_share"])),
            (f"memory, every key (dim {mem['dim']}, {mem['optimizer']}: {mem['slots']} "
             f"slot{'s' if mem['slots'] != 1 else ''})", report.format_bytes(at1))]
    if f.get("mode"):
        rows.insert(1, ("counting", f["mode"]))
    if "eviction" in f:
        e = f["eviction"]
        rows.append((f"keys alive (window {_int(e['window'])}, clock {e['clock']})",
                     _int(e["keys_alive"])))
    return rows


def _feature(i: int, name: str, f: dict, chosen: dict | None) -> str:
    sid = f"feature-{i}"
    threshold = chosen.get("access_threshold") if chosen else None
    mem = f["memory"]["bytes_at_threshold"]
    distinct = f["distinct_keys"]
    out = [f'<section class="feature" id="{sid}" aria-labelledby="{sid}-h">',
           f'<h2 id="{sid}-h"><code>{_e(name)}</code></h2>', '<div class="grid">', "<div>",
           '<h3>Summary</h3>',
           _table(("metric", "value"), _summary_rows(f))]
    if chosen:
        extra = (f", eviction_threshold {chosen['eviction_threshold']}"
                 if "eviction_threshold" in chosen else "")
        out.append(f"<p>Suggested: access_threshold {_e(chosen['access_threshold'])}, "
                   f"vocabulary_size {_e(_int(chosen['vocabulary_size']))}{_e(extra)} "
                   f"({_e(report.format_bytes(chosen['bytes']))}, "
                   f"{_e(_pct(chosen['traffic_kept_share']))} of traffic kept).</p>")
    out.append("</div><div>")
    out.append("<h3>Top keys</h3>")
    if f["top_keys"]:
        total = f["total_keys"]
        out.append('<div class="scroll">' + _table(
            ("key", "count", "share of traffic"),
            [(k["key"], _int(k["count"]), _pct(k["count"] / total if total else 0))
             for k in f["top_keys"]]) + "</div>")
    else:
        out.append('<p class="muted">none listed</p>')
    out.append("</div></div>")
    out.append('<div class="grid">')
    out.append(f'<figure>{frequency_svg(f, f"{sid}-freq", name)}<figcaption>Distinct keys '
               "and the occurrences they carry per frequency bucket: a straight falling line "
               "is a power law; a tall first bucket means many keys seen once.</figcaption>"
               "</figure>")
    out.append(f'<figure>{threshold_svg(f, f"{sid}-keep", name, threshold)}<figcaption>'
               "Raising the admission threshold drops the rare keys: the keys-kept curve falls "
               "fast while the traffic-kept curve stays high on skewed data.</figcaption>"
               "</figure>")
    out.append("</div>")
    rows, classes = [], []
    for r in f["thresholds"]:
        rows.append((r["threshold"], _int(r["keys_kept"]),
                     _pct(r["keys_kept"] / distinct if distinct else 0),
                     _pct(r["traffic_kept_share"]), report.format_bytes(mem.get(str(r["threshold"]), 0))))
        classes.append("chosen" if r["threshold"] == threshold else None)
    out.append("<details><summary>Admission thresholds (table)</summary>"
               + _table(("threshold", "keys kept", "% of keys", "traffic kept", "table memory"),
                        rows, row_classes=classes) + "</details>")
    out.append("<details><summary>Frequency histogram (table)</summary>" + _table(
        ("times seen", "keys", "occurrences"),
        [(f"{_int(b['min_count'])}-{_int(b['max_count'])}", _int(b["keys"]),
          _int(b["traffic"])) for b in f["histogram"]]) + "</details>")
    out.append("</section>")
    return "\n".join(out)


def render_html(doc: dict, suggestion: dict | None = None) -> str:
    """The report as one self-contained HTML page.

    Args:
      doc: a feature-stats document (:func:`sparseflow.stats.compute_stats`, or its JSON).
      suggestion: optional, from :func:`sparseflow.stats.suggest.suggest`: each table's
        suggested threshold is marked on its plot and in its tables.

    Returns:
      The HTML text (ends with a newline).

    Raises:
      ValueError: ``doc`` is not a stats document of this version.
    """
    report.check_document(doc)
    src = doc.get("source", {})
    features = doc["features"]
    chosen = (suggestion or {}).get("tables", {})
    files = src.get("files", []) or []
    info = (f"{len(files)} {src.get('format', '')} file{'s' if len(files) != 1 else ''}, "
            f"{_int(src.get('rows', 0) or 0)} rows, {src.get('mode', 'exact')} counting"
            + (f", timestamp column {src['timestamp']}" if src.get("timestamp") else "")
            + (f", clock {src['clock']}" if src.get("clock") is not None else "") + ".")
    out = ['<!DOCTYPE html>', '<html lang="en">', "<head>", '<meta charset="utf-8"/>',
           '<meta name="viewport" content="width=device-width, initial-scale=1"/>',
           "<title>Feature statistics</title>", f"<style>{CSS}</style>", "</head>", "<body>",
           "<main>", "<h1>Feature statistics</h1>", f"<p>{_e(info)}</p>"]
    if files:
        out.append(f"<details><summary>Files ({len(files)})</summary><ul>"
                   + "".join(f"<li><code>{_e(p)}</code></li>" for p in files)
                   + "</ul></details>")
    if suggestion:
        budget = suggestion["memory_budget_bytes"]
        out.append(f"<p>Suggestion for a memory budget of {_e(report.format_bytes(budget))}: "
                   f"{_e(report.format_bytes(suggestion['total_bytes']))} in all, "
                   f"{_e(_pct(suggestion['traffic_kept_share']))} of traffic kept.</p>")
    out.append(f'<h2>Overview ({len(features)} feature{"s" if len(features) != 1 else ""})</h2>')
    header = ["feature", "rows", "null or empty", "total keys", "distinct keys", "seen once",
              "memory, every key"]
    if chosen:
        header += ["suggested threshold", "vocabulary size"]
    out.append('<div class="scroll"><table><thead><tr>'
               + "".join(f'<th scope="col">{_e(h)}</th>' for h in header)
               + "</tr></thead><tbody>")
    for i, (name, f) in enumerate(features.items()):
        cells = [_int(f["rows"]), _pct(f["null_or_empty_share"]), _int(f["total_keys"]),
                 _int(f["distinct_keys"]), _pct(f["singleton_share"]),
                 report.format_bytes(f["memory"]["bytes_at_threshold"].get("1", 0))]
        if chosen:
            c = chosen.get(name)
            cells += [c["access_threshold"], _int(c["vocabulary_size"])] if c else ["", ""]
        out.append(f'<tr><td><a href="#feature-{i}"><code>{_e(name)}</code></a></td>'
                   + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
    out.append("</tbody></table></div>")
    for i, (name, f) in enumerate(features.items()):
        out.append(_feature(i, name, f, chosen.get(name)))
    out += ['<p class="muted">Written by <code>sparseflow stats</code> (schema '
            f'{_e(doc["schema"])}, version {_e(doc["version"])}).</p>',
            "</main>", "</body>", "</html>"]
    return "\n".join(out) + "\n"
