"""Sizes, table sizes per cache mode, and the session config of the little demo.

The sizes are small for CI: a batch of 128 rows (64 with more than two extra user lookups),
keys in the thousands. For DDR and SSD the fast tier holds the unique keys of two consecutive
batches of either table, but not those of every batch read ahead (the dataset prefetches 100
batches), so the key pipeline has to wait for room.
"""

import math

import tensorflow as tf
from tensorflow.core.protobuf.rewriter_config_pb2 import RewriterConfig

from mx_rec.util.communication.hccl_ops import get_rank_size

SSD_DATA_PATH = ["ssd_data"]


class Config:
    def __init__(self):
        rank_size = get_rank_size()
        self.batch_size = 128
        self.key_type = tf.int64
        self.label_type = tf.float32
        self.data_seed = 7
        self.train_seed = 11
        self.eval_seed = 13

        self.user_range = 6000 * rank_size
        self.item_range = 3000 * rank_size
        self.category_range = 500 * rank_size
        self.user_feat_cnt = 8
        self.item_feat_cnt = 16
        self.category_feat_cnt = 3
        # access_threshold counts occurrences; eviction_threshold is in seconds.
        self.access_threshold = 2
        self.eviction_threshold = 2

        coefficient = 1.1
        self.user_send_cnt = min(int(self.batch_size * self.user_feat_cnt * coefficient),
                                 math.ceil(self.user_range / rank_size))
        self.item_send_cnt = min(int(self.batch_size * self.item_feat_cnt * coefficient),
                                 math.ceil(self.item_range / rank_size))
        self.user_vocab_size = self.user_range
        self.item_vocab_size = self.item_range

        self.user_hashtable_dim = 32
        self.item_hashtable_dim = 8
        self.learning_rate = 0.01

    def cache_mode_dict(self):
        """create_table sizes per CACHE_MODE, used for both tables (as the demo does)."""
        rank_size = get_rank_size()
        fast_tier = 1600 * rank_size
        return {
            "HBM": {"device_vocabulary_size": 2 * self.user_vocab_size * rank_size,
                    "host_vocabulary_size": 0},
            "DDR": {"device_vocabulary_size": fast_tier,
                    "host_vocabulary_size": 2 * self.user_vocab_size * rank_size},
            "SSD": {"device_vocabulary_size": fast_tier // 2,
                    "host_vocabulary_size": fast_tier // 2,
                    "ssd_vocabulary_size": 2 * self.user_vocab_size * rank_size,
                    "ssd_data_path": SSD_DATA_PATH},
        }

    def data_params(self):
        """What random_data_generator needs to regenerate the batches (also written to the
        results, so that a test can recompute what the tables should hold)."""
        names = ("batch_size", "user_range", "item_range", "category_range", "user_feat_cnt",
                 "item_feat_cnt", "category_feat_cnt", "data_seed")
        return {name: getattr(self, name) for name in names}


def sess_config(dump_data=False, dump_path="./dump_output"):
    """The Ascend session config of a Rec SDK program (the NpuOptimizer options mean nothing
    off Ascend; mx_rec drops them with one warning)."""
    session_config = tf.compat.v1.ConfigProto(allow_soft_placement=False,
                                              log_device_placement=False)
    session_config.gpu_options.allow_growth = True
    custom_op = session_config.graph_options.rewrite_options.custom_optimizers.add()
    custom_op.name = "NpuOptimizer"
    custom_op.parameter_map["mix_compile_mode"].b = False
    custom_op.parameter_map["use_off_line"].b = True
    custom_op.parameter_map["enable_data_pre_proc"].b = True
    custom_op.parameter_map["iterations_per_loop"].i = 1
    custom_op.parameter_map["precision_mode"].s = tf.compat.as_bytes("allow_mix_precision")
    custom_op.parameter_map["hcom_parallel"].b = False
    custom_op.parameter_map["op_execute_timeout"].i = 2000
    if dump_data:
        custom_op.parameter_map["enable_dump"].b = True
        custom_op.parameter_map["dump_path"].s = tf.compat.as_bytes(dump_path)
    session_config.graph_options.rewrite_options.remapping = RewriterConfig.OFF
    session_config.graph_options.rewrite_options.memory_optimization = RewriterConfig.OFF
    return session_config
