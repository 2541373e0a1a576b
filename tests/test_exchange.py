"""Two worker processes on loopback exchange keys and embeddings with TensorFlow's collectives
(sparseflow.distributed.Exchange, CollectiveAllToAllV2 under MultiWorkerMirroredStrategy)."""

import json
import os
import subprocess
import sys

import pytest

from sparseflow.distributed.exchange import Exchange
from sparseflow.distributed.launch import free_ports

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run_workers(n=2, timeout=150):
    ports = free_ports(n)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    procs = [subprocess.Popen([sys.executable, "-m", "tests.workers.key_exchange", str(i),
                               json.dumps(ports)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(n)]
    outputs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=timeout)
            outputs.append((p.returncode, out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return outputs


def test_two_workers_send_keys_to_their_owners_and_read_the_answers_back():
    outputs = _run_workers()
    if any(rc != 0 and "Address already in use" in out for rc, out in outputs):
        outputs = _run_workers()   # a port taken between picking and binding: once more
    for index, (rc, out) in enumerate(outputs):
        assert rc == 0, out[-3000:]
        assert f"worker {index}: 12 steps exchanged and checked" in out


def test_exchange_arguments_are_checked():
    with pytest.raises(ValueError, match=r"Argument `world_size`"):
        Exchange(0)
    with pytest.raises(ValueError, match=r"Argument `timeout_seconds`"):
        Exchange(2, timeout_seconds=0)
