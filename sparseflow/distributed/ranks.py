"""Which rank of how many this process is, from the environment its launcher set.

Launchers announce a process's place in several ways; they are read in this order:

- ``sparseflow launch -n N script.py``: ``SPARSEFLOW_RANK`` / ``SPARSEFLOW_WORLD_SIZE``;
- ``mpirun`` (Open MPI): ``OMPI_COMM_WORLD_RANK`` / ``OMPI_COMM_WORLD_SIZE``;
- MPICH / Intel MPI (PMI): ``PMI_RANK`` / ``PMI_SIZE``;
- ``horovodrun``: ``HOROVOD_RANK`` / ``HOROVOD_SIZE``;
- Rec SDK's rank table launch: ``RANK_ID`` / ``RANK_SIZE``;
- ``TF_CONFIG`` (``sparseflow train --workers N`` and ``MultiWorkerMirroredStrategy``).

Every face reads it: the Session API (``init``, the ``mx_rec`` facade), the Estimator, the
TF2 faces and YAML jobs shard their tables over the ranks found (``docs/multi-worker.md``);
several ranks without the addresses their collectives need fail naming what was found.
"""

from __future__ import annotations

import dataclasses
import json
import os

# (rank variable, size variable, launcher), in the order they are read.
_RANK_VARIABLES = (
    ("SPARSEFLOW_RANK", "SPARSEFLOW_WORLD_SIZE", "sparseflow launch"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "mpirun (Open MPI)"),
    ("PMI_RANK", "PMI_SIZE", "an MPI launcher (PMI)"),
    ("HOROVOD_RANK", "HOROVOD_SIZE", "horovodrun"),
    ("RANK_ID", "RANK_SIZE", "Rec SDK's rank table"),
)


@dataclasses.dataclass(frozen=True)
class Ranks:
    """This process's ``rank`` in ``[0, size)``, and what said so (``source``: the variables
    and their values, "" when nothing did)."""

    rank: int
    size: int
    source: str = ""


def _int(name: str, value: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise ValueError(f"Environment variable {name} must be an integer; received "
                         f"{value!r}.") from None


def detect(environ=None) -> Ranks:
    """This process's place among the ranks its launcher started.

    Args:
      environ: the environment to read (default ``os.environ``).

    Returns:
      :class:`Ranks`; ``Ranks(0, 1)`` when no launcher variable is set.

    Raises:
      ValueError: a launcher variable is not an integer, a size below 1, or a rank outside
        ``[0, size)`` (naming the variables); ``TF_CONFIG`` is malformed.
    """
    environ = os.environ if environ is None else environ
    for rank_name, size_name, launcher in _RANK_VARIABLES:
        # An empty value is as good as unset (some job scripts export VAR= ).
        if not environ.get(size_name, "").strip() and not environ.get(rank_name, "").strip():
            continue
        size = _int(size_name, environ.get(size_name, "").strip() or "1")
        rank = _int(rank_name, environ.get(rank_name, "").strip() or "0")
        if size < 1 or not 0 <= rank < size:
            raise ValueError(f"Environment variables {rank_name}={rank} and {size_name}={size} "
                             f"(set by {launcher}) must give a rank in [0, size).")
        return Ranks(rank, size, f"{rank_name}={rank}, {size_name}={size} (set by {launcher})")
    return _from_tf_config(environ.get("TF_CONFIG", ""))


def _from_tf_config(raw: str) -> Ranks:
    """The training tasks of a ``TF_CONFIG`` (chief first, then workers; ps and evaluator
    tasks train no replica), or ``Ranks(0, 1)`` for none. A one-replica cluster (a chief
    alone, as cloud trainers set) is one process."""
    if not raw.strip():
        return Ranks(0, 1)
    try:
        config = json.loads(raw)
        cluster, task = config.get("cluster", {}), config.get("task", {})
        order = [(kind, i) for kind in ("chief", "worker")
                 for i in range(len(cluster.get(kind, [])))]
        kind, index = task.get("type"), task.get("index", 0)
    except (ValueError, AttributeError, TypeError) as err:
        raise ValueError(f"Environment variable TF_CONFIG must be JSON like {{\"cluster\": "
                         f"{{\"worker\": [\"host:port\", ...]}}, \"task\": {{\"type\": "
                         f"\"worker\", \"index\": 0}}}}; received {raw!r} "
                         f"({type(err).__name__}: {err}).") from None
    if len(order) <= 1:
        return Ranks(0, 1)
    if (kind, index) not in order:   # a ps or evaluator task: no replica of its own
        return Ranks(0, 1, f"TF_CONFIG (a {kind} task)")
    rank = order.index((kind, index))
    return Ranks(rank, len(order), f"TF_CONFIG ({kind} {index}, {len(order)} training tasks)")
