"""``TableConfig`` / ``make_table_config``: valid input, then one test per rule."""

import dataclasses
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from sparseflow.embed.table_config import TableConfig, make_table_config
from sparseflow.validation import INT32_MAX

INIT = tf.compat.v1.truncated_normal_initializer(stddev=0.05)


def names(argument, received):
    """Regex: the message names ``argument`` and shows ``received`` as the template does."""
    return rf"`{re.escape(argument)}`.*Received: {re.escape(repr(received))}$"


def make(**overrides):
    kwargs = dict(key_dtype=tf.int64, dim=8, name="user_table", emb_initializer=INIT)
    kwargs.update(overrides)
    return make_table_config(**kwargs)


# --- valid input -----------------------------------------------------------------------------

def test_defaults():
    cfg = make()
    assert isinstance(cfg, TableConfig)
    assert cfg.name == "user_table"
    assert cfg.key_dtype == np.dtype("int64") and isinstance(cfg.key_dtype, np.dtype)
    assert cfg.dim == 8
    assert cfg.emb_initializer is INIT
    assert (cfg.device_vocabulary_size, cfg.host_vocabulary_size,
            cfg.ssd_vocabulary_size) == (1, 0, 0)
    assert cfg.ssd_data_path == (os.getcwd(),)
    assert cfg.is_save is True
    assert cfg.init_param == 1.0 and isinstance(cfg.init_param, float)
    assert cfg.value_dtype == np.dtype("float32")
    assert cfg.capacity == 1


def test_positional_rec_sdk_order():
    cfg = make_table_config(tf.int32, 16, "item_table", INIT, 100, 200)
    assert (cfg.key_dtype, cfg.dim, cfg.name) == (np.dtype("int32"), 16, "item_table")
    assert (cfg.device_vocabulary_size, cfg.host_vocabulary_size) == (100, 200)


@pytest.mark.parametrize("key_dtype, expected", [
    (tf.int32, "int32"), (tf.int64, "int64"), (np.int32, "int32"), (np.int64, "int64"),
    (np.dtype("int32"), "int32"), ("int32", "int32"), ("int64", "int64"),
])
def test_key_dtype_forms(key_dtype, expected):
    cfg = make(key_dtype=key_dtype)
    assert cfg.key_dtype == np.dtype(expected)
    assert tf.as_dtype(cfg.key_dtype) == tf.as_dtype(expected)


@pytest.mark.parametrize("dim", [1, 32, 8192, np.int64(32), tf.TensorShape([32]), [32], (32,)])
def test_dim_forms(dim):
    cfg = make(dim=dim)
    assert type(cfg.dim) is int
    assert cfg.dim in (1, 32, 8192)


@pytest.mark.parametrize("name", ["a", "t" * 100, "user.table_2", "A.b_C.9"])
def test_name_accepted(name):
    assert make(name=name).name == name


@pytest.mark.parametrize("value_dtype", [None, tf.float32, np.float32, np.dtype("float32"),
                                         "float32"])
def test_value_dtype_forms(value_dtype):
    assert make(value_dtype=value_dtype).value_dtype == np.dtype("float32")


def test_vocabulary_bounds_and_capacity():
    cfg = make(device_vocabulary_size=10**9, host_vocabulary_size=10**9,
               ssd_vocabulary_size=10**9)
    assert cfg.capacity == 3 * 10**9
    assert make(device_vocabulary_size=100, host_vocabulary_size=400).capacity == 500


@pytest.mark.parametrize("path, expected", [("/data/ssd", ("/data/ssd",)),
                                            (["/a", "/b"], ("/a", "/b")),
                                            (("/a",), ("/a",))])
def test_ssd_data_path_forms(path, expected):
    cfg = make(host_vocabulary_size=10, ssd_vocabulary_size=10, ssd_data_path=path)
    assert cfg.ssd_data_path == expected


@pytest.mark.parametrize("value", [-10, 10, 0, 0.5, np.float32(2.0)])
def test_init_param_bounds(value):
    assert make(init_param=value).init_param == pytest.approx(float(value))


def test_is_save_false():
    assert make(is_save=False).is_save is False


def test_rec_sdk_options_accepted_and_ignored():
    cfg = make(is_dp=False, enable_merge=False, padding_keys=[0, -1], padding_keys_mask=True,
               padding_keys_len=2, shard_num=8192, fusion_optimizer_var=True,
               hashtable_threshold=0)
    assert cfg == make()
    # Kept: how an owner combines gradients from several ranks (test_routing.py).
    assert make(all2all_gradients_op="sum_gradients_and_div_by_ranksize") != make()


def test_frozen_and_inputs_not_mutated():
    shape = tf.TensorShape([16])
    paths = ["/a"]
    cfg = make(dim=shape, host_vocabulary_size=1, ssd_vocabulary_size=1, ssd_data_path=paths)
    assert shape == tf.TensorShape([16]) and paths == ["/a"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.dim = 4


def test_direct_construction_validates():
    cfg = TableConfig(name="t", key_dtype=tf.int64, dim=tf.TensorShape([4]), emb_initializer=INIT)
    assert (cfg.key_dtype, cfg.dim) == (np.dtype("int64"), 4)
    with pytest.raises(ValueError, match=names("dim", 0)):
        TableConfig(name="t", key_dtype=tf.int64, dim=0, emb_initializer=INIT)
    with pytest.raises(TypeError):
        TableConfig("t", tf.int64, 4, INIT)  # keyword-only


def test_repr():
    text = repr(make(device_vocabulary_size=100, host_vocabulary_size=50))
    assert text.startswith("TableConfig(name='user_table', key_dtype=int64, dim=8, ")
    assert "emb_initializer=TruncatedNormal(mean=0.0, stddev=0.05" in text
    assert "device_vocabulary_size=100" in text and "host_vocabulary_size=50" in text
    assert "ssd" not in text
    assert text.endswith("is_save=True, init_param=1.0, value_dtype=float32)")
    ssd = repr(make(host_vocabulary_size=1, ssd_vocabulary_size=2, ssd_data_path="/d"))
    assert "ssd_vocabulary_size=2, ssd_data_path=('/d',)" in ssd


def test_repr_of_plain_initializer():
    assert "emb_initializer='zeros'" in repr(make(emb_initializer="zeros"))


# --- invalid input ---------------------------------------------------------------------------

@pytest.mark.parametrize("value", [tf.float32, tf.int16, tf.uint64, np.float64, "float32",
                                   "int", np.dtype("int8")])
def test_key_dtype_value(value):
    with pytest.raises(ValueError, match=names("key_dtype", value)) as info:
        make(key_dtype=value)
    assert "tf.int32, tf.int64" in str(info.value)


@pytest.mark.parametrize("value", [None, 5, int, [tf.int64]])
def test_key_dtype_type(value):
    with pytest.raises(TypeError, match=names("key_dtype", value)) as info:
        make(key_dtype=value)
    assert "tf.int32, tf.int64" in str(info.value)


@pytest.mark.parametrize("value", [0, -1, 8193, tf.TensorShape([0]), tf.TensorShape([8193]),
                                   tf.TensorShape([None]), tf.TensorShape([2, 4]),
                                   tf.TensorShape([]), tf.TensorShape(None), [], [4, 4],
                                   [4.0], (0,)])
def test_dim_value(value):
    with pytest.raises(ValueError, match=names("dim", value)) as info:
        make(dim=value)
    assert "[1, 8192]" in str(info.value)


@pytest.mark.parametrize("value", [8.0, "8", None, True])
def test_dim_type(value):
    with pytest.raises(TypeError, match=names("dim", value)):
        make(dim=value)


@pytest.mark.parametrize("value", ["", "t" * 101])
def test_name_length(value):
    with pytest.raises(ValueError, match=names("name", value)):
        make(name=value)


@pytest.mark.parametrize("value", ["user-table", "user table", "t/1", "表", "a\n"])
def test_name_characters(value):
    with pytest.raises(ValueError, match=names("name", value)) as info:
        make(name=value)
    assert "A-Z, a-z, 0-9, '_' and '.'" in str(info.value)


@pytest.mark.parametrize("value", [None, 3, b"t"])
def test_name_type(value):
    with pytest.raises(TypeError, match=names("name", value)):
        make(name=value)


def test_emb_initializer_none():
    with pytest.raises(TypeError, match=names("emb_initializer", None)):
        make(emb_initializer=None)


@pytest.mark.parametrize("value", [0, -1, 10**9 + 1])
def test_device_vocabulary_size_range(value):
    with pytest.raises(ValueError, match=names("device_vocabulary_size", value)):
        make(device_vocabulary_size=value)


@pytest.mark.parametrize("argument", ["host_vocabulary_size", "ssd_vocabulary_size"])
@pytest.mark.parametrize("value", [-1, 10**9 + 1])
def test_host_and_ssd_vocabulary_size_range(argument, value):
    kwargs = {"host_vocabulary_size": 1, argument: value}
    with pytest.raises(ValueError, match=names(argument, value)):
        make(**kwargs)


@pytest.mark.parametrize("argument", ["device_vocabulary_size", "host_vocabulary_size",
                                      "ssd_vocabulary_size"])
@pytest.mark.parametrize("value", [1e3, "10", True, None])
def test_vocabulary_size_type(argument, value):
    with pytest.raises(TypeError, match=names(argument, value)):
        make(**{argument: value})


def test_ssd_needs_host():
    with pytest.raises(ValueError, match=r"`host_vocabulary_size`.*`ssd_vocabulary_size`.*"
                                         r"Received: host_vocabulary_size=0, "
                                         r"ssd_vocabulary_size=5$"):
        make(ssd_vocabulary_size=5)


@pytest.mark.parametrize("value", [-10.5, 10.001, float("nan"), float("inf")])
def test_init_param_range(value):
    with pytest.raises(ValueError, match=names("init_param", value)):
        make(init_param=value)


@pytest.mark.parametrize("value", ["1.0", None, True])
def test_init_param_type(value):
    with pytest.raises(TypeError, match=names("init_param", value)):
        make(init_param=value)


@pytest.mark.parametrize("value", [tf.float16, tf.float64, np.float64, "float16", tf.bfloat16])
def test_value_dtype_value(value):
    with pytest.raises(ValueError, match=names("value_dtype", value)) as info:
        make(value_dtype=value)
    assert "tf.float32" in str(info.value)


def test_value_dtype_type():
    with pytest.raises(TypeError, match=names("value_dtype", 32)):
        make(value_dtype=32)


@pytest.mark.parametrize("value", [1, "True", None])
def test_is_save_type(value):
    with pytest.raises(TypeError, match=names("is_save", value)):
        make(is_save=value)


@pytest.mark.parametrize("value", [[], "", [""], ["/a", 3]])
def test_ssd_data_path_value(value):
    with pytest.raises(ValueError, match=names("ssd_data_path", value)):
        make(host_vocabulary_size=1, ssd_vocabulary_size=1, ssd_data_path=value)


def test_ssd_data_path_type():
    with pytest.raises(TypeError, match=names("ssd_data_path", 3)):
        make(ssd_data_path=3)


@pytest.mark.parametrize("value", [0, 8193])
def test_shard_num_range(value):
    with pytest.raises(ValueError, match=names("shard_num", value)):
        make(shard_num=value)


def test_all2all_gradients_op():
    with pytest.raises(ValueError, match=names("all2all_gradients_op", "mean")) as info:
        make(all2all_gradients_op="mean")
    assert "'sum_gradients', 'sum_gradients_and_div_by_ranksize'" in str(info.value)


def test_hashtable_threshold_range():
    with pytest.raises(ValueError, match=names("hashtable_threshold", INT32_MAX + 1)):
        make(hashtable_threshold=INT32_MAX + 1)


@pytest.mark.parametrize("argument", ["is_dp", "enable_merge", "padding_keys_mask",
                                      "fusion_optimizer_var"])
def test_ignored_bools_type(argument):
    with pytest.raises(TypeError, match=names(argument, 1)):
        make(**{argument: 1})


def test_unknown_argument():
    # A misspelt size must not silently fall back to the default of 1 row.
    with pytest.raises(TypeError, match=r"unexpected keyword argument `device_vocab_size`.*"
                                        r"Received: 1000$"):
        make(device_vocab_size=1000)
