"""Profile of ``benchmarks/e2e.py``'s sparseflow variant (d) against the dense ceiling (a)
and plain TF's lazy Adam (c).

Measurements, all in one process, interleaved over rounds (medians over rounds):

1. Per-op times: (a), (c) and (d) with every step traced (``RunOptions.FULL_TRACE``); each
   node's wall time (``all_end_rel_micros``) summed per category (by node name, see
   ``category``) and averaged per step. TF runs ops concurrently on the machine's cores, so
   categories can add up to more than the step's wall time. sparseflow's nodes
   (``sparseflow_gather``, ``sparseflow_gather_grad``, ``sparseflow_update``) are each a
   numpy function or a compiled op: the graph the run built says which (its op type, see
   ``node_kind``), so each has a category per kind.
2. Inside (d)'s sparseflow nodes, during the same traced steps. A compiled op runs no
   Python: its node's time is its kernel's, over the batch's keys and unique rows (counted
   in ``KeyProcessor.process_unique``, every table). A numpy function's kernel is a Python
   call, timed by a wrapper: the gather's ``expand_tables`` (as ``sparseflow.lookup`` calls
   it through its ``bk`` module), the sparse optimizer's ``_update_tables`` (the lazy Adam
   kernel over every table); so are the tables' ``KeyProcessor.release`` / ``updated``, the
   batch's ``dedup_batch`` and ``KeyProcessor.process_unique``; in this process only and
   only for that run (nothing in sparseflow/ is changed). What a numpy function's node costs
   beyond the calls inside it is the numpy_function call, argument conversion, the Python
   around the calls and any wait for the GIL or a table lock. ``HostRows.gather`` (the
   per-table path) is wrapped too, to check that this path does not use it.
3. The input pipeline alone: (d)'s graph with only ``IteratorGetNext`` fetched (key
   processing, no training), sequential and with a parallel map, against the source alone
   ((a)'s graph, same fetch): wall time and process CPU time per batch.
4. Untraced steps: (a), (c), (d), (d) with its input processed ahead (a finite stream and a
   prefetch buffer as long as the timed window; after the warm-up the script waits until the
   process is idle, so no key processing runs during the timed steps) and (d) with
   ``num_parallel_calls=AUTOTUNE`` in the map. (d) minus (d) processed ahead is what the
   pipeline's concurrent work costs the step.
"""

from __future__ import annotations

import os
import re
import statistics
import threading
import time
from collections import defaultdict

import e2e_variants as ev
import tensorflow as tf

import sparseflow.lookup as sf_lookup
import sparseflow.pipeline.key_processor as sf_keys
from sparseflow.embed.host_rows import HostRows

# -- timers ---------------------------------------------------------------------------------


class Timers:
    """Thread-safe accumulated seconds, calls and items (rows or keys) per label."""

    def __init__(self):
        self.lock = threading.Lock()
        self.reset()

    def reset(self):
        with self.lock:
            self.total = defaultdict(float)
            self.calls = defaultdict(int)
            self.items = defaultdict(int)
            self.items2 = defaultdict(int)

    def add(self, label, seconds, items=0, items2=0):
        with self.lock:
            self.total[label] += seconds
            self.calls[label] += 1
            self.items[label] += items
            self.items2[label] += items2


def _timed(fn, timers, label, count=None):
    """``fn`` wrapped: its wall time (and ``count(args)`` -> (items, items2)) go to ``label``."""

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            dt = time.perf_counter() - t0
            items = count(args) if count is not None else (0, 0)
            timers.add(label, dt, *items)

    return timed


# Labels of the wrapped functions.
EXPAND = "bk.expand_tables"        # a numpy sparseflow_gather's kernel: one call per step and dim
UPDATE = "optimizer _update_tables"  # a numpy sparseflow_update's: lazy Adam, all tables
RELEASE = "KeyProcessor.release"   # in a numpy sparseflow_gather
DRAIN = "KeyProcessor.updated"     # in a numpy sparseflow_update: marks, frees evicted rows
PROCESS = "KeyProcessor.process_unique"   # in the tf.data thread (sparseflow_keys)
DEDUP = "dedup_batch"              # the batch's one dedup, before the tables' process_unique
HOST_GATHER = "HostRows.gather"    # the per-table path; expected unused here
WRAPPED = (EXPAND, UPDATE, RELEASE, DRAIN, PROCESS, DEDUP, HOST_GATHER)


def _expand_items(a):
    """(unique rows read, keys written) of an ``expand_tables`` call."""
    starts, ends, member_rows = a[2], a[3], a[5]
    parts = sorted(set(member_rows.tolist()))
    return int(sum(ends[w] - starts[w] for w in parts)), int(a[8].shape[0])


class _KernelProxy:
    """Stands in for ``sparseflow.lookup.bk`` (the ``batch_kernels`` module): times
    ``expand_tables``, passes everything else through. Only
    ``sparseflow.lookup``'s name is rebound: other users of the module are untouched."""

    def __init__(self, module, timers):
        self._module = module
        self.expand_tables = _timed(module.expand_tables, timers, EXPAND, _expand_items)

    def __getattr__(self, name):
        return getattr(self._module, name)


def graph_op_types(graph=None) -> dict:
    """{node name: op type} of ``graph`` (default: the default graph)."""
    graph = graph or tf.compat.v1.get_default_graph()
    return {op.name: op.type for op in graph.get_operations()}


def recording_op_types(builder):
    """``builder`` that records the op types of the graph it builds in, as ``.op_types``
    (``graph_op_types``): a traced step names its nodes, the graph says what they are."""

    def build(data, cap, **kw):
        built = builder(data, cap, **kw)
        build.op_types = graph_op_types()
        return built

    build.op_types = {}
    return build


def instrumented_sparseflow(timers):
    """A (d) builder whose kernels report to ``timers``; ``restore()`` undoes the patches.
    Like ``recording_op_types``'s, it records its graph's op types as ``.op_types``."""
    patched = []

    def build(data, cap, **kw):
        built = ev.build_sparseflow(data, cap, **kw)
        build.op_types = graph_op_types()
        # The batch's one dedup, as process_tables (the insert function's) calls it.
        if not getattr(sf_keys.dedup_batch, "timed", False):
            patched.append((sf_keys, "dedup_batch", sf_keys.dedup_batch))
            sf_keys.dedup_batch = _timed(sf_keys.dedup_batch, timers, DEDUP,
                                         lambda a: (len(a[0]), 0))
            sf_keys.dedup_batch.timed = True
        # Only a lookup with a numpy gather has the module (the compiled gather runs no
        # Python to time).
        if hasattr(sf_lookup, "bk") and not isinstance(sf_lookup.bk, _KernelProxy):
            patched.append((sf_lookup, "bk", sf_lookup.bk))
            sf_lookup.bk = _KernelProxy(sf_lookup.bk, timers)
        for table in built.tables:
            p = table.processor
            # (keys, unique rows): the rows a compiled op's kernel works on.
            p.process_unique = _timed(p.process_unique, timers, PROCESS,
                                      lambda a: (len(a[1]), int(a[3])))
            p.release = _timed(p.release, timers, RELEASE)
            p.updated = _timed(p.updated, timers, DRAIN)
        opt = built.sparse_opt
        opt._update_tables = _timed(opt._update_tables, timers, UPDATE,
                                    lambda a: (sum(len(r) for r in a[1]), 0))
        original = HostRows.gather
        patched.append((HostRows, "gather", original))
        HostRows.gather = _timed(original, timers, HOST_GATHER, lambda a: (len(a[1]), 0))
        return built

    def restore():
        while patched:
            obj, attr, value = patched.pop()
            setattr(obj, attr, value)

    build.restore = restore
    build.op_types = {}
    return build


# -- op categories --------------------------------------------------------------------------

# sparseflow's nodes, by name: the batch's gather, its gradient, the sparse update. Each is
# a numpy function or a compiled op (a TensorFlow op whose kernel runs no Python), by its
# op type.
GATHER_FN, GRAD_FN, UPDATE_FN = "sparseflow_gather", "sparseflow_gather_grad", "sparseflow_update"
FUNCTIONS = (GATHER_FN, GRAD_FN, UPDATE_FN)
NUMPY_FUNCTION, COMPILED_OP = "numpy function", "compiled op"
# The op types of tf.numpy_function / tf.py_function nodes; any other type is compiled.
NUMPY_FUNCTION_TYPES = ("PyFunc", "PyFuncStateless", "EagerPyFunc")

INPUT = "input: IteratorGetNext (wait)"
GATHER_PY = f"`{GATHER_FN}` {NUMPY_FUNCTION}"
GATHER_OP = f"`{GATHER_FN}` {COMPILED_OP}"
LOOKUP_FWD = "lookup fwd: other ops"
GRAD_PY = f"`{GRAD_FN}` {NUMPY_FUNCTION}"
GRAD_OP = f"`{GRAD_FN}` {COMPILED_OP}"
LOOKUP_BWD = "lookup bwd: other ops"
MODEL_FWD = "model fwd + loss"
MODEL_BWD = "model bwd"
TRIANGLE = "model: dot interaction's triangle gather, fwd + bwd (in the two above)"
DENSE_ADAM = "dense Adam"
UPDATE_PY = f"`{UPDATE_FN}` {NUMPY_FUNCTION}"
UPDATE_OP = f"`{UPDATE_FN}` {COMPILED_OP}"
SPARSE_OTHER = "sparse Adam: other ops"
OTHER = "other"
CATEGORIES = (INPUT, GATHER_PY, GATHER_OP, LOOKUP_FWD, GRAD_PY, GRAD_OP, LOOKUP_BWD, MODEL_FWD,
              MODEL_BWD, TRIANGLE, DENSE_ADAM, UPDATE_PY, UPDATE_OP, SPARSE_OTHER, OTHER)
# Per sparseflow node: its category as a numpy function, as a compiled op.
NODE_CATEGORIES = {GATHER_FN: (GATHER_PY, GATHER_OP), GRAD_FN: (GRAD_PY, GRAD_OP),
                   UPDATE_FN: (UPDATE_PY, UPDATE_OP)}
NUMPY_FUNCTIONS = (GATHER_PY, GRAD_PY, UPDATE_PY)
COMPILED_OPS = (GATHER_OP, GRAD_OP, UPDATE_OP)
SPARSEFLOW_NODES = NUMPY_FUNCTIONS + COMPILED_OPS
# What a numpy function of each node calls that the wrappers time: its kernel (None: none
# wrapped, so a numpy gradient's sum would count as the rest of its node) and the key
# processors' bookkeeping. A compiled op calls none of them.
KERNEL_OF = {GATHER_FN: EXPAND, GRAD_FN: None, UPDATE_FN: UPDATE}
BOOKKEEPING_OF = {GATHER_FN: (RELEASE,), GRAD_FN: (), UPDATE_FN: (DRAIN,)}
MODEL = (MODEL_FWD, MODEL_BWD, DENSE_ADAM)   # the dense model's own ops, in every variant
# Not part of any other category: the triangle is counted inside model fwd / bwd.
OVERLAPPING = (TRIANGLE,)

# sparseflow names its nodes; they sit under name scopes (the lookup's, the gradient's, the
# optimizer's): lookup/sparseflow_gather,
# gradients/lookup/IdentityN_grad/sparseflow_gather_grad, sparse_adam/sparseflow_update.
_SPARSEFLOW_NODE = re.compile(r"(?:^|/)(sparseflow_gather_grad|sparseflow_gather|"
                              r"sparseflow_update)(?:_\d+)?$")
_TRIANGLE = re.compile(r"^(gradients/)?dlrm(_\d+)?/GatherV2(_grad/|$)")


def node_kind(name: str, op_types: dict) -> str:
    """``NUMPY_FUNCTION`` or ``COMPILED_OP``: what node ``name`` is, by its op type in the
    graph the run built (``op_types``, ``graph_op_types``)."""
    if name not in op_types:
        # Not guessed: a wrong kind would put the node's time in the wrong part.
        raise ValueError(f"node {name!r} is not in the graph whose op types were given")
    return NUMPY_FUNCTION if op_types[name] in NUMPY_FUNCTION_TYPES else COMPILED_OP


def category(name: str, get_next: str, op_types: dict) -> str:
    """The part of the step a node belongs to (by its name and name scope; a sparseflow
    node's also by its kind, ``node_kind``)."""
    if name == get_next:
        return INPUT
    m = _SPARSEFLOW_NODE.search(name)
    if m:
        as_numpy, as_op = NODE_CATEGORIES[m.group(1)]
        return as_numpy if node_kind(name, op_types) == NUMPY_FUNCTION else as_op
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


def node_op_types(op_types: dict) -> dict:
    """{category: sorted op types} of the graph's sparseflow nodes (``SPARSEFLOW_NODES``)."""
    out = defaultdict(set)
    for name, op_type in op_types.items():
        if _SPARSEFLOW_NODE.search(name):
            out[category(name, "", op_types)].add(op_type)
    return {c: sorted(types) for c, types in out.items()}


_DIGITS = re.compile(r"_\d+(?=/|$)")


def breakdown(result, get_next: str, op_types: dict):
    """Per category: mean ms per step, nodes per step, and the 3 largest node groups (names
    with their ``_N`` suffixes folded: ``lookup/strided_slice_7`` -> ``lookup/strided_slice``)
    as [(name, nodes per step, ms per step)]; and the model's nodes (``MODEL``) by name, ms
    per step. ``op_types``: of the graph the run built (``graph_op_types``)."""
    sums, counts = defaultdict(float), defaultdict(int)
    groups = defaultdict(lambda: defaultdict(lambda: [0, 0.0]))
    model = defaultdict(float)
    for md in result.traces:
        for name, _, dur in ev.node_times(md):
            c = category(name, get_next, op_types)
            sums[c] += dur
            if c in MODEL:
                model[name] += dur
            counts[c] += 1
            g = groups[c][_DIGITS.sub("", name)]
            g[0] += 1
            g[1] += dur
            if _TRIANGLE.match(name):
                sums[TRIANGLE] += dur
                counts[TRIANGLE] += 1
    n = len(result.traces)
    ms = {k: v / n / 1e3 for k, v in sums.items()}
    per_step = {k: v / n for k, v in counts.items()}
    top = {c: [(name, k / n, us / n / 1e3)
               for name, (k, us) in sorted(g.items(), key=lambda x: -x[1][1])[:3]]
           for c, g in groups.items()}
    return ms, per_step, top, {k: v / n / 1e3 for k, v in model.items()}


def node_kernels(wrapped: dict, ms: dict, nodes: dict) -> dict:
    """Per sparseflow node (``FUNCTIONS``), the kernel that does its work, per step: {ms,
    calls, unique, keys}. A compiled op runs no Python: its node is its kernel (its node
    time and count). A numpy function's kernel is the wrapped call inside it
    (``KERNEL_OF``). Rows: the wrapped kernel's own count where only it ran, else the
    batch's (``process_unique``'s keys and unique rows, every table: what a compiled op
    gathers, sums or updates).

    ``wrapped``: {label: {ms, calls, items, items2}} per step (``PROCESS``: per batch, items
    = keys, items2 = unique rows); ``ms``, ``nodes``: per category, per step (``breakdown``).
    """
    batch = wrapped[PROCESS]
    none = {"ms": 0.0, "calls": 0.0, "items": 0.0, "items2": 0.0}
    out = {}
    for fn, (_, as_op) in NODE_CATEGORIES.items():
        inner = wrapped.get(KERNEL_OF[fn]) or none
        kernel = {"ms": inner["ms"] + ms.get(as_op, 0.0),
                  "calls": inner["calls"] + nodes.get(as_op, 0.0)}
        if inner["calls"] and not nodes.get(as_op):
            # expand_tables counts (unique rows, keys); _update_tables unique rows only.
            kernel["unique"] = inner["items"]
            kernel["keys"] = inner["items2"] if KERNEL_OF[fn] == EXPAND else batch["items"]
        else:
            kernel["unique"], kernel["keys"] = batch["items2"], batch["items"]
        out[fn] = kernel
    return out


def model_diff(nodes_v: dict, nodes_a: dict) -> dict:
    """The model's ops of a variant against (a)'s, by node name: those only the variant runs
    (e.g. an embedding gradient (a)'s constants would not need), those only (a) runs, and the
    ones both run (the same work), with their op time (ms per step)."""
    shared = nodes_v.keys() & nodes_a.keys()
    extra = nodes_v.keys() - nodes_a.keys()
    a_only = nodes_a.keys() - nodes_v.keys()
    return {"extra_n": len(extra), "extra_ms": sum(nodes_v[k] for k in extra),
            "a_only_n": len(a_only), "a_only_ms": sum(nodes_a[k] for k in a_only),
            "shared_n": len(shared), "shared_ms": sum(nodes_v[k] for k in shared),
            "shared_a_ms": sum(nodes_a[k] for k in shared)}


# -- pipeline alone -------------------------------------------------------------------------


def iterate_only(builder, data, cap, warmup, n, **kw) -> tuple[float, float]:
    """(wall ms, process CPU ms) per batch of the graph's input pipeline alone (only
    IteratorGetNext is run)."""
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
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(n):
                sess.run(fetch)
            return ((time.perf_counter() - t0) / n * 1e3, (time.process_time() - c0) / n * 1e3)
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


# -- the profile ----------------------------------------------------------------------------

UNTRACED = ("a_ms", "c_ms", "d_ms", "d_prefilled_ms", "d_parallel_ms")


def run_profile(data, cap, warmup, steps, untraced_steps, rounds=3, trace_every=10,
                log=print) -> dict:
    """Every measurement, interleaved over ``rounds`` rounds (the machine is shared).

    Returns medians over rounds: ``{v}_cats`` (ms per step per category), ``{v}_nodes``
    (nodes per step per category), ``{v}_traced_ms`` for v in a, c, d; ``d_top`` (largest
    node groups per category, last round); ``d_op_types`` (``node_op_types`` of (d)'s graph,
    last round); ``kernels`` {label: {ms, calls, items, items2}} per step of the wrapped
    calls (``PROCESS``, ``DEDUP``: per batch); ``node_kernels`` (``node_kernels``); the
    untraced runs' ms per step and input wait; the pipeline-alone wall and CPU ms per batch;
    ``{v}_model``: ``model_diff`` of c and d against a; ``rounds`` (every scalar per round).
    ``trace_every``: the untraced runs trace every N-th step (not timed) for the input wait.
    """
    n_tables = len(ev.FEATURES)
    acc = defaultdict(list)       # scalar -> per-round values
    cats = {v: defaultdict(list) for v in ("a", "c", "d")}
    nodes = {v: defaultdict(list) for v in ("a", "c", "d")}
    kern = {label: defaultdict(list) for label in WRAPPED}
    nkern = {fn: defaultdict(list) for fn in FUNCTIONS}
    mdiff = {v: defaultdict(list) for v in ("c", "d")}
    top, op_types = {}, {}
    for rnd in range(rounds):
        log(f"profile round {rnd + 1}/{rounds}")
        model_nodes = {}
        for v, builder in (("a", ev.build_dense_ceiling), ("c", ev.build_tf_lazy_adam)):
            builder = recording_op_types(builder)
            r = ev.run_graph(builder, data, cap, warmup, steps, trace_every=1, keep_traces=True)
            ms, cnt, _, model_nodes[v] = breakdown(r, "IteratorGetNext", builder.op_types)
            for k in ms:
                cats[v][k].append(ms[k])
                nodes[v][k].append(cnt[k])
            acc[f"{v}_traced_ms"].append(r.step_ms)
        timers = Timers()
        builder = instrumented_sparseflow(timers)
        try:
            r = ev.run_graph(builder, data, cap, warmup, steps, trace_every=1, keep_traces=True,
                             hook=lambda sess, built, timers=timers: timers.reset())
        finally:
            builder.restore()
        ms, cnt, top, model_nodes["d"] = breakdown(r, "IteratorGetNext", builder.op_types)
        op_types = node_op_types(builder.op_types)
        for k in ms:
            cats["d"][k].append(ms[k])
            nodes["d"][k].append(cnt[k])
        acc["d_traced_ms"].append(r.step_ms)
        for v in ("c", "d"):
            md = model_diff(model_nodes[v], model_nodes["a"])
            for k, x in md.items():
                mdiff[v][k].append(x)
            acc[f"{v}_model_slower_ms"].append(md["shared_ms"] - md["shared_a_ms"])
        # The traced window is exactly `steps` steps (the hook resets the timers after the
        # warm-up; with a hook, run_graph evaluates no final loss). Key processing runs ahead
        # in the tf.data thread: per batch = per n_tables calls.
        batches = timers.calls[PROCESS] / n_tables
        step = {}
        for label in WRAPPED:
            per = (batches if label in (PROCESS, DEDUP) else steps) or 1
            step[label] = {"ms": timers.total[label] / per * 1e3,
                           "calls": timers.calls[label] / per,
                           "items": timers.items[label] / per,
                           "items2": timers.items2[label] / per}
            for k, x in step[label].items():
                kern[label][k].append(x)
        for fn, kernel in node_kernels(step, ms, cnt).items():
            for k, x in kernel.items():
                nkern[fn][k].append(x)
        # Untraced runs, back to back: the ceiling, (c), (d), and (d) changed one way at a
        # time: input processed ahead, a parallel map.
        pre = {"hook": wait_idle, "take": warmup + untraced_steps,
               "prefetch": untraced_steps + 2}
        par = {"parallel_map": tf.data.AUTOTUNE}
        runs = (
            ("a_ms", ev.build_dense_ceiling, {}, trace_every),
            ("c_ms", ev.build_tf_lazy_adam, {}, trace_every),
            ("d_ms", ev.build_sparseflow, {}, trace_every),
            ("d_prefilled_ms", ev.build_sparseflow, pre, 0),
            ("d_parallel_ms", ev.build_sparseflow, par, trace_every),
        )
        for key, b, kw, every in runs:
            r = ev.run_graph(b, data, cap, warmup, untraced_steps, trace_every=every, **kw)
            acc[key].append(r.step_ms)
            if every:
                acc[key.replace("_ms", "_wait")].append(r.wait_share)
        for key, b, kw in (("source", ev.build_dense_ceiling, {}),
                           ("pipeline", ev.build_sparseflow, {}),
                           ("pipeline_parallel", ev.build_sparseflow, par)):
            wall, cpu = iterate_only(b, data, cap, 3, steps, **kw)
            acc[f"{key}_ms"].append(wall)
            acc[f"{key}_cpu_ms"].append(cpu)
        log("  " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in acc.items()))
    out = {k: statistics.median(v) for k, v in acc.items()}
    out["rounds"] = dict(acc)
    for v in ("a", "c", "d"):
        out[f"{v}_cats"] = {k: statistics.median(x) for k, x in cats[v].items()}
        out[f"{v}_nodes"] = {k: statistics.median(x) for k, x in nodes[v].items()}
    for v in ("c", "d"):
        out[f"{v}_model"] = {k: statistics.median(x) for k, x in mdiff[v].items()}
    out["d_top"] = top
    out["d_op_types"] = op_types
    out["kernels"] = {label: {k: statistics.median(x) for k, x in d.items()}
                      for label, d in kern.items()}
    out["node_kernels"] = {fn: {k: statistics.median(x) for k, x in d.items()}
                           for fn, d in nkern.items()}
    out["n_tables"] = n_tables
    out["traced_steps"] = steps
    out["cpus"] = len(os.sched_getaffinity(0))
    return out
