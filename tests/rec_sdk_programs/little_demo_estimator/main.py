"""A program in the shape of Rec SDK's little_demo_estimator (examples/demo/little_demo_estimator),
written for sparseflow's tests: the same mx_rec, tf_adapter and tf.estimator calls in the same
order, driven by the same environment switches as the demo's run.sh, on generated data and at CI
sizes.

    RUN_MODE (or USE_MODE)=train|train_and_evaluate|predict  USE_MODIFY_GRAPH=0|1
    USE_TIMESTAMP=0|1  USE_MULTI_LOOKUP=0|1  MULTI_LOOKUP_TIMES=2  USE_ONE_SHOT=0|1
    USE_DYNAMIC=0|1  USE_DYNAMIC_EXPANSION=0|1  USE_EXPORT_SAVED_MODEL=0|1
    USE_DETERMINISTIC=0|1  CACHE_MODE=HBM|DDR|SSD
    python main.py [--max_steps 40 --train_steps 20 --eval_steps 5 ...]

It imports only mx_rec, the local tf_adapter, TensorFlow, numpy and its own modules, as a Rec
SDK program does (tf.estimator is there once mx_rec is imported), and writes what it saw to
./results.json, and in predict mode the predictions to ./predictions.npz.
"""

import argparse
import json
import os
import random
import shutil
from glob import glob

import numpy as np
import tensorflow as tf

from mx_rec.core.feature_process import EvictHook
from mx_rec.graph.modifier import GraphModifierHook
from mx_rec.util.initialize import init, terminate_config_initializer
from mx_rec.util.log import logger

from tf_adapter import NPUEstimator, NPURunConfig, npu_hooks_append
from config import (GLOBAL_RANDOM_SEED, MULTI_LOOKUP_TIMES, RUN_MODE, USE_DETERMINISTIC,
                    USE_DYNAMIC, USE_DYNAMIC_EXPANSION, USE_EXPORT_SAVED_MODEL, USE_MODIFY_GRAPH,
                    USE_MULTI_LOOKUP, USE_ONE_SHOT, USE_TIMESTAMP, Config)
from nn_model_input import get_model_fn
from nn_reader import input_fn
from recorder import RESULTS
from utils import FeatureSpecIns

tf.compat.v1.disable_eager_execution()
tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)

RUN_MODES = ("train", "train_and_evaluate", "predict")
EXPORT_PATH = "./model_path"
RESULTS_FILE = "results.json"
PREDICTIONS_FILE = "predictions.npz"


def set_seed():
    random.seed(GLOBAL_RANDOM_SEED)
    np.random.seed(GLOBAL_RANDOM_SEED)
    tf.compat.v2.random.set_seed(GLOBAL_RANDOM_SEED)
    os.environ["PYTHONHASHSEED"] = str(GLOBAL_RANDOM_SEED)


def main(params, config):
    session_config = tf.compat.v1.ConfigProto(allow_soft_placement=True,
                                              log_device_placement=False)
    run_config = NPURunConfig(
        model_dir=params.model_dir,
        save_summary_steps=1000,
        save_checkpoints_steps=params.save_checkpoints_steps,
        keep_checkpoint_max=5,
        session_config=session_config,
        log_step_count_steps=1000,
        precision_mode="allow_mix_precision",
        enable_data_pre_proc=True,
        iterations_per_loop=1,
        op_precision_mode="./op_precision.ini",
        op_compiler_cache_mode="enable",
        op_compiler_cache_dir="./op_cache",
        HCCL_algorithm="level0:pairwise;level1:pairwise",
        tf_random_seed=GLOBAL_RANDOM_SEED if USE_DETERMINISTIC else None,
        deterministic=1 if USE_DETERMINISTIC else 0,
    )

    # access_threshold counts occurrences; eviction_threshold is in seconds.
    access_and_evict = None
    hooks_list = [GraphModifierHook(modify_graph=USE_MODIFY_GRAPH)]
    if USE_TIMESTAMP:
        access_and_evict = {
            "user_table": dict(access_threshold=config.access_threshold,
                               eviction_threshold=config.eviction_threshold),
            "item_table": dict(access_threshold=config.access_threshold,
                               eviction_threshold=config.eviction_threshold)}
        hooks_list.append(EvictHook(evict_enable=True, evict_time_interval=10))

    est = NPUEstimator(
        model_fn=get_model_fn(config, access_and_evict),
        params=params,
        model_dir=params.model_dir,
        config=run_config,
    )

    if RUN_MODE == "train":
        est.train(input_fn=lambda: input_fn(params, config), max_steps=params.max_steps,
                  hooks=npu_hooks_append(hooks_list))

    elif RUN_MODE == "train_and_evaluate":
        train_spec = tf.estimator.TrainSpec(
            input_fn=lambda: input_fn(params, config, use_one_shot=USE_ONE_SHOT),
            max_steps=params.max_steps, hooks=npu_hooks_append(hooks_list))
        # No EvictHook in evaluation: evaluation never evicts.
        eval_hook_list = [GraphModifierHook(modify_graph=USE_MODIFY_GRAPH)]
        eval_spec = tf.estimator.EvalSpec(
            input_fn=lambda: input_fn(params, config, is_eval=True, use_one_shot=USE_ONE_SHOT),
            steps=params.eval_steps, hooks=npu_hooks_append(eval_hook_list), throttle_secs=0)
        metrics, _ = tf.estimator.train_and_evaluate(est, train_spec=train_spec,
                                                     eval_spec=eval_spec)
        RESULTS["train_and_evaluate"] = {key: float(value) for key, value in metrics.items()}

        if USE_EXPORT_SAVED_MODEL:
            RESULTS["export_dir"] = _export_model(EXPORT_PATH, config, est)

    elif RUN_MODE == "predict":
        # The evaluation stream: predict reads the batches evaluation reads.
        results = est.predict(input_fn=lambda: input_fn(params, config, is_eval=True),
                              hooks=npu_hooks_append(hooks_list=hooks_list),
                              yield_single_examples=False)
        output_pred1, output_pred2, labels = [], [], []
        for res in results:
            output_pred1.append(res["task_1"])
            output_pred2.append(res["task_2"])
            labels.append(res["label"])
        np.savez(PREDICTIONS_FILE, task_1=np.array(output_pred1), task_2=np.array(output_pred2),
                 label=np.array(labels))
        RESULTS["predictions"] = {"batches": len(output_pred1),
                                  "shape": list(np.shape(output_pred1))}
    else:
        raise ValueError(f"RUN_MODE (or USE_MODE) must be one of {RUN_MODES}, got {RUN_MODE!r}")

    _write_results(params, config)
    terminate_config_initializer()
    logger.info("Demo done!")


def _export_model(save_path, config, est):
    _del_related_dir(save_path)

    def _serving_input_fn():
        inputs = {
            "user_ids": tf.compat.v1.placeholder(shape=(None, config.user_feat_cnt),
                                                 dtype=tf.int64, name="user_ids"),
            "item_ids": tf.compat.v1.placeholder(shape=(None, config.item_feat_cnt),
                                                 dtype=tf.int64, name="item_ids"),
            "label_0": tf.compat.v1.placeholder(shape=(None,), dtype=tf.float32, name="label_0"),
            "label_1": tf.compat.v1.placeholder(shape=(None,), dtype=tf.float32, name="label_1"),
        }
        return tf.estimator.export.ServingInputReceiver(features=inputs, receiver_tensors=inputs)

    export_path = est.export_saved_model(os.path.abspath(save_path),
                                         _serving_input_fn).decode("utf-8")
    logger.info("The SavedModel is in %s", export_path)
    return export_path


def _write_results(params, config):
    results = dict(RESULTS, mode=RUN_MODE, args=vars(params), data=config.data_params(),
                   train_seed=config.train_seed, eval_seed=config.eval_seed,
                   access_threshold=config.access_threshold, use_timestamp=USE_TIMESTAMP,
                   modify_graph=USE_MODIFY_GRAPH, use_one_shot=USE_ONE_SHOT,
                   multi_lookup_times=MULTI_LOOKUP_TIMES if USE_MULTI_LOOKUP else 0)
    # Whole, even where several ranks write it in one directory: the last one's.
    with open(f"{RESULTS_FILE}.{os.getpid()}", "w") as f:
        json.dump(results, f)
    os.replace(f"{RESULTS_FILE}.{os.getpid()}", RESULTS_FILE)


def _del_related_dir(del_path):
    # Only under the working directory.
    for sub_dir in glob(os.path.join(os.getcwd(), del_path)):
        shutil.rmtree(sub_dir, ignore_errors=True)
        logger.info("deleted %s", sub_dir)


def _clear_saved_model():
    _del_related_dir("kernel*")
    _del_related_dir("export_graph")
    if not USE_EXPORT_SAVED_MODEL and not RUN_MODE.startswith("train"):
        return
    logger.warning("A training mode: deleting the previous saved model, if any.")
    _del_related_dir("_rank*")
    _del_related_dir("ssd_sparse_model_rank*")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model_dir", type=str, default="_rank")
    parser.add_argument("--learning_rate", type=float, default=0.001)
    parser.add_argument("--sparse_learning_rate", type=float, default=0.05)
    parser.add_argument("--max_data_generate_steps", type=int, default=40)  # batches generated
    parser.add_argument("--max_steps", type=int, default=40)        # last training step
    parser.add_argument("--train_steps", type=int, default=20)      # evaluate every train_steps
    parser.add_argument("--eval_steps", type=int, default=5)        # batches per evaluation
    # Save every N steps; train_and_evaluate saves (and evaluates) every train_steps.
    parser.add_argument("--save_checkpoints_steps", type=int, default=40)
    args, unknowns = parser.parse_known_args()

    if RUN_MODE == "train":
        args.train_steps = -1
        args.eval_steps = -1
    elif RUN_MODE == "predict":
        args.eval_steps = -1
    elif RUN_MODE == "train_and_evaluate":
        args.save_checkpoints_steps = args.train_steps
    else:
        raise ValueError(f"RUN_MODE (or USE_MODE) must be one of {RUN_MODES}, got {RUN_MODE!r}")

    _clear_saved_model()

    if USE_DETERMINISTIC:
        set_seed()
    init(train_steps=args.train_steps,
         eval_steps=args.eval_steps,
         save_steps=args.save_checkpoints_steps,
         max_steps=args.max_steps,
         use_dynamic=USE_DYNAMIC,
         use_dynamic_expansion=USE_DYNAMIC_EXPANSION)

    cfg = Config()
    FeatureSpecIns.set_instance()
    main(args, cfg)
