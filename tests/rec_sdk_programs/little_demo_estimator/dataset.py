"""The demo's tf.data input: generated batches, sharded by rank, with Rec SDK's batch
timestamp when admission and eviction are on."""

import tensorflow as tf

from random_data_generator import get_data_generator
from mx_rec.util.communication.hccl_ops import get_rank_id, get_rank_size
from mx_rec.util.ops import import_host_pipeline_ops


def generate_dataset(cfg, seed, use_timestamp=False, batch_number=100):
    dataset = tf.compat.v1.data.Dataset.from_generator(
        generator=get_data_generator(cfg.data_params(), seed, batch_number),
        output_types={"item_ids": cfg.key_type,
                      "user_ids": cfg.key_type,
                      "category_ids": cfg.key_type,
                      "label_0": cfg.label_type,
                      "label_1": cfg.label_type},
        output_shapes={"item_ids": tf.TensorShape([cfg.batch_size, cfg.item_feat_cnt]),
                       "user_ids": tf.TensorShape([cfg.batch_size, cfg.user_feat_cnt]),
                       "category_ids": tf.TensorShape([cfg.batch_size, cfg.category_feat_cnt]),
                       "label_0": tf.TensorShape([cfg.batch_size]),
                       "label_1": tf.TensorShape([cfg.batch_size])})
    if use_timestamp:
        dataset = dataset.map(add_timestamp_func)

    rank_size = get_rank_size()
    if rank_size > 1:
        dataset = dataset.shard(rank_size, get_rank_id())
    return dataset


def add_timestamp_func(batch):
    host_pipeline_ops = import_host_pipeline_ops()
    batch["timestamp"] = host_pipeline_ops.return_timestamp(tf.cast(batch["label_0"], tf.int64))
    return batch
