"""Training, evaluation and prediction loops of the little demo, and what a run records
(``RunMode.results``, written to results.json by main.py)."""

import glob
import os
import re

import tensorflow as tf

from config import sess_config
from mx_rec.constants.constants import ApplyGradientsStrategy, BaseEnum
from mx_rec.graph.modifier import modify_graph_and_start_emb_cache
from mx_rec.util.initialize import ConfigInitializer, clear_channel, get_rank_id, get_rank_size
from mx_rec.util.log import logger
from mx_rec.util.tf_version_adapter import hccl_ops
from mx_rec.util.variable import get_dense_and_sparse_variable

SAVE_DIR = "./saved-model"


class UseMode(BaseEnum):
    TRAIN = "train"
    PREDICT = "predict"


class RunMode:
    def __init__(self, is_modify_graph, is_faae, table_list, optimizer_list, train_model,
                 eval_model, train_iterator, eval_iterator, max_train_steps, infer_steps, params):
        self.is_modify_graph = is_modify_graph
        self.is_faae = is_faae
        self.session = tf.compat.v1.Session(config=sess_config(dump_data=False))
        self.train_model = train_model
        self.train_iterator = train_iterator
        self.eval_model = eval_model
        self.eval_iterator = eval_iterator
        self.rank_id = get_rank_id()
        self.train_ops = []
        self.table_list = table_list
        self.optimizer_list = optimizer_list
        self.epoch = 1
        self.max_train_steps = max_train_steps
        self.infer_steps = infer_steps
        self.use_one_shot = params.get("use_one_shot")
        self.saver = None
        self.results = {"train_loss": [], "eval_loss": [], "saved": [], "restored": None,
                        "set_threshold": None,
                        "table_size": {t.table_name: [] for t in table_list},
                        "table_capacity": {t.table_name: [] for t in table_list}}

    def _initializer(self, is_training):
        if not self.is_modify_graph:
            return (self.train_iterator if is_training else self.eval_iterator).initializer
        return ConfigInitializer.get_instance().train_params_config.get_initializer(is_training)

    def _infer(self):
        if not self.use_one_shot:
            self.session.run(self._initializer(False))
        else:
            logger.debug("one-shot iterator, modify graph: %s", self.is_modify_graph)
        clear_channel(is_train_channel=False)

        losses = []
        for i in range(1, self.infer_steps + 1):
            logger.info("infer at step %d", i)
            try:
                losses.append([float(v) for v in self.session.run(self.eval_model.loss_list)])
            except tf.errors.OutOfRangeError:
                logger.info("end of the evaluation data")
                break
        self.results["eval_loss"].append(losses)

    def set_train_ops(self):
        dense_variables, sparse_variables = get_dense_and_sparse_variable()

        # One optimizer pair, so only the first loss is trained (as in the Rec SDK demo).
        for loss, (dense_optimizer, sparse_optimizer) in zip(self.train_model.loss_list,
                                                              self.optimizer_list):
            grads = dense_optimizer.compute_gradients(loss, var_list=dense_variables)
            avg_grads = []
            for grad, var in grads:
                if get_rank_size() > 1:
                    grad = hccl_ops.allreduce(grad, "sum") if grad is not None else None
                if grad is not None:
                    avg_grads.append((grad, var))
            self.train_ops.append(dense_optimizer.apply_gradients(avg_grads))

            if bool(int(os.getenv("USE_DYNAMIC_EXPANSION", 0))):
                from mx_rec.constants.constants import (ASCEND_SPARSE_LOOKUP_ID_OFFSET,
                                                        ASCEND_SPARSE_LOOKUP_LOCAL_EMB,
                                                        ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS)
                train_emb_list = tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
                strategy = ApplyGradientsStrategy.mapping(os.getenv("APPLY_GRADIENTS_STRATEGY"))
                if strategy == ApplyGradientsStrategy.SUM_SAME_ID_GRADIENTS_AND_APPLY:
                    address_list = tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS)
                else:
                    address_list = tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_ID_OFFSET)
                local_grads = tf.gradients(loss, train_emb_list)
                grads_and_vars = list(zip(local_grads, address_list))
                self.train_ops.append(sparse_optimizer.apply_gradients(grads_and_vars))
            else:
                sparse_grads = tf.gradients(loss, sparse_variables)
                grads_and_vars = list(zip(sparse_grads, sparse_variables))
                self.train_ops.append(sparse_optimizer.apply_gradients(grads_and_vars))

    def train(self, train_interval, saving_interval):
        self.set_train_ops()
        # Graph modification comes after the gradients are built.
        if self.is_modify_graph:
            logger.info("start to modify the graph")
            modify_graph_and_start_emb_cache(dump_graph=True)

        if not self.use_one_shot:
            self.session.run(self._initializer(True))
        self.session.run(tf.compat.v1.global_variables_initializer())
        self.saver = tf.compat.v1.train.Saver()

        i = 0
        for i in range(1, self.max_train_steps + 1):
            logger.info("training at step %d", i)
            try:
                _, losses = self.session.run([self.train_ops, self.train_model.loss_list])
            except tf.errors.OutOfRangeError:
                logger.info("end of the training data")
                break
            self.results["train_loss"].append([float(v) for v in losses])
            for t in self.table_list:
                logger.info(f"training at step:{i}, table[{t.table_name}], table size:{t.size()}, "
                            f"table capacity:{t.capacity()}")
                self.results["table_size"][t.table_name].append(int(t.size()))
                self.results["table_capacity"][t.table_name].append(int(t.capacity()))

            if i % train_interval == 0:
                self.evaluate()
            if i % saving_interval == 0:
                self._save(i)
            if self.is_faae and i == train_interval // 2:
                logger.info("set_threshold at step %d", i)
                self.change_threshold(i)

        if i % saving_interval != 0:
            self._save(i)
        logger.info("training end")

    def _save(self, step):
        self.saver.save(self.session, f"{SAVE_DIR}/model-{self.rank_id}", global_step=step)
        self.results["saved"].append(step)

    def evaluate(self):
        logger.info("start evaluate, epoch %d", self.epoch)
        self._infer()
        self.epoch += 1

    def predict(self):
        logger.info("start predict")
        model_files = glob.glob(f"{SAVE_DIR}/sparse-model-{self.rank_id}-*")
        if not model_files:
            raise ValueError(f"no model under {SAVE_DIR}: train first (USE_MODE=train)")
        steps = [int(m.group(1)) for m in
                 (re.match(f".*sparse-model-{self.rank_id}-([0-9]+)", f) for f in model_files) if m]
        if not steps:
            raise RuntimeError("latest model not found")
        latest_step = max(steps)
        self.saver = tf.compat.v1.train.Saver()
        self.saver.restore(self.session, f"{SAVE_DIR}/model-{self.rank_id}-{latest_step}")
        self.results["restored"] = latest_step
        self._infer()
        logger.info("predict end")

    def change_threshold(self, step):
        thres_tensor = tf.constant(60, dtype=tf.int32)
        set_threshold_op = ConfigInitializer.get_instance().host_pipeline_ops.set_threshold(
            thres_tensor, emb_name=self.table_list[0].table_name,
            ids_name=self.table_list[0].table_name + "_lookup")
        value = self.session.run([set_threshold_op])[0]
        self.results["set_threshold"] = {"step": step, "value": int(value),
                                         "table": self.table_list[0].table_name}
