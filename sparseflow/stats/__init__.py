"""Offline feature statistics: exact per-feature key counts of Parquet data, as a versioned
JSON document and a Markdown summary.

    from sparseflow.stats import compute_stats, write_outputs
    doc = compute_stats("data/", ["C1", "C2"], timestamp="ts", eviction_window=86400)
    write_outputs(doc, "stats_out")          # stats_out/stats.json, stats_out/stats.md

Modules: :mod:`~sparseflow.stats.counts` (exact counting), :mod:`~sparseflow.stats.readers`
(streaming Parquet), :mod:`~sparseflow.stats.report` (the document and its Markdown),
:mod:`~sparseflow.stats.job` (the pass over the data). Loads without TensorFlow.
"""

from sparseflow.stats.counts import FeatureCounter
from sparseflow.stats.job import compute_stats, write_outputs
from sparseflow.stats.report import SCHEMA, VERSION, render_markdown

__all__ = ["FeatureCounter", "SCHEMA", "VERSION", "compute_stats", "render_markdown",
           "write_outputs"]
