"""The ``sparseflow`` command: validate, train, evaluate and export YAML-configured jobs.

    sparseflow validate CONFIG [--set KEY=VALUE ...]
    sparseflow train    CONFIG [--set KEY=VALUE ...] [--out DIR] [--no-progress] [--workers N]
    sparseflow eval     CONFIG --checkpoint PATH [--set ...] [--no-progress]
    sparseflow export   CONFIG --checkpoint PATH --out DIR [--set ...]
    sparseflow stats    DATA ... --sparse C1,C2 [--timestamp COL] [--out DIR] [options]
    sparseflow stats    --config CONFIG [--set ...] [--out DIR] [options]

Exit status: 0 success, 2 invalid configuration or arguments, 3 a worker's TF_CONFIG address
is in use (multi-worker training), 1 any other failure.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
MAX_LOCAL_WORKERS = 64


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sparseflow", description="Train recommendation models from a YAML job file.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def job_command(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("config", help="the job's YAML file")
        sub.add_argument("--set", dest="overrides", action="append", default=[],
                         metavar="KEY=VALUE",
                         help="override a config value, e.g. schedule.max_steps=100 (repeatable)")
        return sub

    job_command("validate", "Check a job file and print what it describes.")
    train = job_command("train", "Train a job; resumes from the newest checkpoint in its "
                                 "output directory.")
    train.add_argument("--out", help="output directory (overrides output.dir)")
    train.add_argument("--no-progress", action="store_true",
                       help="plain log lines even on a terminal")
    train.add_argument("--workers", type=int, default=None, metavar="N",
                       help="train on N local worker processes, tables sharded by key "
                            "(docs/multi-worker.md); a worker started with TF_CONFIG "
                            "trains as that cluster's worker")
    evaluate = job_command("eval", "Evaluate a checkpoint on the job's eval split.")
    evaluate.add_argument("--checkpoint", required=True,
                          help="a checkpoint prefix or a directory holding checkpoints")
    evaluate.add_argument("--no-progress", action="store_true",
                          help="plain log lines even on a terminal")
    export = job_command("export", "Export a checkpoint as a SavedModel that serves "
                                   "predictions from raw features.")
    export.add_argument("--checkpoint", required=True,
                        help="a checkpoint prefix or a directory holding checkpoints")
    export.add_argument("--out", required=True, help="the SavedModel directory (new or empty)")
    launch_help = ("Run a Python script as N local processes (ranks), like torchrun: each gets "
                   "SPARSEFLOW_RANK, SPARSEFLOW_WORLD_SIZE and a TF_CONFIG on loopback, and "
                   "its share of the CPUs (bound to them; SPARSEFLOW_BIND_CPUS=0 leaves every "
                   "rank on every CPU); output is prefixed by rank; when one fails the others "
                   "are ended.")
    launch = commands.add_parser("launch", help=launch_help, description=launch_help)
    launch.add_argument("-n", "--ranks", type=int, required=True, metavar="N",
                        help="how many processes")
    launch.add_argument("--grace", type=float, default=30.0, metavar="SECONDS",
                        help="after a rank fails, how long the others may run (default 30)")
    launch.add_argument("-m", dest="module", metavar="MODULE", default=None,
                        help="run a module (python -m MODULE) instead of a script file")
    launch.add_argument("script", help="the Python script (with -m: the module's first "
                        "argument)", nargs="?")
    launch.add_argument("script_args", nargs=argparse.REMAINDER,
                        help="the script's own arguments")
    stats_help = ("Offline feature statistics over Parquet: distinct keys, skew, what each "
                  "admission threshold keeps, keys alive in an eviction window, table memory.")
    stats = commands.add_parser("stats", help=stats_help, description=stats_help)
    stats.add_argument("data", nargs="*", help="data files, directories or globs")
    stats.add_argument("--format", dest="fmt", choices=("parquet", "csv", "criteo_tsv", "tfrecord"),
                       help="the files' format (default parquet, or the config's source)")
    stats.add_argument("--delimiter", default=",", help="CSV field separator (--format csv)")
    stats.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1),
                       help="files counted in parallel (default: %(default)s)")
    stats.add_argument("--no-progress", action="store_true", help="no progress on stderr")
    stats.add_argument("--dask", metavar="ADDRESS",
                       help="count the files on a Dask cluster: a scheduler address "
                            "(tcp://host:8786), or local:N for N local worker processes "
                            "(needs the dask extra: pip install sparseflow[dask])")
    stats.add_argument("--approx", action="store_true",
                       help="approximate mode: fixed memory per feature (HyperLogLog, "
                            "count-min, a key sample) for key sets larger than memory")
    stats.add_argument("--suggest", metavar="BUDGET",
                       help="also write suggested_tables.yaml: thresholds and vocabulary sizes "
                            "whose tables fit this memory budget (e.g. 8GiB, 512M, 1e9)")
    stats.add_argument("--sparse", help="the columns to describe, comma-separated (C1,C2,...)")
    stats.add_argument("--timestamp", help="the timestamp column (for --eviction-window)")
    stats.add_argument("--config", help="take the data, format, sparse columns, timestamp, "
                                        "dim and optimizer from a job's YAML file")
    stats.add_argument("--set", dest="overrides", action="append", default=[],
                       metavar="KEY=VALUE", help="override a --config value (repeatable)")
    stats.add_argument("--out", default="feature_stats",
                       help="output directory for stats.json and stats.md (default: %(default)s)")
    stats.add_argument("--top-k", type=int, default=20, help="keys listed per feature")
    stats.add_argument("--max-threshold", type=int, default=10,
                       help="report admission thresholds 1..N")
    stats.add_argument("--eviction-window", type=int,
                       help="report the keys seen within this many timestamp units of the end")
    stats.add_argument("--dim", type=int, help="embedding dim for the memory estimate "
                                               "(default 16, or the config's)")
    stats.add_argument("--optimizer", choices=("sgd", "adagrad", "adam", "ftrl"),
                       help="sparse optimizer for the memory estimate (default adam, or the "
                            "config's)")
    return parser


def _stats(args) -> int:
    """``sparseflow stats``: the feature-stats job (``sparseflow/stats/``)."""
    from sparseflow.stats.job import compute_stats, write_outputs

    data, sparse, timestamp = list(args.data), args.sparse, args.timestamp
    dim, optimizer, encodings = args.dim, args.optimizer, None
    fmt, delimiter = args.fmt, args.delimiter
    if args.config:
        from sparseflow.jobs.schema import ConfigError, load_config

        try:
            cfg = load_config(args.config, list(args.overrides))
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return EXIT_USAGE
        if cfg.data.source not in ("parquet", "csv", "criteo_tsv", "tfrecord"):
            print(f"error: {args.config}: sparseflow stats reads parquet, csv, criteo_tsv and "
                  f"tfrecord sources; this job's data.source is {cfg.data.source!r}",
                  file=sys.stderr)
            return EXIT_USAGE
        fmt = fmt or cfg.data.source
        if cfg.data.source == "csv":
            delimiter = cfg.data.csv.delimiter
        data = data or list(cfg.data.train)
        sparse = sparse or ",".join(c.name for c in cfg.columns.sparse)
        encodings = {c.name: c.encoding for c in cfg.columns.sparse}
        timestamp = timestamp or cfg.columns.timestamp
        dim = dim or max(t.dim for t in cfg.tables)
        name = cfg.sparse_optimizer.name.lower()
        optimizer = optimizer or {"lazy_adam": "adam"}.get(name, name)
    if not data or not sparse:
        print("error: sparseflow stats needs DATA and --sparse, or --config", file=sys.stderr)
        return EXIT_USAGE
    from sparseflow.jobs.progress import Progress

    # The number of files is known once compute_stats has expanded the paths.
    bar = None if args.no_progress else Progress(None, desc="files", unit="file",
                                                 stream=sys.stderr)

    def progress(done: int, total: int, rows: int) -> None:
        bar.update(done, f"{rows:,} rows", total=total)

    client = cluster = None
    if args.dask:
        try:
            from dask.distributed import Client, LocalCluster
        except ImportError:
            print("error: --dask needs the dask extra: pip install 'sparseflow[dask]'",
                  file=sys.stderr)
            return EXIT_USAGE
        if args.dask.startswith("local:"):
            n = args.dask.split(":", 1)[1]
            if not n.isdigit() or int(n) < 1:
                print(f"error: --dask {args.dask}: local:N needs N >= 1 workers",
                      file=sys.stderr)
                return EXIT_USAGE
            cluster = LocalCluster(n_workers=int(n), threads_per_worker=1,
                                   dashboard_address=None)
            client = Client(cluster)
        else:
            client = Client(args.dask)
    try:
        doc = compute_stats(data, sparse, timestamp=timestamp, top_k=args.top_k,
                            max_threshold=args.max_threshold,
                            eviction_window=args.eviction_window, dim=dim or 16,
                            optimizer=optimizer or "adam", encodings=encodings,
                            fmt=fmt or "parquet", delimiter=delimiter, workers=args.workers,
                            progress=None if bar is None else progress,
                            mode="approximate" if args.approx else "exact",
                            dask_client=client)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        if bar is not None:
            bar.close()
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()
    suggestion = None
    if args.suggest:
        from sparseflow.stats.suggest import parse_budget, suggest

        try:
            suggestion = suggest(doc, parse_budget(args.suggest))
        except ValueError as e:
            print(f"error: --suggest {args.suggest}: {e}", file=sys.stderr)
            return EXIT_USAGE
    paths = write_outputs(doc, args.out, suggestion)
    for name, feature in doc["features"].items():
        print(f"{name}: {feature['distinct_keys']:,} distinct keys in {feature['total_keys']:,}"
              f" ({100 * feature['singleton_share']:.1f}% seen once)")
    print("wrote " + ", ".join(paths.values()))
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    args = _parser().parse_args(argv)
    if args.command == "stats":
        return _stats(args)
    if args.command == "launch":
        return _launch(args)

    from sparseflow.jobs.schema import ConfigError, load_config

    overrides = list(args.overrides)
    if getattr(args, "out", None) and args.command == "train":
        overrides.append(f"output.dir={args.out}")
    try:
        cfg = load_config(args.config, overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:
        print(f"error: cannot read {args.config}: {e.strerror or e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return _run(args, cfg)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED


def _run(args, cfg) -> int:
    if args.command == "validate":
        print(describe(cfg))
        return EXIT_OK
    if args.command == "train":
        _log_to_stderr()
        return _train(args, cfg)
    from sparseflow.jobs import runner   # TensorFlow: 3-4 s, after the arguments are checked

    if args.command == "eval":
        runner.evaluate(cfg, args.checkpoint, tty=False if args.no_progress else None)
    elif args.command == "export":
        from sparseflow.jobs.export import export

        path = export(cfg, args.checkpoint, args.out)
        print(f"exported {cfg.name} to {path}")
    return EXIT_OK


def _train(args, cfg) -> int:
    """One process; N local workers (``--workers N``: one model over tables sharded by key);
    or, with ``TF_CONFIG``, one worker of a cluster."""
    from sparseflow.distributed.cluster import world_from_env

    world = world_from_env()
    if args.workers is not None and not 1 <= args.workers <= MAX_LOCAL_WORKERS:
        print(f"error: --workers must be in [1, {MAX_LOCAL_WORKERS}], got {args.workers}",
              file=sys.stderr)
        return EXIT_USAGE
    if args.workers is not None and world is not None:
        print("error: --workers starts local workers; this process already has TF_CONFIG "
              "(a cluster's worker): unset one of them", file=sys.stderr)
        return EXIT_USAGE
    tty = False if args.no_progress else None
    if args.workers is not None and args.workers > 1:   # each worker loads TensorFlow, not this
        from sparseflow.distributed.launch import launch
        from sparseflow.jobs.schema import output_dir

        argv = ["train", args.config, "--no-progress"]
        for override in args.overrides:
            argv += ["--set", override]
        if args.out:
            argv += ["--out", args.out]
        return launch(argv, args.workers, output_dir(cfg),
                      grace_seconds=cfg.distributed.timeout_seconds + 30)
    from sparseflow.jobs import runner

    if world is None or world.size == 1:
        if args.workers == 1:   # the sharded layer's path, alone: results as N workers'
            from sparseflow.distributed.graph_world import one_rank

            with one_rank():
                runner.train(cfg, tty=tty)
        else:
            runner.train(cfg, tty=tty)
        return EXIT_OK
    from sparseflow.distributed.cluster import EXIT_ADDRESS_IN_USE, AddressInUseError
    from sparseflow.distributed.graph_world import RankLostError

    # A worker of several. Any failure leaves at once: TensorFlow's teardown of a cluster
    # with a failed or dead peer can block.
    try:
        runner.train(cfg, tty=tty)
    except AddressInUseError as e:   # its own status: the launcher retries on other ports
        print(f"error: {e}", file=sys.stderr, flush=True)
        os._exit(EXIT_ADDRESS_IN_USE)
    except RankLostError as e:   # it names the worker ("rank") already
        print(f"error: {e.message}", file=sys.stderr, flush=True)
        os._exit(EXIT_FAILED)
    except ValueError as e:
        print(f"error: worker {world.index} of {world.size}: {e}", file=sys.stderr,
              flush=True)
        os._exit(EXIT_FAILED)
    except KeyboardInterrupt:
        os._exit(130)
    except BaseException:   # noqa: BLE001 -- reported in full, then the same fast exit
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(EXIT_FAILED)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_OK)


def _log_to_stderr() -> None:
    """sparseflow's INFO messages (each eviction) on stderr, apart from the progress output
    (and between a progress bar's redraws when both go to the terminal)."""
    from sparseflow.jobs.progress import ProgressLogHandler

    logger = logging.getLogger("sparseflow")
    if not logger.handlers:
        handler = ProgressLogHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def describe(cfg) -> str:
    """A few lines saying what a validated job will do."""
    tables = ", ".join(f"{t.name}(dim {t.dim}, {t.vocabulary_size:,} rows)" for t in cfg.tables)
    return "\n".join([
        f"{cfg.source_file}: valid",
        f"  data      {cfg.data.source}; labels {', '.join(cfg.columns.labels)}; "
        f"{len(cfg.columns.dense)} dense, {len(cfg.columns.sparse)} sparse columns",
        f"  tables    {len(cfg.tables)}: {tables}",
        f"  features  {len(cfg.features)}",
        f"  model     {cfg.model.name} {cfg.model.params}",
        f"  optimizer sparse {cfg.sparse_optimizer.name}, dense {cfg.dense_optimizer.name}",
        f"  schedule  {cfg.schedule.max_steps} steps of batch {cfg.schedule.batch_size}",
        f"  output    {cfg.output.dir}",
    ])


if __name__ == "__main__":
    sys.exit(main())


def _launch(args) -> int:
    """``sparseflow launch -n N script.py args...`` (or ``-m module args...``)."""
    if not 1 <= args.ranks <= MAX_LOCAL_WORKERS:
        print(f"error: argument -n/--ranks must be an int in [1, {MAX_LOCAL_WORKERS}]. "
              f"Received: {args.ranks}", file=sys.stderr)
        return EXIT_USAGE
    if args.grace < 0:
        print(f"error: argument --grace must be >= 0. Received: {args.grace}", file=sys.stderr)
        return EXIT_USAGE
    from sparseflow.distributed.launch_script import launch_script
    if args.module is not None:
        rest = [a for a in [args.script] if a is not None] + args.script_args
        return launch_script(["-m", args.module, *rest], args.ranks, args.grace)
    if args.script is None or not os.path.isfile(args.script):
        print(f"error: argument script must be a Python file. Received: {args.script!r} "
              f"(not found)", file=sys.stderr)
        return EXIT_USAGE
    return launch_script([args.script, *args.script_args], args.ranks, args.grace)
