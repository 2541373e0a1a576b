"""Which worker this process is, from ``TF_CONFIG`` (what ``MultiWorkerMirroredStrategy``
reads too), the error of a server that cannot listen on its address, and the ``TF_CONFIG``
of each local worker ``sparseflow train --workers N`` starts."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import socket

# The exit status of ``sparseflow train`` when the worker's gRPC server could not bind its
# address: the launcher (launch.py) tells it from other failures and starts the workers
# again on other ports.
EXIT_ADDRESS_IN_USE = 3


class AddressInUseError(RuntimeError):
    """A worker's gRPC server could not listen on its ``TF_CONFIG`` address."""


@dataclasses.dataclass(frozen=True)
class World:
    """This worker's place: ``index`` in ``[0, size)``; ``size`` workers in all; ``address``
    its ``host:port`` in ``TF_CONFIG`` ("" for one worker without ``TF_CONFIG``)."""

    index: int
    size: int
    address: str = dataclasses.field(default="", compare=False)

    @property
    def chief(self) -> bool:
        """Worker 0 writes what is written once (dense checkpoints, the summary)."""
        return self.index == 0


def world_from_env(environ=None) -> World | None:
    """The world ``TF_CONFIG`` describes, or None when it is unset.

    ``TF_CONFIG`` is JSON: ``{"cluster": {"worker": ["host:port", ...]}, "task": {"type":
    "worker", "index": i}}``.

    Raises:
      ValueError: ``TF_CONFIG`` is not such JSON (names what is wrong and shows the value).
    """
    environ = os.environ if environ is None else environ
    raw = environ.get("TF_CONFIG")
    if not raw:
        return None
    example = ('{"cluster": {"worker": ["host1:2222", "host2:2222"]}, '
               '"task": {"type": "worker", "index": 0}}')
    try:
        config = json.loads(raw)
        workers = config["cluster"]["worker"]
        task = config["task"]
        index = task["index"]
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"Environment variable TF_CONFIG must be JSON like {example}; "
                         f"received {raw!r} ({type(err).__name__}: {err}).") from None
    if set(config["cluster"]) - {"worker"}:
        raise ValueError(f"TF_CONFIG's cluster must list workers only (no chief, ps or "
                         f"evaluator: every worker trains); received jobs "
                         f"{sorted(config['cluster'])}.")
    if not isinstance(workers, list) or not workers or not all(
            isinstance(w, str) for w in workers):
        raise ValueError(f"TF_CONFIG's cluster.worker must be a non-empty list of "
                         f"'host:port' strings; received {workers!r}.")
    if task.get("type") != "worker" or not isinstance(index, int) or isinstance(
            index, bool) or not 0 <= index < len(workers):
        raise ValueError(f"TF_CONFIG's task must be {{\"type\": \"worker\", \"index\": i}} "
                         f"with i in [0, {len(workers) - 1}]; received {task!r}.")
    return World(index, len(workers), workers[index])


def address_in_use(world: World, kind: str) -> AddressInUseError:
    """The error of ``kind`` ("worker", "rank") ``world.index`` whose gRPC server could not
    listen on its address: names it, and why where a probe finds out."""
    return AddressInUseError(
        f"{kind} {world.index} of {world.size} cannot listen on {world.address}, its "
        f"address in TF_CONFIG (cluster.worker[{world.index}]): "
        f"{_why_unbindable(world.address)}. Stop the process that holds the port, or "
        f"give this {kind} another port (in the cluster.worker list of every {kind}'s "
        f"TF_CONFIG).")


def local_tf_config(ports: list[int], index: int) -> str:
    """The ``TF_CONFIG`` of local worker ``index`` of ``len(ports)`` on loopback."""
    return json.dumps({"cluster": {"worker": [f"localhost:{p}" for p in ports]},
                       "task": {"type": "worker", "index": index}})


def usable_cpus() -> list[int]:
    """The CPUs this process may run on, ascending: its affinity where the platform has one
    (under ``sparseflow launch``, the rank's block), else every CPU."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


# TensorFlow sizes its thread pools from these when a session or context leaves them 0.
THREAD_VARIABLES = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")


def local_rank_threads(local_ranks: int, environ=None, cpus: int | None = None) -> dict:
    """The environment that sizes TensorFlow's thread pools for one of ``local_ranks``
    processes sharing this machine: each pool gets the rank's share of the CPUs (at least
    one). By default each process sizes both pools to every CPU, and on a machine the ranks
    share their idle pool threads spin on the cores the other rank is computing on (2 ranks
    on 2 cores: 42.6 against 37.1 ms per Session step, BENCHMARKS.md "Sharded faces").

    Args:
      local_ranks: processes started on this machine (>= 1).
      environ: the launcher's environment (default ``os.environ``): a variable it already
        sets is left to it.
      cpus: the CPUs the processes may run on (default: this process's affinity).

    Returns:
      ``{variable: value}`` for each of :data:`THREAD_VARIABLES` the environment does not
      set.
    """
    environ = os.environ if environ is None else environ
    if cpus is None:
        cpus = len(usable_cpus())
    share = str(max(1, cpus // max(1, local_ranks)))
    return {name: share for name in THREAD_VARIABLES if not environ.get(name, "").strip()}


# Set to 0 (or "false", "no", "off") to leave the local ranks on every CPU.
BIND_VARIABLE = "SPARSEFLOW_BIND_CPUS"


def local_rank_cpus(local_ranks: int, rank: int, environ=None,
                    cpus: list[int] | None = None) -> list[int] | None:
    """The CPUs local rank ``rank`` of ``local_ranks`` is bound to: its share of the CPUs,
    one contiguous block per rank (as ``mpirun --bind-to core`` places ranks), so that each
    rank's threads keep their core's caches and a rank waiting in a collective does not
    migrate onto the core its peer computes on. Two ranks on 2 cores, 3 interleaved rounds
    of the Session face: 48.3, 49.7, 45.6 ms per step unbound, 41.8, 40.4, 40.2 bound
    (docs/design-notes.md).

    Args:
      local_ranks: processes started on this machine (>= 1).
      rank: this one's index among them.
      environ: the launcher's environment (default ``os.environ``); ``SPARSEFLOW_BIND_CPUS``
        set to ``0``/``false``/``no``/``off`` turns binding off.
      cpus: the CPUs the processes may run on (default: this process's affinity).

    Returns:
      The CPU numbers, or None: leave the rank unbound (one rank; more ranks than CPUs,
      where the scheduler balances them better than a fixed split; binding turned off; or
      a platform without CPU affinity).
    """
    environ = os.environ if environ is None else environ
    if environ.get(BIND_VARIABLE, "").strip().lower() in ("0", "false", "no", "off"):
        return None
    if cpus is None:
        if not hasattr(os, "sched_setaffinity"):
            return None
        cpus = usable_cpus()
    if local_ranks <= 1 or local_ranks > len(cpus):
        return None
    share = len(cpus) // local_ranks
    return list(cpus[rank * share:(rank + 1) * share])


def bind_to(cpus: list[int] | None):
    """A ``preexec_fn`` for ``subprocess.Popen`` that binds the child to ``cpus`` before it
    starts (every thread it makes inherits them), or None to leave it unbound."""
    if cpus is None:
        return None

    def bind():
        os.sched_setaffinity(0, cpus)

    return bind


def _why_unbindable(address: str) -> str:
    """Why TensorFlow's server (which binds every interface) could not bind the port of
    ``address``, found by trying the same bind."""
    port = address.rsplit(":", 1)[-1]
    if not port.isdigit():
        return f"{port!r} is not a port number"
    probe = socket.socket()
    try:
        probe.bind(("", int(port)))
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            return f"port {port} is in use by another process"
        if err.errno == errno.EACCES:
            return f"binding port {port} is not permitted (ports below 1024 need privileges)"
        return f"binding port {port} fails: {err.strerror}"
    finally:
        probe.close()
    return f"port {port} could not be bound (it is free now: another process held it)"
