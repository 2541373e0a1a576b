"""Generated click data for the little demo: skewed key popularity, labels learnable from the
keys (each key has a hidden weight), reproducible from a seed and a batch index.

numpy only, so that a test can regenerate exactly the batches a run trained on.
"""

import numpy as np


def _popularity(key_range, exponent):
    weights = 1.0 / np.arange(1, key_range + 1) ** exponent
    return weights / weights.sum()


def make_batch(params, seed, index):
    """One batch as a dict of numpy arrays.

    Args:
      params: dict with ``batch_size``, ``user_range``, ``item_range``, ``category_range``,
        ``user_feat_cnt``, ``item_feat_cnt``, ``category_feat_cnt``, ``data_seed``.
      seed: the stream's seed (training and evaluation use different ones).
      index: the batch's position in the stream.

    Returns:
      ``user_ids`` int64 [B, user_feat_cnt], ``item_ids`` int64 [B, item_feat_cnt],
      ``category_ids`` int64 [B, category_feat_cnt], ``label_0``/``label_1`` float32 [B].
    """
    world = np.random.default_rng(params["data_seed"])
    # Which key is popular, and what each key says about the labels, is fixed per data seed.
    user_keys = world.permutation(params["user_range"])
    item_keys = world.permutation(params["item_range"])
    user_weight = world.normal(size=params["user_range"])
    item_weight = world.normal(size=params["item_range"])

    rng = np.random.default_rng([seed, index])
    size = params["batch_size"]
    user_ids = user_keys[rng.choice(params["user_range"], (size, params["user_feat_cnt"]),
                                    p=_popularity(params["user_range"], 1.0))]
    item_ids = item_keys[rng.choice(params["item_range"], (size, params["item_feat_cnt"]),
                                    p=_popularity(params["item_range"], 1.0))]
    category_ids = rng.integers(0, params["category_range"], (size, params["category_feat_cnt"]))
    user_score = user_weight[user_ids].sum(axis=1) / np.sqrt(params["user_feat_cnt"])
    item_score = item_weight[item_ids].sum(axis=1) / np.sqrt(params["item_feat_cnt"])
    logit_0 = 2.0 * (user_score + item_score)
    logit_1 = 2.0 * user_score
    label_0 = rng.random(size) < 1.0 / (1.0 + np.exp(-logit_0))
    label_1 = rng.random(size) < 1.0 / (1.0 + np.exp(-logit_1))
    return {"user_ids": user_ids.astype(np.int64), "item_ids": item_ids.astype(np.int64),
            "category_ids": category_ids.astype(np.int64),
            "label_0": label_0.astype(np.float32), "label_1": label_1.astype(np.float32)}


def get_data_generator(params, seed, batch_number):
    """A generator function yielding ``batch_number`` batches of ``make_batch``."""

    def data_generator():
        for index in range(batch_number):
            yield make_batch(params, seed, index)

    return data_generator
