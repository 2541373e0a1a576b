"""Real data sets loaded at run time from copies that PyPI packages ship (never committed)."""

from sparseflow.datasets.movielens import load_movielens_100k

__all__ = ["load_movielens_100k"]
