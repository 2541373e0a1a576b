"""Busy and stolen ports in multi-worker training: a worker whose address is taken stops at
once naming itself and the address; the launcher holds the ports it chose, and when a port
is taken anyway it starts the workers again on new ports, or gives up naming the worker.

The time limits are hang guards only (the launcher here waits 600 s for the other workers
after a plain failure; without the fast path the tests would hit them)."""

import errno
import json
import os
import re
import signal
import socket
import subprocess
import sys

import pytest

from sparseflow.distributed.cluster import (EXIT_ADDRESS_IN_USE, World, local_tf_config,
                                            world_from_env)
from sparseflow.distributed.launch import launch, reserve_ports
from tests.test_multiworker import ENV, ROOT, sparseflow, write_config


def _run(args, timeout):
    """Runs ``python -m ARGS`` in its own process group, killed whole past ``timeout``."""
    proc = subprocess.Popen([sys.executable, "-m", *args], cwd=ROOT, env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"no result within {timeout} s (hang guard):\n{out[-3000:]}")
    return proc.returncode, out


def test_a_reserved_port_refuses_other_binds_but_lets_a_server_like_grpcs_listen():
    held = reserve_ports(3)
    try:
        ports = [s.getsockname()[1] for s in held]
        assert len(set(ports)) == 3
        for host in ("", "localhost"):   # a plain bind: what the reservation keeps out
            plain = socket.socket()
            with pytest.raises(OSError) as err:
                plain.bind((host, ports[0]))
            plain.close()
            assert err.value.errno == errno.EADDRINUSE
        # TensorFlow's gRPC server sets SO_REUSEADDR: it binds the held port and listens.
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("", ports[1]))
        server.listen()
        client = socket.create_connection(("localhost", ports[1]), timeout=10)
        client.close()
        server.close()
    finally:
        for s in held:
            s.close()


def test_the_world_knows_its_address():
    world = world_from_env({"TF_CONFIG": local_tf_config([1234, 5678], 1)})
    assert world == World(1, 2) and world.address == "localhost:5678"


def test_a_worker_whose_address_is_busy_stops_at_once_naming_it(tmp_path):
    config = write_config(str(tmp_path), str(tmp_path / "out"))
    busy = socket.socket()          # another program's server on worker 1's port
    busy.bind(("localhost", 0))
    busy.listen()
    port = busy.getsockname()[1]
    free = reserve_ports(1)
    try:
        env = dict(ENV, TF_CONFIG=local_tf_config([free[0].getsockname()[1], port], 1))
        done = sparseflow("train", config, "--no-progress", env=env, timeout=120)
    finally:
        busy.close()
        free[0].close()
    assert done.returncode == EXIT_ADDRESS_IN_USE, done.stdout[-2000:] + done.stderr[-3000:]
    assert (f"error: rank 1 of 2 cannot listen on localhost:{port}, its address in "
            f"TF_CONFIG (cluster.worker[1]): port {port} is in use by another process."
            in done.stderr), done.stderr[-3000:]
    assert "Traceback" not in done.stderr


def test_the_launcher_starts_again_on_new_ports_when_a_port_is_taken(tmp_path):
    out = str(tmp_path / "out")
    config = write_config(str(tmp_path), out)
    code, output = _run(["tests.workers.stolen_port", "1", "ONCE", "3", out, "train", config,
                         "--no-progress", "--set", "schedule.max_steps=2"], timeout=400)
    assert code == 0, output[-4000:]
    stolen = re.findall(r"stolen (localhost:\d+)", output)
    assert len(stolen) == 1
    assert (f"sparseflow: worker 1 on {stolen[0]} could not listen (another process took "
            f"the port); starting the 2 workers again on new ports (attempt 2 of 3)"
            in output), output[-4000:]
    assert output.count("sparseflow: started 2 workers") == 2
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    assert summary["workers"] == 2 and summary["steps"] == 2


def test_the_launcher_gives_up_after_its_attempts_naming_the_worker(tmp_path):
    out = str(tmp_path / "out")
    config = write_config(str(tmp_path), out)
    code, output = _run(["tests.workers.stolen_port", "0", "ALWAYS", "2", out, "train",
                         config, "--no-progress"], timeout=200)
    assert code == 1, output[-4000:]
    stolen = re.findall(r"stolen localhost:(\d+)", output)
    assert len(stolen) == 2 and stolen[0] != stolen[1]
    assert "attempt 2 of 2" in output
    # Worker 0's own message (it writes to the launcher's output), then the launcher's.
    assert f"error: rank 0 of 2 cannot listen on localhost:{stolen[1]}" in output
    assert (f"sparseflow: error: worker 0 on localhost:{stolen[1]} could not listen (another "
            f"process took the port), on each of 2 attempts with new ports" in output)
    assert "Traceback" not in output
    assert not os.path.exists(os.path.join(out, "checkpoints"))   # nothing trained


def test_launch_checks_its_attempts(tmp_path):
    with pytest.raises(ValueError, match=r"Argument `attempts` must be an int >= 1. "
                                         r"Received: 0"):
        launch(["train"], 2, str(tmp_path), grace_seconds=1, attempts=0)
