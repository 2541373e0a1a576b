"""Rec SDK ``mx_rec.core.asc.helper``: ``get_asc_insert_func``, and ``FeatureSpec`` (Rec SDK
scripts import it from here as well as from ``mx_rec.core.asc.feature_spec``)."""

from sparseflow.featurespec.spec import FeatureSpec
from sparseflow.pipeline.insert_func import get_asc_insert_func

__all__ = ["FeatureSpec", "get_asc_insert_func"]
