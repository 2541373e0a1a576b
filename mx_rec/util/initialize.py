"""Rec SDK ``mx_rec.util.initialize``."""

from sparseflow.runtime import get_use_dynamic_expansion, init, terminate_config_initializer
from sparseflow.pipeline.graph_modifier import get_initializer

__all__ = ["init", "terminate_config_initializer", "get_use_dynamic_expansion",
           "get_initializer"]
