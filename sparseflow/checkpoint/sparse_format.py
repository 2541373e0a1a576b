"""The on-disk format of sparse checkpoints: Arrow IPC files plus a verified manifest.

One directory per checkpoint::

    manifest.json              format version, kind (full / delta) and base; per table:
                               config, row counts, clock, optimizer steps, slot names, and
                               each file's byte size and CRC32
    <table>/admitted.arrow     key int64, count int32, last_seen int64,
                               values: fixed-size list of float32 [dim * (1 + slots)] — each
                               row's [weights | slot 1 | slot 2], as the table stores it
    <table>/counted.arrow      key int64, count int32 (counted, not admitted)
    <table>/tombstones.arrow   key int64 (incremental: evicted since the base)
    <table>/sketch.arrow       counters uint32 [depth * width] (a table counting admissions in
                               a count-min sketch; the manifest entry's "sketch" holds its
                               version, width, depth, seed and total). Checkpoints without it
                               load: the table's sketch starts empty (with a warning).

Arrow's IPC file format (uncompressed) writes the arrays as they are and reads them back
memory-mapped: within a small factor of ``np.save`` (BENCHMARKS.md). Parquet, tried first,
was several times slower to write and read for these dense float blocks.

Reading verifies every file's size and CRC32 against the manifest *before* anything is parsed,
and raises naming the file on a mismatch — a truncated or corrupted checkpoint never loads
partially.

An incremental checkpoint (``kind: "delta"``) holds only the keys whose rows changed since its
``base`` (another checkpoint directory beside it, full or delta) plus tombstones; restoring
reads the chain back to a full one and applies the deltas in order.
"""

from __future__ import annotations

import json
import os
import zlib

import numpy as np
import pyarrow as pa

from sparseflow.checkpoint.table_state import TableState
from sparseflow.ops.count_min import CountMinSketch

FORMAT_VERSION = 1
SKETCH_VERSION = 1   # the layout of sketch.arrow and of the manifest's "sketch" entry
MANIFEST = "manifest.json"
_CHUNK = 1 << 24


class CheckpointError(ValueError):
    """A checkpoint is missing, corrupt, truncated or of an unknown format."""


def file_crc32(path: str) -> int:
    """CRC32 of a file's bytes, read in 16 MiB chunks."""
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def _fixed_list(matrix: np.ndarray) -> pa.Array:
    flat = pa.array(np.ascontiguousarray(matrix, np.float32).reshape(-1))
    return pa.FixedSizeListArray.from_arrays(flat, matrix.shape[1])


def _matrix(column: pa.ChunkedArray, width: int) -> np.ndarray:
    flat = column.combine_chunks().flatten().to_numpy(zero_copy_only=False)
    return flat.reshape(-1, width)


def _write(table: pa.Table, path: str) -> dict:
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return {"bytes": os.path.getsize(path), "crc32": file_crc32(path)}


def _read(path: str) -> pa.Table:
    return pa.ipc.open_file(pa.memory_map(path, "r")).read_all()


def write_table_state(directory: str, name: str, state: TableState, dim: int,
                      config: dict) -> dict:
    """Writes one table's state under ``directory/name``; returns its manifest entry."""
    table_dir = os.path.join(directory, name)
    os.makedirs(table_dir, exist_ok=True)
    admitted = pa.table({"key": pa.array(state.keys, pa.int64()),
                         "count": pa.array(state.counts, pa.int32()),
                         "last_seen": pa.array(state.last_seen, pa.int64()),
                         "values": _fixed_list(state.values)})
    counted = pa.table({"key": pa.array(state.counted_keys, pa.int64()),
                        "count": pa.array(state.counted_counts, pa.int32())})
    tombstones = pa.table({"key": pa.array(state.tombstones, pa.int64())})
    parts = [("admitted.arrow", admitted), ("counted.arrow", counted),
             ("tombstones.arrow", tombstones)]
    if state.sketch is not None:
        parts.append(("sketch.arrow", pa.table(
            {"counters": pa.array(state.sketch.counters.reshape(-1), pa.uint32())})))
    files = {filename: _write(t, os.path.join(table_dir, filename)) for filename, t in parts}
    entry = {"config": config, "dim": dim, "admitted_rows": int(state.keys.shape[0]),
             "counted_rows": int(state.counted_keys.shape[0]), "clock": int(state.clock),
             "optimizer_steps": int(state.optimizer_steps), "slots": list(state.slot_names),
             "files": files}
    if state.sketch is not None:
        sketch = state.sketch
        entry["sketch"] = {"version": SKETCH_VERSION, "width": sketch.width,
                           "depth": sketch.depth, "seed": sketch.seed, "total": sketch.total}
    return entry


def write_manifest(directory: str, tables: dict, base: str | None = None,
                   world: dict | None = None) -> None:
    """Writes ``manifest.json`` (fsynced) for the table entries of :func:`write_table_state`.

    Args:
      base: for an incremental checkpoint, the name of its base directory (a sibling).
      world: for one rank's shard, ``{"rank": r, "size": N, "shards": [...]}`` (every
        rank's shard directory, relative to this one's parent or absolute); None for one
        process.
    """
    path = os.path.join(directory, MANIFEST)
    manifest = {"format_version": FORMAT_VERSION, "kind": "full" if base is None else "delta",
                "base": base, "tables": tables}
    if world is not None:
        manifest["world"] = world
    with open(path, "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def read_manifest(directory: str) -> dict:
    """Reads and checks a checkpoint's manifest.

    Raises:
      CheckpointError: no manifest (not a checkpoint, or a save that never finished), an
        unreadable one, or an unknown format version.
    """
    path = os.path.join(directory, MANIFEST)
    if not os.path.exists(path):
        raise CheckpointError(f"No sparse checkpoint at {directory!r}: {MANIFEST} is missing.")
    try:
        with open(path) as f:
            manifest = json.load(f)
    except (OSError, ValueError) as err:
        raise CheckpointError(f"Checkpoint manifest {path!r} is unreadable: {err}") from err
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"Checkpoint {path!r} has format_version "
                              f"{manifest.get('format_version')!r}; this sparseflow reads "
                              f"{FORMAT_VERSION}.")
    return manifest


def verify_files(directory: str, manifest: dict) -> None:
    """Checks every file's size and CRC32 against the manifest.

    Raises:
      CheckpointError: naming the first missing, truncated or corrupted file.
    """
    for name, entry in manifest["tables"].items():
        for filename, expected in entry["files"].items():
            path = os.path.join(directory, name, filename)
            if not os.path.exists(path):
                raise CheckpointError(f"Checkpoint file {path!r} is missing.")
            size = os.path.getsize(path)
            if size != expected["bytes"]:
                raise CheckpointError(f"Checkpoint file {path!r} is truncated or altered: "
                                      f"{size} bytes, the manifest says {expected['bytes']}.")
            if file_crc32(path) != expected["crc32"]:
                raise CheckpointError(f"Checkpoint file {path!r} is corrupt: its CRC32 does "
                                      f"not match the manifest.")


def read_table_state(directory: str, name: str, entry: dict) -> TableState:
    """Reads one table's state (files already verified by :func:`verify_files`)."""
    table_dir = os.path.join(directory, name)
    width = entry["dim"] * (1 + len(entry["slots"]))
    try:
        admitted = _read(os.path.join(table_dir, "admitted.arrow"))
        counted = _read(os.path.join(table_dir, "counted.arrow"))
        tombstones = _read(os.path.join(table_dir, "tombstones.arrow"))
    except (OSError, pa.ArrowException) as err:
        raise CheckpointError(f"Checkpoint files of table `{name}` in {directory!r} are "
                              f"unreadable: {err}") from err

    def ints(t: pa.Table, column: str, dtype) -> np.ndarray:
        return t.column(column).to_numpy().astype(dtype, copy=False)

    return TableState(
        keys=ints(admitted, "key", np.int64), counts=ints(admitted, "count", np.int32),
        last_seen=ints(admitted, "last_seen", np.int64),
        values=_matrix(admitted.column("values"), width), slot_names=tuple(entry["slots"]),
        counted_keys=ints(counted, "key", np.int64),
        counted_counts=ints(counted, "count", np.int32),
        clock=entry["clock"], optimizer_steps=entry["optimizer_steps"],
        tombstones=ints(tombstones, "key", np.int64),
        sketch=_read_sketch(directory, name, entry))


def _read_sketch(directory: str, name: str, entry: dict) -> CountMinSketch | None:
    """Table ``name``'s admission sketch, or None when the checkpoint has none (written by a
    table counting exactly, or before sketches were saved).

    Raises:
      CheckpointError: an unknown sketch version, or counters that do not match it.
    """
    meta = entry.get("sketch")
    if meta is None:
        return None
    path = os.path.join(directory, name, "sketch.arrow")
    if meta.get("version") != SKETCH_VERSION:
        raise CheckpointError(f"Checkpoint {path!r} has sketch version "
                              f"{meta.get('version')!r}; this sparseflow reads "
                              f"{SKETCH_VERSION}.")
    try:
        counters = _read(path).column("counters").to_numpy().astype(np.uint32, copy=False)
        return CountMinSketch.from_counters(
            counters.reshape(meta["depth"], meta["width"]), meta["seed"], meta["total"])
    except (OSError, pa.ArrowException, KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"Checkpoint file {path!r} does not hold the sketch its "
                              f"manifest describes: {err}") from err


def chain(directory: str) -> list[tuple[str, dict]]:
    """The checkpoints to apply, oldest (full) first: ``[(directory, manifest), ...]``.

    Every link's files are verified before this returns.

    Raises:
      CheckpointError: a link is missing, corrupt, or the chain loops.
    """
    links = []
    seen = set()
    while True:
        if directory in seen:
            raise CheckpointError(f"Checkpoint chain loops at {directory!r}.")
        seen.add(directory)
        manifest = read_manifest(directory)
        verify_files(directory, manifest)
        links.append((directory, manifest))
        if manifest.get("kind", "full") == "full":
            return links[::-1]
        directory = os.path.join(os.path.dirname(directory), manifest["base"])
