"""Generated data for demos, tests and benchmarks: Criteo-shaped keys and a learnable CTR task.

Nothing here is real data (Criteo and MovieLens may not be redistributed). Keys follow bounded
power laws calibrated as in ``shared/DATA.md``: Kaggle Criteo's per-feature cardinalities, one
exponent per feature chosen so that a batch of 4 096 rows keeps about 25–35 % of its keys
unique, and ranks scattered over the int64 space (times a large odd constant plus a per-feature
salt) so that nothing can index a table by the raw value.
"""

from __future__ import annotations

import numpy as np

# Kaggle Criteo C1..C26 cardinalities.
CRITEO_CARDINALITIES = (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683,
                        8351593, 3194, 27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15,
                        286181, 105, 142572)
_SCATTER = np.uint64(0x9E3779B97F4A7C15)


def zipf_ranks(rng: np.random.Generator, cardinality: int, exponent: float,
               size) -> np.ndarray:
    """Ranks in [0, cardinality) with P(rank r) ~ (r+1)^-exponent (continuous inverse CDF).

    Args:
      rng: the generator.
      cardinality: number of distinct ranks, >= 1.
      exponent: power-law exponent, > 0.
      size: output shape.

    Returns:
      int64 array of ``size``.
    """
    u = rng.random(size)
    if abs(exponent - 1.0) < 1e-9:
        ranks = np.exp(u * np.log(cardinality + 1.0))
    else:
        a = 1.0 - exponent
        ranks = (u * ((cardinality + 1.0) ** a - 1.0) + 1.0) ** (1.0 / a)
    return np.minimum(ranks.astype(np.int64) - 1, cardinality - 1).clip(0)


def scatter_keys(ranks: np.ndarray, salt: int) -> np.ndarray:
    """Maps ranks to int64 keys spread over the whole int64 space (a bijection per salt)."""
    mixed = ranks.astype(np.uint64) * _SCATTER + np.uint64(salt * 0x632BE59BD9B4E019 % 2**64)
    return mixed.view(np.int64)


def criteo_exponent(cardinality: int) -> float:
    """Per-feature exponent: heavier skew for huge vocabularies, as real logs show."""
    if cardinality < 10_000:
        return 1.1
    if cardinality < 1_000_000:
        return 1.05
    return 1.0


def criteo_keys(rng: np.random.Generator, batch_size: int,
                cardinalities=CRITEO_CARDINALITIES) -> np.ndarray:
    """One Criteo-shaped batch of categorical keys.

    Returns:
      int64 ``[batch_size, len(cardinalities)]``; column j holds feature C(j+1)'s keys.
    """
    cols = [scatter_keys(zipf_ranks(rng, c, criteo_exponent(c), batch_size), salt=j + 1)
            for j, c in enumerate(cardinalities)]
    return np.stack(cols, axis=1)


def key_weight(keys: np.ndarray, salt: int) -> np.ndarray:
    """A hidden per-key effect in about [-1, 1], a fixed function of the key.

    Labels built from it make the generated CTR task learnable by embeddings.
    """
    h = keys.view(np.uint64) * np.uint64(0xBF58476D1CE4E5B9) + np.uint64(salt)
    h ^= h >> np.uint64(31)
    return (h >> np.uint64(11)).astype(np.float64) / float(1 << 53) * 2.0 - 1.0


def ctr_dataset(rng: np.random.Generator, n_rows: int, features: dict[str, tuple[int, int, float]],
                n_labels: int = 2) -> dict[str, np.ndarray]:
    """A CTR data set whose labels depend on the keys through hidden per-key effects.

    Args:
      rng: the generator.
      n_rows: samples.
      features: name -> (ids per sample, cardinality, zipf exponent).
      n_labels: labels ``label_0`` .. ``label_{n-1}``, each from a different hidden effect.

    Returns:
      dict of int64 ``[n_rows, ids]`` key arrays and float32 ``[n_rows]`` 0/1 labels.
    """
    data: dict[str, np.ndarray] = {}
    logits = np.zeros((n_labels, n_rows))
    for j, (name, (ids, cardinality, exponent)) in enumerate(features.items()):
        keys = scatter_keys(zipf_ranks(rng, cardinality, exponent, (n_rows, ids)), salt=j + 101)
        data[name] = keys
        for label in range(n_labels):
            logits[label] += 3.0 * key_weight(keys, salt=label * 7 + j).mean(axis=1)
    for label in range(n_labels):
        p = 1.0 / (1.0 + np.exp(-(logits[label] - 1.0)))
        data[f"label_{label}"] = (rng.random(n_rows) < p).astype(np.float32)
    return data
