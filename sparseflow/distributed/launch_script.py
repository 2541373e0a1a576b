"""``sparseflow launch -n N script.py args...``: N local processes of one script, like
``torchrun``: each is told its rank (``SPARSEFLOW_RANK``, ``SPARSEFLOW_WORLD_SIZE``) and a
``TF_CONFIG`` on loopback ports; their output is streamed here, each line prefixed by its rank;
when one fails, the others are ended after ``grace_seconds``.

What the script does with its rank is its own: ``sparseflow/distributed/ranks.py`` reads these
variables first, and the faces that train one process's tables refuse to run as one of
several ranks until the sharding layer serves them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from sparseflow.distributed.cluster import (bind_to, local_rank_cpus, local_rank_threads,
                                           local_tf_config)
from sparseflow.distributed.launch import _status, reserve_ports, watch

RANK_VARIABLE, WORLD_VARIABLE = "SPARSEFLOW_RANK", "SPARSEFLOW_WORLD_SIZE"


def _pump(rank: int, pipe, stream, lock: threading.Lock) -> None:
    """Copies ``pipe``'s lines to ``stream`` as ``[rank r] line``."""
    for line in iter(pipe.readline, ""):
        with lock:
            stream.write(f"[rank {rank}] {line}" if line.endswith("\n")
                         else f"[rank {rank}] {line}\n")
            stream.flush()
    pipe.close()


def launch_script(command: list[str], ranks: int, grace_seconds: float = 30.0,
                  stream=None, log=None) -> int:
    """Runs ``python <command>`` as ``ranks`` local processes and waits for all of them.

    Args:
      command: the script and its arguments.
      ranks: N >= 1.
      grace_seconds: after a process fails, how long the others may run before they are
        killed (they usually fail by themselves when a peer of their collectives is gone).
      stream: where the processes' prefixed output goes (default stdout).
      log: where the launcher's own lines go (default stderr).

    Returns:
      0 when every process succeeded, else the exit status of the first that failed (1 if
      it was killed by a signal).

    Raises:
      ValueError: ``command`` is empty, ``ranks`` is not an int >= 1 or ``grace_seconds``
        is negative.
    """
    if not command:
        raise ValueError("Argument `command` must name a script to run. Received: []")
    if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 1:
        raise ValueError(f"Argument `ranks` must be an int >= 1. Received: {ranks!r}")
    if grace_seconds < 0:
        raise ValueError(f"Argument `grace_seconds` must be >= 0. Received: {grace_seconds!r}")
    stream = stream if stream is not None else sys.stdout
    log = log if log is not None else sys.stderr
    held = reserve_ports(ranks)
    ports = [s.getsockname()[1] for s in held]
    lock = threading.Lock()
    procs, pumps = [], []
    try:
        for rank in range(ranks):
            # Unbuffered: a rank's lines reach the terminal as it prints them, not when its
            # pipe buffer fills.
            env = dict(os.environ, TF_CONFIG=local_tf_config(ports, rank),
                       PYTHONUNBUFFERED="1", **local_rank_threads(ranks),
                       **{RANK_VARIABLE: str(rank), WORLD_VARIABLE: str(ranks)})
            proc = subprocess.Popen([sys.executable, *command], env=env, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    bufsize=1,
                                    preexec_fn=bind_to(local_rank_cpus(ranks, rank)))
            procs.append(proc)
            pump = threading.Thread(target=_pump, args=(rank, proc.stdout, stream, lock),
                                    daemon=True)
            pump.start()
            pumps.append(pump)
        print(f"sparseflow launch: started {ranks} ranks of {' '.join(command)} (TF_CONFIG on "
              f"localhost ports {', '.join(map(str, ports))})", file=log, flush=True)
        first = watch(procs, grace_seconds, log, name="rank", stop_at_once=())
    except BaseException:
        for p in procs:
            p.kill()
        raise
    finally:
        for s in held:
            s.close()
        for p in procs:
            p.wait()
        for pump in pumps:
            pump.join(timeout=5)
    if first is None:
        return 0
    rank, code = first
    print(f"sparseflow launch: rank {rank} failed with status {_status(code)}; the job "
          f"failed", file=log, flush=True)
    return code if code > 0 else 1
