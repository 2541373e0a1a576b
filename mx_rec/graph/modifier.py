"""Rec SDK ``mx_rec.graph.modifier``."""

from sparseflow.pipeline.graph_modifier import (GraphModifierHook,
                                                modify_graph_and_start_emb_cache)

__all__ = ["GraphModifierHook", "modify_graph_and_start_emb_cache"]
