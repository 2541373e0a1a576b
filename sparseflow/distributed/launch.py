"""``sparseflow train CONFIG --workers N``: N local worker processes, each ``sparseflow
train`` with its own ``TF_CONFIG`` on loopback ports, watched until all end.

Worker 0 writes to this process's output; worker r > 0 to ``<output.dir>/workers/worker-r.log``.
When a worker fails, the others fail too (their collectives time out, or TensorFlow's
coordination service reports the peer lost); any still running ``grace_seconds`` after the
first failure are killed, so the launcher never hangs on a dead cluster.

Ports: the launcher holds each chosen port (:func:`reserve_ports`) until the workers end, so
that no other process's plain bind or outgoing connection takes it between the choice and
the worker's bind. A process that binds it anyway (with ``SO_REUSEADDR``, listening first)
makes the worker exit at start with :data:`~sparseflow.distributed.cluster.EXIT_ADDRESS_IN_USE`;
the launcher then stops the other workers at once (they are still waiting for that one:
nothing was trained or written) and starts them all again on new ports, up to ``attempts``
times.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from sparseflow.distributed.cluster import (EXIT_ADDRESS_IN_USE, bind_to, local_rank_cpus,
                                           local_rank_threads, local_tf_config)

WORKER_LOG_DIR = "workers"
PORT_ATTEMPTS = 3


def reserve_ports(n: int) -> list[socket.socket]:
    """``n`` sockets bound to distinct free TCP ports on every interface, not listening.

    They carry ``SO_REUSEADDR``, as TensorFlow's gRPC server's socket does: while they are
    open, the server binds their port (the kernel lets two such sockets share it while
    neither listens), but a bind without ``SO_REUSEADDR`` by another process fails and no
    outgoing connection gets the port as its local one. Close them when the workers end.
    """
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            socks.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("", 0))
    except OSError:
        for s in socks:
            s.close()
        raise
    return socks


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free now (not held: for tests that start workers)."""
    socks = reserve_ports(n)
    try:
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def launch(argv: list[str], workers: int, out_dir: str, grace_seconds: float,
           stream=None, attempts: int = PORT_ATTEMPTS) -> int:
    """Runs ``python -m sparseflow <argv>`` as ``workers`` local workers.

    Args:
      argv: the ``train`` command line without ``--workers`` (each worker's own).
      workers: N >= 1.
      out_dir: the job's output directory (worker logs go under it).
      grace_seconds: after a worker fails, how long the others may take to fail by
        themselves before they are killed.
      stream: where the launcher's own lines go (default stderr).
      attempts: how many times to start the workers when one cannot listen on its port
        (another process took it), each time on new ports; >= 1.

    Returns:
      0 when every worker succeeded, else 1.

    Raises:
      ValueError: ``attempts`` is not an int >= 1.
    """
    if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1:
        raise ValueError(f"Argument `attempts` must be an int >= 1. Received: {attempts!r}")
    stream = stream if stream is not None else sys.stderr
    log_dir = os.path.join(out_dir, WORKER_LOG_DIR)
    os.makedirs(log_dir, exist_ok=True)
    for attempt in range(1, attempts + 1):
        held = reserve_ports(workers)
        ports = [s.getsockname()[1] for s in held]
        try:
            procs = _run(argv, ports, log_dir, grace_seconds, stream)
        finally:
            for s in held:
                s.close()
        busy = [i for i, p in enumerate(procs) if p.returncode == EXIT_ADDRESS_IN_USE]
        if not busy:
            break
        taken = ", ".join(f"worker {i} on localhost:{ports[i]}" for i in busy)
        if attempt < attempts:
            print(f"sparseflow: {taken} could not listen (another process took the port); "
                  f"starting the {workers} workers again on new ports (attempt "
                  f"{attempt + 1} of {attempts})", file=stream, flush=True)
            continue
        print(f"sparseflow: error: {taken} could not listen (another process took the "
              f"port), on each of {attempts} attempts with new ports; see the worker's "
              f"message{_where(busy[0], log_dir)}", file=stream, flush=True)
        return 1
    failed = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode != 0]
    for index, code in failed:
        print(f"sparseflow: worker {index} failed with status {_status(code)} (its log"
              f"{_where(index, log_dir)})", file=stream, flush=True)
    return 1 if failed else 0


def _run(argv: list[str], ports: list[int], log_dir: str, grace_seconds: float,
         stream) -> list[subprocess.Popen]:
    """Starts one worker per port and watches them until all have ended; returns them."""
    workers = len(ports)
    procs, logs = [], []
    try:
        for index in range(workers):
            env = dict(os.environ, TF_CONFIG=local_tf_config(ports, index),
                       **local_rank_threads(workers))
            if index == 0:
                out = None
            else:
                out = open(os.path.join(log_dir, f"worker-{index}.log"), "w")
                logs.append(out)
            procs.append(subprocess.Popen([sys.executable, "-m", "sparseflow", *argv],
                                          env=env, stdout=out,
                                          stderr=subprocess.STDOUT if out else None,
                                          preexec_fn=bind_to(local_rank_cpus(workers,
                                                                             index))))
        print(f"sparseflow: started {workers} workers on localhost ports "
              f"{', '.join(map(str, ports))}; logs of workers 1.. in {log_dir}", file=stream,
              flush=True)
        watch(procs, grace_seconds, stream)
    except BaseException:
        for p in procs:
            p.kill()
        raise
    finally:
        for p in procs:
            p.wait()
        for f in logs:
            f.close()
    return procs


def watch(procs: list[subprocess.Popen], grace_seconds: float, stream,
          name: str = "worker", stop_at_once=(EXIT_ADDRESS_IN_USE,)):
    """Polls the processes until all have ended, killing the rest ``grace_seconds`` after
    the first failure, or at once when one exits with a status in ``stop_at_once`` (a worker
    that could not listen on its port: the others wait for it, nothing ran yet).

    Args:
      procs: the processes, by index.
      grace_seconds: how long the others may run after the first failure.
      stream: where the lines about failures go.
      name: what a process is called in them ("worker", "rank").
      stop_at_once: exit statuses that end the others without waiting.

    Returns:
      (index, status) of the first process that failed, or None.
    """
    first, deadline = None, None
    while any(p.poll() is None for p in procs):
        for index, p in enumerate(procs):
            code = p.poll()
            if code in stop_at_once:
                for other in procs:
                    if other.poll() is None:
                        other.kill()
                return index, code
            if code not in (None, 0) and first is None:
                first = (index, code)
                deadline = time.monotonic() + grace_seconds
                print(f"sparseflow: {name} {index} exited with status {_status(code)}"
                      f"; waiting up to {grace_seconds:g} s for the others to stop",
                      file=stream, flush=True)
        if deadline is not None and time.monotonic() > deadline:
            for index, p in enumerate(procs):
                if p.poll() is None:
                    print(f"sparseflow: killing {name} {index} (still running "
                          f"{grace_seconds:g} s after {name} {first[0]} failed)",
                          file=stream, flush=True)
                    p.kill()
        time.sleep(0.1)
    if first is None:
        first = next(((i, p.returncode) for i, p in enumerate(procs) if p.returncode != 0),
                     None)
    return first


def _where(index: int, log_dir: str) -> str:
    """Where worker ``index``'s output is, as `` above`` / `` in PATH``."""
    return " above" if index == 0 else f" in {os.path.join(log_dir, f'worker-{index}.log')}"


def _status(code: int) -> str:
    return f"{code} (killed by signal {-code})" if code < 0 else str(code)
