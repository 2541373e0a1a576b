"""Bad input at the public API gets an error naming the argument, the value and what is
allowed — at graph-construction time where possible."""

import numpy as np
import pytest
import tensorflow as tf

import sparseflow as sf
from sparseflow.optimizers import adagrad, ftrl, gradient_descent, lazy_adam
from tests.pipeline_utils import make_batch_iterator


def _table(name="t", **kwargs):
    return sf.create_table(tf.int64, 4, name, tf.compat.v1.zeros_initializer(), **kwargs)


def _batch(spec, data=None):
    data = data or {spec.index_key: np.zeros((4, 2), np.int64)}
    return make_batch_iterator(data, 2, [spec]).get_next()


@pytest.mark.parametrize("call", [
    lambda: sf.create_table(tf.int64, 4, "t", tf.compat.v1.zeros_initializer()),
    lambda: sf.get_asc_insert_func(tgt_key_specs=[]),
    lambda: sf.start_asc_pipeline(),
    lambda: sf.get_dense_and_sparse_variable(),
    lambda: lazy_adam.create_hash_optimizer(),
    lambda: gradient_descent.create_hash_optimizer(0.1),
    lambda: adagrad.create_hash_optimizer(),
    lambda: ftrl.create_hash_optimizer(0.1),
    lambda: sf.sparse_lookup(None, None),
    lambda: sf.FeatureSpec("f"),
], ids=["create_table", "insert_func", "start", "variables", "lazy_adam", "sgd", "adagrad",
        "ftrl", "sparse_lookup", "FeatureSpec"])
def test_every_api_before_init_raises_not_initialized(graph, call):
    with pytest.raises(sf.NotInitializedError, match=r"call sparseflow\.init\(\.\.\.\) before"):
        call()


def test_create_table_rejects_duplicate_names_and_late_creation(sf_init):
    _table("t")
    with pytest.raises(ValueError, match=r"`name` must be unique.*'t'"):
        _table("t")
    sf.start_asc_pipeline()
    with pytest.raises(RuntimeError, match=r"Cannot create table `u`.*pipeline has already"):
        _table("u")


def test_sparse_lookup_argument_errors(sf_init):
    table = _table("t")
    other = _table("other")
    spec = sf.FeatureSpec("f", table_name="t")
    batch = _batch(spec)
    with pytest.raises(TypeError, match=r"`hashtable` must be a table returned by create_table"):
        sf.sparse_lookup("t", spec, batch=batch)
    with pytest.raises(TypeError, match=r"`ids` must be a FeatureSpec. Received: 3"):
        sf.sparse_lookup(table, 3, batch=batch)
    with pytest.raises(ValueError, match=r"FeatureSpec `f` has `table_name`='t', but "
                                         r"sparse_lookup was given table 'other'"):
        sf.sparse_lookup(other, spec, batch=batch)
    with pytest.raises(ValueError, match=r"`send_count` must be an int in \[1, 2147483647\]. "
                                         r"Received: 0"):
        sf.sparse_lookup(table, spec, send_count=0, batch=batch)
    with pytest.raises(TypeError, match=r"`is_train` must be a bool. Received: 1"):
        sf.sparse_lookup(table, spec, is_train=1, batch=batch)
    with pytest.raises(TypeError, match=r"`batch` must be the dict produced by dataset.map"):
        sf.sparse_lookup(table, spec, batch=None)
    with pytest.raises(ValueError, match=r"`batch` has no rows for FeatureSpec `f` of table 't'.*"
                                         r"get_asc_insert_func"):
        sf.sparse_lookup(table, spec, batch={"f": tf.zeros([2, 2], tf.int64)})
    with pytest.raises(ValueError, match=r"`ids` must be an output of iterator.get_next\(\)"):
        sf.sparse_lookup(table, tf.zeros([2], tf.int64), modify_graph=True)
    with pytest.raises(TypeError, match=r"unexpected keyword argument `serving_defualt_value`"):
        sf.sparse_lookup(table, spec, batch=batch, serving_defualt_value=1.0)
    with pytest.raises(ValueError, match=r"`access_and_evict_config` must be a dict with keys "
                                         r"access_threshold, eviction_threshold, "
                                         r"faae_coefficient only\. Received: \['a'\]"):
        sf.sparse_lookup(table, spec, batch=batch, access_and_evict_config={"a": 1})


def test_insert_func_errors_name_the_problem(sf_init):
    spec = sf.FeatureSpec("f", table_name="t", index_key="missing")
    fn = sf.get_asc_insert_func(tgt_key_specs=[spec])
    ds = tf.data.Dataset.from_tensors({"f": tf.zeros([2], tf.int64)})
    with pytest.raises(KeyError, match=r"FeatureSpec `f` reads batch\['missing'\].*\['f'\]"):
        ds.map(fn)
    float_spec = sf.FeatureSpec("g", table_name="t")
    with pytest.raises(TypeError, match=r"FeatureSpec `g`.*dtype float32.*int32 or int64"):
        tf.data.Dataset.from_tensors({"g": tf.zeros([2])}).map(
            sf.get_asc_insert_func(tgt_key_specs=[float_spec]))
    with pytest.raises(TypeError, match=r"dataset of dicts"):
        tf.data.Dataset.from_tensors(tf.zeros([2], tf.int64)).map(
            sf.get_asc_insert_func(tgt_key_specs=[float_spec]))
    with pytest.raises(TypeError, match=r"`is_training` must be a bool"):
        sf.get_asc_insert_func(tgt_key_specs=[spec], is_training="yes")
    with pytest.raises(ValueError, match=r"`args_index_list` and `table_names` are not supported"):
        sf.get_asc_insert_func(args_index_list=[0], table_names=["t"])


def test_start_pipeline_checks_wiring(sf_init):
    with pytest.raises(ValueError, match=r"found no table"):
        sf.start_asc_pipeline()
    _table("t")
    spec = sf.FeatureSpec("f", table_name="nope")
    sf.get_asc_insert_func(tgt_key_specs=[spec])
    with pytest.raises(ValueError, match=r"FeatureSpec `f` has table_name='nope'.*Tables: \['t'\]"):
        sf.start_asc_pipeline()


def test_start_pipeline_twice_raises(sf_init):
    _table("t")
    sf.start_asc_pipeline()
    with pytest.raises(RuntimeError, match=r"already called"):
        sf.start_asc_pipeline()


def test_running_the_dataset_before_start_says_what_to_call(sf_init):
    spec = sf.FeatureSpec("f", table_name="t")
    _table("t")
    it = make_batch_iterator({"f": np.zeros((4, 2), np.int64)}, 2, [spec])
    batch = it.get_next()
    with tf.compat.v1.Session() as sess:
        sess.run(it.initializer)
        with pytest.raises(tf.errors.OpError, match=r"call start_asc_pipeline\(\)"):
            sess.run(batch["f"])


def test_train_specs_of_one_table_must_agree_on_thresholds(sf_init):
    table = _table("t")
    a = sf.FeatureSpec("a", table_name="t", access_threshold=2)
    b = sf.FeatureSpec("b", table_name="t", access_threshold=3)
    sf.get_asc_insert_func(tgt_key_specs=[a])
    sf.get_asc_insert_func(tgt_key_specs=[b])
    with pytest.raises(ValueError, match=r"Table `t`.*access_threshold=3.*already has "
                                         r"access_threshold=2"):
        sf.start_asc_pipeline()
    assert table.access_threshold == 2


def test_apply_gradients_rejects_dense_variables_and_dense_gradients(sf_init):
    table = _table("t")
    var = tf.Variable(tf.zeros([3]))
    opt = lazy_adam.create_hash_optimizer()
    with pytest.raises(TypeError, match=r"`grads_and_vars` must be pairs \(gradient, sparseflow "
                                        r"table\)"):
        opt.apply_gradients([(tf.zeros([3]), var)])
    with pytest.raises(TypeError, match=r"`grads_and_vars` must be gradients from "
                                        r"tf.gradients\(loss, table\) \(IndexedSlices\)"):
        opt.apply_gradients([(tf.zeros([3, 4]), table)])


def test_apply_gradients_with_nothing_to_apply_raises_like_tf(sf_init):
    """An empty list (built from a collection nobody filled) or only None gradients must not
    build a no-op: the program would train without its sparse tables."""
    table, other = _table("t"), _table("u")
    opt = lazy_adam.create_hash_optimizer()
    with pytest.raises(ValueError, match=r"No gradients provided: `grads_and_vars` is empty"):
        opt.apply_gradients([])
    with pytest.raises(ValueError, match=r"No gradients provided for any table.*"
                                         r"\['t', 'u'\]"):
        opt.apply_gradients(zip([None, None], [table, other]))
    spec = sf.FeatureSpec("f", table_name="t")
    emb = sf.sparse_lookup(table, spec, batch=_batch(spec))
    grad = tf.gradients(tf.reduce_sum(emb), [table])[0]
    assert isinstance(opt.apply_gradients([(grad, table), (None, other)]), tf.Operation)


def test_by_address_apply_gradients_with_nothing_to_apply_raises(graph):
    from sparseflow.lookup import ADDRESS_COLLECTION
    from sparseflow.optimizers import lazy_adam_by_addr

    sf.init(use_dynamic_expansion=True)
    table = _table("t")
    spec = sf.FeatureSpec("f", table_name="t")
    sf.sparse_lookup(table, spec, batch=_batch(spec))
    addresses = tf.compat.v1.get_collection(ADDRESS_COLLECTION)
    assert len(addresses) == 1
    opt = lazy_adam_by_addr.create_hash_optimizer_by_address(0.1)
    with pytest.raises(ValueError, match=r"No gradients provided: `grads_and_vars` is empty"):
        opt.apply_gradients([])
    with pytest.raises(ValueError, match=r"No gradients provided for any table.*\['t'\]"):
        opt.apply_gradients([(None, addresses[0])])


def test_a_table_takes_one_sparse_optimizer(sf_init):
    table = _table("t")
    spec = sf.FeatureSpec("f", table_name="t")
    emb = sf.sparse_lookup(table, spec, batch=_batch(spec))
    grad = tf.gradients(tf.reduce_sum(emb), [table])[0]
    lazy_adam.create_hash_optimizer(name="first").apply_gradients([(grad, table)])
    with pytest.raises(ValueError, match=r"Table `t` is already updated by optimizer `first`"):
        adagrad.create_hash_optimizer(name="second").apply_gradients([(grad, table)])


def test_optimizers_refuse_dynamic_expansion(graph):
    sf.init(use_dynamic_expansion=True)
    with pytest.raises(ValueError, match=r"dynamic expansion mode is not compatible"):
        lazy_adam.create_hash_optimizer()


def test_ftrl_rejects_l2_shrinkage_it_cannot_apply(sf_init):
    with pytest.raises(ValueError, match=r"`l2_shrinkage_regularization_strength` must be 0.*0.5"):
        ftrl.create_hash_optimizer(0.1, l2_shrinkage_regularization_strength=0.5)


def test_every_kernel_releases_the_gil():
    import numba

    from sparseflow.ops import hash_index, init_kernels, key_kernels, optimizer_kernels
    kernels = [obj for module in (hash_index, init_kernels, key_kernels, optimizer_kernels)
               for obj in vars(module).values()
               if isinstance(obj, numba.core.registry.CPUDispatcher)]
    assert len(kernels) >= 15
    for kernel in kernels:
        assert kernel.targetoptions.get("nogil") is True, kernel.py_func.__name__


def test_kernels_load_without_tensorflow():
    import subprocess
    import sys
    code = ("import sys; import sparseflow.ops.key_kernels, sparseflow.ops.hash_index, "
            "sparseflow.ops.optimizer_kernels, sparseflow.ops.init_kernels; "
            "print('tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_public_names_and_submodules_resolve():
    for name in sf.__all__:
        assert getattr(sf, name) is not None
    assert sf.runtime.current is not None and sf.ops is not None
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        sf.nope  # noqa: B018


@pytest.mark.parametrize("first,second,ok", [
    (None, 5, False), (5, None, False), (None, -1, True), (-1, None, True), (3, 3, True)])
def test_threshold_agreement_treats_none_as_off_in_any_order(sf_init, first, second, ok):
    table = _table("t")
    sf.get_asc_insert_func(tgt_key_specs=[sf.FeatureSpec("a", table_name="t",
                                                         access_threshold=first)])
    sf.get_asc_insert_func(tgt_key_specs=[sf.FeatureSpec("b", table_name="t",
                                                         access_threshold=second)])
    if ok:
        sf.start_asc_pipeline()
        assert table.access_threshold == (-1 if first is None else first)
    else:
        with pytest.raises(ValueError, match=r"Table `t`.*must be same in one table"):
            sf.start_asc_pipeline()


def test_int64_features_cannot_feed_an_int32_table(sf_init):
    sf.create_table(tf.int32, 4, "t", tf.compat.v1.zeros_initializer())
    spec = sf.FeatureSpec("f", table_name="t")
    tf.data.Dataset.from_tensors({"f": tf.constant([2**40], tf.int64)}).map(
        sf.get_asc_insert_func(tgt_key_specs=[spec]))
    with pytest.raises(ValueError, match=r"FeatureSpec `f` feeds int64 keys to table `t` created "
                                         r"with key_dtype=tf.int32"):
        sf.start_asc_pipeline()
