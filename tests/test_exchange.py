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


def test_a_graph_collective_takes_no_instance_key_in_a_step_whose_batch_never_comes(
        monkeypatch):
    """The end of the data (OutOfRangeError) in a step with an exchange of a statically
    shaped batch: no collective may take its run's key and launch (its counts and width are
    known without the batch), or a peer's step, aborted at the same end of data, would
    leave it half done and the ranks' key counts apart."""
    import itertools

    import numpy as np
    import tensorflow as tf

    from sparseflow.distributed import exchange as exchange_module

    taken = []

    def counter(start):
        for key in itertools.count(start):
            taken.append(key)
            yield key

    monkeypatch.setattr(exchange_module, "_run_counter", counter)
    groups = itertools.count(7001)
    with tf.Graph().as_default():
        ex = exchange_module.RunKeyedExchange(2, 0.5, lambda: next(groups))
        data = tf.data.Dataset.from_tensors(np.zeros([2, 3], np.int64)).take(0)
        batch = tf.compat.v1.data.make_one_shot_iterator(data).get_next()
        assert batch.shape.as_list() == [2, 3]          # static: its width is a constant
        received, _, _ = ex.all_to_all_dynamic(batch, tf.constant([3, 3]))
        with tf.compat.v1.Session() as sess:
            with pytest.raises(tf.errors.OutOfRangeError):
                sess.run(received)
    assert taken == []


def test_run_keyed_collectives_of_a_static_shape_share_one_instance_key(monkeypatch):
    """A collective whose input has one shape every run keeps one instance key (TensorFlow
    then resolves it once, not through the group's leader each run, and no Python call
    takes a key); a collective whose width varies counts its runs (its resolved shape is
    kept per key)."""
    import itertools

    import tensorflow as tf

    from sparseflow.distributed import exchange as exchange_module

    counters = []

    def counter(start):
        counters.append(start)
        return itertools.count(start)

    monkeypatch.setattr(exchange_module, "_run_counter", counter)
    groups = itertools.count(7101)
    with tf.Graph().as_default():
        ex = exchange_module.RunKeyedExchange(2, 0.5, lambda: next(groups))
        static = ex.reduce(tf.zeros([2], tf.int64), "Max")
        varying = ex.all_to_all(tf.compat.v1.placeholder(tf.float32, [2, None, 4]))
        assert len(counters) == 1   # the varying one's
        static_key = static.op.inputs[3]
        assert static_key.op.type == "Const"
        assert tf.get_static_value(static_key) == exchange_module.FIXED_INSTANCE_KEY
        assert varying.op.inputs[3].op.type == "PyFunc"   # taken from the counter per run
        assert [tf.get_static_value(op.inputs[2]) for op in (static.op, varying.op)] == [
            7101, 7102]   # a group per op


def test_counted_collectives_of_a_static_shape_keep_one_key_per_signature():
    """A TF2 collective whose input has a static shape keeps one instance key per signature
    (its group, op, shape, dtype and attributes), a hash above the counted keys, the same
    whatever exchanges a rank built before it; one whose width varies takes a key from the
    counter on each run."""
    import tensorflow as tf

    from sparseflow.distributed import exchange as exchange_module

    first = exchange_module.CountedExchange(2, 5.0, 1010)
    second = exchange_module.CountedExchange(2, 5.0, 1010)
    other_group = exchange_module.CountedExchange(2, 5.0, 1011)
    keys = {}
    with tf.Graph().as_default():
        def key_of(out):
            op = out.op
            while op.type == "Identity":   # the watchdog's mark after the collective
                op = op.inputs[0].op
            key = op.inputs[3]
            return int(tf.get_static_value(key)) if key.op.type == "Const" else key.op.type

        keys["reduce"] = key_of(first.reduce(tf.zeros([2], tf.int64), "Max"))
        keys["reduce again"] = key_of(first.reduce(tf.ones([2], tf.int64), "Max"))
        keys["min"] = key_of(first.reduce(tf.zeros([2], tf.int64), "Min"))
        keys["other shape"] = key_of(first.reduce(tf.zeros([3], tf.int64), "Max"))
        keys["other exchange"] = key_of(second.reduce(tf.zeros([2], tf.int64), "Max"))
        keys["other group"] = key_of(other_group.reduce(tf.zeros([2], tf.int64), "Max"))
        keys["varying"] = key_of(first.all_to_all(
            tf.compat.v1.placeholder(tf.float32, [2, None, 4])))
    static = [keys[k] for k in ("reduce", "min", "other shape", "other group")]
    assert all(exchange_module.STATIC_KEY_BASE <= k < 2**31 - 1 for k in static)
    assert len(set(static)) == 4
    assert keys["reduce again"] == keys["other exchange"] == keys["reduce"]
    # Fixed by the signature alone, not by what the process built before: another process
    # that first builds other collectives (a rank with an extra exchange) gets the same key.
    import subprocess
    import sys
    import textwrap

    program = textwrap.dedent("""
        import tensorflow as tf
        from sparseflow.distributed.exchange import CountedExchange
        with tf.Graph().as_default():
            CountedExchange(2, 5.0, 1010).reduce(tf.zeros([7], tf.int32), "Add")
            out = CountedExchange(2, 5.0, 1010).reduce(tf.zeros([2], tf.int64), "Max")
            op = out.op
            while op.type == "Identity":
                op = op.inputs[0].op
            print("KEY", int(tf.get_static_value(op.inputs[3])))
    """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=120)
    assert f"KEY {keys['reduce']}" in done.stdout, done.stdout + done.stderr[-2000:]
    assert keys["varying"] == "PyFunc"


def test_two_signatures_with_one_static_key_are_refused(monkeypatch):
    from sparseflow.distributed import exchange as exchange_module

    signature = (1010, "CollectiveReduceV2", (3,), "int32", ())
    key = exchange_module._static_key(signature)
    assert exchange_module._static_key(signature) == key   # the same signature again: fine
    monkeypatch.setitem(exchange_module._STATIC_KEYS, key, (1010, "Other", (5,), "int32", ()))
    with pytest.raises(RuntimeError, match=f"share the instance key {key}"):
        exchange_module._static_key(signature)
