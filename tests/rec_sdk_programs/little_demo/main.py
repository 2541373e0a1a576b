"""A program in the shape of Rec SDK's little demo (examples/demo/little_demo), written for
sparseflow's tests: the same mx_rec calls in the same order, driven by the same environment
switches as the demo's run.sh, on generated data and at CI sizes.

    USE_MODE=train|predict  CACHE_MODE=HBM|DDR|SSD  USE_DYNAMIC=0|1  USE_MODIFY_GRAPH=0|1
    USE_TIMESTAMP=0|1  USE_ONE_SHOT=0|1  USE_MULTI_LOOKUP=0|1  MULTI_LOOKUP_TIMES=2|3
    USE_DYNAMIC_EXPANSION=0|1  APPLY_GRADIENTS_STRATEGY=direct_apply|sum_same_id_gradients_and_apply
    python main.py

It trains 40 steps, evaluates every 20, saves every 20 into ./saved-model, sets the user table's
admission threshold to 60 at step 10 (USE_TIMESTAMP=1), and writes what it saw to
./results.json: the losses and table sizes of every step, the evaluation losses, the saves.
It imports only mx_rec, TensorFlow, numpy and its own modules, as a Rec SDK program does.
"""

import json
import os
import shutil
import warnings
from glob import glob

import tensorflow as tf

from config import SSD_DATA_PATH, Config
from dataset import generate_dataset
from model import MyModel
from optimizer import create_dense_and_sparse_optimizer
from run_mode import SAVE_DIR, RunMode, UseMode

from mx_rec.constants.constants import ASCEND_TIMESTAMP, CacheModeEnum
from mx_rec.core.asc.feature_spec import FeatureSpec
from mx_rec.core.asc.helper import get_asc_insert_func
from mx_rec.core.asc.manager import start_asc_pipeline
from mx_rec.core.embedding import create_table, sparse_lookup
from mx_rec.graph.modifier import modify_graph_and_start_emb_cache
from mx_rec.util.initialize import (get_rank_id, get_rank_size, init, set_if_load,
                                    terminate_config_initializer)
from mx_rec.util.log import logger
from mx_rec.util.variable import get_dense_and_sparse_variable

tf.compat.v1.disable_eager_execution()

MAX_TRAIN_STEPS = 40   # training steps (and training batches)
TRAIN_STEPS = 20       # evaluate every TRAIN_STEPS steps
EVAL_STEPS = 5         # evaluation steps (and evaluation batches)
SAVING_INTERVAL = 20   # save every SAVING_INTERVAL steps
RESULTS_FILE = "results.json"


def make_batch_and_iterator(is_training, feature_spec_list=None, use_timestamp=False,
                            dump_graph=False, batch_number=100):
    seed = cfg.train_seed if is_training else cfg.eval_seed
    dataset = generate_dataset(cfg, seed, use_timestamp=use_timestamp, batch_number=batch_number)
    if not MODIFY_GRAPH_FLAG:
        insert_fn = get_asc_insert_func(tgt_key_specs=feature_spec_list, is_training=is_training,
                                        dump_graph=dump_graph)
        dataset = dataset.map(insert_fn)
    dataset = dataset.prefetch(100)
    if USE_ONE_SHOT:
        iterator = dataset.make_one_shot_iterator()
    else:
        iterator = dataset.make_initializable_iterator()
    batch = iterator.get_next()
    return batch, iterator


def model_forward(input_list, batch, is_train, modify_graph, config_dict=None):
    embedding_list = []
    for feature, hash_table, send_count, is_grad, dim in zip(*input_list):
        access_and_evict_config = None
        if isinstance(config_dict, dict):
            access_and_evict_config = config_dict.get(hash_table.table_name)
        embedding = sparse_lookup(hash_table, feature, send_count, is_train=is_train,
                                  access_and_evict_config=access_and_evict_config,
                                  is_grad=is_grad, name=hash_table.table_name + "_lookup",
                                  modify_graph=modify_graph, batch=batch,
                                  serving_default_value=tf.ones(shape=(dim), dtype=tf.float32) * 2)
        embedding_list.append(tf.reduce_sum(embedding, axis=1, keepdims=False))

    my_model = MyModel()
    my_model(embedding_list, batch["label_0"], batch["label_1"])
    return my_model


def build_graph(hash_table_list, is_train, feature_spec_list=None, config_dict=None,
                batch_number=100):
    batch, iterator = make_batch_and_iterator(is_train, feature_spec_list=feature_spec_list,
                                              use_timestamp=USE_TIMESTAMP, dump_graph=is_train,
                                              batch_number=batch_number)
    if MODIFY_GRAPH_FLAG:
        input_list = [[batch["user_ids"], batch["item_ids"]],
                      [hash_table_list[0], hash_table_list[1]],
                      [cfg.user_send_cnt, cfg.item_send_cnt],
                      [True, True],
                      [cfg.user_hashtable_dim, cfg.item_hashtable_dim]]
        if use_multi_lookup:
            for column in input_list:
                column.extend([column[0]] * MULTI_LOOKUP_TIMES)
        if USE_TIMESTAMP:
            tf.compat.v1.add_to_collection(ASCEND_TIMESTAMP, batch["timestamp"])
        model = model_forward(input_list, batch, is_train=is_train, modify_graph=True,
                              config_dict=config_dict)
    else:
        input_list = [feature_spec_list,
                      [hash_table_list[0], hash_table_list[1]],
                      [cfg.user_send_cnt, cfg.item_send_cnt],
                      [True, True],
                      [cfg.user_hashtable_dim, cfg.item_hashtable_dim]]
        if use_multi_lookup:
            # The extra user specs are already in feature_spec_list.
            for column in input_list[1:]:
                column.extend([column[0]] * MULTI_LOOKUP_TIMES)
        model = model_forward(input_list, batch, is_train=is_train, modify_graph=False,
                              config_dict=config_dict)
    return iterator, model, batch


def create_feature_spec_list(use_timestamp=False):
    access_threshold = cfg.access_threshold if use_timestamp else None
    eviction_threshold = cfg.eviction_threshold if use_timestamp else None
    feature_spec_list = [FeatureSpec("user_ids", table_name="user_table",
                                     access_threshold=access_threshold,
                                     eviction_threshold=eviction_threshold,
                                     faae_coefficient=1),
                         FeatureSpec("item_ids", table_name="item_table",
                                     access_threshold=access_threshold,
                                     eviction_threshold=eviction_threshold,
                                     faae_coefficient=4)]
    if use_multi_lookup:
        for _ in range(MULTI_LOOKUP_TIMES):
            feature_spec_list.append(FeatureSpec("user_ids", table_name="user_table",
                                                 access_threshold=access_threshold,
                                                 eviction_threshold=eviction_threshold,
                                                 faae_coefficient=1))
    if use_timestamp:
        feature_spec_list.append(FeatureSpec("timestamp", is_timestamp=True))
    return feature_spec_list


def clear_saved_model():
    mode = UseMode.mapping(os.getenv("USE_MODE"))
    if mode == UseMode.TRAIN:
        logger.info("train mode: deleting the previous saved model, if any")
        shutil.rmtree(os.path.join(os.getcwd(), "saved-model"), ignore_errors=True)
    if not (os.getenv("CACHE_MODE", "") == CacheModeEnum.SSD.value and mode == UseMode.TRAIN):
        return
    # The SSD tier does not overwrite its files: start from an empty directory.
    for part_path in SSD_DATA_PATH:
        part_path = os.path.join(os.getcwd(), part_path)
        shutil.rmtree(part_path, ignore_errors=True)
        os.makedirs(part_path, exist_ok=True)


def switch(name, default):
    try:
        return bool(int(os.getenv(name, default)))
    except ValueError as err:
        raise ValueError(f"please set {name} to 0 or 1, got {os.getenv(name)!r}") from err


if __name__ == "__main__":
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
    warnings.filterwarnings("ignore")

    use_mode = UseMode.mapping(os.getenv("USE_MODE"))
    clear_saved_model()

    use_dynamic = switch("USE_DYNAMIC", 0)
    use_dynamic_expansion = switch("USE_DYNAMIC_EXPANSION", 0)
    use_multi_lookup = switch("USE_MULTI_LOOKUP", 1)
    MODIFY_GRAPH_FLAG = switch("USE_MODIFY_GRAPH", 0)
    USE_TIMESTAMP = switch("USE_TIMESTAMP", 0)
    USE_ONE_SHOT = switch("USE_ONE_SHOT", 0)
    try:
        MULTI_LOOKUP_TIMES = int(os.getenv("MULTI_LOOKUP_TIMES", 2))
    except ValueError as err:
        raise ValueError("please set MULTI_LOOKUP_TIMES to an int") from err

    init(use_mpi=False,
         train_steps=TRAIN_STEPS,
         eval_steps=EVAL_STEPS,
         save_steps=SAVING_INTERVAL,
         use_dynamic=use_dynamic,
         use_hot=False,
         use_dynamic_expansion=use_dynamic_expansion)
    rank_id = get_rank_id()
    set_if_load(bool(glob(f"{SAVE_DIR}/sparse-model-{rank_id}-*")))

    cfg = Config()
    if use_multi_lookup and MULTI_LOOKUP_TIMES > 2:
        cfg.batch_size = 64

    # access_threshold counts occurrences; eviction_threshold is in seconds.
    ACCESS_AND_EVICT = None
    if USE_TIMESTAMP:
        ACCESS_AND_EVICT = {
            "user_table": dict(access_threshold=cfg.access_threshold,
                               eviction_threshold=cfg.eviction_threshold, faae_coefficient=1),
            "item_table": dict(access_threshold=cfg.access_threshold,
                               eviction_threshold=cfg.eviction_threshold, faae_coefficient=4)}
    train_feature_spec_list = None
    eval_feature_spec_list = None
    if not MODIFY_GRAPH_FLAG:
        train_feature_spec_list = create_feature_spec_list(use_timestamp=USE_TIMESTAMP)
        eval_feature_spec_list = create_feature_spec_list(use_timestamp=USE_TIMESTAMP)

    # The optimizers come before the tables, which are bound to them.
    optimizer_list = [create_dense_and_sparse_optimizer(cfg)]
    sparse_optimizer_list = [sparse_optimizer for _, sparse_optimizer in optimizer_list]

    cache_mode_dict = cfg.cache_mode_dict()
    cache_mode = os.getenv("CACHE_MODE")
    if cache_mode not in cache_mode_dict:
        raise ValueError(f"CACHE_MODE must be one of {list(cache_mode_dict)}, got {cache_mode!r}")

    user_hashtable = create_table(key_dtype=tf.int64,
                                  dim=tf.TensorShape([cfg.user_hashtable_dim]),
                                  name="user_table",
                                  emb_initializer=tf.compat.v1.truncated_normal_initializer(),
                                  optimizer_list=sparse_optimizer_list,
                                  all2all_gradients_op="sum_gradients_and_div_by_ranksize",
                                  **cache_mode_dict[cache_mode])
    item_hashtable = create_table(key_dtype=tf.int64,
                                  dim=tf.TensorShape([cfg.item_hashtable_dim]),
                                  name="item_table",
                                  emb_initializer=tf.compat.v1.truncated_normal_initializer(),
                                  optimizer_list=sparse_optimizer_list,
                                  **cache_mode_dict[cache_mode])

    # In predict mode the training graph is not built.
    train_iterator, train_model = None, None
    table_list = [user_hashtable, item_hashtable]
    if use_mode == UseMode.TRAIN:
        train_iterator, train_model, _ = build_graph(
            table_list, is_train=True, feature_spec_list=train_feature_spec_list,
            config_dict=ACCESS_AND_EVICT, batch_number=MAX_TRAIN_STEPS * get_rank_size())
    eval_iterator, eval_model, _ = build_graph(
        table_list, is_train=False, feature_spec_list=eval_feature_spec_list,
        config_dict=ACCESS_AND_EVICT, batch_number=EVAL_STEPS * get_rank_size())
    dense_variables, sparse_variables = get_dense_and_sparse_variable()

    run_mode = RunMode(MODIFY_GRAPH_FLAG, USE_TIMESTAMP, table_list, optimizer_list, train_model,
                       eval_model, train_iterator, eval_iterator, MAX_TRAIN_STEPS, EVAL_STEPS,
                       {"use_one_shot": USE_ONE_SHOT})

    if not MODIFY_GRAPH_FLAG:
        start_asc_pipeline()
    if MODIFY_GRAPH_FLAG and use_mode != UseMode.TRAIN:
        logger.info("start to modify the graph")
        modify_graph_and_start_emb_cache(dump_graph=True)

    if use_mode == UseMode.TRAIN:
        run_mode.train(TRAIN_STEPS, SAVING_INTERVAL)
    elif use_mode == UseMode.PREDICT:
        run_mode.predict()

    results = dict(run_mode.results, mode=use_mode.value, data=cfg.data_params(),
                   train_seed=cfg.train_seed, eval_seed=cfg.eval_seed,
                   train_batches=MAX_TRAIN_STEPS, eval_batches=EVAL_STEPS,
                   access_threshold=cfg.access_threshold, use_timestamp=USE_TIMESTAMP,
                   multi_lookup_times=MULTI_LOOKUP_TIMES if use_multi_lookup else 0)
    # Several ranks share the working directory: each writes its own results.
    results_file = RESULTS_FILE if get_rank_size() == 1 else f"results-{get_rank_id()}.json"
    with open(results_file, "w") as f:
        json.dump(results, f)
    terminate_config_initializer()
    logger.info("Demo done!")
