"""The job config: frozen dataclasses, and their validation from a loaded YAML tree.

``load_config`` / ``parse_config`` read a job file (see docs/yaml-pipelines.md), apply the
overrides and return a :class:`JobConfig` with every default filled in, or raise
:class:`ConfigError` naming the file, the line, the key path and what is allowed. Field checks
(types, ranges, choices) are in :mod:`sparseflow.jobs.fields`; the rules that tie sections
together (a source's columns, the tables of features, the model's dims) are here, one
function per top-level key.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any, Mapping, Sequence

from sparseflow.embed.limits import (ACCESS_THRESHOLD_MAX, ACCESS_THRESHOLD_MIN,
                                     EVICTION_THRESHOLD_MAX, FEATURE_NAME_MAX_LEN, MAX_DIM,
                                     MAX_VOCABULARY_SIZE, TABLE_NAME_MAX_LEN,
                                     TABLE_NAME_PATTERN)
from sparseflow.jobs.fields import (INT32_MAX, Range, boolean, choice, integer,
                                    mapping, number, show, string, strings, widths)
from sparseflow.jobs.yaml_tree import ConfigError, Node, dotted, load_tree

__all__ = [
    "ConfigError", "CsvOptions", "DataConfig", "ColumnsConfig", "EvictionSchedule",
    "FeatureEntry", "GeneratorOptions", "InitializerConfig", "JobConfig", "ModelConfig",
    "MovielensOptions", "OptimizerConfig", "OutputConfig", "ScheduleConfig", "SparseColumn",
    "TableEntry", "load_config", "parse_config",
]



# ----------------------------------------------------------------------------- dataclasses

@dataclass(frozen=True)
class GeneratorOptions:
    """``data.generator``: synthetic Criteo-like rows (``eval_rows`` 0: no eval split)."""
    kind: str = "criteo"
    train_rows: int = 1048576
    eval_rows: int = 65536
    seed: int = 2026
    cardinality_cap: int = 1_000_000


@dataclass(frozen=True)
class CsvOptions:
    """``data.csv``: one-character ``delimiter``; ``header`` row with the column names."""
    delimiter: str = ","
    header: bool = True


@dataclass(frozen=True)
class MovielensOptions:
    """``data.movielens``: where the dataset is cached; share of the latest rows for eval."""
    cache_dir: str = "~/.cache/sparseflow"
    eval_fraction: float = 0.1


@dataclass(frozen=True)
class DataConfig:
    """``data``: ``train``/``eval`` are paths (empty for generator and movielens sources)."""
    source: str
    train: tuple[str, ...] = ()
    eval: tuple[str, ...] = ()
    shuffle_buffer: int = 0
    csv: CsvOptions = CsvOptions()
    generator: GeneratorOptions = GeneratorOptions()
    movielens: MovielensOptions = MovielensOptions()
    parallel_map: bool = False


@dataclass(frozen=True)
class SparseColumn:
    """One id column: ``length`` ids per row (> 1: multi-hot), ``encoding`` int|hex|string."""
    name: str
    length: int = 1
    encoding: str = "int"


@dataclass(frozen=True)
class ColumnsConfig:
    """``columns``: the batch's ``labels`` and ``dense`` columns, sparse id columns, timestamp."""
    labels: tuple[str, ...]
    dense: tuple[str, ...] = ()
    dense_transform: str = "none"
    sparse: tuple[SparseColumn, ...] = ()
    timestamp: str | None = None


class _CopiedParams:
    """Gives a dataclass with a ``params`` dict its own deep copy of the dict passed in."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", copy.deepcopy(dict(self.params)))


@dataclass(frozen=True)
class InitializerConfig(_CopiedParams):
    """A table's initializer: ``name`` and its TF keyword arguments, e.g. ``{"stddev": 0.05}``."""
    name: str
    params: dict = field(default_factory=dict)


def _default_initializer() -> InitializerConfig:
    return InitializerConfig("truncated_normal", {"mean": 0.0, "stddev": 0.05})


@dataclass(frozen=True)
class TableEntry:
    """One table (``tables.NAME``), ``tables.defaults`` merged in."""
    name: str
    dim: int
    vocabulary_size: int
    initializer: InitializerConfig = field(default_factory=_default_initializer)
    access_threshold: int = -1
    eviction_threshold: int = -1
    admission_counter: str = "exact"
    rows_on: str = "auto"                       # host | device | auto (the placement rule)
    host_vocabulary_size: int = 0               # rows in the host tier behind the device tier
    ssd_vocabulary_size: int = 0                # rows in the disk tier behind the host tier
    ssd_data_path: tuple[str, ...] | None = None  # the disk tier's directories; None: the cwd


@dataclass(frozen=True)
class FeatureEntry:
    """One feature: sparse column ``index_key`` looked up in ``table``."""
    name: str
    table: str
    index_key: str
    faae_coefficient: int = 1
    combiner: str = "mean"


@dataclass(frozen=True)
class OptimizerConfig(_CopiedParams):
    """An optimizer: ``params`` holds the other hyper-parameters, named as the factory's."""
    name: str
    learning_rate: float
    params: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ModelConfig(_CopiedParams):
    """The built-in model ``name`` and its keys (defaults filled in; lists as lists)."""
    name: str
    params: dict = field(default_factory=dict)


@dataclass(frozen=True)
class EvictionSchedule:
    """``schedule.eviction``: evict every ``every_steps`` steps, and/or after the first step
    ending ``every_seconds`` or more after the previous eviction (Rec SDK ``EvictHook``'s
    ``evict_step_interval`` / ``evict_time_interval``); 0 = never."""
    every_steps: int = 0
    every_seconds: float = 0.0


@dataclass(frozen=True)
class ScheduleConfig:
    """``schedule``: batch size, step counts and periods (0 = at the end only), seed."""
    batch_size: int
    max_steps: int
    eval_every: int = 0
    eval_steps: int = 0
    save_every: int = 0
    log_every: int = 20
    seed: int = 0
    eviction: EvictionSchedule = EvictionSchedule()


@dataclass(frozen=True)
class OutputConfig:
    """``output``: the run directory, kept as written (the trainer resolves relative paths)."""
    dir: str
    tensorboard: bool = True


@dataclass(frozen=True)
class DistributedConfig:
    """``distributed``: how several workers share the tables (``sparseflow train --workers N``
    or ``TF_CONFIG``). ``hash``: the owner rule (``mod``: ``key mod N``, Rec SDK's; ``mix``:
    of the mixed key). ``send_count``: the most unique keys of one table a worker sends one
    owner per step (Rec SDK's); null exchanges counts first (``use_dynamic``).
    ``timeout_seconds``: a collective not done by then fails the step (a dead or stuck peer)."""
    hash: str = "mod"
    send_count: int | None = None
    timeout_seconds: float = 60.0


@dataclass(frozen=True)
class JobConfig:
    """A whole validated job. ``source_file`` is the config path as passed ("<string>" for text)."""
    name: str
    source_file: str
    data: DataConfig
    columns: ColumnsConfig
    tables: tuple[TableEntry, ...]
    features: tuple[FeatureEntry, ...]
    sparse_optimizer: OptimizerConfig
    dense_optimizer: OptimizerConfig
    model: ModelConfig
    schedule: ScheduleConfig
    output: OutputConfig
    distributed: DistributedConfig = DistributedConfig()

    def table(self, name: str) -> TableEntry:
        """The table called ``name``. Raises KeyError when there is none."""
        for table in self.tables:
            if table.name == name:
                return table
        raise KeyError(f"no table {name!r}; tables: {', '.join(t.name for t in self.tables)}")

    def to_dict(self) -> dict:
        """The config as the plain dict of a YAML file (every default written out).

        ``parse_config(yaml.safe_dump(cfg.to_dict()))`` equals ``cfg`` (with the same file).
        """
        return _to_dict(self)


def output_dir(cfg: JobConfig) -> str:
    """``output.dir`` as an absolute path (relative paths are taken from the working dir)."""
    return os.path.abspath(os.path.expanduser(cfg.output.dir))


# ----------------------------------------------------------------------------- entry points

def load_config(path: str | os.PathLike, overrides: Sequence[str] = (),
                environ: Mapping[str, str] | None = None) -> JobConfig:
    """Reads and validates the job file at ``path``.

    Args:
      path: the YAML file; errors name it as passed.
      overrides: ``--set`` strings ``"a.b=value"`` (value read as YAML), applied last.
      environ: environment for ``${VAR}`` and ``SPARSEFLOW__A__B`` overrides; None: os.environ.

    Returns:
      The :class:`JobConfig`; ``name`` defaults to the file's stem.

    Raises:
      ConfigError: the file cannot be read, or the config is invalid.
    """
    file = os.fspath(path)
    try:
        with open(file, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(file, None, "", f"cannot read the file: {e}") from None
    return parse_config(text, file, overrides, environ)


def parse_config(text: str, file: str = "<string>", overrides: Sequence[str] = (),
                 environ: Mapping[str, str] | None = None) -> JobConfig:
    """Like :func:`load_config`, from the YAML ``text``; ``file`` names it in errors.

    ``name`` defaults to the stem of ``file`` ("job" for "<string>").

    Raises:
      ConfigError: the config is invalid.
    """
    tree = load_tree(text, file, overrides, environ)
    default_name = "job" if file == "<string>" else PurePath(file).stem
    return _job(tree.node(), file, default_name)


# ----------------------------------------------------------------------------- sections

FILE_SOURCES = ("parquet", "csv", "criteo_tsv", "tfrecord")
SOURCES = ("generator", *FILE_SOURCES, "movielens")
CRITEO_COLUMNS = ("label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27)))
MOVIELENS_COLUMNS = ("label", "user_id", "item_id", "age", "gender", "occupation", "zip_code",
                     "release_year", "genres", "timestamp")
RESERVED_COLUMNS = ("labels", "dense")  # batch keys the data pipeline emits
_TABLE_KEYS = ("dim", "vocabulary_size", "initializer", "access_threshold",
               "eviction_threshold", "admission_counter", "rows_on", "host_vocabulary_size",
               "ssd_vocabulary_size", "ssd_data_path")
ROWS_ON = ("host", "device", "auto")  # auto: create_table's placement rule (rows_on=None)
INITIALIZERS = {  # name -> default keyword arguments of the TF initializer
    "truncated_normal": {"mean": 0.0, "stddev": 0.05},
    "random_normal": {"mean": 0.0, "stddev": 0.05},
    "random_uniform": {"minval": -0.05, "maxval": 0.05},
    "zeros": {}, "constant": {"value": 0.0}, "glorot_uniform": {}, "glorot_normal": {},
}
_UNIT = Range(0.0, 1.0, low_open=True)  # (0, 1]
_FTRL = {"learning_rate_power": (-0.5, Range(None, 0.0)),
         "initial_accumulator_value": (0.1, _UNIT),
         "l1_regularization_strength": (0.0, Range(0.0, 1e4)),
         "l2_regularization_strength": (0.0, Range(0.0, 1e4))}
# name -> {hyper-parameter: (default, range)}: the factories' own (sparseflow.optimizers.hparams).
SPARSE_OPTIMIZERS = {
    "lazy_adam": {"beta1": (0.9, Range(0.0, 1.0, True, True)), "beta2": (0.999, Range(0.0, 1.0)),
                  "epsilon": (1e-8, _UNIT)},
    "sgd": {"weight_decay": (None, Range(1e-5, 1e-2))},
    "adagrad": {"initial_accumulator_value": (0.9, _UNIT)},
    "ftrl": _FTRL,
}
# The tf.compat.v1.train optimizers' keyword arguments and defaults.
DENSE_OPTIMIZERS = {
    "adam": {"beta1": (0.9, Range(0.0, 1.0, high_open=True)),
             "beta2": (0.999, Range(0.0, 1.0, high_open=True)), "epsilon": (1e-8, _UNIT)},
    "sgd": {},
    "adagrad": {"initial_accumulator_value": (0.1, _UNIT)},
    "ftrl": _FTRL,
}
LEARNING_RATE = Range(0.0, 10.0)
MODELS = {"dlrm": ("bottom_mlp", "top_mlp", "interaction"),
          "wide_deep": ("deep_mlp", "wide_features"),
          "dcn_v2": ("cross_layers", "deep_mlp", "low_rank", "structure")}


def _job(root: Node, file: str, default_name: str) -> JobConfig:
    mapping(root, ("name", "data", "columns", "tables", "features", "optimizer", "model",
                   "schedule", "output", "distributed"))
    name = string(root["name"], default_name, max_len=200)
    data = _data(root["data"])
    columns, column_nodes = _columns(root["columns"], data)
    tables, table_nodes = _tables(root["tables"], columns)
    _check_parallel_map(root["data"]["parallel_map"], data, tables)
    features = _features(root["features"], columns, tables, table_nodes, column_nodes)
    optimizer = root["optimizer"]
    mapping(optimizer, ("sparse", "dense"))
    sparse_optimizer = _optimizer(optimizer["sparse"], SPARSE_OPTIMIZERS)
    dense_optimizer = _optimizer(optimizer["dense"], DENSE_OPTIMIZERS)
    model = _model(root["model"], columns, tables, features, table_nodes)
    schedule = _schedule(root["schedule"], tables)
    output = root["output"]
    mapping(output, ("dir", "tensorboard"))
    return JobConfig(name, file, data, columns, tuple(tables.values()), tuple(features),
                     sparse_optimizer, dense_optimizer, model, schedule,
                     OutputConfig(string(output["dir"]), boolean(output["tensorboard"], True)),
                     _distributed(root["distributed"]))


def _check_parallel_map(n: Node, data: DataConfig, tables: dict) -> None:
    """A parallel map admits keys in the order batches finish processing: allowed only where
    that cannot change what trains (every table's access_threshold <= 1, README "Parallel
    map")."""
    if not data.parallel_map:
        return
    counted = sorted(name for name, t in tables.items() if t.access_threshold > 1)
    if counted:
        n.fail(f"true needs every table's access_threshold <= 1 (a key's admitting batch would "
               f"follow processing order); table {counted[0]} has "
               f"{tables[counted[0]].access_threshold}. Set it to false, or lower the "
               f"threshold")


def _distributed(n: Node) -> DistributedConfig:
    mapping(n, ("hash", "send_count", "timeout_seconds"), {})
    send_count = n["send_count"]
    return DistributedConfig(
        hash=choice(n["hash"], ("mod", "mix"), "mod"),
        send_count=None if not send_count.present or send_count.value is None
        else integer(send_count, 1, INT32_MAX),
        timeout_seconds=number(n["timeout_seconds"], Range(0.0, 86_400.0, low_open=True),
                               60.0))


def _data(n: Node) -> DataConfig:
    mapping(n, ("source", "train", "eval", "shuffle_buffer", "csv", "generator", "movielens",
                "parallel_map"))
    source = choice(n["source"], SOURCES)
    for block, sources in (("csv", ("csv", "criteo_tsv")), ("generator", ("generator",)),
                           ("movielens", ("movielens",))):
        if n[block].present and source not in sources:
            n[block].fail(f"only for source {' or '.join(sources)}; data.source is {source}")
    train = eval_ = ()
    if source in FILE_SOURCES:
        train = strings(n["train"], min_items=1)
        eval_ = strings(n["eval"], ())
    else:
        for key in ("train", "eval"):
            if n[key].present:
                n[key].fail(f"not allowed for source {source}, which makes its own train and "
                            f"eval splits (see data.{source})")
    shuffle_buffer = integer(n["shuffle_buffer"], 0, INT32_MAX, 0)
    g, m = n["generator"], n["movielens"]
    mapping(g, ("kind", "train_rows", "eval_rows", "seed", "cardinality_cap"), {})
    mapping(m, ("cache_dir", "eval_fraction"), {})
    generator = GeneratorOptions(
        choice(g["kind"], ("criteo",), "criteo"), integer(g["train_rows"], 1, None, 1048576),
        integer(g["eval_rows"], 0, None, 65536), integer(g["seed"], 0, INT32_MAX, 2026),
        integer(g["cardinality_cap"], 1, None, 1_000_000))
    movielens = MovielensOptions(string(m["cache_dir"], "~/.cache/sparseflow"),
                                 number(m["eval_fraction"], Range(0.0, 1.0, high_open=True), 0.1))
    return DataConfig(source, train, eval_, shuffle_buffer, _csv(n["csv"], source), generator,
                      movielens, boolean(n["parallel_map"], False))


def _csv(n: Node, source: str) -> CsvOptions:
    mapping(n, ("delimiter", "header"), {})
    if source == "criteo_tsv":  # fixed format: tab-separated, no header
        if string(n["delimiter"], "\t") != "\t":
            n["delimiter"].fail('criteo_tsv files are tab-separated ("\\t"); for another '
                                "delimiter use source csv")
        if boolean(n["header"], False):
            n["header"].fail("criteo_tsv files have no header row; for files with one use "
                             "source csv")
        return CsvOptions("\t", False)
    delimiter = string(n["delimiter"], ",")
    if len(delimiter) != 1:
        n["delimiter"].fail(f"must be a single character, got {show(delimiter)}")
    return CsvOptions(delimiter, boolean(n["header"], True))


def _columns(n: Node, data: DataConfig) -> tuple[ColumnsConfig, dict[str, Node]]:
    mapping(n, ("labels", "dense", "dense_transform", "sparse", "timestamp"))
    labels = strings(n["labels"], min_items=1)
    dense = strings(n["dense"], ())
    transform = choice(n["dense_transform"], ("none", "log1p"), "none")
    sparse, sparse_nodes = _sparse(n["sparse"])
    ts = n["timestamp"]
    timestamp = string(ts, max_len=255) if ts.present and ts.value is not None else None
    available, what = None, ""
    if data.source in ("generator", "criteo_tsv"):
        available = CRITEO_COLUMNS
        what = "source generator (kind criteo)" if data.source == "generator" else "source criteo_tsv"
    elif data.source == "movielens":
        available, what = MOVIELENS_COLUMNS, "source movielens"
    lengths = {c.name: c.length for c in sparse}
    used = [(name, _item(n["labels"], i), "labels") for i, name in enumerate(labels)]
    used += [(name, _item(n["dense"], i), "dense") for i, name in enumerate(dense)]
    used += [(c.name, sparse_nodes[c.name], "sparse") for c in sparse]
    used += [(timestamp, ts, "timestamp")] if timestamp is not None else []
    seen: dict[str, str] = {}
    for name, node, role in used:
        if name in seen:
            node.fail(f'column "{name}" is already used at {seen[name]}; a column may be used once')
        seen[name] = dotted(node.path)
        if role in ("sparse", "timestamp") and name in RESERVED_COLUMNS:
            node.fail(f'"{name}" is reserved (the data pipeline emits the batch keys labels and '
                      "dense); rename the column")
        if available is not None and name not in available:
            node.fail(f'unknown column "{name}" for {what}; available: {", ".join(available)}')
        if data.source == "movielens" and name == "genres" and lengths.get(name, 1) <= 1:
            node.fail("genres is multi-hot: list it under columns.sparse with length > 1, "
                      "e.g. genres: {length: 6}")
    return ColumnsConfig(labels, dense, transform, sparse, timestamp), sparse_nodes


def _item(n: Node, i: int) -> Node:
    return n[i] if isinstance(n.value, list) else n  # a single string is a list of one


def _sparse(n: Node) -> tuple[tuple[SparseColumn, ...], dict[str, Node]]:
    if isinstance(n.value, list):  # shorthand: a list of names, each with the defaults
        names = strings(n, min_items=1)
        nodes = {name: n[i] for i, name in enumerate(names)}
        return tuple(SparseColumn(name) for name in names), nodes
    if not mapping(n, None):
        n.fail("must list at least one sparse column")
    columns, nodes = [], {}
    for name, c in n.items():
        if len(name) > 255:
            c.fail("column names are at most 255 characters")
        mapping(c, ("length", "encoding"))
        columns.append(SparseColumn(name, integer(c["length"], 1, INT32_MAX, 1),
                                    choice(c["encoding"], ("int", "hex", "string"), "int")))
        nodes[name] = c
    return tuple(columns), nodes


def _tables(n: Node, columns: ColumnsConfig) -> tuple[dict[str, TableEntry], dict[str, tuple]]:
    """Returns name -> TableEntry and name -> (table node, {key: node the value came from})."""
    names = [name for name in mapping(n, None) if name != "defaults"]
    if not names:
        n.fail("must define at least one table")
    d = n["defaults"]
    defaults = mapping(d, _TABLE_KEYS, {})
    tables, nodes = {}, {}
    for name in names:
        t = n[name]
        if not TABLE_NAME_PATTERN.fullmatch(name):
            t.fail(f"table names are 1 to {TABLE_NAME_MAX_LEN} characters of A-Z, a-z, 0-9, "
                   '"_" and "."')
        own = mapping(t, _TABLE_KEYS)
        k = {key: d[key] if key in defaults and key not in own else t[key] for key in _TABLE_KEYS}
        dim = integer(k["dim"], 1, MAX_DIM)
        vocabulary_size = integer(k["vocabulary_size"], 1, MAX_VOCABULARY_SIZE)
        initializer = _initializer(k["initializer"])
        access = integer(k["access_threshold"], ACCESS_THRESHOLD_MIN, ACCESS_THRESHOLD_MAX, -1)
        eviction = integer(k["eviction_threshold"], -1, EVICTION_THRESHOLD_MAX, -1)
        if eviction >= 0 and access < 0:
            k["eviction_threshold"].fail("needs access_threshold >= 0 (eviction works with "
                                         f"admission), got access_threshold {access}")
        if eviction >= 0 and columns.timestamp is None:
            k["eviction_threshold"].fail("needs a timestamp column: set columns.timestamp "
                                         "(its values drive the eviction clock)")
        counter = choice(k["admission_counter"], ("exact", "sketch"), "exact")
        rows_on, host, ssd, ssd_path = _tiers(k, name)
        tables[name] = TableEntry(name, dim, vocabulary_size, initializer, access, eviction,
                                  counter, rows_on, host, ssd, ssd_path)
        nodes[name] = (t, k)
    return tables, nodes


def _tiers(k: dict[str, Node], name: str) -> tuple[str, int, int, tuple[str, ...] | None]:
    """A table's placement and tiers: rows_on, host_vocabulary_size, ssd_vocabulary_size and
    ssd_data_path (None: not given, create_table's default, the current directory)."""
    rows_on = choice(k["rows_on"], ROWS_ON, "auto")
    host = integer(k["host_vocabulary_size"], 0, MAX_VOCABULARY_SIZE, 0)
    ssd = integer(k["ssd_vocabulary_size"], 0, MAX_VOCABULARY_SIZE, 0)
    if ssd > 0 and host == 0:
        k["ssd_vocabulary_size"].fail("needs host_vocabulary_size > 0 (the disk tier sits "
                                      f"behind the host tier), got {ssd}")
    if ssd > 0 and rows_on == "device":
        k["ssd_vocabulary_size"].fail("needs host rows, rows_on host or auto (the disk tier "
                                      "sits behind host rows), got rows_on device")
    p = k["ssd_data_path"]
    path = strings(p, min_items=1) if p.present and p.value is not None else None
    if ssd == 0 and path is not None:
        if p.path[:2] == ("tables", "defaults"):  # a shared default: for tables with a disk tier
            path = None
        else:
            p.fail("only with ssd_vocabulary_size > 0 (the disk tier's directories); table "
                   f'"{name}" has no disk tier')
    return rows_on, host, ssd, path


def _initializer(n: Node) -> InitializerConfig:
    if not n.present:
        return _default_initializer()
    if "seed" in mapping(n, None):
        n["seed"].fail("not allowed: initializers are seeded from schedule.seed")
    name = choice(n["name"], tuple(INITIALIZERS))
    defaults = INITIALIZERS[name]
    mapping(n, ("name", *defaults))
    params = {key: number(n[key], Range(0.0, None, True) if key == "stddev" else Range(None, None),
                          default) for key, default in defaults.items()}
    if name == "random_uniform" and params["minval"] >= params["maxval"]:
        at = n["maxval"] if n["maxval"].present else n["minval"]
        at.fail(f"maxval ({params['maxval']:g}) must be greater than minval "
                f"({params['minval']:g})")
    return InitializerConfig(name, params)


def _features(n: Node, columns: ColumnsConfig, tables: dict, table_nodes: dict,
              column_nodes: dict) -> list[FeatureEntry]:
    sparse = [c.name for c in columns.sparse]
    defined = ", ".join(tables)
    features = []
    if not n.present or n.value is None:  # one feature per sparse column, table of the same name
        for name in sparse:
            if name not in tables:
                column_nodes[name].fail(
                    f'no table "{name}" for this column: without a features block each sparse '
                    f"column is looked up in the table of its name; defined tables: {defined}")
            features.append(FeatureEntry(name, name, name))
    else:
        if not mapping(n, None):
            n.fail("must list at least one feature (or leave features out: one per sparse "
                   "column, table of the same name)")
        for name, f in n.items():
            if len(name) > FEATURE_NAME_MAX_LEN:
                f.fail(f"feature names are at most {FEATURE_NAME_MAX_LEN} characters")
            mapping(f, ("table", "index_key", "faae_coefficient", "combiner"))
            table = string(f["table"], name)
            if table not in tables:
                hint = "" if f["table"].present else " (table defaults to the feature name)"
                f["table"].fail(f'unknown table "{table}"{hint}; defined tables: {defined}')
            key = string(f["index_key"], name)
            if key not in sparse:
                hint = "" if f["index_key"].present else " (index_key defaults to the feature name)"
                f["index_key"].fail(f'unknown sparse column "{key}"{hint}; sparse columns: '
                                    f'{", ".join(sparse)}')
            features.append(FeatureEntry(
                name, table, key, integer(f["faae_coefficient"], 1, INT32_MAX, 1),
                choice(f["combiner"], ("sum", "mean", "sqrtn"), "mean")))
    used = {f.table for f in features}
    for name, (t, _) in table_nodes.items():
        if name not in used:
            t.fail("not used by any feature; look it up from a feature or remove it")
    return features


def _optimizer(n: Node, known: dict) -> OptimizerConfig:
    mapping(n, None)
    name = choice(n["name"], tuple(known))
    mapping(n, ("name", "learning_rate", *known[name]))
    learning_rate = number(n["learning_rate"], LEARNING_RATE)
    params = {key: None if default is None and n[key].value is None
              else number(n[key], rng, default) for key, (default, rng) in known[name].items()}
    return OptimizerConfig(name, learning_rate, params)


def _model(n: Node, columns: ColumnsConfig, tables: dict, features: list,
           table_nodes: dict) -> ModelConfig:
    mapping(n, None)
    name = choice(n["name"], tuple(MODELS))
    mapping(n, ("name", *MODELS[name]))
    if name == "dlrm":
        params = _dlrm(n, columns, tables, features, table_nodes)
    elif name == "wide_deep":
        deep_mlp = widths(n["deep_mlp"])
        wide = strings(n["wide_features"], ())
        by_name = {f.name: f for f in features}
        for i, feature in enumerate(wide):
            item = _item(n["wide_features"], i)
            if feature not in by_name:
                item.fail(f'unknown feature "{feature}"; features: {", ".join(by_name)}')
            if feature in wide[:i]:
                item.fail(f'feature "{feature}" is listed twice')
            table = tables[by_name[feature].table]
            if table.dim != 1:
                item.fail(f'feature "{feature}" uses table "{table.name}" with dim {table.dim}; '
                          "wide features need dim-1 tables")
        if len(set(wide)) == len(features) and not columns.dense:
            n["wide_features"].fail("leaves the deep part without input: keep a feature out of "
                                    "wide_features or add dense columns")
        params = {"deep_mlp": deep_mlp, "wide_features": list(wide)}
    else:
        params = {"cross_layers": integer(n["cross_layers"], 1, 16),
                  "deep_mlp": widths(n["deep_mlp"]),
                  "low_rank": integer(n["low_rank"], 0, INT32_MAX, 0),
                  "structure": choice(n["structure"], ("stacked", "parallel"), "stacked")}
    return ModelConfig(name, params)


def _dlrm(n: Node, columns: ColumnsConfig, tables: dict, features: list,
          table_nodes: dict) -> dict:
    if columns.dense:
        bottom = widths(n["bottom_mlp"])
        if not bottom:
            n["bottom_mlp"].fail("must list at least one width: the dense columns go through "
                                 "the bottom MLP")
    else:  # no dense input, no bottom MLP: refuse one rather than silently ignore it
        bottom = widths(n["bottom_mlp"], [])
        if bottom:
            n["bottom_mlp"].fail("must be empty or left out: there are no dense columns "
                                 "(columns.dense), so there is no bottom MLP")
    top = widths(n["top_mlp"])
    interaction = choice(n["interaction"], ("dot", "cat"), "dot")
    if interaction == "dot":
        if len(features) + bool(columns.dense) < 2:
            n["interaction"].fail("dot needs at least two vectors to interact (the features' "
                                  "embeddings and the bottom MLP's output); got one: use "
                                  "interaction: cat")
        first = tables[features[0].table]
        for feature in features:
            table = tables[feature.table]
            if table.dim != first.dim:
                table_nodes[table.name][1]["dim"].fail(
                    f'dlrm with interaction dot needs one dim for all tables: table '
                    f'"{table.name}" has dim {table.dim}, table "{first.name}" has dim {first.dim}')
        if bottom and bottom[-1] != first.dim:
            n["bottom_mlp"][-1].fail(
                f"the bottom MLP's last width ({bottom[-1]}) must equal the tables' dim "
                f"({first.dim}) with interaction dot")
    return {"bottom_mlp": bottom, "top_mlp": top, "interaction": interaction}


def _schedule(n: Node, tables: dict) -> ScheduleConfig:
    mapping(n, ("batch_size", "max_steps", "eval_every", "eval_steps", "save_every",
                "log_every", "seed", "eviction"))
    values = dict(batch_size=integer(n["batch_size"], 1, INT32_MAX),
                  max_steps=integer(n["max_steps"], 1),
                  **{key: integer(n[key], 0, None, 0)
                     for key in ("eval_every", "eval_steps", "save_every")},
                  log_every=integer(n["log_every"], 1, None, 20),
                  seed=integer(n["seed"], 0, INT32_MAX, 0))
    e = n["eviction"]
    mapping(e, ("every_steps", "every_seconds"), {})
    every_steps = integer(e["every_steps"], 0, None, 0)
    every_seconds = number(e["every_seconds"], Range(0.0, 365 * 86_400.0), 0.0)
    for key, value in (("every_steps", every_steps), ("every_seconds", every_seconds)):
        if value > 0 and not any(t.eviction_threshold >= 0 for t in tables.values()):
            e[key].fail("needs a table with eviction_threshold >= 0; no table evicts")
    return ScheduleConfig(**values, eviction=EvictionSchedule(every_steps, every_seconds))


def _to_dict(cfg: JobConfig) -> dict:
    d = cfg.data
    data: dict[str, Any] = {"source": d.source}
    if d.source in ("parquet", "csv", "criteo_tsv", "tfrecord"):
        data.update(train=list(d.train), eval=list(d.eval))
    data["shuffle_buffer"] = d.shuffle_buffer
    data["parallel_map"] = d.parallel_map
    if d.source in ("csv", "criteo_tsv"):
        data["csv"] = {"delimiter": d.csv.delimiter, "header": d.csv.header}
    elif d.source in ("generator", "movielens"):
        options = getattr(d, d.source)
        data[d.source] = {k: getattr(options, k) for k in options.__dataclass_fields__}
    c = cfg.columns
    columns: dict[str, Any] = {
        "labels": list(c.labels), "dense": list(c.dense), "dense_transform": c.dense_transform,
        "sparse": {s.name: {"length": s.length, "encoding": s.encoding} for s in c.sparse}}
    if c.timestamp is not None:
        columns["timestamp"] = c.timestamp
    s = cfg.schedule
    return {
        "name": cfg.name,
        "data": data,
        "columns": columns,
        "tables": {t.name: {"dim": t.dim, "vocabulary_size": t.vocabulary_size,
                            "initializer": {"name": t.initializer.name,
                                            **copy.deepcopy(t.initializer.params)},
                            "access_threshold": t.access_threshold,
                            "eviction_threshold": t.eviction_threshold,
                            "admission_counter": t.admission_counter,
                            "rows_on": t.rows_on,
                            "host_vocabulary_size": t.host_vocabulary_size,
                            "ssd_vocabulary_size": t.ssd_vocabulary_size,
                            **({} if t.ssd_data_path is None
                               else {"ssd_data_path": list(t.ssd_data_path)})}
                   for t in cfg.tables},
        "features": {f.name: {"table": f.table, "index_key": f.index_key,
                              "faae_coefficient": f.faae_coefficient, "combiner": f.combiner}
                     for f in cfg.features},
        "optimizer": {key: {"name": o.name, "learning_rate": o.learning_rate,
                            **copy.deepcopy(o.params)}
                      for key, o in (("sparse", cfg.sparse_optimizer),
                                     ("dense", cfg.dense_optimizer))},
        "model": {"name": cfg.model.name, **copy.deepcopy(cfg.model.params)},
        "schedule": {"batch_size": s.batch_size, "max_steps": s.max_steps,
                     "eval_every": s.eval_every, "eval_steps": s.eval_steps,
                     "save_every": s.save_every, "log_every": s.log_every, "seed": s.seed,
                     "eviction": {"every_steps": s.eviction.every_steps,
                                  "every_seconds": s.eviction.every_seconds}},
        "output": {"dir": cfg.output.dir, "tensorboard": cfg.output.tensorboard},
        "distributed": {"hash": cfg.distributed.hash, "send_count": cfg.distributed.send_count,
                        "timeout_seconds": cfg.distributed.timeout_seconds},
    }

