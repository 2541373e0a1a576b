"""Rec SDK ``mx_rec.graph.modifier``."""

import tensorflow as tf

from sparseflow import runtime
from sparseflow.pipeline.graph_modifier import get_initializer, modify_graph_and_start_emb_cache
from sparseflow.pipeline.manager import start_asc_pipeline

__all__ = ["GraphModifierHook", "modify_graph_and_start_emb_cache"]


class GraphModifierHook(tf.compat.v1.train.SessionRunHook):
    """Rewrites the graph and starts the key pipeline for a monitored session.

    Args:
      dump_graph: write the graph before and after the rewrite (modify_graph=True).
      modify_graph: True: automatic graph modification at ``begin`` and the rewritten
        training iterator initialized when the session is created; False: only start the
        pipeline (FeatureSpec mode).
    """

    def __init__(self, dump_graph=False, modify_graph=True):
        self.dump_graph = dump_graph
        self.modify_graph = modify_graph

    def begin(self):
        if self.modify_graph:
            modify_graph_and_start_emb_cache(dump_graph=self.dump_graph)
        elif not runtime.current("GraphModifierHook").pipeline_started:
            start_asc_pipeline()

    def after_create_session(self, session, coord):
        if self.modify_graph:
            session.run(get_initializer(True))
