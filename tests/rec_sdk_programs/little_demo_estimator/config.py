"""Switches and sizes of the estimator demo.

The switches are the environment variables of Rec SDK's run.sh for little_demo_estimator
(0 off, any other integer on). The run mode comes from RUN_MODE, or else USE_MODE (the name
run.sh exports). The sizes are CI sizes: batches of 64 rows, a few thousand keys.
"""

import math
import os

import tensorflow as tf

from mx_rec.util.communication.hccl_ops import get_rank_size

GLOBAL_RANDOM_SEED = 128


def _switch(name, default):
    return bool(int(os.getenv(name, default)))


try:
    RUN_MODE = os.getenv("RUN_MODE") or os.getenv("USE_MODE")
    USE_DYNAMIC = _switch("USE_DYNAMIC", 0)
    USE_DYNAMIC_EXPANSION = _switch("USE_DYNAMIC_EXPANSION", 0)
    USE_MULTI_LOOKUP = _switch("USE_MULTI_LOOKUP", 1)
    MULTI_LOOKUP_TIMES = int(os.getenv("MULTI_LOOKUP_TIMES", 2))
    USE_MODIFY_GRAPH = _switch("USE_MODIFY_GRAPH", 0)
    USE_TIMESTAMP = _switch("USE_TIMESTAMP", 0)
    USE_ONE_SHOT = _switch("USE_ONE_SHOT", 0)
    USE_DP = _switch("USE_DP", 0)
    USE_DETERMINISTIC = _switch("USE_DETERMINISTIC", 0)
    USE_EXPORT_SAVED_MODEL = _switch("USE_EXPORT_SAVED_MODEL", 0)
except ValueError as err:
    raise ValueError("USE_DYNAMIC, USE_DYNAMIC_EXPANSION, USE_MULTI_LOOKUP, MULTI_LOOKUP_TIMES, "
                     "USE_MODIFY_GRAPH, USE_TIMESTAMP, USE_ONE_SHOT, USE_DP, USE_DETERMINISTIC "
                     "and USE_EXPORT_SAVED_MODEL take integers (0: off)") from err

CACHE_MODE = os.getenv("CACHE_MODE", "HBM")


class Config:
    def __init__(self):
        rank_size = get_rank_size()
        self.batch_size = 64
        self.key_type = tf.int64
        self.label_type = tf.float32
        # Seeds of the generated streams: training batches, evaluation (and prediction) batches.
        self.data_seed = 5
        self.train_seed = 17
        self.eval_seed = 23

        self.user_range = 3000 * rank_size
        self.item_range = 1500 * rank_size
        self.category_range = 200 * rank_size
        self.user_feat_cnt = 8
        self.item_feat_cnt = 16
        self.category_feat_cnt = 3
        # access_threshold counts occurrences; eviction_threshold is in seconds.
        self.access_threshold = 4
        self.eviction_threshold = 60

        coefficient = 1.1
        self.user_send_cnt = min(int(self.batch_size * self.user_feat_cnt * coefficient),
                                 math.ceil(self.user_range / rank_size))
        self.item_send_cnt = min(int(self.batch_size * self.item_feat_cnt * coefficient),
                                 math.ceil(self.item_range / rank_size))
        self.user_vocab_size = max(self.user_send_cnt * rank_size * rank_size, self.user_range)
        self.item_vocab_size = max(self.item_send_cnt * rank_size * rank_size, self.item_range)

        self.user_hashtable_dim = 32
        self.item_hashtable_dim = 8

    def cache_mode_dict(self):
        """create_table sizes per CACHE_MODE (HBM, DDR, SSD), used for both tables."""
        vocab_size = self.user_vocab_size
        return {
            "HBM": {"device_vocabulary_size": vocab_size, "host_vocabulary_size": 0},
            "DDR": {"device_vocabulary_size": int(vocab_size * 0.4),
                    "host_vocabulary_size": vocab_size},
            "SSD": {"device_vocabulary_size": int(vocab_size * 0.4),
                    "host_vocabulary_size": int(vocab_size * 0.8),
                    "ssd_vocabulary_size": int(vocab_size * 1.8)},
        }

    def data_params(self):
        """What random_data_generator needs to regenerate a stream's batches (written to the
        results, so that a test can recompute them)."""
        names = ("batch_size", "user_range", "item_range", "category_range", "user_feat_cnt",
                 "item_feat_cnt", "category_feat_cnt", "data_seed")
        return {name: getattr(self, name) for name in names}
