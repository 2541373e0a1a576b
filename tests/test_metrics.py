"""``sparseflow.metrics.auc`` against the pairwise definition of ROC AUC."""

import numpy as np
import pytest

from sparseflow.metrics import auc


def _pairwise_auc(labels, scores) -> float:
    """P(score of a random positive > score of a random negative), ties counting 1/2."""
    pos, neg = scores[labels > 0.5], scores[labels <= 0.5]
    greater = (pos[:, None] > neg[None, :]).sum()
    ties = (pos[:, None] == neg[None, :]).sum()
    return float((greater + 0.5 * ties) / (pos.size * neg.size))


@pytest.mark.parametrize("seed", range(4))
def test_auc_matches_the_pairwise_definition_with_ties(seed):
    rng = np.random.default_rng(seed)
    labels = (rng.random(300) < 0.3).astype(np.float32)
    scores = np.round(rng.random(300) + 0.3 * labels, 1)   # rounded: many tied scores
    assert auc(labels, scores) == pytest.approx(_pairwise_auc(labels, scores), abs=1e-12)


def test_auc_of_a_perfect_a_reversed_and_a_one_class_ranking():
    labels = np.array([0, 0, 1, 1], np.float32)
    assert auc(labels, np.array([0.1, 0.2, 0.8, 0.9])) == 1.0
    assert auc(labels, np.array([0.9, 0.8, 0.2, 0.1])) == 0.0
    assert auc(np.ones(3), np.array([0.1, 0.5, 0.7])) == 0.5
