"""A program in the shape of Rec SDK's WideDeep example (examples/WideDeep/main_mxrec.py),
written for sparseflow's tests: its mx_rec calls in its order, FeatureSpec mode, on
generated Criteo-like TFRecords.

    DATA_PATH=<dir with train/*.tfrecord, test/*.tfrecord>  CACHE_MODE=HBM|DDR|SSD
    USE_FAAE=0|1  USE_MULTI_LOOKUP=0|1  USE_DYNAMIC=0|1  python main.py

Beside the dlrm example's calls, WideDeep looks the same ids (the integer dense features
appended to the sparse ones) up in two tables, ``wide_embeddings`` and ``deep_embeddings``,
maps ``dataset.eos_map(import_host_pipeline_ops(LIBREC_EOS_OPS_SO), channel,
max_train_steps, eval_steps)`` before the insert function, and computes the tables' gradients
with the sparse optimizer's ``compute_gradients``.

What differs from the example, and why:
- No ``from npu_bridge.npu_init import *`` (Ascend's TF adapter, not mx_rec): so no
  ``npu_plugin.set_device_sat_mode(0)`` and no ``util.set_iteration_per_loop(sess, op, 10)``
  (one session run is one step here); ``hccl_ops`` comes from mx_rec.util.tf_version_adapter.
- No sklearn (``roc_auc_score``): the evaluation reports the mean log loss.
- ``tf.train.Saver`` is TF 1's name; TF 2.21 has only ``tf.compat.v1.train.Saver``.
- The local loss-scale wrappers are left out: the example's ``SparseLossScaleOptimizer``
  returns plain gradients from ``compute_gradients``; mx_rec's lazy Adam returns
  (gradient, table) pairs, as TF's optimizers do, and those pairs are applied.
- The sparse optimizer gets the schedule's base rate, not the schedule's tensor: sparseflow's
  sparse optimizers take a constant learning rate (their updates run outside the TF graph).
- FeatureSpec mode only, without dynamic expansion: the example's graph-modification and
  expansion branches are left out (the little demo's program runs those modes).
It writes results.json: the loss of every step, the evaluation losses, and each table's
size and capacity after the last step.
"""

import json
import os
import shutil
import warnings
from glob import glob

import tensorflow as tf

from mx_rec.constants.constants import ASCEND_TIMESTAMP, LIBREC_EOS_OPS_SO, CacheModeEnum
from mx_rec.core.asc.helper import FeatureSpec, get_asc_insert_func
from mx_rec.core.asc.manager import start_asc_pipeline
from mx_rec.core.embedding import create_table, sparse_lookup
from mx_rec.core.feature_process import EvictHook
from mx_rec.optimizers.lazy_adam import create_hash_optimizer
from mx_rec.util.initialize import ConfigInitializer, init, terminate_config_initializer
from mx_rec.util.log import logger
from mx_rec.util.ops import import_host_pipeline_ops
from mx_rec.util.tf_version_adapter import hccl_ops
from mx_rec.util.variable import get_dense_and_sparse_variable
import mx_rec.util as mxrec_util

tf.compat.v1.disable_eager_execution()

SEED = 128
SSD_DATA_PATH = ["ssd_data"]


class Config:
    def __init__(self):
        self.data_path = os.getenv("DATA_PATH")
        if not self.data_path:
            raise ValueError("set DATA_PATH to the directory holding train/ and test/")
        self.cache_mode = os.getenv("CACHE_MODE")
        if self.cache_mode not in [m.value for m in CacheModeEnum]:
            raise ValueError(f"CACHE_MODE must be HBM, DDR or SSD, got {self.cache_mode!r}")
        self.rank_size = mxrec_util.communication.hccl_ops.get_rank_size()
        self.rank_id = mxrec_util.communication.hccl_ops.get_rank_id()
        self.line_per_sample = 8
        self.batch_size = 256
        self.key_type = tf.int64
        self.emb_dim = 8
        self.field_num, self.dense_num = 26, 13
        self.send_count = self.batch_size * (self.field_num + self.dense_num) // self.rank_size
        self.dev_vocab_size = 20000 * self.rank_size
        self.global_step = tf.Variable(0, trainable=False)
        self.base_lr_dense, self.base_lr_sparse = 0.02, 0.02
        warmup = tf.minimum(1.0, tf.cast(self.global_step + 1, tf.float32) / 5.0)
        self.learning_rate = [self.base_lr_dense * warmup, self.base_lr_sparse * warmup]

    def get_emb_table_cfg(self):
        if self.cache_mode == CacheModeEnum.HBM.value:
            return {"device_vocabulary_size": self.dev_vocab_size}
        if self.cache_mode == CacheModeEnum.DDR.value:
            return {"device_vocabulary_size": self.dev_vocab_size // 2,
                    "host_vocabulary_size": self.dev_vocab_size}
        return {"device_vocabulary_size": self.dev_vocab_size // 2,
                "host_vocabulary_size": self.dev_vocab_size // 2,
                "ssd_vocabulary_size": self.dev_vocab_size, "ssd_data_path": SSD_DATA_PATH}


def sess_config():
    config = tf.compat.v1.ConfigProto(allow_soft_placement=False, log_device_placement=False)
    custom_op = config.graph_options.rewrite_options.custom_optimizers.add()
    custom_op.name = "NpuOptimizer"
    custom_op.parameter_map["iterations_per_loop"].i = 10
    custom_op.parameter_map["HCCL_algorithm"].s = tf.compat.as_bytes("level0:fullmesh")
    return config


class MyModel:
    """Wide: the sum over the ids of their wide embeddings' mean; deep: an MLP over the deep
    embeddings."""

    def build_model(self, wide_embedding, deep_embedding, label, is_training, seed):
        with tf.compat.v1.variable_scope("wide_deep", reuse=tf.compat.v1.AUTO_REUSE):
            wide_logit = tf.reduce_sum(tf.reduce_mean(wide_embedding, axis=2), axis=1)[:, None]
            deep = tf.reshape(deep_embedding,
                              [-1, deep_embedding.shape[1] * deep_embedding.shape[2]])
            deep = tf.compat.v1.layers.dense(deep, 32, tf.nn.relu, name="deep_0",
                                             kernel_initializer=
                                             tf.compat.v1.glorot_uniform_initializer(seed))
            logit = wide_logit + tf.compat.v1.layers.dense(deep, 1, name="deep_logit")
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
            labels=tf.cast(label, tf.float32), logits=logit))
        return {"loss": loss, "pred": tf.sigmoid(logit), "label": label}


def add_timestamp_func(batch):
    batch["timestamp"] = import_host_pipeline_ops().return_timestamp(
        tf.cast(batch["label"], dtype=tf.int64))
    return batch


def make_batch_and_iterator(config, feature_spec_list, is_training, dump_graph,
                            is_use_faae=False):
    def extract_fn(data_record):
        features = {
            "label": tf.compat.v1.FixedLenFeature((config.line_per_sample,), tf.int64),
            "sparse_feature": tf.compat.v1.FixedLenFeature(
                (config.field_num * config.line_per_sample,), tf.int64),
            "dense_feature": tf.compat.v1.FixedLenFeature(
                (config.dense_num * config.line_per_sample,), tf.int64)}
        return tf.compat.v1.parse_single_example(data_record, features)

    def reshape_fn(batch):
        batch["label"] = tf.reshape(batch["label"], [-1, 1])
        batch["dense_feature"] = tf.reshape(batch["dense_feature"], [-1, config.dense_num])
        batch["sparse_feature"] = tf.reshape(batch["sparse_feature"], [-1, config.field_num])
        return batch

    def map_fn(batch):
        # The integer dense features are ids too: both tables look them up.
        batch["sparse_feature"] = tf.concat([batch["dense_feature"], batch["sparse_feature"]],
                                            axis=1)
        return batch

    pattern = "train" if is_training else "test"
    files_list = sorted(glob(os.path.join(config.data_path, pattern) + "/*.tfrecord"))
    dataset = tf.data.TFRecordDataset(files_list)
    dataset = dataset.shard(config.rank_size, config.rank_id)
    if is_training:
        dataset = dataset.shuffle(1000, seed=SEED)
    dataset = dataset.map(extract_fn).batch(config.batch_size // config.line_per_sample,
                                            drop_remainder=True)
    dataset = dataset.map(reshape_fn)
    dataset = dataset.map(map_fn)
    if is_use_faae:
        dataset = dataset.map(add_timestamp_func)
    # The end-of-sequence map comes before the insert function, as in the example.
    librec = import_host_pipeline_ops(LIBREC_EOS_OPS_SO)
    channel_id = 0 if is_training else 1
    dataset = dataset.eos_map(librec, channel_id, max_train_steps, eval_steps)
    insert_fn = get_asc_insert_func(tgt_key_specs=feature_spec_list, is_training=is_training,
                                    dump_graph=dump_graph)
    dataset = dataset.map(insert_fn)
    dataset = dataset.prefetch(100)
    iterator = dataset.make_initializable_iterator()
    return iterator.get_next(), iterator


def model_forward(feature_list, wide_hash_table_list, deep_hash_table_list, batch, is_train,
                  is_use_faae):
    specs = feature_list[:-1] if is_use_faae else feature_list   # the timestamp spec last
    wide_feature_list, deep_feature_list = specs[0::2], specs[1::2]
    wide_embedding_list, deep_embedding_list = [], []
    for wide_feature, wide_hash_table in zip(wide_feature_list, wide_hash_table_list):
        wide_embedding_list.append(sparse_lookup(
            wide_hash_table, wide_feature, cfg.send_count, dim=None, is_train=is_train,
            name="wide_embedding_lookup", modify_graph=False, batch=batch,
            access_and_evict_config=None))
    for deep_feature, deep_hash_table in zip(deep_feature_list, deep_hash_table_list):
        deep_embedding_list.append(sparse_lookup(
            deep_hash_table, deep_feature, cfg.send_count, dim=None, is_train=is_train,
            name="deep_embedding_lookup", modify_graph=False, batch=batch,
            access_and_evict_config=None))
    if len(wide_embedding_list) == 1:
        wide_emb, deep_emb = wide_embedding_list[0], deep_embedding_list[0]
    else:
        wide_emb = tf.reduce_sum(wide_embedding_list, axis=0)
        deep_emb = tf.reduce_sum(deep_embedding_list, axis=0)
    return MyModel().build_model(wide_emb, deep_emb, batch["label"], is_train, SEED)


def evaluate():
    sess.run([eval_iterator.initializer])
    losses = []
    while len(losses) < eval_steps:
        try:
            losses.append(float(sess.run(eval_model["loss"])))
        except tf.errors.OutOfRangeError:
            break
    return sum(losses) / len(losses)


def create_feature_spec_list(use_timestamp=False):
    access_threshold = 3 if use_timestamp else None
    eviction_threshold = 180 if use_timestamp else None
    tables = ["wide_embeddings", "deep_embeddings"] * (2 if use_multi_lookup else 1)
    feature_spec_list = [FeatureSpec("sparse_feature", table_name=table,
                                     batch_size=cfg.batch_size,
                                     access_threshold=access_threshold,
                                     eviction_threshold=eviction_threshold) for table in tables]
    if use_timestamp:
        feature_spec_list.append(FeatureSpec("timestamp", is_timestamp=True))
    return feature_spec_list


def get_dense_and_sparse_optimizer(config):
    dense_optimizer = tf.compat.v1.train.AdamOptimizer(config.learning_rate[0])
    sparse_optimizer = create_hash_optimizer(learning_rate=config.base_lr_sparse)
    return dense_optimizer, sparse_optimizer


if __name__ == "__main__":
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
    warnings.filterwarnings("ignore")
    if os.getenv("CACHE_MODE") == CacheModeEnum.SSD.value:
        for sub_path in SSD_DATA_PATH:
            shutil.rmtree(sub_path, ignore_errors=True)
            os.makedirs(sub_path, exist_ok=True)

    max_train_steps = 40
    train_steps = 20   # evaluate every train_steps steps
    eval_steps = 5
    use_multi_lookup = bool(int(os.getenv("USE_MULTI_LOOKUP", 0)))
    use_faae = bool(int(os.getenv("USE_FAAE", 0)))
    use_dynamic = bool(int(os.getenv("USE_DYNAMIC", 0)))
    init(train_steps=train_steps, eval_steps=eval_steps, use_dynamic=use_dynamic)
    ConfigInitializer.get_instance().if_load = bool(glob("./saved-model/sparse-model-0"))

    cfg = Config()
    feature_spec_list_train = create_feature_spec_list(use_timestamp=use_faae)
    feature_spec_list_eval = create_feature_spec_list(use_timestamp=use_faae)
    train_batch, train_iterator = make_batch_and_iterator(cfg, feature_spec_list_train, True,
                                                          dump_graph=True, is_use_faae=use_faae)
    eval_batch, eval_iterator = make_batch_and_iterator(cfg, feature_spec_list_eval, False,
                                                        dump_graph=False, is_use_faae=use_faae)
    if use_faae:
        cfg.dev_vocab_size = cfg.dev_vocab_size // 2

    optimizer_list = [get_dense_and_sparse_optimizer(cfg)]
    wide_emb_initializer = tf.compat.v1.truncated_normal_initializer(stddev=0.05, seed=SEED)
    deep_emb_initializer = tf.compat.v1.truncated_normal_initializer(stddev=0.05, seed=SEED)
    sparse_hashtable_wide = create_table(key_dtype=cfg.key_type,
                                         dim=tf.TensorShape([cfg.emb_dim]),
                                         name="wide_embeddings",
                                         emb_initializer=wide_emb_initializer,
                                         **cfg.get_emb_table_cfg())
    sparse_hashtable_deep = create_table(key_dtype=cfg.key_type,
                                         dim=tf.TensorShape([cfg.emb_dim]),
                                         name="deep_embeddings",
                                         emb_initializer=deep_emb_initializer,
                                         **cfg.get_emb_table_cfg())
    if use_faae:
        tf.compat.v1.add_to_collection(ASCEND_TIMESTAMP, train_batch["timestamp"])

    lookups = 2 if use_multi_lookup else 1
    wide_hashtable_list = [sparse_hashtable_wide] * lookups
    deep_hashtable_list = [sparse_hashtable_deep] * lookups
    train_model = model_forward(feature_spec_list_train, wide_hashtable_list,
                                deep_hashtable_list, train_batch, True, use_faae)
    eval_model = model_forward(feature_spec_list_eval, wide_hashtable_list,
                               deep_hashtable_list, eval_batch, False, use_faae)

    train_variables, emb_variables = get_dense_and_sparse_variable()
    rank_size = mxrec_util.communication.hccl_ops.get_rank_size()
    train_ops = []
    for loss, (model_optimizer, emb_optimizer) in zip([train_model["loss"]], optimizer_list):
        grads = model_optimizer.compute_gradients(loss, var_list=train_variables)
        avg_grads = []
        for grad, var in grads:
            if rank_size > 1:
                grad = hccl_ops.allreduce(grad, "sum") if grad is not None else None
            if grad is not None:
                avg_grads.append((grad, var))
        train_ops.append(model_optimizer.apply_gradients(avg_grads))
        grads_and_vars = emb_optimizer.compute_gradients(loss, emb_variables)
        train_ops.append(emb_optimizer.apply_gradients(grads_and_vars))
    # The learning rates follow the global step.
    train_ops.extend([cfg.global_step.assign(cfg.global_step + 1), cfg.learning_rate[0],
                      cfg.learning_rate[1]])
    with tf.control_dependencies(train_ops):
        train_ops = tf.no_op()

    saver = tf.compat.v1.train.Saver()   # built, never used, as in the example
    start_asc_pipeline()

    if use_faae:
        hook_list = [EvictHook(evict_enable=True, evict_time_interval=120)]
        sess = tf.compat.v1.train.MonitoredTrainingSession(hooks=hook_list, config=sess_config())
        sess.graph._unsafe_unfinalize()
    else:
        sess = tf.compat.v1.Session(config=sess_config())
        sess.run(tf.compat.v1.global_variables_initializer())
    sess.run(train_iterator.initializer)

    results = {"train_loss": [], "eval_loss": [], "table_size": {}, "table_capacity": {}}
    i = 0
    while True:
        i += 1
        try:
            _, loss = sess.run([train_ops, train_model["loss"]])
            lr = sess.run(cfg.learning_rate)
        except tf.errors.OutOfRangeError:
            logger.info("Encounter the end of Sequence for training.")
            break
        results["train_loss"].append(float(loss))
        for table in (sparse_hashtable_wide, sparse_hashtable_deep):
            logger.info(f"step {i}: loss {loss}, lr {lr}, table[{table.table_name}] size "
                        f"{table.size()}, capacity {table.capacity()}")
            results["table_size"][table.table_name] = int(table.size())
            results["table_capacity"][table.table_name] = int(table.capacity())
        if i % train_steps == 0:
            results["eval_loss"].append(evaluate())

    sess.close()
    # Whole, even where several ranks write it in one directory: the last one's.
    with open(f"results.json.{os.getpid()}", "w") as f:
        json.dump(results, f)
    os.replace(f"results.json.{os.getpid()}", "results.json")
    terminate_config_initializer()
    logger.info("Demo done!")
