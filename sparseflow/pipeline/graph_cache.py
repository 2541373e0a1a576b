"""Per-graph memo tables, so that several lookups of one table in one graph share ops."""

from __future__ import annotations


def graph_cache(graph, name: str, create: bool = True) -> dict | None:
    """A dict stored on ``graph`` under ``name``, created empty on first use.

    Args:
      graph: a ``tf.Graph`` (or FuncGraph).
      name: which cache.
      create: False: None when the graph has none yet (nothing is added to it).

    Returns:
      The dict (it lives as long as the graph), or None.
    """
    attribute = f"_sparseflow_{name}"
    cache = getattr(graph, attribute, None)
    if cache is None and create:
        cache = {}
        setattr(graph, attribute, cache)
    return cache
