"""Profile of ``benchmarks/e2e.py``'s sparseflow variant (d) against the dense ceiling (a).

Three measurements, all in one process:

1. Per-op times: (a) and (d) with every step traced (``RunOptions.FULL_TRACE``); each node's
   wall time (``all_end_rel_micros``) summed per category and averaged per step. TF runs up to
   two ops at once here (2 cores), so categories can add up to more than the step's wall time.
   In (d) the tables' numpy functions are wrapped (in this process only; sparseflow is not
   modified) to time the numba kernels inside them: what the node costs beyond the kernel is
   numpy_function/Python overhead and waiting for the GIL.
2. The input pipeline alone: (d)'s graph with only ``IteratorGetNext`` fetched (key
   processing, no training), against the source alone ((a)'s graph, same fetch).
3. (d) with its input processed ahead: a finite stream and a prefetch buffer as long as the
   timed window; after the warm-up the script waits until the process is idle (the pipeline
   has filled the buffer), then times the steps. The difference to the normal run is what the
   pipeline's concurrent work costs the step (competition for the two cores and the GIL).
"""

from __future__ import annotations

import re
import threading
import time
from collections import defaultdict

import e2e_variants as ev
import tensorflow as tf


class Timers:
    """Thread-safe accumulated seconds, calls and items (rows) per label."""

    def __init__(self):
        self.lock = threading.Lock()
        self.reset()

    def reset(self):
        with self.lock:
            self.total = defaultdict(float)
            self.calls = defaultdict(int)
            self.items = defaultdict(int)

    def add(self, label, seconds, items=0):
        with self.lock:
            self.total[label] += seconds
            self.calls[label] += 1
            self.items[label] += items


def _wrap(obj, attr, timers, label):
    original = getattr(obj, attr)

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            # HostRows.gather(rows) and KeyProcessor.process(keys, ...): count the first
            # argument's entries (LazyAdam._update's first argument is the storage).
            items = len(args[0]) if attr in ("gather", "process") else 0
            timers.add(label, time.perf_counter() - t0, items)

    setattr(obj, attr, timed)   # an instance attribute: only this table / optimizer


def instrumented_sparseflow(timers):
    def build(data, cap, **kw):
        built = ev.build_sparseflow(data, cap, **kw)
        for table in built.tables:
            _wrap(table.rows, "gather", timers, "gather kernel")
            _wrap(table.processor, "process", timers, "key processor")
        _wrap(built.sparse_opt, "_update", timers, "lazy adam kernel")
        return built
    return build


INPUT = "input: IteratorGetNext (wait)"
GATHER_PY = "lookup fwd: sparseflow gather numpy_function"
LOOKUP_FWD = "lookup fwd: other ops (gather/slice/reshape)"
LOOKUP_BWD = "lookup bwd: gather grads, segment sums"
MODEL_FWD = "model fwd + loss"
MODEL_BWD = "model bwd"
TRIANGLE = "model: dot interaction's triangle gather, fwd + bwd (in the two above)"
DENSE_ADAM = "dense Adam"
UPDATE_PY = "sparse Adam: sparseflow update numpy_function"
SPARSE_OTHER = "sparse Adam: other ops"
OTHER = "other"
CATEGORIES = (INPUT, GATHER_PY, LOOKUP_FWD, LOOKUP_BWD, MODEL_FWD, MODEL_BWD, TRIANGLE,
              DENSE_ADAM, UPDATE_PY, SPARSE_OTHER, OTHER)
_TRIANGLE = re.compile(r"^(gradients/)?dlrm(_\d+)?/GatherV2(_grad/|$)")


def category(name: str, get_next: str) -> str:
    """The part of the step a node belongs to (by its name scope)."""
    if name == get_next:
        return INPUT
    if "sparseflow_gather" in name and not name.startswith("gradients/"):
        return GATHER_PY
    if "sparseflow_update" in name:
        return UPDATE_PY
    if name.startswith(("lookup/", "tables/")):
        return LOOKUP_FWD
    if name.startswith("gradients/lookup/"):
        return LOOKUP_BWD
    if name.startswith("dense_adam"):
        return DENSE_ADAM
    if name.startswith(("sparse_adam", "lazy_adam")):
        return SPARSE_OTHER
    if name.startswith("gradients/"):
        return MODEL_BWD
    if name.startswith(("dlrm", "logistic_loss", "Mean", "const_embedding", "Sigmoid")):
        return MODEL_FWD
    return OTHER


def breakdown(result, get_next: str):
    """Mean ms per step per category, and the mean traced step span in ms."""
    sums = defaultdict(float)
    spans = []
    for md in result.traces:
        nodes = ev.node_times(md)
        start = min(s for _, s, _ in nodes)
        end = max(s + d for _, s, d in nodes)
        spans.append(end - start)
        for name, _, dur in nodes:
            sums[category(name, get_next)] += dur
            if _TRIANGLE.match(name):
                sums[TRIANGLE] += dur
    n = len(result.traces)
    return {k: v / n / 1e3 for k, v in sums.items()}, sum(spans) / n / 1e3


def iterate_only(builder, data, cap, warmup, n, **kw) -> float:
    """ms per batch of the graph's input pipeline alone (only IteratorGetNext is run)."""
    graph = tf.Graph()
    built = sess = None
    try:
        with graph.as_default():
            built = builder(data, cap, **kw)
            fetch = graph.get_operation_by_name(built.get_next_name)
            sess = tf.compat.v1.Session(graph=graph, config=ev.session_config())
            sess.run(built.init_ops)
            if built.after_init is not None:
                built.after_init()
            sess.run(built.iterator_init, feed_dict=built.feed)
            for _ in range(warmup):
                sess.run(fetch)
            t0 = time.perf_counter()
            for _ in range(n):
                sess.run(fetch)
            return (time.perf_counter() - t0) / n * 1e3
    finally:
        if sess is not None:
            sess.close()
        if built is not None and built.close is not None:
            built.close()


def wait_idle(sess, built, timeout=120.0, quiet_cpu_s=0.03, interval=0.3):
    """Sleeps until this process used < ``quiet_cpu_s`` CPU seconds in ``interval``."""
    deadline = time.perf_counter() + timeout
    last = time.process_time()
    while time.perf_counter() < deadline:
        time.sleep(interval)
        now = time.process_time()
        if now - last < quiet_cpu_s:
            return
        last = now


def run_profile(data, cap, warmup, steps, untraced_steps, rounds=3, log=print) -> dict:
    """Every measurement, interleaved over ``rounds`` rounds (the machine is shared);
    returns medians over rounds for the report."""
    import statistics

    from e2e_fused import build_sparseflow_fused

    n_tables = len(ev.FEATURES)
    acc = defaultdict(list)       # scalar -> per-round values
    cats = {k: defaultdict(list) for k in ("a", "c", "d")}
    for rnd in range(rounds):
        log(f"profile round {rnd + 1}/{rounds}")
        for v, builder in (("a", ev.build_dense_ceiling), ("c", ev.build_tf_lazy_adam)):
            r = ev.run_graph(builder, data, cap, warmup, steps, trace_every=1, keep_traces=True)
            c, _ = breakdown(r, "IteratorGetNext")
            for k, x in c.items():
                cats[v][k].append(x)
            acc[f"{v}_traced_ms"].append(r.step_ms)
        timers = Timers()
        r = ev.run_graph(instrumented_sparseflow(timers), data, cap, warmup, steps,
                         trace_every=1, keep_traces=True,
                         hook=lambda sess, built, timers=timers: timers.reset())
        c, _ = breakdown(r, "IteratorGetNext")
        for k, x in c.items():
            cats["d"][k].append(x)
        acc["d_traced_ms"].append(r.step_ms)
        # Kernel time inside the numpy functions per step (calls / 26 = steps or batches).
        for label in ("gather kernel", "lazy adam kernel", "key processor"):
            if timers.calls[label]:
                acc[label].append(timers.total[label] / (timers.calls[label] / n_tables) * 1e3)
        if timers.calls["gather kernel"]:
            acc["unique rows"].append(timers.items["gather kernel"]
                                      / (timers.calls["gather kernel"] / n_tables))
        # Untraced runs, back to back: the ceiling, (c), (d), and (d) changed one way at a
        # time: input processed ahead, a parallel map, the fused prototype, and combinations.
        pre = {"hook": wait_idle, "take": warmup + untraced_steps,
               "prefetch": untraced_steps + 2}
        par = {"parallel_map": tf.data.AUTOTUNE}
        runs = (
            ("a_ms", ev.build_dense_ceiling, {}, 10),
            ("c_ms", ev.build_tf_lazy_adam, {}, 10),
            ("d_ms", ev.build_sparseflow, {}, 10),
            ("d_prefilled_ms", ev.build_sparseflow, pre, 0),
            ("d_parallel_ms", ev.build_sparseflow, par, 10),
            ("d_fused_ms", build_sparseflow_fused, {}, 10),
            ("d_fused_parallel_ms", build_sparseflow_fused, par, 10),
            ("d_fused_prefilled_ms", build_sparseflow_fused, pre, 0),
        )
        for key, builder, kw, trace_every in runs:
            r = ev.run_graph(builder, data, cap, warmup, untraced_steps,
                             trace_every=trace_every, **kw)
            acc[key].append(r.step_ms)
            if key in ("d_ms", "d_fused_ms"):   # same batches, same math: same final loss
                acc[key.replace("_ms", "_loss")].append(r.loss)
            if trace_every:
                acc[key.replace("_ms", "_wait")].append(r.wait_share)
        acc["source_ms"].append(iterate_only(ev.build_dense_ceiling, data, cap, 3, steps))
        acc["pipeline_ms"].append(iterate_only(ev.build_sparseflow, data, cap, 3, steps))
        acc["pipeline_parallel_ms"].append(iterate_only(ev.build_sparseflow, data, cap, 3, steps,
                                                        parallel_map=tf.data.AUTOTUNE))
        log("  " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in acc.items()))
    out = {k: statistics.median(v) for k, v in acc.items()}
    out["rounds"] = dict(acc)
    for v in ("a", "c", "d"):
        out[f"{v}_cats"] = {k: statistics.median(x) for k, x in cats[v].items()}
    return out
