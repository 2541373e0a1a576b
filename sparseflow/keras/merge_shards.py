"""Joins the Keras weight files that N ranks saved into the file one process would save.

Over N ranks each rank's ``model.save_weights`` / ``model.save`` file holds the shard of
every :class:`~sparseflow.keras.SparseEmbedding` and
:class:`~sparseflow.keras.DistributedEmbedding` table it owns (and a copy of the replicated
dense weights), so it loads on the same N ranks only. The merged file holds every key and
loads on any number of ranks (each keeps the keys it owns) or in one process.
"""

from __future__ import annotations

import io
import os
import zipfile
from typing import Sequence

import h5py
import numpy as np

from sparseflow.tf2 import saved_state

# Where a .keras archive keeps its weights (Keras's saving_lib).
_WEIGHTS_IN_ARCHIVE = "model.weights.h5"


def merge_weight_shards(paths: Sequence[str], merged_path: str) -> str:
    """Writes one process's weights file from the files every rank of one run saved.

    Args:
      paths: each rank's ``.weights.h5`` (``model.save_weights``) or ``.keras``
        (``model.save``) file, in any order; all ranks of the run, each once.
      merged_path: the file to write, of the same kind; not one of ``paths``.

    Returns:
      ``merged_path``, for ``model.load_weights`` / ``keras.models.load_model``. Every
      weight that is not a sparseflow layer's table comes from rank 0's file.

    Raises:
      ValueError: no paths, mixed or unknown file kinds, an unreadable file (naming it), a
        file that is not a rank's shard, ranks missing or given twice, files of different
        models, or ``merged_path`` among ``paths``.
    """
    if isinstance(paths, (str, bytes)) or not paths:
        raise ValueError(f"Argument `paths` must be a list of every rank's weights file; "
                         f"received: {paths!r}")
    paths = [os.fspath(p) for p in paths]
    merged_path = os.fspath(merged_path)
    kinds = {_kind(p) for p in paths + [merged_path]}
    if len(kinds) != 1:
        raise ValueError(f"Arguments `paths` and `merged_path` must all be .weights.h5 or "
                         f"all .keras files; received: {paths + [merged_path]}")
    if merged_path in paths:
        raise ValueError(f"Argument `merged_path` ({merged_path!r}) is one of the files "
                         f"being merged: give a new path (nothing is replaced).")
    (kind,) = kinds
    blobs = [(open(p, "rb").read() if os.path.isfile(p) else None) if kind == "h5"
             else _weights_in_archive(p) for p in paths]
    files = [_open_h5(p, data) for p, data in zip(paths, blobs)]
    first = _rank_zero(files, paths)
    # Merged in memory: a refused merge writes nothing.
    buffer = io.BytesIO(blobs[first])
    with h5py.File(buffer, "r+") as out:
        _merge_into(out, files, paths)
    if kind == "h5":
        with open(merged_path, "wb") as f:
            f.write(buffer.getvalue())
        return merged_path
    with zipfile.ZipFile(paths[first]) as src, \
            zipfile.ZipFile(merged_path, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            data = buffer.getvalue() if item.filename == _WEIGHTS_IN_ARCHIVE \
                else src.read(item.filename)
            dst.writestr(item, data)
    return merged_path


def _kind(path: str) -> str:
    if path.endswith(".weights.h5"):
        return "h5"
    if path.endswith(".keras"):
        return "keras"
    raise ValueError(f"{path!r} is neither a .weights.h5 nor a .keras file.")


def _weights_in_archive(path: str) -> bytes:
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.read(_WEIGHTS_IN_ARCHIVE)
    except (OSError, KeyError, zipfile.BadZipFile) as err:
        raise ValueError(f"Cannot read the weights of {path!r}: {err}") from None


def _open_h5(path: str, data: bytes | None) -> h5py.File:
    if data is None:
        raise ValueError(f"Cannot read {path!r}: no such file.")
    try:
        return h5py.File(io.BytesIO(data), "r")
    except OSError as err:
        raise ValueError(f"Cannot read {path!r} as a Keras weights file: {err}") from None


def _layer_groups(file: h5py.File) -> list[str]:
    """The groups holding a sparseflow layer's table (its ``vars``), sorted."""
    found = []

    def visit(name, obj):
        if isinstance(obj, h5py.Group) and {"keys", "values", "slot_names"} <= set(obj.keys()):
            found.append(name)

    file.visititems(visit)
    return sorted(found)


def _rank_zero(files: list, paths: list) -> int:
    """The index of rank 0's file (its dense weights are the ones kept)."""
    groups = _layer_groups(files[0])
    if not groups:
        raise ValueError(f"{paths[0]} holds no sparseflow Keras layer table: there is "
                         f"nothing to merge.")
    for path, file in zip(paths[1:], files[1:]):
        if _layer_groups(file) != groups:
            raise ValueError(f"{path} and {paths[0]} are not weights of one model (their "
                             f"sparseflow layers differ).")
    ranks = [saved_state.state_from_layer(f[groups[0]])[1][0] for f in files]
    return ranks.index(0) if 0 in ranks else 0


def _merge_into(out: h5py.File, files: list, paths: list) -> None:
    for name in _layer_groups(out):
        shards = [saved_state.state_from_layer(f[name]) for f in files]
        state = saved_state.merge_shards(shards, paths, f"layer `{name}`")
        group = out[name]
        for key in [k for k in group.keys() if k != "0"]:   # "0": the layer's anchor
            del group[key]
        for key, value in saved_state.layer_arrays(state, list(saved_state.ONE_PROCESS)) \
                .items():
            group.create_dataset(key, data=np.asarray(value))
