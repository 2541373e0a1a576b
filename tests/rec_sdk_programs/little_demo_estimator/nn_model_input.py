"""model_fn: builds LittleModel on input_fn's features and returns the EstimatorSpec of the
mode (the training op, the evaluation loss, or the predictions with their export outputs)."""

from functools import partial

import tensorflow as tf

from mx_rec.constants.constants import ASCEND_TIMESTAMP
from mx_rec.util.log import logger

from config import USE_MODIFY_GRAPH, USE_TIMESTAMP
from nn_model_build import LittleModel
from nn_optim import get_train_op
from recorder import RecordHook, record_model_fn


def log_formatter(mode, tensors):
    if mode == tf.estimator.ModeKeys.TRAIN:
        return f"train_loss:{tensors['train_loss']:.16f}"
    if mode == tf.estimator.ModeKeys.EVAL:
        return f"eval_loss:{tensors['eval_loss']:.16f}"
    if mode == tf.estimator.ModeKeys.PREDICT:
        return f"predict_loss:{tensors['predict_loss']:.16f}"
    raise NotImplementedError(mode)


def get_model_fn(cfg, access_and_evict_config_dict=None):
    def model_fn(features, labels, mode, params):
        if USE_MODIFY_GRAPH and USE_TIMESTAMP:
            model = LittleModel(cfg, mode, features,
                                access_and_evict_config_dict=access_and_evict_config_dict)
            tf.compat.v1.add_to_collection(ASCEND_TIMESTAMP, features["timestamp"])
        else:
            model = LittleModel(cfg, mode, features)

        logger.info("model_fn(mode=%s): features %s, labels %s", mode, sorted(features), labels)
        loss, prediction = model.inference(features["label_0"], features["label_1"])
        record_model_fn(mode, model.table_list)

        loss_dict = {}
        if mode == tf.estimator.ModeKeys.TRAIN:
            logging_hook = tf.compat.v1.train.LoggingTensorHook(
                {"train_loss": loss}, every_n_iter=1, formatter=partial(log_formatter, mode))
            loss_dict["loss"] = [["train_loss", loss]]
            return tf.estimator.EstimatorSpec(
                mode=mode, loss=loss, train_op=get_train_op(params, loss_dict["loss"]),
                training_hooks=[logging_hook, RecordHook("train", loss, model.table_list)])
        if mode == tf.estimator.ModeKeys.EVAL:
            logging_hook = tf.compat.v1.train.LoggingTensorHook(
                {"eval_loss": loss}, every_n_iter=1, formatter=partial(log_formatter, mode))
            return tf.estimator.EstimatorSpec(
                mode=mode, loss=loss,
                evaluation_hooks=[logging_hook, RecordHook("eval", loss, model.table_list)])
        if mode == tf.estimator.ModeKeys.PREDICT:
            logging_hook = tf.compat.v1.train.LoggingTensorHook(
                {"predict_loss": loss}, every_n_iter=1, formatter=partial(log_formatter, mode))
            loss_dict["task_1"] = prediction[0]
            loss_dict["task_2"] = prediction[1]
            loss_dict["label"] = features["label_0"]
            export_outputs = {"predictor": tf.estimator.export.PredictOutput(loss_dict)}
            return tf.estimator.EstimatorSpec(
                mode=mode, predictions=loss_dict, export_outputs=export_outputs,
                prediction_hooks=[logging_hook, RecordHook("predict", loss, model.table_list)])
        raise NotImplementedError(mode)

    return model_fn
