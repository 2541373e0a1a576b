"""The faces that configure a table agree on its limits (sparseflow/embed/limits.py): Rec
SDK's ``create_table`` and ``FeatureSpec``, the TF2 ``TableConfig`` and the YAML job schema
accept the same largest values and refuse the same first values beyond them, each naming the
argument; ``sparseflow stats --suggest`` flags a vocabulary the job config would refuse."""

import re

import pytest
import tensorflow as tf
import yaml

import sparseflow as sf
from sparseflow import tf2
from sparseflow.embed import limits
from sparseflow.jobs import ConfigError
from sparseflow.stats.suggest import render_yaml_fragment, suggest
from sparseflow.validation import INT32_MAX
from tests.test_feature_stats_report import doc_from_counts
from tests.test_job_config import MINIMAL, parse

INIT = tf.compat.v1.zeros_initializer()


def create_table(name="t", dim=4, vocabulary_size=10):
    return sf.create_table(tf.int64, dim, name, INIT, device_vocabulary_size=vocabulary_size)


def yaml_job(**table):
    """MINIMAL with table C1's keys overridden (a dim for every table and the DLRM's bottom
    MLP: its dot interaction needs one dim)."""
    overrides = [f"tables.C1.{k}={v}" for k, v in table.items()]
    if "dim" in table:
        overrides += [f"tables.C2.dim={table['dim']}", f"model.bottom_mlp=[64, {table['dim']}]"]
    return parse(MINIMAL, overrides)


def yaml_table_name(name):
    """MINIMAL with table C1 renamed ``name`` (feature C1 looks it up)."""
    text = MINIMAL.replace("  C1: {vocabulary_size: 100}", f"  '{name}': {{vocabulary_size: 100}}")
    return parse(text + f"features:\n  C1: {{table: '{name}'}}\n  C2: {{}}\n")


def test_the_limits_are_rec_sdks_documented_ranges():
    assert limits.MAX_DIM == 8192 and limits.MAX_VOCABULARY_SIZE == 10**9
    assert (limits.ACCESS_THRESHOLD_MIN, limits.ACCESS_THRESHOLD_MAX) == (-1, INT32_MAX)
    assert limits.EVICTION_THRESHOLD_MAX == INT32_MAX
    assert limits.TABLE_NAME_PATTERN.fullmatch("a" * limits.TABLE_NAME_MAX_LEN)
    assert not limits.TABLE_NAME_PATTERN.fullmatch("a" * (limits.TABLE_NAME_MAX_LEN + 1))
    assert not limits.TABLE_NAME_PATTERN.fullmatch("C-1")


def test_the_largest_dim_and_vocabulary_pass_every_face(sf_init):
    biggest = dict(dim=limits.MAX_DIM, vocabulary_size=limits.MAX_VOCABULARY_SIZE)
    assert tf2.TableConfig(**biggest).dim == limits.MAX_DIM
    job = yaml_job(**biggest)
    assert (job.tables[0].dim, job.tables[0].vocabulary_size) == (
        limits.MAX_DIM, limits.MAX_VOCABULARY_SIZE)
    # create_table allocates its rows: the largest dim with a small vocabulary.
    assert create_table(dim=limits.MAX_DIM).config.dim == limits.MAX_DIM
    assert sf.FeatureSpec("f", access_threshold=limits.ACCESS_THRESHOLD_MAX,
                          eviction_threshold=limits.EVICTION_THRESHOLD_MAX)


@pytest.mark.parametrize("argument, value", [
    ("dim", limits.MAX_DIM + 1),
    ("dim", 0),
    ("vocabulary_size", limits.MAX_VOCABULARY_SIZE + 1),
    ("vocabulary_size", 0),
])
def test_dim_and_vocabulary_beyond_the_limit_are_refused_by_every_face(sf_init, argument,
                                                                       value):
    kwargs = dict(dim=4, vocabulary_size=10)
    kwargs[argument] = value
    # create_table's name for the vocabulary is Rec SDK's.
    create_arg = "device_vocabulary_size" if argument == "vocabulary_size" else argument
    with pytest.raises(ValueError, match=f"`{create_arg}`.*Received: {value}"):
        create_table(**kwargs)
    with pytest.raises(ValueError, match=f"`{argument}`.*Received: {value}"):
        tf2.TableConfig(**kwargs)
    with pytest.raises(ConfigError, match=f"tables.C1.{argument}: .*got {value}"):
        yaml_job(**{argument: value})


@pytest.mark.parametrize("argument, value", [
    ("access_threshold", limits.ACCESS_THRESHOLD_MIN - 1),
    ("access_threshold", limits.ACCESS_THRESHOLD_MAX + 1),
    ("eviction_threshold", limits.EVICTION_THRESHOLD_MAX + 1),
])
def test_thresholds_beyond_the_limit_are_refused_by_every_face(sf_init, argument, value):
    with pytest.raises(ValueError, match=f"`{argument}`.*Received: {value}"):
        sf.FeatureSpec("f", **{argument: value})
    with pytest.raises(ValueError, match=f"`{argument}`.*Received: {value}"):
        tf2.TableConfig(10, 4, **{argument: value})
    with pytest.raises(ConfigError, match=f"tables.C1.{argument}: .*got {value}"):
        yaml_job(**{argument: value})


@pytest.mark.parametrize("name", ["a" * (limits.TABLE_NAME_MAX_LEN + 1), "C-1", "C 1"])
def test_a_table_name_refused_by_one_face_is_refused_by_every_face(sf_init, name):
    with pytest.raises(ValueError, match=f"`name`.*Received: {re.escape(repr(name))}"):
        create_table(name)
    with pytest.raises(ValueError, match=f"`name`.*Received: {re.escape(repr(name))}"):
        tf2.TableConfig(10, 4, name=name)
    with pytest.raises(ConfigError, match="table names are 1 to 100 characters"):
        yaml_table_name(name)


def test_a_table_name_of_the_largest_length_passes_every_face(sf_init):
    name = "t." + "a" * (limits.TABLE_NAME_MAX_LEN - 2)
    assert create_table(name).table_name == name
    assert tf2.TableConfig(10, 4, name=name).name == name
    assert name in {t.name for t in yaml_table_name(name).tables}


@pytest.mark.parametrize("vocabulary_size, flagged", [
    (limits.MAX_VOCABULARY_SIZE, False), (limits.MAX_VOCABULARY_SIZE + 1, True)])
def test_suggest_flags_exactly_the_vocabularies_the_job_config_refuses(vocabulary_size,
                                                                       flagged):
    suggestion = suggest(doc_from_counts({"C1": [3, 1, 1]}, max_threshold=2), 10**6)
    suggestion["tables"]["C1"]["vocabulary_size"] = vocabulary_size
    text = render_yaml_fragment(suggestion)
    assert ("above the config limit" in text) == flagged
    size = yaml.safe_load(text)["tables"]["C1"]["vocabulary_size"]
    if flagged:
        with pytest.raises(ConfigError, match="tables.C1.vocabulary_size"):
            yaml_job(vocabulary_size=size)
    else:
        assert yaml_job(vocabulary_size=size).tables[0].vocabulary_size == size
