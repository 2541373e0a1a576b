"""The Rec SDK names that Rec SDK's example programs import from ``mx_rec``, and what each does
on one CPU process: ranks, ConfigInitializer, host-pipeline ops, constants, the log, the HCCL
and NPU stand-ins, hooks and the tf.data additions."""

import logging
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import mx_rec  # noqa: F401  (installs the facade's TF changes)
import sparseflow as sf
from mx_rec import _dataset
from mx_rec._npu import hccl_ops as npu_hccl
from mx_rec.constants import constants as C
from mx_rec.util import log as mx_log
from mx_rec.util.initialize import (ConfigInitializer, clear_channel, get_host_pipeline_ops,
                                    get_rank_id, get_rank_size, set_if_load)
from mx_rec.util.ops import import_host_pipeline_ops
from mx_rec.util.tf_version_adapter import NPUCheckpointSaverHook, hccl_ops, npu_ops
from sparseflow.optimizers import lazy_adam
from sparseflow.runtime import NotInitializedError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def fresh_log(monkeypatch):
    """Forget which one-time messages were logged, so a test sees its own first time."""
    monkeypatch.setattr(mx_log, "_logged", set())


def _info(caplog, text):
    return [r for r in caplog.records if r.levelno == logging.INFO and text in r.getMessage()]


# --- ranks -------------------------------------------------------------------------------

def test_rank_functions_answer_rank_0_of_1_before_and_after_init(graph):
    assert not sf.runtime.is_initialized()
    from mx_rec.util.communication import hccl_ops as comm
    assert (get_rank_id(), get_rank_size()) == (0, 1)
    assert (comm.get_rank_id(), comm.get_rank_size(), comm.get_local_rank_size()) == (0, 1, 1)
    sf.init()
    assert (get_rank_id(), get_rank_size(), comm.get_rank_id()) == (0, 1, 0)


def test_import_mx_rec_util_exposes_communication_as_an_attribute():
    """``import mx_rec.util as u; u.communication.hccl_ops.get_rank_id()`` (dlrm's form) in a
    fresh interpreter, where nothing else imported the submodule."""
    code = ("import mx_rec.util as u; h = u.communication.hccl_ops; "
            "print(h.get_rank_id(), h.get_rank_size())")
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300, check=True)
    assert out.stdout.split() == ["0", "1"]


def test_rank_functions_read_the_launchers_environment(monkeypatch):
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "8")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "5")
    assert (get_rank_id(), get_rank_size()) == (5, 8)
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    assert get_rank_size() == 1
    monkeypatch.setenv("HOROVOD_RANK", "3")
    monkeypatch.setenv("HOROVOD_SIZE", "4")
    monkeypatch.delenv("OMPI_COMM_WORLD_SIZE")
    monkeypatch.delenv("OMPI_COMM_WORLD_RANK")
    assert (get_rank_id(), get_rank_size()) == (3, 4)
    monkeypatch.setenv("HOROVOD_SIZE", "four")
    with pytest.raises(ValueError, match="HOROVOD_SIZE must be an integer; received 'four'"):
        get_rank_size()


# --- ConfigInitializer and mx_rec.util.initialize -----------------------------------------

def test_config_api_before_init_raises_not_initialized(graph):
    with pytest.raises(NotInitializedError, match=r"ConfigInitializer.get_instance\(\)"):
        ConfigInitializer.get_instance()
    for call in (lambda: set_if_load(True), get_host_pipeline_ops,
                 lambda: clear_channel(is_train_channel=False)):
        with pytest.raises(NotInitializedError):
            call()


def test_config_initializer_reads_and_sets_the_init_config(graph):
    sf.init(train_steps=100, eval_steps=10, save_steps=50, max_steps=200, use_dynamic=False,
            use_dynamic_expansion=True)
    config = ConfigInitializer.get_instance()
    assert ConfigInitializer.get_instance() is config
    assert (config.use_dynamic, config.use_static, config.use_dynamic_expansion) == \
        (False, True, True)
    assert (config.max_steps, config.train_steps, config.eval_steps, config.save_steps) == \
        (200, 100, 10, 50)
    assert config.if_load is False
    set_if_load(True)
    assert config.if_load is True and sf.runtime.current().config.if_load is True
    config.if_load = False  # dlrm: ConfigInitializer.get_instance().if_load = IF_LOAD
    assert sf.runtime.current().config.if_load is False
    with pytest.raises(TypeError, match=r"`if_load` must be a bool. Received: 1"):
        config.if_load = 1
    with pytest.raises(TypeError, match=r"`if_load` must be a bool"):
        set_if_load("yes")
    sf.terminate_config_initializer()
    sf.init()
    assert ConfigInitializer.get_instance() is not config
    assert ConfigInitializer.get_instance().use_dynamic is True
    with pytest.raises(NotInitializedError, match=r"init\(\) that was terminated"):
        config.use_dynamic


def test_train_params_config_channels_and_initializers(sf_init):
    params = ConfigInitializer.get_instance().train_params_config
    assert (params.get_training_mode_channel_id(True),
            params.get_training_mode_channel_id(False)) == (0, 1)
    assert (C.TRAIN_CHANNEL_ID, C.EVAL_CHANNEL_ID) == (0, 1)
    with pytest.raises(TypeError, match=r"`is_training` must be a bool. Received: 1"):
        params.get_training_mode_channel_id(1)
    with pytest.raises(RuntimeError, match=r"No rewritten training iterator"):
        params.get_initializer(True)
    with pytest.raises(RuntimeError, match=r"No rewritten eval iterator"):
        params.get_target_batch(False)


def _modify_graph_with_labels():
    """A training and an evaluation iterator of {ids, label}, looked up with modify_graph."""
    table = sf.create_table(tf.int64, 2, "t", tf.compat.v1.ones_initializer(),
                            device_vocabulary_size=100)
    ids = np.arange(40, dtype=np.int64).reshape(10, 4) % 13
    labels = np.arange(10, dtype=np.float32)
    train_it = tf.compat.v1.data.make_initializable_iterator(
        tf.data.Dataset.from_tensor_slices({"ids": ids, "label": labels}).batch(2))
    eval_it = tf.compat.v1.data.make_initializable_iterator(
        tf.data.Dataset.from_tensor_slices({"ids": ids, "label": labels + 100}).batch(2))
    train_batch, eval_batch = train_it.get_next(), eval_it.get_next()
    train_emb = sf.sparse_lookup(table, train_batch["ids"], 8, modify_graph=True)
    eval_emb = sf.sparse_lookup(table, eval_batch["ids"], 8, is_train=False, modify_graph=True)
    eval_out = tf.reduce_sum(eval_emb, axis=[1, 2]) + eval_batch["label"]
    return table, train_emb, eval_out


def test_get_target_batch_is_the_rewritten_batch_in_the_original_structure(sf_init):
    _, train_emb, eval_out = _modify_graph_with_labels()
    sf.modify_graph_and_start_emb_cache()
    params = ConfigInitializer.get_instance().train_params_config
    target = params.get_target_batch(False)
    assert sorted(target) == ["ids", "label"]
    assert params.get_initializer(False) is sf.get_initializer(False)
    with tf.compat.v1.Session() as sess:
        sess.run([params.get_initializer(True), params.get_initializer(False)])
        sess.run(train_emb)  # admits keys 0..7
        labels, out = sess.run([target["label"], eval_out])
        rest = [sess.run(target["label"]) for _ in range(4)]
    # the rewritten evaluation iterator: batch 0's labels, the same batch as the model's
    np.testing.assert_array_equal(labels, [100.0, 101.0])
    np.testing.assert_array_equal(out - labels, [8.0, 8.0])  # 4 admitted keys x dim 2 x ones
    np.testing.assert_array_equal(np.concatenate(rest), 100.0 + np.arange(2, 10))


def test_optimizer_config_holds_the_last_sparse_optimizer(sf_init):
    config = ConfigInitializer.get_instance().optimizer_config
    assert config.optimizer_instance is None
    first = lazy_adam.create_hash_optimizer(learning_rate=0.1)
    second = lazy_adam.create_hash_optimizer(learning_rate=0.2)
    assert config.optimizer_instance is second
    config.optimizer_instance = first
    assert ConfigInitializer.get_instance().optimizer_config.optimizer_instance is first
    with pytest.raises(TypeError, match=r"`optimizer_instance` must be a sparse optimizer"):
        config.optimizer_instance = tf.compat.v1.train.GradientDescentOptimizer(0.1)


# --- host-pipeline ops ---------------------------------------------------------------------

def test_host_pipeline_ops_are_one_object_and_the_library_path_is_accepted(sf_init, caplog,
                                                                          fresh_log):
    caplog.set_level(logging.INFO, logger="mx_rec")
    ops = import_host_pipeline_ops()
    assert import_host_pipeline_ops(C.LIBREC_EOS_OPS_SO) is ops
    assert import_host_pipeline_ops(C.LIBREC_EOS_OPS_SO) is ops
    assert get_host_pipeline_ops() is ops
    assert ConfigInitializer.get_instance().host_pipeline_ops is ops
    assert len(_info(caplog, "librec_eos_ops.so")) == 1
    with pytest.raises(TypeError, match=r"`so_path` must be a str, a path or None. Received: 3"):
        import_host_pipeline_ops(3)


def test_set_threshold_returns_an_op_that_applies_when_run(sf_init):
    keys = np.array([[1], [1], [1], [2]], np.int64)
    spec = sf.FeatureSpec("f", table_name="user_table", access_threshold=5)
    table = sf.create_table(tf.int64, 2, "user_table", tf.compat.v1.ones_initializer(),
                            device_vocabulary_size=10)
    ds = tf.data.Dataset.from_tensor_slices({"f": keys}).batch(1)
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False  # processed when drawn
    it = tf.compat.v1.data.make_initializable_iterator(
        ds.map(sf.get_asc_insert_func(tgt_key_specs=[spec])).with_options(options))
    rows = sf.pipeline.insert_func.batch_rows(it.get_next(), "user_table")
    op = import_host_pipeline_ops().set_threshold(tf.constant(3, tf.int32),
                                                  emb_name="user_table",
                                                  ids_name="user_table_lookup")
    sf.start_asc_pipeline()
    assert table.access_threshold == 5  # the op is built, not run
    with tf.compat.v1.Session() as sess:
        sess.run(it.initializer)
        got = [sess.run(rows)[0] for _ in range(2)]  # key 1: counts 1, 2 < 5
        assert table.processor.threshold == 5
        assert sess.run([op]) == [3]                  # little_demo: session.run([op])
        got.append(sess.run(rows)[0])                 # key 1: count 3 >= 3, admitted
    assert got[:2] == [-1, -1] and got[2] >= 0
    assert (table.access_threshold, table.processor.threshold) == (3, 3)


def test_set_threshold_takes_ints_and_int64_tensors_and_checks_its_arguments(sf_init):
    table = sf.create_table(tf.int64, 2, "user_table", tf.compat.v1.ones_initializer(),
                            device_vocabulary_size=10)
    ops = import_host_pipeline_ops()
    from_int = ops.set_threshold(60, emb_name="user_table")
    from_int64 = ops.set_threshold(tf.constant(7, tf.int64), emb_name="user_table")
    too_big = ops.set_threshold(tf.constant(2**40, tf.int64), emb_name="user_table")
    with tf.compat.v1.Session() as sess:
        assert sess.run(from_int) == 60 and table.access_threshold == 60
        assert sess.run(from_int64) == 7 and table.access_threshold == 7
        with pytest.raises(tf.errors.OpError, match=r"must be an int in \[-1, 2147483647\]"):
            sess.run(too_big)
    assert table.access_threshold == 7
    with pytest.raises(ValueError, match=r"`emb_name` must be the name of the table whose "
                                         r"threshold to set, one of \['user_table'\]. "
                                         r"Received: None"):
        ops.set_threshold(60)
    with pytest.raises(ValueError, match=r"`emb_name` .* Received: 'item_table'"):
        ops.set_threshold(60, emb_name="item_table")
    with pytest.raises(ValueError, match=r"`threshold` must be an int in \[-1, 2147483647\]. "
                                         r"Received: -2"):
        ops.set_threshold(-2, emb_name="user_table")
    with pytest.raises(TypeError, match=r"`threshold` must be an int .* Received: '60'"):
        ops.set_threshold("60", emb_name="user_table")
    with pytest.raises(TypeError, match=r"`threshold` must be an int .* integer scalar tensor"):
        ops.set_threshold(tf.constant(6.0), emb_name="user_table")
    with pytest.raises(ValueError, match=r"`threshold` must be a scalar tensor"):
        ops.set_threshold(tf.constant([6, 7]), emb_name="user_table")
    with pytest.raises(TypeError, match=r"`ids_name` must be a str or None. Received: 1"):
        ops.set_threshold(6, emb_name="user_table", ids_name=1)


def test_return_timestamp_is_the_unix_time_in_seconds_when_run(graph):
    ops = import_host_pipeline_ops()
    label = tf.constant([1.0, 0.0])
    stamp = ops.return_timestamp(tf.cast(label, tf.int64))
    ds = tf.data.Dataset.from_tensor_slices({"label_0": np.ones(4, np.float32)}).batch(2)
    ds = ds.map(lambda b: dict(b, timestamp=ops.return_timestamp(tf.cast(b["label_0"],
                                                                         tf.int64))))
    batch = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
    assert stamp.dtype == tf.int64 and stamp.shape.rank == 0
    assert batch["timestamp"].dtype == tf.int64 and batch["timestamp"].shape.rank == 0
    with tf.compat.v1.Session() as sess:
        before = int(time.time())
        value, in_map = sess.run([stamp, batch["timestamp"]])
        after = int(time.time())
    assert before <= value <= after and before <= in_map <= after
    with pytest.raises(TypeError, match=r"`tensor` must be an int64 tensor"):
        ops.return_timestamp(label)


def test_clear_channel_is_a_runnable_no_op_logged_once(sf_init, caplog, fresh_log):
    caplog.set_level(logging.INFO, logger="mx_rec")
    op = import_host_pipeline_ops().clear_channel(1)
    op_v_a = clear_channel(is_train_channel=False)  # Rec SDK's older initialize.clear_channel
    assert op.type == "NoOp" and op_v_a.type == "NoOp" and op_v_a.name.startswith(
        "clear_channel_1")
    assert clear_channel(is_train_channel=True).name.startswith("clear_channel_0")
    with tf.compat.v1.Session() as sess:
        sess.run([op, op_v_a])
    assert len(_info(caplog, "clear_channel is a no-op")) == 1
    with pytest.raises(ValueError, match=r"`channel_id` must be 0 \(training\) or 1 "
                                         r"\(evaluation\). Received: 2"):
        import_host_pipeline_ops().clear_channel(2)
    with pytest.raises(TypeError, match=r"`channel_id` .* Received: '1'"):
        import_host_pipeline_ops().clear_channel("1")
    with pytest.raises(TypeError, match=r"`is_train_channel` must be a bool"):
        clear_channel(is_train_channel=0)


# --- constants -----------------------------------------------------------------------------

def test_collection_and_library_names():
    from sparseflow import lookup
    names = [n for n in dir(C) if n.startswith("ASCEND_")]
    assert {"ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS", "ASCEND_SPARSE_LOOKUP_LOCAL_EMB",
            "ASCEND_SPARSE_LOOKUP_ID_OFFSET", "ASCEND_TIMESTAMP"} <= set(names)
    for name in names:
        assert getattr(C, name) == name
    # the collections sparseflow fills are the ones scripts read
    assert lookup.LOCAL_EMB_COLLECTION == C.ASCEND_SPARSE_LOOKUP_LOCAL_EMB
    assert lookup.ADDRESS_COLLECTION == C.ASCEND_SPARSE_LOOKUP_ID_OFFSET
    assert C.LIBREC_EOS_OPS_SO == "librec_eos_ops.so"
    assert C.LIBASC_OPS_SO == "libasc_ops.so"
    assert C.LIBREC_TF_REC_V1_CPU_SO.endswith(".so")


def test_base_enum_mapping_finds_members_by_value_and_names_the_allowed_values():
    class UseMode(C.BaseEnum):  # little_demo's run_mode.UseMode
        TRAIN = "train"
        PREDICT = "predict"

    assert UseMode.mapping("predict") is UseMode.PREDICT
    assert UseMode.mapping(UseMode.TRAIN) is UseMode.TRAIN
    with pytest.raises(KeyError, match=r"`key` of UseMode.mapping must be one of 'train', "
                                       r"'predict'. Received: None"):
        UseMode.mapping(None)  # os.getenv of an unset variable
    strategy = C.ApplyGradientsStrategy
    assert strategy.mapping("direct_apply") is strategy.DIRECT_APPLY
    assert strategy.mapping("sum_same_id_gradients_and_apply") is \
        strategy.SUM_SAME_ID_GRADIENTS_AND_APPLY
    assert [m.value for m in C.CacheModeEnum] == ["HBM", "DDR", "SSD"]
    assert C.CacheModeEnum.mapping("SSD") is C.CacheModeEnum.SSD
    with pytest.raises(KeyError, match=r"'HBM', 'DDR', 'SSD'. Received: 'hbm'"):
        C.CacheModeEnum.mapping("hbm")


# --- log -----------------------------------------------------------------------------------

def test_logger_is_mx_rec_at_info_and_honours_mxrec_log_level(monkeypatch, fresh_log):
    assert mx_log.logger is logging.getLogger("mx_rec")
    assert mx_log.logger.level == logging.getLevelName(os.environ.get("MXREC_LOG_LEVEL", "INFO"))
    probe = logging.getLogger("mx_rec_probe_for_test")
    monkeypatch.setenv("MXREC_LOG_LEVEL", "DEBUG")
    mx_log._configure(probe)
    assert probe.level == logging.DEBUG and len(probe.handlers) == 1
    monkeypatch.setenv("MXREC_LOG_LEVEL", "LOUD")
    with pytest.raises(ValueError, match=r"`MXREC_LOG_LEVEL` must be one of DEBUG, INFO, "
                                         r"WARNING, ERROR. Received: 'LOUD'"):
        mx_log._configure(probe)
    assert mx_log.log_once("k", "first") is True and mx_log.log_once("k", "again") is False


def test_ignored_init_options_are_named_once_at_info(graph, caplog, monkeypatch):
    monkeypatch.setattr(sf.runtime, "_IGNORED_LOGGED", set())
    caplog.set_level(logging.INFO, logger="sparseflow")
    sf.init(use_mpi=True, use_hot=False)
    sf.terminate_config_initializer()
    sf.init(use_hot=False, bind_cpu=True)
    named = [r.getMessage() for r in caplog.records if "accepted and ignored" in r.getMessage()]
    assert named == [named[0], named[1]] and "use_hot, use_mpi" in named[0]
    assert "bind_cpu" in named[1] and "use_hot" not in named[1]


# --- HCCL and NPU stand-ins ------------------------------------------------------------------

@pytest.mark.parametrize("reduction", ["sum", "max", "min", "prod"])
def test_allreduce_over_one_rank_is_the_tensor(graph, reduction):
    x = np.array([[1.5, -2.0], [3.0, 4.0]], np.float32)
    out = hccl_ops.allreduce(tf.constant(x), reduction)
    with tf.compat.v1.Session() as sess:
        np.testing.assert_array_equal(sess.run(out), x)
    slices = tf.IndexedSlices(tf.constant(x), tf.constant([0, 3]))
    assert hccl_ops.allreduce(slices, reduction, fusion=0, fusion_id=2) is slices


def test_collectives_check_their_arguments_and_refuse_several_ranks(graph, monkeypatch):
    t = tf.constant([1.0])
    with pytest.raises(ValueError, match=r"`reduction` must be one of sum, max, min, prod. "
                                         r"Received: 'mean'"):
        hccl_ops.allreduce(t, "mean")
    with pytest.raises(ValueError, match=r"`fusion` must be an int in \[0, 2\]. Received: 3"):
        hccl_ops.allreduce(t, "sum", fusion=3)
    with pytest.raises(TypeError, match=r"`group` must be a non-empty str"):
        hccl_ops.allreduce(t, "sum", group=None)
    with pytest.raises(TypeError, match=r"`tensor` must be a tensor. Received: None"):
        hccl_ops.allreduce(None, "sum")
    assert hccl_ops.allgather(t, 1) is t
    with pytest.raises(ValueError, match=r"`rank_size` must be the number of ranks, 1. "
                                         r"Received: 2"):
        hccl_ops.allgather(t, 2)
    assert hccl_ops.broadcast([t], 0) == [t]
    with pytest.raises(ValueError, match=r"`root_rank` must be an int in \[0, 0\]"):
        hccl_ops.broadcast([t], 1)
    monkeypatch.setattr(npu_hccl, "world", lambda: (0, 2))
    with pytest.raises(RuntimeError, match=r"hccl_ops.allreduce on rank 0 of 2: call init\(\) "
                                           r"first"):
        hccl_ops.allreduce(t, "sum")


def test_npu_dropout_is_tf_dropout_with_rate_one_minus_keep_prob(graph):
    x = tf.constant(np.arange(1, 201, dtype=np.float32).reshape(20, 10))
    tf.compat.v1.set_random_seed(3)
    ours = npu_ops.dropout(x, keep_prob=0.8, seed=11)
    reference = tf.nn.dropout(x, rate=0.2, seed=11)
    kept_all = npu_ops.dropout(x, 1.0)
    with tf.compat.v1.Session() as sess:
        got, want, same, xs = sess.run([ours, reference, kept_all, x])
    np.testing.assert_allclose(got, want)
    np.testing.assert_array_equal(same, xs)
    kept = got != 0
    np.testing.assert_allclose(got[kept], xs[kept] / 0.8, rtol=1e-6)
    assert 0 < kept.sum() < kept.size
    with pytest.raises(ValueError, match=r"`keep_prob` must be a float in \(0, 1\]. "
                                         r"Received: 0"):
        npu_ops.dropout(x, 0)
    with pytest.raises(TypeError, match=r"`keep_prob` must be a float in \(0, 1\] or a float "
                                        r"tensor. Received: '0.8'"):
        npu_ops.dropout(x, "0.8")


def test_npu_checkpoint_saver_hook_saves_checkpoints(graph, tmp_path):
    step = tf.compat.v1.train.get_or_create_global_step()
    tf.compat.v1.get_variable("w", initializer=tf.ones([2]))
    inc = tf.compat.v1.assign_add(step, 1)
    hook = NPUCheckpointSaverHook(str(tmp_path), save_steps=2)
    with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as sess:
        for _ in range(3):
            sess.run(inc)
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("model.ckpt-3")


# --- hooks and re-exports ------------------------------------------------------------------

def test_feature_spec_is_also_served_by_helper():
    from mx_rec.core.asc import feature_spec, helper
    assert helper.FeatureSpec is feature_spec.FeatureSpec is sf.FeatureSpec


def test_npu_graph_hooks_change_nothing_and_say_so_once(sf_init, caplog, fresh_log):
    from mx_rec.graph.acg_push_ops import ACGPushOpsToDatasetHook
    from mx_rec.graph.hooks import LookupSubgraphSlicerHook, OrphanLookupKeySlicerHook
    caplog.set_level(logging.INFO, logger="mx_rec")
    batch = tf.compat.v1.data.make_one_shot_iterator(
        tf.data.Dataset.from_tensor_slices({"s": ["1", "2"]}).batch(2)).get_next()
    out = tf.strings.to_number(batch["s"], tf.int64)
    hooks = [ACGPushOpsToDatasetHook(dump_graph=True), OrphanLookupKeySlicerHook(),
             LookupSubgraphSlicerHook(op_types=["StringToNumber"])]
    ops_before = [op.name for op in sf_init.get_operations()]
    for hook in hooks + hooks:
        hook.begin()
    assert [op.name for op in sf_init.get_operations()] == ops_before
    with tf.compat.v1.train.MonitoredSession(hooks=hooks) as sess:
        np.testing.assert_array_equal(sess.run(out), [1, 2])
    for name in ("ACGPushOpsToDatasetHook", "OrphanLookupKeySlicerHook",
                 "LookupSubgraphSlicerHook"):
        assert len(_info(caplog, name)) == 1
    with pytest.raises(TypeError, match=r"`dump_graph` must be a bool. Received: 'yes'"):
        ACGPushOpsToDatasetHook(dump_graph="yes")
    with pytest.raises(TypeError, match=r"`op_types` must be a list of op type names"):
        LookupSubgraphSlicerHook(op_types="StringToNumber")
    with pytest.raises(TypeError, match=r"`full_graph` must be a tf.Graph or None"):
        OrphanLookupKeySlicerHook(full_graph="g")


# --- tf.data additions ---------------------------------------------------------------------

def test_eos_map_on_one_process_is_the_dataset(graph):
    librec = import_host_pipeline_ops(C.LIBREC_EOS_OPS_SO)
    v2 = tf.data.Dataset.range(5)
    assert v2.eos_map(librec, 0, -1, 10) is v2
    v1 = tf.compat.v1.data.Dataset.range(3)
    assert v1.eos_map(librec, 1, 100, 10) is v1
    it = v2.eos_map(librec, 1, -1, 2).make_initializable_iterator()
    with tf.compat.v1.Session() as sess:
        sess.run(it.initializer)
        assert [sess.run(it.get_next()) for _ in range(5)] == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match=r"`channel_id` must be 0 \(training\) or 1 "
                                         r"\(evaluation\). Received: 2"):
        v2.eos_map(librec, 2, -1, 10)
    with pytest.raises(TypeError, match=r"`librec` must be the object "
                                        r"import_host_pipeline_ops\(...\) returns"):
        v2.eos_map(None, 0, -1, 10)
    with pytest.raises(ValueError, match=r"`max_eval_steps` must be an int in "
                                         r"\[-1, 2147483647\]. Received: -2"):
        v2.eos_map(librec, 0, -1, -2)


def test_tf2_datasets_get_tf1_iterator_methods_and_tf_keeps_its_own(graph, monkeypatch):
    one_shot = tf.data.Dataset.range(2).make_one_shot_iterator().get_next()
    init_it = tf.data.Dataset.range(3).make_initializable_iterator()
    with tf.compat.v1.Session() as sess:
        assert [sess.run(one_shot) for _ in range(2)] == [0, 1]
        with pytest.raises(tf.errors.OutOfRangeError):
            sess.run(one_shot)
        for _ in range(2):  # initializable: starts over
            sess.run(init_it.initializer)
            assert [sess.run(init_it.get_next()) for _ in range(3)] == [0, 1, 2]
    v1 = tf.compat.v1.data.Dataset
    assert "make_initializable_iterator" in vars(v1)  # TF's own V1 method, not ours
    assert v1.make_initializable_iterator is not _dataset._make_initializable_iterator
    sentinel = object()
    monkeypatch.setattr(tf.data.Dataset, "make_one_shot_iterator", sentinel)
    _dataset.install()
    assert tf.data.Dataset.make_one_shot_iterator is sentinel
