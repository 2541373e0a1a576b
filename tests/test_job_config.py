"""The YAML job config (sparseflow.jobs): valid configs, every error kind with its exact
file:line and key path, overrides, and the to_dict round trip."""

import pickle
import textwrap

import pytest
import yaml

from sparseflow.jobs import ConfigError, JobConfig, load_config
from sparseflow.jobs.schema import (SPARSE_OPTIMIZERS, ColumnsConfig, CsvOptions, DataConfig,
                                    EvictionSchedule, FeatureEntry, GeneratorOptions,
                                    InitializerConfig, ModelConfig, MovielensOptions,
                                    OptimizerConfig, OutputConfig, ScheduleConfig, SparseColumn,
                                    TableEntry, parse_config)

# Line numbers matter: the error tests edit one line and assert where the error points.
MINIMAL = textwrap.dedent("""\
    data:
      source: generator
    columns:
      labels: [label]
      dense: [I1, I2]
      sparse:
        C1: {}
        C2: {}
    tables:
      defaults: {dim: 16}
      C1: {vocabulary_size: 100}
      C2: {vocabulary_size: 200}
    optimizer:
      sparse: {name: lazy_adam, learning_rate: 0.001}
      dense: {name: adam, learning_rate: 0.001}
    model:
      name: dlrm
      bottom_mlp: [64, 16]
      top_mlp: [32]
    schedule:
      batch_size: 128
      max_steps: 10
    output:
      dir: runs/min
    """)

FULL = textwrap.dedent("""\
    name: full_job
    data:
      source: csv
      train: ["${DATA_DIR:-/data}/train.csv", /data/more/*.csv]
      eval: /data/eval.csv
      shuffle_buffer: 10000
      csv: {delimiter: ";", header: false}
    columns:
      labels: [click, buy]
      dense: [age, price]
      dense_transform: log1p
      sparse:
        user: {encoding: string}
        item:
        tags: {length: 4, encoding: hex}
      timestamp: ts
    tables:
      defaults: {dim: 8, initializer: {name: random_uniform, minval: -0.1, maxval: 0.1}}
      user: {vocabulary_size: 1000, access_threshold: 2, eviction_threshold: 3600,
             admission_counter: sketch}
      item: {vocabulary_size: 500, initializer: {name: zeros}}
      tags: {vocabulary_size: 50, initializer: {name: constant, value: 1}}
      wide: {dim: 1, vocabulary_size: 1000}
    features:
      user: {}
      item: {faae_coefficient: 2}
      tags: {combiner: sqrtn}
      user_wide: {table: wide, index_key: user, combiner: sum}
    optimizer:
      sparse: {name: ftrl, learning_rate: 0.05, l1_regularization_strength: 0.001}
      dense: {name: adagrad, learning_rate: 1, initial_accumulator_value: 0.5}
    model:
      name: wide_deep
      deep_mlp: [64, 32]
      wide_features: [user_wide]
    schedule:
      batch_size: 512
      max_steps: 1000
      eval_every: 100
      eval_steps: 10
      save_every: 500
      log_every: 50
      seed: 7
      eviction: {every_steps: 200}
    output:
      dir: /tmp/runs/full
      tensorboard: false
    """)


def parse(text, overrides=(), environ=None, file="job.yaml"):
    return parse_config(text, file, overrides, {} if environ is None else environ)


def error(text, overrides=(), environ=None, file="job.yaml"):
    """The message of the ConfigError that parsing ``text`` raises."""
    with pytest.raises(ConfigError) as info:
        parse(text, overrides, environ, file)
    return str(info.value)


def edit(old, new, text=MINIMAL):
    assert text.count(old) == 1, old
    return text.replace(old, new)


# ------------------------------------------------------------------------------ valid configs

def test_minimal_config_fills_defaults():
    cfg = parse(MINIMAL)
    initializer = InitializerConfig("truncated_normal", {"mean": 0.0, "stddev": 0.05})
    assert cfg == JobConfig(
        name="job", source_file="job.yaml",
        data=DataConfig("generator", (), (), 0, CsvOptions(), GeneratorOptions(),
                        MovielensOptions()),
        columns=ColumnsConfig(("label",), ("I1", "I2"), "none",
                              (SparseColumn("C1"), SparseColumn("C2")), None),
        tables=(TableEntry("C1", 16, 100, initializer), TableEntry("C2", 16, 200, initializer)),
        features=(FeatureEntry("C1", "C1", "C1"), FeatureEntry("C2", "C2", "C2")),
        sparse_optimizer=OptimizerConfig("lazy_adam", 0.001,
                                         {"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8}),
        dense_optimizer=OptimizerConfig("adam", 0.001,
                                        {"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8}),
        model=ModelConfig("dlrm", {"bottom_mlp": [64, 16], "top_mlp": [32],
                                   "interaction": "dot"}),
        schedule=ScheduleConfig(128, 10, 0, 0, 0, 20, 0, EvictionSchedule(0)),
        output=OutputConfig("runs/min", True))
    assert cfg.table("C2").vocabulary_size == 200
    with pytest.raises(KeyError, match="C3"):
        cfg.table("C3")


def test_full_config():
    cfg = parse(FULL)
    assert cfg.name == "full_job"
    assert cfg.data == DataConfig("csv", ("/data/train.csv", "/data/more/*.csv"),
                                  ("/data/eval.csv",), 10000, CsvOptions(";", False),
                                  GeneratorOptions(), MovielensOptions())
    assert cfg.columns == ColumnsConfig(
        ("click", "buy"), ("age", "price"), "log1p",
        (SparseColumn("user", 1, "string"), SparseColumn("item"), SparseColumn("tags", 4, "hex")),
        "ts")
    uniform = InitializerConfig("random_uniform", {"minval": -0.1, "maxval": 0.1})
    assert cfg.tables == (
        TableEntry("user", 8, 1000, uniform, 2, 3600, "sketch"),
        TableEntry("item", 8, 500, InitializerConfig("zeros", {})),
        TableEntry("tags", 8, 50, InitializerConfig("constant", {"value": 1.0})),
        TableEntry("wide", 1, 1000, uniform))
    assert cfg.features == (FeatureEntry("user", "user", "user"),
                            FeatureEntry("item", "item", "item", faae_coefficient=2),
                            FeatureEntry("tags", "tags", "tags", combiner="sqrtn"),
                            FeatureEntry("user_wide", "wide", "user", combiner="sum"))
    assert cfg.sparse_optimizer == OptimizerConfig("ftrl", 0.05, {
        "learning_rate_power": -0.5, "initial_accumulator_value": 0.1,
        "l1_regularization_strength": 0.001, "l2_regularization_strength": 0.0})
    assert cfg.dense_optimizer == OptimizerConfig("adagrad", 1.0,
                                                  {"initial_accumulator_value": 0.5})
    assert isinstance(cfg.dense_optimizer.learning_rate, float)  # an int is accepted as a float
    assert cfg.model == ModelConfig("wide_deep", {"deep_mlp": [64, 32],
                                                  "wide_features": ["user_wide"]})
    assert cfg.schedule == ScheduleConfig(512, 1000, 100, 10, 500, 50, 7, EvictionSchedule(200))
    assert cfg.output == OutputConfig("/tmp/runs/full", False)


def test_other_sources_and_models():
    movielens = textwrap.dedent("""\
        data: {source: movielens, movielens: {eval_fraction: 0}}
        columns:
          labels: label
          sparse: [user_id, item_id]
          timestamp: timestamp
        tables:
          defaults: {dim: 4}
          user_id: {vocabulary_size: 1000}
          item_id: {vocabulary_size: 2000}
        optimizer:
          sparse: {name: sgd, learning_rate: 0.1}
          dense: {name: sgd, learning_rate: 0.1}
        model: {name: dcn_v2, cross_layers: 3, deep_mlp: [16]}
        schedule: {batch_size: 8, max_steps: 1}
        output: {dir: out}
        """)
    cfg = parse(movielens)
    assert cfg.data.movielens == MovielensOptions("~/.cache/sparseflow", 0.0)
    assert cfg.columns.sparse == (SparseColumn("user_id"), SparseColumn("item_id"))
    assert cfg.sparse_optimizer.params == {"weight_decay": None}
    assert cfg.model.params == {"cross_layers": 3, "deep_mlp": [16], "low_rank": 0,
                                "structure": "stacked"}
    tsv = edit("source: generator", "source: criteo_tsv\n  train: day_0.tsv")
    assert parse(tsv).data.csv == CsvOptions("\t", False)
    # dlrm's cat interaction has no dim constraint; without dense columns, no bottom MLP.
    cat = edit("  dense: [I1, I2]\n", "", edit("C2: {vocabulary_size: 200}",
                                              "C2: {vocabulary_size: 200, dim: 4}"))
    cat = edit("bottom_mlp: [64, 16]", "interaction: cat", cat)
    assert parse(cat).model.params == {"bottom_mlp": [], "top_mlp": [32], "interaction": "cat"}


def test_load_config_from_file(tmp_path):
    path = tmp_path / "demo.yaml"
    path.write_text(edit("  max_steps: 10", "  max_steps: 0"))
    with pytest.raises(ConfigError) as info:
        load_config(str(path), environ={})
    assert str(info.value) == f"{path}:22 schedule.max_steps: must be an integer >= 1, got 0"
    path.write_text(MINIMAL)
    cfg = load_config(path, ["schedule.max_steps=3"], environ={})
    assert (cfg.name, cfg.source_file, cfg.schedule.max_steps) == ("demo", str(path), 3)
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=f"^{missing}: cannot read the file"):
        load_config(missing, environ={})


def test_params_dicts_are_copied():
    params = {"deep_mlp": [8]}
    model = ModelConfig("wide_deep", params)
    params["deep_mlp"].append(4)
    assert model.params == {"deep_mlp": [8]}
    cfg = parse(MINIMAL)
    cfg.to_dict()["model"]["top_mlp"].append(1)
    assert cfg.model.params["top_mlp"] == [32]


@pytest.mark.parametrize("text", [MINIMAL, FULL])
def test_to_dict_round_trips(text):
    cfg = parse(text)
    # sort_keys=False: the order of columns, tables and features is part of the config (the
    # model takes the features' embeddings in that order).
    assert parse(yaml.safe_dump(cfg.to_dict(), sort_keys=False)) == cfg
    assert parse(yaml.safe_dump(cfg.to_dict())).features == tuple(
        sorted(cfg.features, key=lambda f: f.name))


def test_exponent_floats_without_a_dot_are_numbers():
    # YAML 1.1 (PyYAML) reads 1e-8 as a string; the loader reads it as a number.
    cfg = parse(edit("{name: adam, learning_rate: 0.001}",
                     "{name: adam, learning_rate: 1e-3, epsilon: 1e-7}"))
    assert cfg.dense_optimizer.learning_rate == 1e-3
    assert cfg.dense_optimizer.params["epsilon"] == 1e-7
    quoted = edit("{name: adam, learning_rate: 0.001}", "{name: adam, learning_rate: '1e-3'}")
    assert error(quoted) == ('job.yaml:15 optimizer.dense.learning_rate: must be a number in '
                             '[0, 10], got "1e-3"')


# ------------------------------------------------------------------------------ error kinds

def test_config_error_attributes():
    with pytest.raises(ConfigError) as info:
        parse(edit("defaults: {dim: 16}", 'defaults: {dim: "16x"}'), file="criteo.yaml")
    e = info.value
    assert isinstance(e, ValueError)
    assert (e.file, e.line, e.path) == ("criteo.yaml", 10, "tables.defaults.dim")
    assert e.reason == 'must be an integer in [1, 8192], got "16x"'
    assert str(e) == 'criteo.yaml:10 tables.defaults.dim: must be an integer in [1, 8192], got "16x"'
    assert str(pickle.loads(pickle.dumps(e))) == str(e)


def test_yaml_syntax_error():
    message = error(edit("  dir: runs/min", "  dir: runs/min\n    bad: x"))
    assert message == "job.yaml:25: invalid YAML: mapping values are not allowed here"
    assert error("- a\n- b\n").startswith("job.yaml:1: the file must be a mapping")


def test_duplicate_key():
    assert error(edit("  max_steps: 10", "  max_steps: 10\n  max_steps: 11")) == (
        "job.yaml:23 schedule.max_steps: duplicate key (first at line 22)")


def test_unknown_key_with_suggestion():
    assert error(edit("  max_steps: 10", "  max_step: 10")) == (
        "job.yaml:22 schedule.max_step: unknown key; allowed: batch_size, eval_every, "
        "eval_steps, eviction, log_every, max_steps, save_every, seed (did you mean max_steps?)")
    assert error(edit("C1: {vocabulary_size: 100}", "C1: {vocab_size: 100}")).startswith(
        "job.yaml:11 tables.C1.vocab_size: unknown key; allowed: access_threshold, ")
    assert error(edit("C1: {vocabulary_size: 100}", "C1: {vocab_size: 100}")).endswith(
        "(did you mean vocabulary_size?)")


def test_missing_key_points_at_the_parent():
    assert error(edit("  max_steps: 10\n", "")) == (
        "job.yaml:20 schedule.max_steps: required key is missing")
    assert error(edit("C1: {vocabulary_size: 100}", "C1: {dim: 4}")) == (
        "job.yaml:11 tables.C1.vocabulary_size: required key is missing")
    assert error("") == "job.yaml:1 data: required key is missing"


@pytest.mark.parametrize("old, new, expected", [
    ("batch_size: 128", "batch_size: true",
     "job.yaml:21 schedule.batch_size: must be an integer in [1, 2147483647], got true"),
    ("batch_size: 128", "batch_size: 12.5",
     "job.yaml:21 schedule.batch_size: must be an integer in [1, 2147483647], got 12.5"),
    ("learning_rate: 0.001}\n  dense", 'learning_rate: "fast"}\n  dense',
     'job.yaml:14 optimizer.sparse.learning_rate: must be a number in [0, 10], got "fast"'),
    ("top_mlp: [32]", "top_mlp: 32",
     "job.yaml:19 model.top_mlp: must be a list of layer widths (integers >= 1), got 32"),
    ("  dir: runs/min", "  dir: runs/min\n  tensorboard: 1",
     "job.yaml:25 output.tensorboard: must be true or false, got 1"),
    ("labels: [label]", "labels: {label: 1}",
     'job.yaml:4 columns.labels: must be a list of strings, got {"label": 1}'),
])
def test_wrong_type(old, new, expected):
    assert error(edit(old, new)) == expected


@pytest.mark.parametrize("old, new, expected", [
    ("defaults: {dim: 16}", "defaults: {dim: 8193}",
     "job.yaml:10 tables.defaults.dim: must be an integer in [1, 8192], got 8193"),
    ("C1: {vocabulary_size: 100}", "C1: {vocabulary_size: 0}",
     "job.yaml:11 tables.C1.vocabulary_size: must be an integer in [1, 1000000000], got 0"),
    ("C1: {vocabulary_size: 100}", "C1: {vocabulary_size: 100, access_threshold: -2}",
     "job.yaml:11 tables.C1.access_threshold: must be an integer in [-1, 2147483647], got -2"),
    ("learning_rate: 0.001}\n  dense", "learning_rate: 11}\n  dense",
     "job.yaml:14 optimizer.sparse.learning_rate: must be a number in [0, 10], got 11"),
    ("{name: lazy_adam, learning_rate: 0.001}", "{name: lazy_adam, learning_rate: 0.1, beta1: 1}",
     "job.yaml:14 optimizer.sparse.beta1: must be a number in (0, 1), got 1"),
    ("{name: adam, learning_rate: 0.001}", "{name: adam, learning_rate: 0.1, epsilon: 0}",
     "job.yaml:15 optimizer.dense.epsilon: must be a number in (0, 1], got 0"),
    ("    C1: {}", "    C1: {length: 0}",
     "job.yaml:7 columns.sparse.C1.length: must be an integer in [1, 2147483647], got 0"),
    ("top_mlp: [32]", "top_mlp: [32, 0]",
     "job.yaml:19 model.top_mlp[1]: must be an integer in [1, 2147483647], got 0"),
    ("  max_steps: 10", "  max_steps: 10\n  eviction: {every_steps: -1}",
     "job.yaml:23 schedule.eviction.every_steps: must be an integer >= 0, got -1"),
    ("  max_steps: 10", "  max_steps: 10\n  eviction: {every_seconds: -0.5}",
     "job.yaml:23 schedule.eviction.every_seconds: must be a number in [0, 3.1536e+07], "
     "got -0.5"),
])
def test_out_of_range(old, new, expected):
    assert error(edit(old, new)) == expected


@pytest.mark.parametrize("old, new, expected", [
    ("name: dlrm", "name: dlrn",
     'job.yaml:17 model.name: must be one of dlrm, wide_deep, dcn_v2, got "dlrn" '
     "(did you mean dlrm?)"),
    ("source: generator", "source: kafka",
     'job.yaml:2 data.source: must be one of generator, parquet, csv, criteo_tsv, tfrecord, '
     'movielens, got "kafka"'),
    ("    C1: {}", "    C1: {encoding: base64}",
     'job.yaml:7 columns.sparse.C1.encoding: must be one of int, hex, string, got "base64"'),
    ("{name: lazy_adam,", "{name: adam,",
     'job.yaml:14 optimizer.sparse.name: must be one of lazy_adam, sgd, adagrad, ftrl, '
     'got "adam" (did you mean lazy_adam?)'),
    ("top_mlp: [32]", "top_mlp: [32]\n  interaction: sum",
     'job.yaml:20 model.interaction: must be one of dot, cat, got "sum"'),
    ("defaults: {dim: 16}", "defaults: {dim: 16, initializer: {name: he_normal}}",
     'job.yaml:10 tables.defaults.initializer.name: must be one of truncated_normal, '
     'random_normal, random_uniform, zeros, constant, glorot_uniform, glorot_normal, got '
     '"he_normal" (did you mean truncated_normal?)'),
])
def test_bad_choice(old, new, expected):
    assert error(edit(old, new)) == expected


def test_unknown_table_reference():
    text = MINIMAL + "features:\n  C1: {table: C01}\n  C2: {}\n"
    assert error(text) == 'job.yaml:26 features.C1.table: unknown table "C01"; defined tables: C1, C2'
    text = MINIMAL + "features:\n  C1: {}\n  C2: {index_key: C9}\n"
    assert error(text) == ('job.yaml:27 features.C2.index_key: unknown sparse column "C9"; '
                           "sparse columns: C1, C2")
    # Without a features block each sparse column needs the table of its name.
    assert error(edit("  C2: {vocabulary_size: 200}\n", "")) == (
        'job.yaml:8 columns.sparse.C2: no table "C2" for this column: without a features block '
        "each sparse column is looked up in the table of its name; defined tables: C1")
    text = edit("  C2: {vocabulary_size: 200}\n", "  C2: {vocabulary_size: 200}\n  C3: "
                "{vocabulary_size: 5}\n")
    assert error(text) == ("job.yaml:13 tables.C3: not used by any feature; look it up from a "
                           "feature or remove it")


def test_unknown_column():
    message = error(edit("    C2: {}", "    C27: {}"))
    assert message.startswith('job.yaml:8 columns.sparse.C27: unknown column "C27" for source '
                              "generator (kind criteo); available: label, I1, I2, ")
    assert message.endswith(", C26")
    assert error(edit("labels: [label]", "labels: [click]")).startswith(
        'job.yaml:4 columns.labels[0]: unknown column "click"')


def test_unset_environment_variable():
    assert error(edit("dir: runs/min", "dir: ${OUT_DIR}/x")) == (
        "job.yaml:24 output.dir: environment variable OUT_DIR is not set (write "
        "${OUT_DIR:-default} to give a default)")


def test_override_errors():
    assert error(MINIMAL, ["schedule.max_steps=abc"]) == (
        '--set schedule.max_steps: must be an integer >= 1, got "abc"')
    assert error(MINIMAL, environ={"SPARSEFLOW__SCHEDULE__MAX_STEPS": "0"}) == (
        "$SPARSEFLOW__SCHEDULE__MAX_STEPS schedule.max_steps: must be an integer >= 1, got 0")
    assert error(MINIMAL, ["model.top_mlp=[8, x]"]) == (
        '--set model.top_mlp[1]: must be an integer in [1, 2147483647], got "x"')
    assert error(MINIMAL, ["schedule.max_step=5"]).startswith(
        "--set schedule.max_step: unknown key; allowed: ")
    assert error(MINIMAL, ["schedule.max_steps"]) == (
        '--set: expected KEY.PATH=VALUE, got "schedule.max_steps"')
    assert error(MINIMAL, ["schedule.max_steps.x=1"]) == (
        "--set schedule.max_steps.x: cannot set it: schedule.max_steps is not a mapping")
    assert error(MINIMAL, ["model.top_mlp=[8"]).startswith(
        '--set model.top_mlp: invalid YAML value "[8": ')
    # An override that replaces a mapping takes the blame for what it left out.
    assert error(MINIMAL, ["output={tensorboard: false}"]) == (
        "--set output.dir: required key is missing")


# ------------------------------------------------------------------------------ cross-field rules

def test_dlrm_dot_needs_one_dim():
    assert error(edit("C2: {vocabulary_size: 200}", "C2: {vocabulary_size: 200, dim: 32}")) == (
        'job.yaml:12 tables.C2.dim: dlrm with interaction dot needs one dim for all tables: '
        'table "C2" has dim 32, table "C1" has dim 16')
    assert error(edit("[64, 16]", "[64, 8]")) == (
        "job.yaml:18 model.bottom_mlp[1]: the bottom MLP's last width (8) must equal the "
        "tables' dim (16) with interaction dot")


def test_dlrm_dot_needs_two_vectors():
    text = edit("  dense: [I1, I2]\n", "", edit("  bottom_mlp: [64, 16]\n", ""))
    text = edit("    C2: {}\n", "", edit("  C2: {vocabulary_size: 200}\n", "", text))
    assert error(text) == (
        "job.yaml:13 model.interaction: dot needs at least two vectors to interact (the "
        "features' embeddings and the bottom MLP's output); got one: use interaction: cat")


def test_dlrm_bottom_mlp_follows_dense_columns():
    assert error(edit("  dense: [I1, I2]\n", "")) == (
        "job.yaml:17 model.bottom_mlp: must be empty or left out: there are no dense columns "
        "(columns.dense), so there is no bottom MLP")
    assert error(edit("  bottom_mlp: [64, 16]\n", "")) == (
        "job.yaml:16 model.bottom_mlp: required key is missing")


def test_eviction_rules():
    text = edit("C2: {vocabulary_size: 200}",
                "C2: {vocabulary_size: 200, access_threshold: 1, eviction_threshold: 5}")
    assert error(text) == (
        "job.yaml:12 tables.C2.eviction_threshold: needs a timestamp column: set "
        "columns.timestamp (its values drive the eviction clock)")
    assert error(edit("C2: {vocabulary_size: 200}",
                      "C2: {vocabulary_size: 200, eviction_threshold: 5}")) == (
        "job.yaml:12 tables.C2.eviction_threshold: needs access_threshold >= 0 (eviction works "
        "with admission), got access_threshold -1")
    assert error(edit("  max_steps: 10", "  max_steps: 10\n  eviction: {every_steps: 5}")) == (
        "job.yaml:23 schedule.eviction.every_steps: needs a table with eviction_threshold >= 0; "
        "no table evicts")
    assert error(edit("  max_steps: 10", "  max_steps: 10\n  eviction: {every_seconds: 60}")) \
        == ("job.yaml:23 schedule.eviction.every_seconds: needs a table with "
            "eviction_threshold >= 0; no table evicts")


def test_wide_features_need_dim_one_tables():
    text = edit("eviction: {every_steps: 200}", "eviction: {every_steps: 0}",
                edit("wide_features: [user_wide]", "wide_features: [user_wide, item]", FULL))
    assert error(text) == ('job.yaml:35 model.wide_features[1]: feature "item" uses table '
                           '"item" with dim 8; wide features need dim-1 tables')
    text = edit("wide_features: [user_wide]", "wide_features: [user_wid]", FULL)
    assert error(text) == ('job.yaml:35 model.wide_features[0]: unknown feature "user_wid"; '
                           "features: user, item, tags, user_wide")


@pytest.mark.parametrize("old, new, expected", [
    ("source: generator", "source: generator\n  train: x",
     "job.yaml:3 data.train: not allowed for source generator, which makes its own train and "
     "eval splits (see data.generator)"),
    ("source: generator", "source: csv",
     "job.yaml:1 data.train: required key is missing"),
    ("source: generator", "source: parquet\n  train: x\n  csv: {}",
     "job.yaml:4 data.csv: only for source csv or criteo_tsv; data.source is parquet"),
    ("source: generator", "source: criteo_tsv\n  train: x\n  csv: {header: true}",
     "job.yaml:4 data.csv.header: criteo_tsv files have no header row; for files with one use "
     "source csv"),
    ("    C2: {}", "    I1: {}",
     'job.yaml:8 columns.sparse.I1: column "I1" is already used at columns.dense[0]; a column '
     "may be used once"),
    ("sparse:\n    C1: {}\n    C2: {}", "sparse:\n    C1: {}\n    C2: {}\n  timestamp: labels",
     'job.yaml:9 columns.timestamp: "labels" is reserved (the data pipeline emits the batch '
     "keys labels and dense); rename the column"),
    ("defaults: {dim: 16}", "defaults: {dim: 16, initializer: {name: zeros, seed: 1}}",
     "job.yaml:10 tables.defaults.initializer.seed: not allowed: initializers are seeded from "
     "schedule.seed"),
    ("defaults: {dim: 16}", "defaults: {dim: 16, initializer: {name: zeros, stddev: 1}}",
     "job.yaml:10 tables.defaults.initializer.stddev: unknown key; allowed: name"),
    ("C1: {vocabulary_size: 100}",
     "C1: {vocabulary_size: 100, initializer: {name: random_uniform, minval: 1}}",
     "job.yaml:11 tables.C1.initializer.minval: maxval (0.05) must be greater than minval (1)"),
    ("  C1: {vocabulary_size: 100}", "  C-1: {vocabulary_size: 100}",
     'job.yaml:11 tables.C-1: table names are 1 to 100 characters of A-Z, a-z, 0-9, "_" and "."'),
])
def test_section_rules(old, new, expected):
    assert error(edit(old, new)) == expected


def test_movielens_genres_is_multi_hot():
    text = textwrap.dedent("""\
        data: {source: movielens}
        columns:
          labels: [label]
          sparse: {genres: {length: 1}}
        """)
    assert error(text) == ("job.yaml:4 columns.sparse.genres: genres is multi-hot: list it under "
                           "columns.sparse with length > 1, e.g. genres: {length: 6}")


# ------------------------------------------------------------------------------ overrides

def test_environment_then_set_precedence():
    environ = {"SPARSEFLOW__SCHEDULE__MAX_STEPS": "5", "SPARSEFLOW__SCHEDULE__BATCH_SIZE": "64",
               "OTHER__SCHEDULE__SEED": "3"}
    cfg = parse(MINIMAL, ["schedule.max_steps=7"], environ)
    assert (cfg.schedule.batch_size, cfg.schedule.max_steps, cfg.schedule.seed) == (64, 7, 0)


def test_override_creates_missing_keys_and_reads_yaml_values():
    text = edit("source: generator", "source: parquet\n  train: [a.parquet]")
    cfg = parse(text, ["data.eval=[b.parquet, c.parquet]", "model.top_mlp=[64,16]",
                       "output.tensorboard=false", "schedule.eviction.every_steps=0"])
    assert cfg.data.eval == ("b.parquet", "c.parquet")
    assert cfg.model.params["top_mlp"] == [64, 16]
    assert cfg.output.tensorboard is False


def test_interpolation():
    text = edit("dir: runs/min", "dir: ${RUNS:-/tmp/runs}/${NAME}")
    assert parse(text, environ={"NAME": "a"}).output.dir == "/tmp/runs/a"
    assert parse(text, environ={"NAME": "a", "RUNS": "/r"}).output.dir == "/r/a"
    # A plain scalar is typed after interpolation; a quoted one stays a string.
    text = edit("max_steps: 10", "max_steps: ${STEPS:-100}")
    assert parse(text).schedule.max_steps == 100
    assert parse(text, environ={"STEPS": "3"}).schedule.max_steps == 3
    quoted = edit("max_steps: 10", "max_steps: '${STEPS:-100}'")
    assert error(quoted) == 'job.yaml:22 schedule.max_steps: must be an integer >= 1, got "100"'
    # Override values are not interpolated (the shell has already done that).
    assert parse(MINIMAL, ["output.dir=${X}"]).output.dir == "${X}"


# ------------------------------------------------------------------------------ consistency

def _hparams_function(name):
    from sparseflow.optimizers import hparams
    return {"lazy_adam": hparams.lazy_adam_hparams, "sgd": hparams.sgd_hparams,
            "adagrad": hparams.adagrad_hparams, "ftrl": hparams.ftrl_hparams}[name]


@pytest.mark.parametrize("name", sorted(SPARSE_OPTIMIZERS))
def test_sparse_optimizer_params_match_the_factories(name):
    """Defaults and range bounds of the schema agree with sparseflow.optimizers.hparams."""
    check = _hparams_function(name)
    cfg = parse(MINIMAL, [f"optimizer.sparse={{name: {name}, learning_rate: 0.1}}"])
    factory = check(learning_rate=0.1, **cfg.sparse_optimizer.params)
    assert {k: factory[k] for k in cfg.sparse_optimizer.params} == {
        k: (0.0 if v is None else v) for k, v in cfg.sparse_optimizer.params.items()}
    for key, (_, rng) in SPARSE_OPTIMIZERS[name].items():
        for bound, is_open, step in ((rng.low, rng.low_open, -1e-9),
                                     (rng.high, rng.high_open, 1e-9)):
            if bound is None:
                continue
            outside = bound if is_open else bound + step
            spec = f"optimizer.sparse={{name: {name}, learning_rate: 0.1, {key}: {outside!r}}}"
            assert f"optimizer.sparse.{key}: must be" in error(MINIMAL, [spec])
            with pytest.raises(ValueError, match=key):
                check(learning_rate=0.1, **{key: outside})
            if not is_open:
                check(learning_rate=0.1, **{key: bound})
                parse(MINIMAL, [spec.replace(repr(outside), repr(bound))])


# ------------------------------------------------------------------------------ table tiers

def test_table_tiers_parse_with_their_defaults():
    for table in parse(MINIMAL).tables:
        assert (table.rows_on, table.host_vocabulary_size, table.ssd_vocabulary_size,
                table.ssd_data_path) == ("auto", 0, 0, None)
    text = edit("defaults: {dim: 16}", "defaults: {dim: 16, rows_on: host, ssd_data_path: /ssd}")
    text = edit("C1: {vocabulary_size: 100}",
                "C1: {vocabulary_size: 100, host_vocabulary_size: 900, ssd_vocabulary_size: 5000}",
                text)
    text = edit("C2: {vocabulary_size: 200}",
                "C2: {vocabulary_size: 200, rows_on: device, host_vocabulary_size: 800}", text)
    cfg = parse(text)
    c1, c2 = cfg.tables
    assert (c1.rows_on, c1.host_vocabulary_size, c1.ssd_vocabulary_size, c1.ssd_data_path) == (
        "host", 900, 5000, ("/ssd",))
    # The default ssd_data_path applies to tables with a disk tier only.
    assert (c2.rows_on, c2.host_vocabulary_size, c2.ssd_vocabulary_size, c2.ssd_data_path) == (
        "device", 800, 0, None)
    assert parse(text, ["tables.C1.ssd_data_path=[/a, /b]"]).table("C1").ssd_data_path == (
        "/a", "/b")
    assert parse(text, ["tables.C1.ssd_data_path=null"]).table("C1").ssd_data_path is None
    # config.json writes them out, and reads back as the same job.
    tables = cfg.to_dict()["tables"]
    assert {k: tables["C1"][k] for k in ("rows_on", "host_vocabulary_size",
                                         "ssd_vocabulary_size", "ssd_data_path")} == {
        "rows_on": "host", "host_vocabulary_size": 900, "ssd_vocabulary_size": 5000,
        "ssd_data_path": ["/ssd"]}
    assert "ssd_data_path" not in tables["C2"]
    assert parse(yaml.safe_dump(cfg.to_dict(), sort_keys=False)) == cfg


@pytest.mark.parametrize("old, new, expected", [
    ("C1: {vocabulary_size: 100}", "C1: {vocabulary_size: 100, rows_on: gpu}",
     'job.yaml:11 tables.C1.rows_on: must be one of host, device, auto, got "gpu"'),
    ("defaults: {dim: 16}", "defaults: {dim: 16, rows_on: Host}",
     'job.yaml:10 tables.defaults.rows_on: must be one of host, device, auto, got "Host" '
     "(did you mean host?)"),
    ("C1: {vocabulary_size: 100}", "C1: {vocabulary_size: 100, host_vocabulary_size: -1}",
     "job.yaml:11 tables.C1.host_vocabulary_size: must be an integer in [0, 1000000000], "
     "got -1"),
    ("C1: {vocabulary_size: 100}", "C1: {vocabulary_size: 100, host_vocabulary_size: 10,\n"
     "       ssd_vocabulary_size: 1.5}",
     "job.yaml:12 tables.C1.ssd_vocabulary_size: must be an integer in [0, 1000000000], "
     "got 1.5"),
    ("C1: {vocabulary_size: 100}", "C1: {vocabulary_size: 100, ssd_vocabulary_size: 1000}",
     "job.yaml:11 tables.C1.ssd_vocabulary_size: needs host_vocabulary_size > 0 (the disk "
     "tier sits behind the host tier), got 1000"),
    ("defaults: {dim: 16}", "defaults: {dim: 16, ssd_vocabulary_size: 1000}",
     "job.yaml:10 tables.defaults.ssd_vocabulary_size: needs host_vocabulary_size > 0 (the "
     "disk tier sits behind the host tier), got 1000"),
    ("defaults: {dim: 16}", "defaults: {dim: 16, rows_on: device}\n"
     "  C3: {vocabulary_size: 100, host_vocabulary_size: 10, ssd_vocabulary_size: 10}",
     "job.yaml:11 tables.C3.ssd_vocabulary_size: needs host rows, rows_on host or auto (the "
     "disk tier sits behind host rows), got rows_on device"),
    ("C1: {vocabulary_size: 100}", "C1: {vocabulary_size: 100, host_vocabulary_size: 10,\n"
     "       ssd_vocabulary_size: 10, ssd_data_path: []}",
     "job.yaml:12 tables.C1.ssd_data_path: must list at least 1 item, got []"),
    ("C1: {vocabulary_size: 100}", "C1: {vocabulary_size: 100, host_vocabulary_size: 10,\n"
     "       ssd_vocabulary_size: 10, ssd_data_path: [/ssd, 7]}",
     "job.yaml:12 tables.C1.ssd_data_path[1]: must be a non-empty string of at most 1000 "
     "characters, got 7"),
    ("defaults: {dim: 16}", "defaults: {dim: 16, ssd_data_path: {dir: /ssd}}",
     'job.yaml:10 tables.defaults.ssd_data_path: must be a list of strings, got {"dir": "/ssd"}'),
    ("C1: {vocabulary_size: 100}", "C1: {vocabulary_size: 100, ssd_data_path: /ssd}",
     'job.yaml:11 tables.C1.ssd_data_path: only with ssd_vocabulary_size > 0 (the disk tier\'s '
     'directories); table "C1" has no disk tier'),
])
def test_table_tier_errors(old, new, expected):
    assert error(edit(old, new)) == expected


def test_table_tier_override_errors():
    assert error(MINIMAL, ["tables.C2.rows_on=gpu"]) == (
        '--set tables.C2.rows_on: must be one of host, device, auto, got "gpu"')
    assert error(MINIMAL, ["tables.C2.ssd_vocabulary_size=5"]) == (
        "--set tables.C2.ssd_vocabulary_size: needs host_vocabulary_size > 0 (the disk tier "
        "sits behind the host tier), got 5")


def test_job_graph_passes_table_tiers_to_create_table(monkeypatch):
    """The tier keys reach create_table: the built table holds them (rows_on: auto passes
    None, the placement rule, which tests/conftest.py pins to host)."""
    import sparseflow as sf
    from sparseflow.jobs import runner

    calls = {}
    create_table = sf.create_table

    def spy(*args, **kwargs):
        calls[args[2]] = kwargs
        return create_table(*args, **kwargs)

    monkeypatch.setattr(sf, "create_table", spy)
    text = edit("C1: {vocabulary_size: 100}",
                "C1: {vocabulary_size: 100, rows_on: host, host_vocabulary_size: 50}")
    with runner.job_graph(parse(text), training=False, evaluation=False) as job:
        c1, c2 = job.tables["C1"], job.tables["C2"]
        assert (c1.rows_on, c1.config.device_vocabulary_size, c1.config.host_vocabulary_size,
                c1.capacity()) == ("host", 100, 50, 150)
        assert (c2.config.host_vocabulary_size, c2.config.ssd_vocabulary_size) == (0, 0)
    assert calls["C1"]["rows_on"] == "host" and calls["C2"]["rows_on"] is None


def test_create_table_receives_device_and_disk_tiers(monkeypatch):
    """rows_on: device and the disk tier arrive as create_table's arguments (the table itself
    is not built: only the hand-over is checked)."""
    import sparseflow as sf
    from sparseflow.jobs.graph import _create_table

    calls = []
    monkeypatch.setattr(sf, "create_table", lambda *args, **kwargs: calls.append(kwargs))
    text = edit("C1: {vocabulary_size: 100}",
                "C1: {vocabulary_size: 100, rows_on: device, host_vocabulary_size: 400}")
    text = edit("C2: {vocabulary_size: 200}",
                "C2: {vocabulary_size: 200, host_vocabulary_size: 20, ssd_vocabulary_size: 30,\n"
                "       ssd_data_path: [/ssd0, /ssd1]}", text)
    cfg = parse(text)
    for i, table in enumerate(cfg.tables):
        _create_table(table, i)
    assert [{k: c[k] for k in ("device_vocabulary_size", "host_vocabulary_size",
                               "ssd_vocabulary_size", "ssd_data_path", "rows_on")}
            for c in calls] == [
        {"device_vocabulary_size": 100, "host_vocabulary_size": 400, "ssd_vocabulary_size": 0,
         "ssd_data_path": None, "rows_on": "device"},
        {"device_vocabulary_size": 200, "host_vocabulary_size": 20, "ssd_vocabulary_size": 30,
         "ssd_data_path": ["/ssd0", "/ssd1"], "rows_on": None}]
