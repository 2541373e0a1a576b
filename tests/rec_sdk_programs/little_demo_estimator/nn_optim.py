"""The training op: Adam on the dense variables (all-reduced over ranks), Rec SDK's hash SGD on
the tables (by address under dynamic expansion), and the global step's increment."""

import tensorflow as tf

from mx_rec.optimizers.gradient_descent import create_hash_optimizer
from mx_rec.optimizers.gradient_descent_by_addr import create_hash_optimizer_by_addr
from mx_rec.util.communication.hccl_ops import get_rank_size
from mx_rec.util.initialize import ConfigInitializer
from mx_rec.util.log import logger
from mx_rec.util.tf_version_adapter import hccl_ops
from mx_rec.util.variable import get_dense_and_sparse_variable


def get_train_op_list(losses, learning_rate, sparse_learning_rate):
    train_ops_list = []
    update_ops = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
    name = None

    dense_optimizer = tf.compat.v1.train.AdamOptimizer(learning_rate=learning_rate)
    use_dynamic_expansion = ConfigInitializer.get_instance().use_dynamic_expansion
    if use_dynamic_expansion:
        sparse_optimizer = create_hash_optimizer_by_addr(learning_rate=sparse_learning_rate)
        logger.info("sparse optimizer: gradient_descent_by_addr")
    else:
        sparse_optimizer = create_hash_optimizer(learning_rate=sparse_learning_rate)
        logger.info("sparse optimizer: gradient_descent")

    dense_variables, sparse_variables = get_dense_and_sparse_variable()
    # A list holding the list of dense variables, as the demo passes it.
    trainable_variables = [dense_variables]

    for name, loss in losses:
        with tf.control_dependencies(update_ops):
            grads = dense_optimizer.compute_gradients(loss, var_list=trainable_variables)
            dense_grads = grads[:len(dense_variables)]
            avg_grads = []
            for grad, var in dense_grads:
                if get_rank_size() > 1:
                    grad = hccl_ops.allreduce(grad, "sum") if grad is not None else None
                if grad is not None:
                    avg_grads.append((grad, var))
            train_ops_list.append(dense_optimizer.apply_gradients(avg_grads,
                                                                  name="dense_optimizer"))

            if use_dynamic_expansion:
                from mx_rec.constants.constants import (ASCEND_SPARSE_LOOKUP_LOCAL_EMB,
                                                        ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS)
                local_emb_list = tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
                address_list = tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS)
                local_grads = tf.gradients(loss, local_emb_list)
                grads_and_vars = list(zip(local_grads, address_list))
                train_ops_list.append(sparse_optimizer.apply_gradients(
                    grads_and_vars, name="hashtable_optimizer"))
            else:
                sparse_grads = tf.gradients(loss, sparse_variables)
                grads_and_vars = list(zip(sparse_grads, sparse_variables))
                train_ops_list.append(sparse_optimizer.apply_gradients(
                    grads_and_vars, name="sparse_optimizer"))

    train_ops_list.append(tf.compat.v1.assign_add(tf.compat.v1.train.get_global_step(), 1))
    return train_ops_list, name


def get_train_op(params, losses):
    op_list, name = get_train_op_list(losses, params.learning_rate, params.sparse_learning_rate)
    train_op = tf.group(*op_list, name=name + "_train")
    return tf.group(*([loss for _, loss in losses] + [train_op]))
