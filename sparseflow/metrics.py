"""Evaluation metrics over numpy arrays, shared by the YAML job runner and the examples."""

from __future__ import annotations

import numpy as np


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC by the rank-sum (Mann-Whitney) formula.

    Args:
      labels: any shape; an entry > 0.5 is a positive.
      scores: the same number of entries as ``labels``: higher means more likely positive.

    Returns:
      The probability that a random positive scores above a random negative (a tie counts
      one half: tied scores get their average rank); 0.5 if one class is absent.
    """
    labels = np.asarray(labels).ravel() > 0.5
    scores = np.asarray(scores, np.float64).ravel()
    n_pos = int(labels.sum())
    n_neg = labels.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return 0.5
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    # Average 1-based ranks over runs of tied scores.
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    ends = np.r_[starts[1:], scores.size]
    run_rank = (starts + ends - 1) / 2.0 + 1.0
    ranks = np.empty(scores.size, np.float64)
    ranks[order] = np.repeat(run_rank, ends - starts)
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))
