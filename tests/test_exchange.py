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


def test_run_keyed_collectives_keep_one_key_per_shape_and_width_rung(monkeypatch):
    """A collective whose input has one shape every run keeps one instance key (TensorFlow
    then resolves it once, not through the group's leader each run, and no Python call
    takes a key); an exchange buffer whose width varies is padded to its width's rung and
    keeps one key per rung, its output cut back to its width; only another varying shape
    counts its runs (its resolved shape is kept per key)."""
    import itertools

    import numpy as np
    import tensorflow as tf

    from sparseflow.distributed import exchange as exchange_module
    from sparseflow.distributed import width_buckets

    counters = []

    def counter(start):
        counters.append(start)
        return itertools.count(start)

    monkeypatch.setattr(exchange_module, "_run_counter", counter)
    groups = itertools.count(7101)
    with tf.Graph().as_default():
        ex = exchange_module.RunKeyedExchange(2, 0.5, lambda: next(groups))
        static = ex.reduce(tf.zeros([2], tf.int64), "Max")
        buffer = tf.compat.v1.placeholder(tf.float32, [2, None, 4])
        varying = ex.all_to_all(buffer)
        assert counters == []   # neither takes a key from a counter
        static_key = static.op.inputs[3]
        assert static_key.op.type == "Const"
        assert tf.get_static_value(static_key) == exchange_module.FIXED_INSTANCE_KEY
        collective = varying.op.inputs[0].op   # the output is cut back to the width
        assert collective.type == "CollectiveAllToAllV2"
        assert [tf.get_static_value(op.inputs[2]) for op in (static.op, collective)] == [
            7101, 7102]   # a group per op
        padded, key = collective.inputs[0], collective.inputs[3]
        other = ex.all_to_all(tf.compat.v1.placeholder(tf.float32, [None]))
        assert len(counters) == 1   # any other varying shape counts its runs
        assert other.op.inputs[3].op.type == "PyFunc"
        with tf.compat.v1.Session() as sess:
            for width in (0, 5, 16, 17, 33, 1000):
                got_padded, got_key = sess.run([padded, key], {buffer: np.ones([2, width, 4])})
                rung = width_buckets.rung_of(width)
                assert got_key == exchange_module.FIRST_RUNG_KEY + rung
                assert got_padded.shape == (2, width_buckets.RUNGS[rung], 4)
                np.testing.assert_array_equal(got_padded[:, :width], np.ones([2, width, 4]))
                assert not got_padded[:, width:].any()
    assert width_buckets.RUNGS[width_buckets.rung_of(17)] == 18


def _key_of(out):
    """The instance key of the CountedExchange collective behind ``out``: an int, or the
    type of the op that computes it."""
    op = out.op
    while op.type in ("Identity", "StridedSlice"):   # the watchdog's mark, the cut back
        op = op.inputs[0].op
    import tensorflow as tf

    value = tf.get_static_value(op.inputs[3])
    return int(value) if value is not None else op.inputs[3].op.type


def test_counted_collectives_of_a_static_shape_keep_one_key_per_signature():
    """A TF2 collective whose input has a static shape keeps one instance key per signature
    (its group, chain, op, shape, dtype and attributes), a hash above the counted keys, the
    same whatever exchanges a rank built before it."""
    import tensorflow as tf

    from sparseflow.distributed import exchange as exchange_module
    from sparseflow.distributed import width_buckets

    first = exchange_module.CountedExchange(2, 5.0, 1010)
    second = exchange_module.CountedExchange(2, 5.0, 1010)
    other_group = exchange_module.CountedExchange(2, 5.0, 1011)
    other_chain = exchange_module.CountedExchange(2, 5.0, 1010, chain="layer_2")
    keys = {}
    with tf.Graph().as_default():
        keys["reduce"] = _key_of(first.reduce(tf.zeros([2], tf.int64), "Max"))
        keys["reduce again"] = _key_of(first.reduce(tf.ones([2], tf.int64), "Max"))
        keys["min"] = _key_of(first.reduce(tf.zeros([2], tf.int64), "Min"))
        keys["other shape"] = _key_of(first.reduce(tf.zeros([3], tf.int64), "Max"))
        keys["other exchange"] = _key_of(second.reduce(tf.zeros([2], tf.int64), "Max"))
        keys["other group"] = _key_of(other_group.reduce(tf.zeros([2], tf.int64), "Max"))
        keys["other chain"] = _key_of(other_chain.reduce(tf.zeros([2], tf.int64), "Max"))
    static = [keys[k] for k in ("reduce", "min", "other shape", "other group",
                                "other chain")]
    assert all(exchange_module.STATIC_KEY_BASE <= k < 2**31 - 1 - width_buckets.N_RUNGS
               for k in static)
    # Each signature a region of its own: no two regions overlap.
    assert len({k // width_buckets.N_RUNGS for k in static}) == 5
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


def test_counted_exchange_buffers_keep_one_key_per_width_rung():
    """An exchange buffer ``[n, m, ...]`` whose width varies, in a ``tf.function`` or run
    eagerly with a new width each time, is padded to its width's rung: one key per rung in
    its signature's region, the output cut back to the width; no counter is taken."""
    import numpy as np
    import tensorflow as tf

    from sparseflow.distributed import exchange as exchange_module
    from sparseflow.distributed import width_buckets

    ex = exchange_module.CountedExchange(2, 5.0, 1010, chain="buffers")
    with tf.Graph().as_default():
        buffer = tf.compat.v1.placeholder(tf.float32, [2, None, 4])
        out = ex.all_to_all(buffer)
        assert out.op.type == "StridedSlice"
        collective = out.op.inputs[0].op
        while collective.type == "Identity":
            collective = collective.inputs[0].op
        key = collective.inputs[3]
        region = exchange_module._static_key(
            (1010, "buffers", "collective_all_to_all_v2", (2, None, 4), "float32",
             (("communication_hint", "auto"),)))
        with tf.compat.v1.Session() as sess:
            for width in (0, 3, 17, 300):
                assert sess.run(key, {buffer: np.zeros([2, width, 4])}) == (
                    region + width_buckets.rung_of(width))
    # Eagerly each width is static: a new width must not make a new signature.
    before = dict(exchange_module._STATIC_KEYS)
    with tf.Graph().as_default():
        for width in (3, 4, 5, 17):
            exchange_module._to_rung(tf.zeros([2, width, 4]))
        padded, index, width = exchange_module._to_rung(tf.zeros([2, 17, 4]))
        assert padded.shape.as_list() == [2, 18, 4] and width == 17
        assert index == width_buckets.rung_of(17)
    assert exchange_module._STATIC_KEYS == before


def test_two_signatures_hashing_to_one_region_are_told_apart(monkeypatch):
    """A signature whose hash falls on another's region is hashed again (salted): both get
    regions of their own, the same in every process that built the same signatures."""
    from sparseflow.distributed import exchange as exchange_module
    from sparseflow.distributed import width_buckets

    signature = (1010, "", "CollectiveReduceV2", (3,), "int32", ())
    key = exchange_module._static_key(signature)
    assert exchange_module._static_key(signature) == key   # the same signature again: fine
    other = (1010, "", "Other", (5,), "int32", ())
    monkeypatch.setitem(exchange_module._STATIC_KEYS, key, other)
    moved = exchange_module._static_key(signature)
    assert moved != key
    assert (moved - exchange_module.STATIC_KEY_BASE) % width_buckets.N_RUNGS == 0
    assert exchange_module._STATIC_KEYS[key] == other
    assert exchange_module._STATIC_KEYS[moved] == signature
