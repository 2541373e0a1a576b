"""The mx_rec facade: Rec SDK import paths, the patched Saver and layers, explicit errors."""

import importlib
import os
import subprocess
import sys

import pytest

import sparseflow as sf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PATHS = {  # module -> names that must be the sparseflow objects
    "mx_rec.util.initialize": {"init": "init",
                               "terminate_config_initializer": "terminate_config_initializer",
                               "get_use_dynamic_expansion": "get_use_dynamic_expansion",
                               "get_initializer": "get_initializer"},
    "mx_rec.core.embedding": {"create_table": "create_table", "sparse_lookup": "sparse_lookup"},
    "mx_rec.core.asc.helper": {"get_asc_insert_func": "get_asc_insert_func"},
    "mx_rec.core.asc.manager": {"start_asc_pipeline": "start_asc_pipeline"},
    "mx_rec.core.asc.feature_spec": {"FeatureSpec": "FeatureSpec"},
    "mx_rec.core.feature_process": {"EvictHook": "EvictHook"},
    "mx_rec.util.variable": {"get_dense_and_sparse_variable": "get_dense_and_sparse_variable"},
    "mx_rec.saver": {"Saver": "Saver"},
    "mx_rec.saver.sparse": {"export": "export"},
    "mx_rec.graph.modifier": {"modify_graph_and_start_emb_cache":
                              "modify_graph_and_start_emb_cache"},
}


@pytest.mark.parametrize("module", sorted(PATHS))
def test_rec_sdk_import_paths_resolve_to_sparseflow(module):
    mod = importlib.import_module(module)
    for name, sf_name in PATHS[module].items():
        assert getattr(mod, name) is getattr(sf, sf_name)


@pytest.mark.parametrize("name", ["lazy_adam", "gradient_descent", "adagrad", "ftrl"])
def test_optimizer_modules(name):
    mod = importlib.import_module(f"mx_rec.optimizers.{name}")
    assert mod.create_hash_optimizer is importlib.import_module(
        f"sparseflow.optimizers.{name}").create_hash_optimizer


def test_collection_names():
    from mx_rec.constants import constants
    for name in ("ASCEND_SPARSE_LOOKUP_LOCAL_EMB", "ASCEND_SPARSE_LOOKUP_ID_OFFSET",
                 "ASCEND_GLOBAL_HASHTABLE_COLLECTION", "ASCEND_TIMESTAMP"):
        assert getattr(constants, name) == name


@pytest.mark.parametrize("module, factory", [
    ("lazy_adam_by_addr", "create_hash_optimizer_by_address"),
    ("adagrad_by_addr", "create_hash_optimizer_by_address"),
    ("gradient_descent_by_addr", "create_hash_optimizer_by_addr"),
])
def test_by_address_optimizers_are_sparseflows(module, factory):
    facade = importlib.import_module(f"mx_rec.optimizers.{module}")
    ours = importlib.import_module(f"sparseflow.optimizers.{module}")
    assert getattr(facade, factory) is getattr(ours, factory)


def test_graph_modifier_hook_without_modification_starts_the_pipeline(sf_init):
    import tensorflow as tf

    from mx_rec.graph.modifier import GraphModifierHook
    sf.create_table(tf.int64, 2, "t", tf.compat.v1.ones_initializer())
    step = tf.compat.v1.train.get_or_create_global_step()
    inc = tf.compat.v1.assign_add(step, 1)
    with tf.compat.v1.train.MonitoredTrainingSession(
            hooks=[GraphModifierHook(modify_graph=False)]) as sess:
        sess.run(inc)
    assert sf.runtime.current().pipeline_started


def _run_demo(mode, cwd):
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    script = os.path.join(ROOT, "examples", "mx_rec_little_demo.py")
    run = subprocess.run([sys.executable, script, "--mode", mode, "--steps", "40"], cwd=cwd,
                         env=env, capture_output=True, text=True, timeout=300, check=True)
    line = run.stdout.strip().splitlines()[-1]
    first = float(line.split("first 10 steps loss ")[1].split(",")[0])
    last = float(line.split("last 10 steps loss ")[1].split(";")[0])
    return first, last, "restored model-0-0" in run.stdout


@pytest.mark.parametrize("mode,sparse_dir", [
    ("feature_spec", "sparse-model-0-40"), ("modify_graph", "sparse-model-0-40"),
    ("hooks", "sparse-model.ckpt-40")])
def test_ported_demo_runs_in_each_rec_sdk_mode(tmp_path, mode, sparse_dir):
    """Rec SDK's little demo, imports unchanged, in each mode: losses fall on learnable data
    and the plain tf.compat.v1.train.Saver() (or the session's) saves the sparse tables."""
    first, last, restored = _run_demo(mode, tmp_path)
    assert last < first - 0.05 and not restored
    assert os.path.isdir(tmp_path / "saved-model" / sparse_dir)


def test_ported_demo_restores_when_a_checkpoint_exists(tmp_path):
    _run_demo("feature_spec", tmp_path)
    first, last, restored = _run_demo("feature_spec", tmp_path)  # finds sparse-model-0-0
    assert restored and last < first


def test_graph_modifier_hook_rewrites_and_initializes_in_a_monitored_session(sf_init):
    import numpy as np
    import tensorflow as tf

    from mx_rec.graph.modifier import GraphModifierHook
    table = sf.create_table(tf.int64, 2, "t", tf.compat.v1.ones_initializer(),
                            device_vocabulary_size=20)
    it = tf.compat.v1.data.make_initializable_iterator(
        tf.data.Dataset.from_tensor_slices({"ids": np.arange(8).reshape(4, 2)}).batch(2))
    emb = sf.sparse_lookup(table, it.get_next()["ids"], 4, modify_graph=True)
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[GraphModifierHook()]) as sess:
        values = sess.run(emb)
    np.testing.assert_array_equal(values, np.ones((2, 2, 2)))
    assert 4 <= table.size() <= 8  # the first batch, perhaps the next one read ahead


def test_host_pipeline_ops_set_threshold(sf_init):
    import tensorflow as tf

    from mx_rec.util.ops import import_host_pipeline_ops
    table = sf.create_table(tf.int64, 2, "user_table", tf.compat.v1.ones_initializer())
    op = import_host_pipeline_ops().set_threshold(60, emb_name="user_table", ids_name="user_ids")
    with tf.compat.v1.Session() as sess:
        sess.run(op)  # the threshold changes when the op runs (tests/test_mx_rec_names.py)
    assert table.access_threshold == 60
    with pytest.raises(ValueError, match=r"`emb_name` must be the name of the table"):
        import_host_pipeline_ops().set_threshold(60)
    from mx_rec.saver import Saver
    tf.compat.v1.get_variable("v", initializer=tf.ones([1]))
    assert Saver(prefix_name="checkpoint").prefix_name == "checkpoint"


def test_ascend_session_options_are_ignored_with_one_warning(caplog):
    import tensorflow as tf

    import mx_rec  # noqa: F401  (installs the facade's TF changes)
    from mx_rec import _compat
    _compat._warned_npu = False
    config = tf.compat.v1.ConfigProto()
    npu = config.graph_options.rewrite_options.custom_optimizers.add()
    npu.name = "NpuOptimizer"
    npu.parameter_map["use_off_line"].b = True
    caplog.set_level("WARNING", logger="mx_rec")
    for _ in range(2):
        with tf.Graph().as_default():
            with tf.compat.v1.Session(config=config) as sess:
                assert sess.run(tf.constant(2.0) * 3) == 6.0
    warnings = [r for r in caplog.records if "Ascend-only session options" in r.getMessage()]
    assert len(warnings) == 1 and "NpuOptimizer" in warnings[0].getMessage()
    assert config.graph_options.rewrite_options.custom_optimizers[0].name == "NpuOptimizer"


def test_patched_saver_keeps_isinstance_working(sf_init):
    import tensorflow as tf

    import mx_rec  # noqa: F401
    from sparseflow.checkpoint.saver import _TF_SAVER
    tf.compat.v1.get_variable("v", initializer=tf.ones([1]))
    sparse_saver = tf.compat.v1.train.Saver()  # sparseflow is initialized: sparseflow's Saver
    assert isinstance(sparse_saver, sf.Saver)
    assert isinstance(sparse_saver, tf.compat.v1.train.Saver)
    assert isinstance(_TF_SAVER(), tf.compat.v1.train.Saver)
