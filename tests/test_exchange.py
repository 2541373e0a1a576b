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


def _ids_of(out):
    """``(group key, instance key)`` of the CountedExchange collective behind ``out``: ints,
    or for a key computed at run time the type of the op that computes it."""
    import tensorflow as tf

    op = out.op
    while op.type in ("Identity", "StridedSlice"):   # the watchdog's mark, the cut back
        op = op.inputs[0].op
    ids = []
    for tensor in (op.inputs[2], op.inputs[3]):
        value = tf.get_static_value(tensor)
        ids.append(int(value) if value is not None else tensor.op.type)
    return tuple(ids)


ALL_TO_ALL_SIGNATURE = (1010, None, "collective_all_to_all_v2", (2, None, 4), "float32",
                        (("communication_hint", "auto"),))


def test_counted_collectives_keep_one_group_per_signature():
    """A TF2 collective of a static shape gets the group of its signature (its exchange's
    group, op chain, op, shape, dtype and attributes), a hash far above the other groups,
    the same whatever exchanges a rank built before it, and instance key 1."""
    import tensorflow as tf

    from sparseflow.distributed import exchange as exchange_module

    first = exchange_module.CountedExchange(2, 5.0, 1010)
    second = exchange_module.CountedExchange(2, 5.0, 1010)
    other_group = exchange_module.CountedExchange(2, 5.0, 1011)
    ids = {}
    with tf.Graph().as_default():
        ids["reduce"] = _ids_of(first.reduce(tf.zeros([2], tf.int64), "Max"))
        ids["reduce again"] = _ids_of(first.reduce(tf.ones([2], tf.int64), "Max"))
        ids["min"] = _ids_of(first.reduce(tf.zeros([2], tf.int64), "Min"))
        ids["other shape"] = _ids_of(first.reduce(tf.zeros([3], tf.int64), "Max"))
        ids["other exchange"] = _ids_of(second.reduce(tf.zeros([2], tf.int64), "Max"))
        ids["other group"] = _ids_of(other_group.reduce(tf.zeros([2], tf.int64), "Max"))
    groups = [ids[k][0] for k in ("reduce", "min", "other shape", "other group")]
    assert all(exchange_module.SIGNATURE_GROUP_BASE <= g < 2**31 - 1 for g in groups)
    assert len(set(groups)) == 4
    assert ids["reduce again"] == ids["other exchange"] == ids["reduce"]
    assert {key for _, key in ids.values()} == {exchange_module.FIXED_INSTANCE_KEY}
    # Fixed by the signature alone, not by what the process built before: another process
    # that first builds other collectives (a rank with an extra exchange) gets the same group.
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
            print("GROUP", int(tf.get_static_value(op.inputs[2])))
    """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=120)
    assert f"GROUP {ids['reduce'][0]}" in done.stdout, done.stdout + done.stderr[-2000:]


def test_counted_exchange_buffers_keep_one_key_per_width_rung():
    """An exchange buffer ``[n, m, ...]``, in a ``tf.function`` with a width known only at
    run time or run eagerly with a new width each time, is padded to its width's rung: one
    group for every width, instance key 2 + the rung's index, the output cut back to the
    width; no counter is taken."""
    import numpy as np
    import tensorflow as tf

    from sparseflow.distributed import exchange as exchange_module
    from sparseflow.distributed import width_buckets

    ex = exchange_module.CountedExchange(2, 5.0, 1010)
    group = exchange_module._signature_group(ALL_TO_ALL_SIGNATURE)
    with tf.Graph().as_default():
        buffer = tf.compat.v1.placeholder(tf.float32, [2, None, 4])
        out = ex.all_to_all(buffer)
        assert out.op.type == "StridedSlice"
        got_group, key = _ids_of(out)
        assert got_group == group and key == "AddV2"   # 2 + the rung's index, in the graph
        collective = out.op.inputs[0].op
        while collective.type == "Identity":
            collective = collective.inputs[0].op
        with tf.compat.v1.Session() as sess:
            for width in (0, 3, 17, 300):
                got_key, padded = sess.run([collective.inputs[3], collective.inputs[0]],
                                           {buffer: np.ones([2, width, 4])})
                rung = width_buckets.rung_of(width)
                assert got_key == exchange_module.FIRST_RUNG_KEY + rung
                assert padded.shape == (2, width_buckets.RUNGS[rung], 4)
                assert padded[:, :width].all() and not padded[:, width:].any()
        assert out.shape.as_list() == [2, None, 4]
    # Eagerly every width is static: each is padded to its rung, under one signature.
    calls = []

    def fake_all_to_all(**kwargs):
        calls.append((kwargs["group_key"], kwargs["instance_key"], kwargs["input"].shape))
        return kwargs["input"]

    fake_all_to_all.__name__ = "collective_all_to_all_v2"
    signatures = len(exchange_module._SIGNATURE_GROUPS)
    for width in (3, 4, 5, 17, 18):
        out = ex._run(fake_all_to_all, tf.ones([2, width, 4]), communication_hint="auto")
        assert out.shape == (2, width, 4)
    assert len(exchange_module._SIGNATURE_GROUPS) == signatures   # none new
    assert calls == [(group, exchange_module.FIRST_RUNG_KEY + width_buckets.rung_of(w),
                      (2, int(width_buckets.RUNGS[width_buckets.rung_of(w)]), 4))
                     for w in (3, 4, 5, 17, 18)]
    assert calls[-2][2][1] == calls[-1][2][1] == 18   # 17 pads to the rung 18


def test_a_buffer_already_at_its_rung_is_sent_as_it_is():
    """An all-to-all told its buffer's rung (``rung=``: the replies to what
    ``all_to_all_dynamic`` received, whose width is a rung) sends the buffer unpadded and
    uncut, under the rung's key and the signature's group; ``all_to_all_dynamic`` pads its
    buffer to the agreed rung once and returns the rung's index with ``with_rung``."""
    import itertools

    import numpy as np
    import tensorflow as tf

    from sparseflow.distributed import exchange as exchange_module
    from sparseflow.distributed import width_buckets

    def pads(graph):
        return [op for op in graph.get_operations() if op.type in ("Pad", "PadV2")]

    rung = width_buckets.rung_of(18)
    assert width_buckets.RUNGS[rung] == 18
    group = exchange_module._signature_group(ALL_TO_ALL_SIGNATURE)
    for make in (lambda: exchange_module.CountedExchange(2, 5.0, 1010),
                 lambda: exchange_module.RunKeyedExchange(2, 0.5, itertools.count(7301).__next__)):
        with tf.Graph().as_default() as graph:
            ex = make()
            buffer = tf.compat.v1.placeholder(tf.float32, [2, None, 4])
            index = tf.compat.v1.placeholder(tf.int32, [])
            out = ex.all_to_all(buffer, rung=index)
            assert pads(graph) == []
            collective = out.op
            while collective.type == "Identity":
                collective = collective.inputs[0].op
            assert collective.type == "CollectiveAllToAllV2"   # nothing cut back
            if isinstance(ex, exchange_module.CountedExchange):
                assert tf.get_static_value(collective.inputs[2]) == group
            with tf.compat.v1.Session() as sess:
                sent, key = sess.run([collective.inputs[0], collective.inputs[3]],
                                     {buffer: np.full([2, 18, 4], 3.0), index: rung})
            np.testing.assert_array_equal(sent, np.full([2, 18, 4], 3.0))
            assert key == exchange_module.FIRST_RUNG_KEY + rung

    with tf.Graph().as_default() as graph:
        ex = exchange_module.RunKeyedExchange(2, 0.5, itertools.count(7401).__next__)
        batch = tf.compat.v1.placeholder(tf.int64, [2, None, 2])
        out = ex.all_to_all_dynamic(batch, tf.constant([[3], [3]]), -1, with_rung=True)
        assert len(out) == 4 and out[3].dtype == tf.int32
        assert len(pads(graph)) == 1   # to the agreed rung, not again to its own
        assert len(ex.all_to_all_dynamic(batch, tf.constant([[3], [3]]), -1)) == 3


def test_collectives_of_other_op_chains_get_other_groups_numbered_per_graph():
    """In a ``tf.function``, the same collective built in two op chains gets two groups
    (the chains' collectives may run at once); chains are numbered in the order first
    opened in their graph, whatever their names, so every rank that traces the same
    function agrees. A counted key is refused in a chain."""
    import pytest
    import tensorflow as tf

    from sparseflow.distributed import exchange as exchange_module
    from sparseflow.distributed import op_chains

    ex = exchange_module.CountedExchange(2, 5.0, 1010)

    def groups_of(names):
        found = []

        @tf.function(input_signature=[tf.TensorSpec([2, None, 4], tf.float32)])
        def step(x):
            for name in names:
                with op_chains.chain(name):
                    found.append(_ids_of(ex.all_to_all(x))[0])
            return x

        step.get_concrete_function()
        return found

    first, second = groups_of(["layer_a", "layer_b"])
    assert first != second
    assert groups_of(["other_x", "other_y"]) == [first, second]
    assert groups_of(["layer_b", "layer_a"]) == [first, second]   # by order, not by name

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def counted(x):
        with op_chains.chain("c"):
            return ex.reduce(x, "Add")

    with pytest.raises(RuntimeError, match="in an op chain"):
        counted.get_concrete_function()


def test_two_signatures_with_one_group_are_refused(monkeypatch):
    from sparseflow.distributed import exchange as exchange_module

    signature = (1010, None, "CollectiveReduceV2", (3,), "int32", ())
    group = exchange_module._signature_group(signature)
    assert exchange_module._signature_group(signature) == group   # the same again: fine
    monkeypatch.setitem(exchange_module._SIGNATURE_GROUPS, group,
                        (1010, None, "Other", (5,), "int32", ()))
    with pytest.raises(RuntimeError, match=f"share the group key {group}"):
        exchange_module._signature_group(signature)


def _marks(graph) -> dict:
    names = [op.name for op in graph.get_operations()
             if op.type in ("PyFunc", "EagerPyFunc", "SparseflowCountProgress")]
    return {kind: sum(f"sparseflow_collective_{kind}" in n for n in names)
            for kind in ("started", "finished")}


def test_collectives_watched_as_one_report_one_start_and_one_end():
    """An exchange's chained collectives (counts, keys, rows) report to the watchdog once: a
    start before the first and an end after the last, not one of each per collective (each
    report is a numpy function on the chain's path); nested spans report once; outside a
    span every collective reports its own."""
    import tensorflow as tf

    from sparseflow.distributed import exchange as exchange_module

    exchange = exchange_module.CountedExchange(2, 5.0, 1012)

    def three(x):
        received, _, _ = exchange.all_to_all_dynamic(x, tf.fill([2], 3), 0)
        return exchange.all_to_all(received * 2)

    with tf.Graph().as_default() as alone:
        three(tf.zeros([2, 3], tf.int64))
    assert _marks(alone) == {"started": 3, "finished": 3}
    with tf.Graph().as_default() as spanned:
        with exchange.watched_as_one():
            with exchange.watched_as_one():
                out = three(tf.zeros([2, 3], tf.int64))
    assert _marks(spanned) == {"started": 1, "finished": 1}
    # The process's watchdog is told by compiled ops: nothing enters Python for it.
    assert not [op for op in spanned.get_operations() if op.type in ("PyFunc", "EagerPyFunc")]
    finished = next(op for op in spanned.get_operations()
                    if "sparseflow_collective_finished" in op.name)
    collectives = [op for op in spanned.get_operations() if op.type == "CollectiveAllToAllV2"]
    assert len(collectives) == 3
    # The end waits for every collective of the span, the last one's output included.
    waited = {op.name for op in finished.control_inputs}
    assert {op.name for op in collectives} <= waited, waited
    assert out.shape.rank == 2
    # The span is over: the next collective reports alone again.
    with tf.Graph().as_default() as after:
        exchange.all_to_all(tf.zeros([2, 4], tf.int64))
    assert _marks(after) == {"started": 1, "finished": 1}


def test_a_span_whose_end_a_numpy_function_reports_adds_no_end_of_its_own():
    """The owner's update reports the gradients' collective's end itself (take_end): the
    span then adds only its start; the callable is the watchdog's end report, and a no-op
    where nothing watches (one worker's exchange, a nested span)."""
    import tensorflow as tf

    from sparseflow.distributed import exchange as exchange_module
    from sparseflow.distributed.collective_watchdog import process_watchdog

    exchange = exchange_module.CountedExchange(2, 5.0, 1013)
    with tf.Graph().as_default() as graph:
        with exchange.watched_as_one() as span:
            exchange.all_to_all(tf.zeros([2, 3], tf.float32))
            with exchange.watched_as_one() as inner:
                assert inner.take_end() is exchange_module._no_report   # noqa: SLF001
            end = span.take_end()
    assert _marks(graph) == {"started": 1, "finished": 0}
    assert end == process_watchdog(5.0).finished
    with exchange_module.CountedExchange(1, 5.0, 1014).watched_as_one() as alone:
        assert alone.take_end() is exchange_module._no_report   # noqa: SLF001


class _CountingWatchdog:
    def __init__(self):
        self.started = self.finished = 0

    def started_call(self):
        self.started += 1

    def finished_call(self):
        self.finished += 1


def collective_all_to_all_v2(input, **attrs):   # noqa: A002 -- the op's argument name
    """A stand-in all-to-all (matched by name) that hands its buffer back."""
    import tensorflow as tf

    del attrs
    return tf.identity(input)


def test_a_span_reports_its_end_once_whether_it_completes_or_fails_eagerly():
    """Eagerly (the collectives run as they are built): a span that completes reports one
    start and one end; a span whose body raises after a collective ran, or whose numpy
    function between collectives fails (guard), still reports its end, once."""
    import tensorflow as tf

    from sparseflow.distributed import exchange as exchange_module

    exchange = exchange_module.CountedExchange(2, 5.0, 1015)
    counts = _CountingWatchdog()

    class Watchdog:
        started = staticmethod(counts.started_call)
        finished = staticmethod(counts.finished_call)

    exchange._watchdog = Watchdog()   # noqa: SLF001 -- counts the reports
    x = tf.zeros([2, 3], tf.float32)

    def run():
        return exchange._run(collective_all_to_all_v2, x,   # noqa: SLF001
                             communication_hint="auto")

    with exchange.watched_as_one():
        run()
        run()
    assert (counts.started, counts.finished) == (1, 1)
    with pytest.raises(RuntimeError, match="owner failed"):
        with exchange.watched_as_one():
            run()
            raise RuntimeError("owner failed")
    assert (counts.started, counts.finished) == (2, 2)

    def failing(token):
        raise ValueError(f"table full at {token}")

    with pytest.raises(ValueError, match="table full"):
        with exchange.watched_as_one() as span:
            run()
            span.guard(failing)(7)
    assert (counts.started, counts.finished) == (3, 3)
    with exchange.watched_as_one() as span:
        assert span.take_end() is exchange_module._no_report   # noqa: SLF001 -- none yet
        assert span.guard(failing) is failing   # nothing started: nothing to end
    assert (counts.started, counts.finished) == (3, 3)
    with exchange_module.CountedExchange(1, 5.0, 1016).watched_as_one() as alone:
        assert alone.guard(failing) is failing
