"""Which rank of how many this process is, from the environment its launcher set, and the
guard that keeps a face that cannot shard from training N independent models.

Launchers announce a process's place in several ways; they are read in this order:

- ``sparseflow launch -n N script.py``: ``SPARSEFLOW_RANK`` / ``SPARSEFLOW_WORLD_SIZE``;
- ``mpirun`` (Open MPI): ``OMPI_COMM_WORLD_RANK`` / ``OMPI_COMM_WORLD_SIZE``;
- MPICH / Intel MPI (PMI): ``PMI_RANK`` / ``PMI_SIZE``;
- ``horovodrun``: ``HOROVOD_RANK`` / ``HOROVOD_SIZE``;
- Rec SDK's rank table launch: ``RANK_ID`` / ``RANK_SIZE``;
- ``TF_CONFIG`` (``sparseflow train --workers N`` and ``MultiWorkerMirroredStrategy``).

Only YAML jobs shard tables over several processes today (``distributed/``, through
``TF_CONFIG``). The Session API (``init``), the ``mx_rec`` facade, ``sparseflow.tf2``, the
Keras layer and the Estimator call :func:`require_one_process`: started as one of several
ranks, they fail naming what they found, instead of each rank silently training a model of
its own on its part of the data.
"""

from __future__ import annotations

import dataclasses
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
        if size_name not in environ and rank_name not in environ:
            continue
        size = _int(size_name, environ.get(size_name, "1"))
        rank = _int(rank_name, environ.get(rank_name, "0"))
        if size < 1 or not 0 <= rank < size:
            raise ValueError(f"Environment variables {rank_name}={rank} and {size_name}={size} "
                             f"(set by {launcher}) must give a rank in [0, size).")
        return Ranks(rank, size, f"{rank_name}={rank}, {size_name}={size} (set by {launcher})")
    from sparseflow.distributed.cluster import world_from_env
    world = world_from_env(environ)
    if world is not None:
        return Ranks(world.index, world.size,
                     f"TF_CONFIG (worker {world.index} of {world.size})")
    return Ranks(0, 1)


def require_one_process(face: str, environ=None) -> Ranks:
    """Fails when this process is one of several ranks: ``face`` (an API, named in the
    message) trains one process's model only.

    Args:
      face: what the user called, e.g. "sparseflow.init()".
      environ: the environment to read (default ``os.environ``).

    Returns:
      The :class:`Ranks` (of size 1).

    Raises:
      RuntimeError: several ranks; the message names what was found and what to do.
      ValueError: as :func:`detect`.
    """
    ranks = detect(environ)
    if ranks.size > 1:
        raise RuntimeError(
            f"{face}: this process is rank {ranks.rank} of {ranks.size} ({ranks.source}), but "
            f"{face} trains the tables of one process: each of the {ranks.size} ranks would "
            f"train a model of its own on its part of the data. Run the script as one process, "
            f"or train a YAML job on several workers (sparseflow train CONFIG --workers N; "
            f"docs/multi-worker.md).")
    return ranks
