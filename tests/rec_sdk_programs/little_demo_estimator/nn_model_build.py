"""LittleModel: the demo's two tables (user dim 32, item dim 8), their lookups (one per
feature, plus MULTI_LOOKUP_TIMES more of user_ids), sum-pooled and concatenated, through an
MLP with two heads, one per label. The tables are created here, inside model_fn: once per
graph the Estimator builds."""

import tensorflow as tf

from mx_rec.constants.constants import CacheModeEnum
from mx_rec.core.embedding import create_table, sparse_lookup
from mx_rec.util.initialize import ConfigInitializer
from mx_rec.util.log import logger
from mx_rec.util.tf_version_adapter import npu_ops

from config import CACHE_MODE, MULTI_LOOKUP_TIMES, USE_DP, USE_MODIFY_GRAPH, USE_MULTI_LOOKUP
from utils import FeatureSpecIns


class LittleModel:
    def __init__(self, cfg, mode, features, access_and_evict_config_dict=None):
        self.layer_dims = [256, 128, 64]
        self.act_func = "relu"
        self.keep_prob = 0.8
        self.emb_dim = None
        self.all_layer_dims = None
        self.h_w, self.h_b = [], []
        self.heads = []
        self.loss_list = []
        self.predict_list = []
        self.table_list = []

        self.is_train = mode == tf.estimator.ModeKeys.TRAIN
        self.cfg = cfg
        self.features = features
        self.access_and_evict_config_dict = access_and_evict_config_dict

    @staticmethod
    def activate(act_func, input_x):
        if act_func == "tanh":
            return tf.tanh(input_x)
        if act_func == "relu":
            return tf.nn.relu(input_x)
        return tf.sigmoid(input_x)

    def _variable(self, name, shape, initializer, kind):
        return tf.compat.v1.get_variable(
            name, shape=shape, initializer=initializer, dtype=tf.float32,
            collections=[tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, "deep", kind])

    def inference(self, label_0, label_1):
        with tf.compat.v1.variable_scope("mlp", reuse=tf.compat.v1.AUTO_REUSE):
            embedding = tf.concat(self._get_embedding_list(), axis=1)
            self.emb_dim = embedding.shape.as_list()[-1]
            self.all_layer_dims = [self.emb_dim] + self.layer_dims + [1]

            uniform = tf.compat.v1.random_uniform_initializer(-0.05, 0.05)
            for i in range(len(self.all_layer_dims) - 2):
                self.h_w.append(self._variable("h%d_w" % (i + 1), self.all_layer_dims[i:i + 2],
                                               uniform, "mlp_wts"))
                self.h_b.append(self._variable("h%d_b" % (i + 1), [self.all_layer_dims[i + 1]],
                                               tf.compat.v1.zeros_initializer, "mlp_bias"))
            last = self.all_layer_dims[-2:]
            for head in range(2):
                self.heads.append((
                    self._variable("h_w_head_%d" % head, last, uniform, "mlp_wts"),
                    self._variable("h_b_head_%d" % head, [1], tf.compat.v1.zeros_initializer,
                                   "mlp_bias")))

            for logit, label in zip(self._forward(embedding), (label_0, label_1)):
                self.predict_list.append(tf.sigmoid(logit))
                self.loss_list.append(
                    tf.nn.sigmoid_cross_entropy_with_logits(logits=logit, labels=label))
            loss = tf.reduce_mean(self.loss_list, keepdims=False)
            return loss, self.predict_list

    def _layer(self, hidden, weight):
        hidden = self.activate(self.act_func, hidden)
        if self.is_train:
            hidden = npu_ops.dropout(hidden, keep_prob=self.keep_prob)
        return tf.matmul(hidden, weight)

    def _forward(self, embedding):
        # As the demo: the concatenated embeddings go through activation (and, in training,
        # dropout) before each layer, the first included.
        hidden = tf.reshape(embedding, [-1, self.emb_dim])
        for weight, bias in zip(self.h_w, self.h_b):
            hidden = self._layer(hidden, weight) + bias
        return [tf.reshape(self._layer(hidden, weight) + bias, [-1])
                for weight, bias in self.heads]

    def _get_embedding_list(self):
        cache_mode_dict = self.cfg.cache_mode_dict()
        if CACHE_MODE not in cache_mode_dict:
            raise ValueError(f"CACHE_MODE must be one of {list(cache_mode_dict)}, "
                             f"got {CACHE_MODE!r}")
        if CACHE_MODE in (CacheModeEnum.DDR.value, CacheModeEnum.SSD.value) and \
                ConfigInitializer.get_instance().use_static:
            logger.warning("CACHE_MODE %s: use_dynamic=1 avoids tuning the send counts",
                           CACHE_MODE)

        user_hashtable = create_table(key_dtype=tf.int64,
                                      dim=tf.TensorShape([self.cfg.user_hashtable_dim]),
                                      name="user_table",
                                      emb_initializer=tf.compat.v1.truncated_normal_initializer(),
                                      is_dp=USE_DP,
                                      **cache_mode_dict[CACHE_MODE])
        item_hashtable = create_table(key_dtype=tf.int64,
                                      dim=tf.TensorShape([self.cfg.item_hashtable_dim]),
                                      name="item_table",
                                      emb_initializer=tf.compat.v1.truncated_normal_initializer(),
                                      **cache_mode_dict[CACHE_MODE])
        self.table_list = [user_hashtable, item_hashtable]

        if USE_MODIFY_GRAPH:
            feature_list = [self.features["user_ids"], self.features["item_ids"]]
        elif self.is_train:
            feature_list = list(FeatureSpecIns.get_instance().get_train_feature_spec_list())
        else:
            feature_list = list(FeatureSpecIns.get_instance().get_eval_feature_spec_list())
        table_list = [user_hashtable, item_hashtable]
        send_count_list = [self.cfg.user_send_cnt, self.cfg.item_send_cnt]
        is_grad_list = [True, True]
        if USE_MULTI_LOOKUP:
            if USE_MODIFY_GRAPH:
                feature_list.extend([self.features["user_ids"]] * MULTI_LOOKUP_TIMES)
            # (FeatureSpec mode: the extra user specs are in the spec list already.)
            table_list.extend([user_hashtable] * MULTI_LOOKUP_TIMES)
            send_count_list.extend([self.cfg.user_send_cnt] * MULTI_LOOKUP_TIMES)
            is_grad_list.extend([False] * MULTI_LOOKUP_TIMES)

        embedding_list = []
        for feature, hash_table, send_count, is_grad in zip(feature_list, table_list,
                                                            send_count_list, is_grad_list):
            access_and_evict_config = None
            if isinstance(self.access_and_evict_config_dict, dict):
                access_and_evict_config = self.access_and_evict_config_dict.get(
                    hash_table.table_name)
            embedding = sparse_lookup(hash_table, feature, send_count, dim=None,
                                      is_train=self.is_train, is_grad=is_grad,
                                      name=hash_table.table_name + "_lookup",
                                      modify_graph=USE_MODIFY_GRAPH,
                                      access_and_evict_config=access_and_evict_config,
                                      batch=self.features)
            embedding_list.append(tf.reduce_sum(embedding, axis=1, keepdims=False))
        return embedding_list
