"""Generated click data: Zipf-skewed keys (a few keys in most rows, many seen once) and two
labels that depend on hidden per-key weights, so that the embeddings have something to learn.

numpy only, and each batch a function of (data seed, stream seed, batch index), so that a test
can regenerate the batches a run read.
"""

import numpy as np


def _keys(rng, key_range, shape, permutation):
    # Zipf ranks folded into the range, then mapped to keys by a fixed permutation (the
    # popular keys are not the small ones).
    ranks = (rng.zipf(1.2, size=shape) - 1) % key_range
    return permutation[ranks]


def make_batch(params, seed, index):
    """Batch ``index`` of stream ``seed``.

    Args:
      params: dict with ``batch_size``, ``user_range``, ``item_range``, ``category_range``,
        ``user_feat_cnt``, ``item_feat_cnt``, ``category_feat_cnt``, ``data_seed``.
      seed: the stream's seed.
      index: the batch's position in the stream.

    Returns:
      dict: ``user_ids`` int64 [B, user_feat_cnt], ``item_ids`` int64 [B, item_feat_cnt],
      ``category_ids`` int64 [B, category_feat_cnt], ``label_0`` / ``label_1`` float32 [B].
    """
    world = np.random.default_rng(params["data_seed"])
    user_perm = world.permutation(params["user_range"])
    item_perm = world.permutation(params["item_range"])
    user_weight = world.normal(0.0, 1.0, params["user_range"])
    item_weight = world.normal(0.0, 1.0, params["item_range"])

    rng = np.random.default_rng([seed, index])
    size = params["batch_size"]
    user_ids = _keys(rng, params["user_range"], (size, params["user_feat_cnt"]), user_perm)
    item_ids = _keys(rng, params["item_range"], (size, params["item_feat_cnt"]), item_perm)
    category_ids = rng.integers(0, params["category_range"], (size, params["category_feat_cnt"]))
    user_score = user_weight[user_ids].mean(axis=1)
    item_score = item_weight[item_ids].mean(axis=1)
    label_0 = rng.random(size) < 1.0 / (1.0 + np.exp(-4.0 * (user_score + item_score)))
    label_1 = rng.random(size) < 1.0 / (1.0 + np.exp(-4.0 * user_score))
    return {"item_ids": item_ids.astype(np.int64), "user_ids": user_ids.astype(np.int64),
            "category_ids": category_ids.astype(np.int64),
            "label_0": label_0.astype(np.float32), "label_1": label_1.astype(np.float32)}


def get_data_generator(params, seed, batch_number):
    """A generator function yielding batches 0 .. batch_number - 1 of stream ``seed``."""

    def data_generator():
        for index in range(batch_number):
            yield make_batch(params, seed, index)

    return data_generator
