"""``sparseflow train CONFIG --workers N``: N local worker processes, each ``sparseflow
train`` with its own ``TF_CONFIG`` on loopback ports, watched until all end.

Worker 0 writes to this process's output; worker r > 0 to ``<output.dir>/workers/worker-r.log``.
When a worker fails, the others fail too (their collectives time out, or TensorFlow's
coordination service reports the peer lost); any still running ``grace_seconds`` after the
first failure are killed, so the launcher never hangs on a dead cluster.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from sparseflow.distributed.cluster import local_tf_config

WORKER_LOG_DIR = "workers"


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on loopback now."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("localhost", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def launch(argv: list[str], workers: int, out_dir: str, grace_seconds: float,
           stream=None) -> int:
    """Runs ``python -m sparseflow <argv>`` as ``workers`` local workers.

    Args:
      argv: the ``train`` command line without ``--workers`` (each worker's own).
      workers: N >= 1.
      out_dir: the job's output directory (worker logs go under it).
      grace_seconds: after a worker fails, how long the others may take to fail by
        themselves before they are killed.
      stream: where the launcher's own lines go (default stderr).

    Returns:
      0 when every worker succeeded, else 1.
    """
    stream = stream if stream is not None else sys.stderr
    ports = free_ports(workers)
    log_dir = os.path.join(out_dir, WORKER_LOG_DIR)
    os.makedirs(log_dir, exist_ok=True)
    procs, logs = [], []
    for index in range(workers):
        env = dict(os.environ, TF_CONFIG=local_tf_config(ports, index))
        if index == 0:
            out = None
        else:
            out = open(os.path.join(log_dir, f"worker-{index}.log"), "w")
            logs.append(out)
        procs.append(subprocess.Popen([sys.executable, "-m", "sparseflow", *argv], env=env,
                                      stdout=out, stderr=subprocess.STDOUT if out else None))
    print(f"sparseflow: started {workers} workers on localhost ports "
          f"{', '.join(map(str, ports))}; logs of workers 1.. in {log_dir}", file=stream,
          flush=True)
    first_failure, deadline = None, None
    try:
        while any(p.poll() is None for p in procs):
            for index, p in enumerate(procs):
                if p.poll() not in (None, 0) and first_failure is None:
                    first_failure = (index, p.returncode)
                    deadline = time.monotonic() + grace_seconds
                    print(f"sparseflow: worker {index} exited with status {_status(p.returncode)}"
                          f"; waiting up to {grace_seconds:.0f} s for the others to stop",
                          file=stream, flush=True)
            if deadline is not None and time.monotonic() > deadline:
                for index, p in enumerate(procs):
                    if p.poll() is None:
                        print(f"sparseflow: killing worker {index} (still running "
                              f"{grace_seconds:.0f} s after worker {first_failure[0]} failed)",
                              file=stream, flush=True)
                        p.kill()
            time.sleep(0.2)
    except KeyboardInterrupt:
        for p in procs:
            p.kill()
        raise
    finally:
        for p in procs:
            p.wait()
        for f in logs:
            f.close()
    failed = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode != 0]
    for index, code in failed:
        where = "above" if index == 0 else os.path.join(log_dir, f"worker-{index}.log")
        print(f"sparseflow: worker {index} failed with status {_status(code)} (its log: "
              f"{where})", file=stream, flush=True)
    return 1 if failed else 0


def _status(code: int) -> str:
    return f"{code} (killed by signal {-code})" if code < 0 else str(code)
