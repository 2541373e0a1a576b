"""Where a sharded checkpoint's files are, and reading them.

``checkpoints/step-NNNNNNNNN/`` holds ``worker-r-of-N/`` (each worker's shards in the
single-process sparse format: manifest + CRC'd Arrow files), ``dense/`` and ``world.json``,
written last: a step directory with it is complete.
"""

from __future__ import annotations

import json
import os

from sparseflow.checkpoint import sparse_format as fmt
from sparseflow.distributed.sharding import rebucket

WORLD_FILE = "world.json"


def complete_checkpoints(ckpt_dir: str) -> list[str]:
    """The complete step directories of ``ckpt_dir``, oldest first."""
    if not os.path.isdir(ckpt_dir):
        return []
    return [os.path.join(ckpt_dir, d) for d in sorted(os.listdir(ckpt_dir))
            if d.startswith("step-") and os.path.exists(os.path.join(ckpt_dir, d, WORLD_FILE))]


def sharded_checkpoint(path: str, subdir: str = "checkpoints") -> str | None:
    """The newest complete sharded checkpoint at ``path`` (itself, or in it or its
    ``subdir``), or None."""
    if os.path.exists(os.path.join(path, WORLD_FILE)):
        return path
    for directory in (path, os.path.join(path, subdir)):
        found = complete_checkpoints(directory)
        if found:
            return found[-1]
    return None


def read_world(path: str) -> dict:
    """``world.json`` of the sharded checkpoint ``path``: step, world_size, hash, tables."""
    with open(os.path.join(path, WORLD_FILE)) as f:
        return json.load(f)


def open_shards(path: str, only: int | None = None) -> list[tuple[str, dict]]:
    """``(directory, manifest)`` of every worker's shards (or of worker ``only``'s alone),
    their files verified.

    Raises:
      CheckpointError: a missing manifest, or a missing, truncated or corrupt file.
    """
    n = int(read_world(path)["world_size"])
    shards = []
    for r in range(n) if only is None else [only]:
        directory = os.path.join(path, f"worker-{r}-of-{n}")
        manifest = fmt.read_manifest(directory)
        fmt.verify_files(directory, manifest)
        shards.append((directory, manifest))
    return shards


def table_shards(path: str, shards: list[tuple[str, dict]], name: str) -> list:
    """Table ``name``'s ``TableState`` from every shard of :func:`open_shards`.

    Raises:
      CheckpointError: a shard does not hold the table.
    """
    states = []
    for directory, manifest in shards:
        if name not in manifest["tables"]:
            raise fmt.CheckpointError(
                f"Checkpoint {path!r} has no table `{name}` (in {directory!r}, which holds "
                f"{sorted(manifest['tables'])}).")
        states.append(fmt.read_table_state(directory, name, manifest["tables"][name]))
    return states


def owned_state(path: str, shards: list[tuple[str, dict]], name: str, world_size: int,
                index: int, hash: str = "mod"):
    """Table ``name``'s keys that worker ``index`` of ``world_size`` owns, from every shard
    of :func:`open_shards`, one old shard in memory at a time (each split as it is read,
    the parts joined by a re-bucketing to one worker, which refuses a key found twice).

    Raises:
      CheckpointError: a shard does not hold the table.
      ValueError: a key in two shards.
    """
    parts = [rebucket(table_shards(path, [shard], name), world_size, hash)[index]
             for shard in shards]
    return rebucket(parts, 1)[0]
