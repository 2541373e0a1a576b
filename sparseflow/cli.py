"""The ``sparseflow`` command: validate, train, evaluate and export YAML-configured jobs.

    sparseflow validate CONFIG [--set KEY=VALUE ...]
    sparseflow train    CONFIG [--set KEY=VALUE ...] [--out DIR] [--no-progress]
    sparseflow eval     CONFIG --checkpoint PATH [--set ...]
    sparseflow export   CONFIG --checkpoint PATH --out DIR [--set ...]
    sparseflow stats    ...   (the offline feature-stats job; arrives with its own issue)

Exit status: 0 success, 2 invalid configuration or arguments, 1 any other failure.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


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
    evaluate = job_command("eval", "Evaluate a checkpoint on the job's eval split.")
    evaluate.add_argument("--checkpoint", required=True,
                          help="a checkpoint prefix or a directory holding checkpoints")
    export = job_command("export", "Export a checkpoint as a SavedModel that serves "
                                   "predictions from raw features.")
    export.add_argument("--checkpoint", required=True,
                        help="a checkpoint prefix or a directory holding checkpoints")
    export.add_argument("--out", required=True, help="the SavedModel directory (new or empty)")
    stats = commands.add_parser("stats", help="Offline feature statistics (not yet available).")
    stats.add_argument("args", nargs=argparse.REMAINDER)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    args = _parser().parse_args(argv)
    if args.command == "stats":
        print("sparseflow stats: the offline feature-stats job is not part of this release yet "
              "(it is tracked as its own issue).", file=sys.stderr)
        return EXIT_USAGE

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
    from sparseflow.jobs import runner

    if args.command == "train":
        _log_to_stderr()
        runner.train(cfg, tty=False if args.no_progress else None)
    elif args.command == "eval":
        runner.evaluate(cfg, args.checkpoint)
    elif args.command == "export":
        from sparseflow.jobs.export import export

        path = export(cfg, args.checkpoint, args.out)
        print(f"exported {cfg.name} to {path}")
    return EXIT_OK


def _log_to_stderr() -> None:
    """sparseflow's INFO messages (each eviction) on stderr, apart from the progress output."""
    logger = logging.getLogger("sparseflow")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
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
