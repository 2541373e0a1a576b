"""The launcher of ``sparseflow train --workers 2`` with a port taken between its choice and
the worker's bind, for tests/test_worker_ports.py: after the launcher reserves its ports, a
"thief" binds one of them the way a server would (``SO_REUSEADDR``, listening), which the
reservation cannot prevent.

    python -m tests.workers.stolen_port WORKER ONCE|ALWAYS ATTEMPTS OUT_DIR TRAIN_ARGV...

WORKER: whose port is taken. ONCE: only on the first attempt; ALWAYS: on every attempt.
Prints ``stolen localhost:PORT`` per theft, then exits with the launcher's status.
"""

import socket
import sys

from sparseflow.distributed import launch

thieves = []   # held open until the launcher returns


def main(worker: int, mode: str, attempts: int, out_dir: str, argv: list) -> int:
    reserve = launch.reserve_ports

    def reserve_then_steal(n):
        held = reserve(n)
        if mode == "ALWAYS" or not thieves:
            port = held[worker].getsockname()[1]
            thief = socket.socket()
            thief.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            thief.bind(("", port))
            thief.listen()
            thieves.append(thief)
            print(f"stolen localhost:{port}", flush=True)
        return held

    launch.reserve_ports = reserve_then_steal
    return launch.launch(argv, 2, out_dir, grace_seconds=600, stream=sys.stdout,
                         attempts=attempts)


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5:]))
