"""The demo's model: the pooled embeddings of every lookup, concatenated, through a small MLP
with two heads (one loss per label)."""

import tensorflow as tf

SEED = 128


class MyModel:
    def __init__(self):
        self.layer_dims = [64, 32]
        self.loss_list = []
        self.predict_list = []
        self.h_w, self.h_b = [], []
        self.heads = []

    def __call__(self, embedding_list, label_0, label_1):
        with tf.compat.v1.variable_scope("mlp", reuse=tf.compat.v1.AUTO_REUSE):
            embedding = tf.concat(embedding_list, axis=1)
            dims = [embedding.shape.as_list()[-1]] + self.layer_dims
            for i in range(len(dims) - 1):
                self.h_w.append(tf.compat.v1.get_variable(
                    "h%d_w" % (i + 1), shape=dims[i:i + 2], dtype=tf.float32,
                    initializer=tf.random_uniform_initializer(-0.05, 0.05, SEED),
                    collections=[tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, "deep", "mlp_wts"]))
                self.h_b.append(tf.compat.v1.get_variable(
                    "h%d_b" % (i + 1), shape=[dims[i + 1]], dtype=tf.float32,
                    initializer=tf.zeros_initializer,
                    collections=[tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, "deep", "mlp_bias"]))
            for head in range(2):
                self.heads.append((
                    tf.compat.v1.get_variable(
                        "h_w_head_%d" % head, shape=[dims[-1], 1], dtype=tf.float32,
                        initializer=tf.random_uniform_initializer(-0.05, 0.05, SEED),
                        collections=[tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, "deep", "mlp_wts"]),
                    tf.compat.v1.get_variable(
                        "h_b_head_%d" % head, shape=[1], dtype=tf.float32,
                        initializer=tf.zeros_initializer,
                        collections=[tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, "deep", "mlp_bias"])))

            hidden = embedding
            for w, b in zip(self.h_w, self.h_b):
                hidden = tf.nn.relu(tf.matmul(hidden, w) + b)
            for (w, b), label in zip(self.heads, (label_0, label_1)):
                logit = tf.reshape(tf.matmul(hidden, w) + b, [-1])
                self.predict_list.append(tf.sigmoid(logit))
                self.loss_list.append(tf.reduce_mean(
                    tf.nn.sigmoid_cross_entropy_with_logits(logits=logit, labels=label)))
