"""End-to-end training throughput: sparseflow vs plain TF on a Criteo-shaped DLRM.

Workload: generated Criteo-shaped batches of 4096 rows: 26 single-hot categorical features
(Zipf keys over Kaggle Criteo's cardinalities, ``sparseflow.synthetic``), 13 dense features;
tables of min(cardinality, 10^6) rows, dim 16; ``sparseflow.models.DLRM`` (bottom MLP 64-16,
top MLP 256-128-1, dot interaction); Adam everywhere. Variants, all measured in this run:

  a      the dense part alone, every embedding a constant (the ceiling); graph + Session
  a_tf2  the same in TF2: eager iterator, ``tf.function`` step (jit off)
  b      plain TF: tf.Variable tables (key mod vocabulary), one Keras Adam
         (``tf_keras.optimizers.legacy.Adam``: Keras 3's Adam cannot run in a Session)
  b_tf2  the same in TF2 with Keras 3's ``keras.optimizers.Adam`` (= ``tf.keras`` in TF 2.21)
  c      plain TF, same tables, hand-written lazy Adam (unique, segment-sum, scatter m, v, w)
  d      sparseflow: FeatureSpec(access_threshold=1) + create_table per feature,
         get_asc_insert_func in the dataset map, sparse_lookup, lazy_adam.create_hash_optimizer
         + tf.compat.v1.train.AdamOptimizer, start_asc_pipeline, Session
  d_tf2  (d) through the TF2 API (``sparseflow.tf2``: TableConfig / FeatureConfig / Embedding,
         preprocess in the dataset map, enqueue / dequeue / apply_gradients in a
         ``tf.function``, jit off, 10 steps per call in a ``tf.range`` loop over the iterator,
         as TPUEmbedding's training loop)
  d_tf2_1  the same, one step per call
  d_par  (d) with num_parallel_calls=tf.data.AUTOTUNE in the insert function's map: batches
         are processed concurrently, so admission order follows processing order (not
         reproducible run to run); the targets are evaluated on (d), the deterministic one

Run (``--quick``: a smoke run in well under a minute; ``--write``: record the section of
BENCHMARKS.md):

    .venv/bin/python benchmarks/e2e.py [--steps 60] [--rounds 3] [--quick] [--write]

The profile of (d) against (a) and (c) that follows the rounds (``--profile-steps 0`` skips
it) is in ``e2e_profile.py``; the variants are built in ``e2e_variants.py``.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import e2e_variants as ev
import numpy as np
import tensorflow as tf
from report import listed, machine_line, replace_section

from sparseflow.distributed.cluster import usable_cpus

SECTION = "## End-to-end throughput (Criteo-shaped DLRM)"
DEFAULT_ROUNDS = 3
VARIANTS = ("a", "a_tf2", "b", "b_tf2", "c", "d", "d_tf2", "d_tf2_1", "d_est", "d_yaml",
            "d_par")
LABELS = {
    "a": "(a) dense part alone, constant embeddings (ceiling), Session",
    "a_tf2": "(a) same, TF2 tf.function (jit off)",
    "b": "(b) plain TF, tf.Variable tables, Keras 2 Adam (tf_keras legacy), Session",
    "b_tf2": "(b) same, Keras 3 Adam, TF2 tf.function",
    "c": "(c) plain TF, same tables, hand-written lazy Adam, Session",
    "d": "(d) sparseflow, Session",
    "d_tf2": "(d) sparseflow, TF2 API (sparseflow.tf2), tf.function, 10 steps per call",
    "d_tf2_1": "(d) sparseflow, TF2 API, tf.function, 1 step per call",
    "d_est": "(d) sparseflow, Estimator (model_fn, RunConfig defaults)",
    "d_yaml": "(d) sparseflow, YAML job's graph (Parquet source, its map)",
    "d_par": "(d) sparseflow, parallel map (admission order follows processing order)",
}
TARGETS = (("d/a", 0.8), ("d/c", 1.5), ("d/b", 10.0), ("d_tf2/d", 0.95), ("d_yaml/d", 0.95),
           ("d_est/d", 0.95))
# Reported without a target: the targets are evaluated on (d), the deterministic configuration.
REPORTED = ("d_par/a", "d_tf2_1/d", "a_tf2/a")
WAIT_TARGET = 0.05


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60,
                    help="timed (untraced) steps per variant and round (b, b_tf2: --steps-b)")
    ap.add_argument("--steps-b", type=int, default=20,
                    help="timed steps of the dense-Adam variants b and b_tf2 (~0.25 s per step)")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    ap.add_argument("--warmup-b", type=int, default=3, help="untimed steps of b and b_tf2")
    ap.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS,
                    help="interleaved rounds (median)")
    ap.add_argument("--trace-every", type=int, default=10,
                    help="trace every N-th step for the input wait (not timed)")
    ap.add_argument("--cap", type=int, default=10**6, help="table rows: min(cardinality, cap)")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="comma-separated subset of " + ",".join(VARIANTS))
    ap.add_argument("--profile-steps", type=int, default=20,
                    help="traced steps of the (d)-vs-(a) profile; 0 skips the profile")
    ap.add_argument("--profile-rounds", type=int, default=3, help="interleaved profile rounds")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: few steps, 10^5-row tables, one round, short profile")
    ap.add_argument("--write", action="store_true", help="write the section of BENCHMARKS.md")
    ap.add_argument("--md", default=None,
                    help="with --write: the markdown file to write (default BENCHMARKS.md)")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.steps_b, args.warmup, args.warmup_b = 6, 2, 2, 1
        args.rounds, args.trace_every, args.cap = 1, 3, 10**5
        args.profile_steps, args.profile_rounds = min(args.profile_steps, 4), 1
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = set(args.variants) - set(VARIANTS)
    if unknown:
        ap.error(f"unknown variants {sorted(unknown)}")
    if args.trace_every < 2:
        ap.error("--trace-every must be >= 2")
    return args


def n_batches_needed(args) -> int:
    """Distinct batches: enough that no variant sees a batch twice in one run (warm-up,
    timed and traced steps, what the prefetch buffer reads ahead), so the stream keeps
    bringing new keys to sparseflow's tables (each run starts with empty tables)."""
    every = args.trace_every   # the profile's untraced runs trace at the same rate
    per_run = max(args.warmup + args.steps + math.ceil(args.steps / (every - 1)),
                  args.warmup + args.profile_steps)
    # The parallel map (d_par) keeps up to one batch per core in flight besides the prefetch.
    return per_run + ev.PREFETCH + 2 + (os.cpu_count() or 1)


def run_variant(v, data, args):
    if v == "d_tf2":
        return ev.run_sparseflow_tf2(data, args.cap, args.warmup, args.steps,
                                     ev.TF2_STEPS_PER_CALL)
    if v == "d_tf2_1":
        return ev.run_sparseflow_tf2(data, args.cap, args.warmup, args.steps, 1)
    if v == "d_est":
        return ev.run_sparseflow_estimator(data, args.cap, args.warmup, args.steps)
    if v == "d_yaml":
        return ev.run_graph(ev.build_yaml_job, data, args.cap, args.warmup, args.steps,
                            args.trace_every, parquet=_parquet(data))
    if v in ("a_tf2", "b_tf2"):
        steps, warm = (args.steps_b, args.warmup_b) if v == "b_tf2" else (args.steps, args.warmup)
        return ev.run_tf2(v, data, args.cap, warm, steps)
    steps, warm = (args.steps_b, args.warmup_b) if v == "b" else (args.steps, args.warmup)
    return ev.run_graph(ev.GRAPH_BUILDERS[v], data, args.cap, warm, steps, args.trace_every)


_PARQUET = {}


def _parquet(data) -> str:
    """The Parquet file of ``data``'s batches for the YAML job, written once per run."""
    if id(data) not in _PARQUET:
        import atexit
        import shutil
        import tempfile

        directory = tempfile.mkdtemp(prefix="e2e-yaml-")
        atexit.register(shutil.rmtree, directory, True)
        path = os.path.join(directory, "batches.parquet")
        ev.write_parquet(data, path)
        _PARQUET[id(data)] = path
    return _PARQUET[id(data)]


def ratios_of_round(r: dict) -> dict:
    """d/a, d/c, d/b of one round (b: the faster of b and b_tf2, the stricter ratio),
    d_tf2/d (the TF2 API against the Session path: the issue asks for within 10%), and
    d_par/a."""
    out = {}
    if "d_par" in r and "a" in r:
        out["d_par/a"] = r["d_par"].samples_per_s / r["a"].samples_per_s
    if "a_tf2" in r and "a" in r:   # what tf.function itself costs the dense model
        out["a_tf2/a"] = r["a_tf2"].samples_per_s / r["a"].samples_per_s
    if "d" not in r:
        return out
    d = r["d"].samples_per_s
    for v in ("d_tf2", "d_tf2_1", "d_est", "d_yaml"):
        if v in r:
            out[f"{v}/d"] = r[v].samples_per_s / d
    if "a" in r:
        out["d/a"] = d / r["a"].samples_per_s
    if "c" in r:
        out["d/c"] = d / r["c"].samples_per_s
    bs = [r[b].samples_per_s for b in ("b", "b_tf2") if b in r]
    if bs:
        out["d/b"] = d / max(bs)
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    load_start = os.getloadavg()[0]
    n = n_batches_needed(args)
    caps = ev.capacities(args.cap)
    if max(ev.CRITEO_CARDINALITIES) > args.cap and n * ev.BATCH > args.cap:
        print(f"warning: {n * ev.BATCH} rows may bring more keys than a {args.cap}-row table "
              "holds", file=sys.stderr)
    data = ev.make_data(n)
    print(f"machine: {machine_line(TF=tf.__version__, numpy=np.__version__)}; load {load_start:.2f}")
    print(f"data: {n} distinct batches of {ev.BATCH} ({n * ev.BATCH:,} rows, "
          f"{sum(a.nbytes for a in data.arrays().values()) / 2**20:.0f} MiB), generated "
          f"before timing; tables {sum(caps):,} rows in all")
    rounds = []
    for rnd in range(args.rounds):
        res = {}
        # The first variant rotates: none always runs at one place in the round (after the
        # dense-Adam variants, which fill the most memory), whose effect varied with it.
        shift = rnd % len(args.variants)
        for v in args.variants[shift:] + args.variants[:shift]:
            t0 = time.perf_counter()
            res[v] = run_variant(v, data, args)
            r = res[v]
            extra = (f", {r.new_keys_per_step:,.0f} new keys/step"
                     if r.new_keys_per_step is not None else "")
            print(f"round {rnd + 1} {v:6s} {r.samples_per_s:10,.0f} samples/s  "
                  f"{r.step_ms:7.1f} ms/step  input wait {_pct(r.wait_share):>6s}  "
                  f"loss {r.loss:.4f}{extra}  ({time.perf_counter() - t0:.1f} s)", flush=True)
        rounds.append(res)
        rat = ratios_of_round(res)
        if rat:
            print(f"round {rnd + 1} ratios: "
                  + ", ".join(f"{k} {x:.2f}" for k, x in rat.items()))

    summary = summarize(rounds, args)
    print_summary(summary)
    prof = None
    if args.profile_steps > 0 and {"a", "d"} <= set(args.variants):
        from e2e_profile import run_profile

        prof = run_profile(data, args.cap, args.warmup, args.profile_steps, args.steps,
                           rounds=args.profile_rounds, trace_every=args.trace_every)
        print(render_profile(prof))
        print()
        print(render_findings(prof, summary, args.cap))
    elapsed = time.perf_counter() - t_start
    print(f"total {elapsed:.0f} s, load average at the end {os.getloadavg()[0]:.2f}")
    if args.write:
        section = render(summary, prof, args, n, load_start, os.getloadavg()[0], elapsed)
        if args.md:
            replace_section(section, args.md)
        else:
            replace_section(section)
        print(f"updated {args.md or 'BENCHMARKS.md'}")
    return 0


def cpu_of_round(r: dict) -> dict:
    """Process CPU per step and busy cores of one round's Session variants, and what their CPU
    allows d/c and d/b.

    At equal busy cores, two steps' times stand as their CPU per step, so a wall-time ratio
    of (d) against a baseline can pass the baseline's CPU over (d)'s only by (d) keeping more
    cores busy than the baseline does. The CPU ratios are taken with (d) as it is and with
    tables that cost nothing, (d) = (a): any table implementation runs every op of the
    ceiling's model besides its own. CPU is steadier than wall time when other jobs load the
    machine: they lengthen a step, not the process's CPU in it.

    Returns ``{"<v> cpu": core-ms, "<v> busy": cores}`` for (a), (b), (c), (d) where
    measured (b: the Session variant, Keras 2; b_tf2's CPU is not measured), and
    ``"d/c as is"``, ``"d/c any"``, ``"d/b as is"``, ``"d/b any"``: the baseline's CPU over
    (d)'s, and over (a)'s. Empty without (a)'s and (d)'s CPU.
    """
    if any(v not in r or r[v].cpu_ms is None for v in ("a", "d")):
        return {}
    out = {}
    for v in ("a", "b", "c", "d"):
        if v in r and r[v].cpu_ms is not None:
            out[f"{v} cpu"] = r[v].cpu_ms
            out[f"{v} busy"] = r[v].cpu_ms / r[v].step_ms
    for base in ("c", "b"):
        if f"{base} cpu" in out:
            out[f"d/{base} as is"] = out[f"{base} cpu"] / out["d cpu"]
            out[f"d/{base} any"] = out[f"{base} cpu"] / out["a cpu"]
    return out


def summarize(rounds, args) -> dict:
    variants = [v for v in args.variants if all(v in r for r in rounds)]
    per = {}
    for v in variants:
        rs = [r[v] for r in rounds]
        per[v] = {
            "samples": statistics.median(x.samples_per_s for x in rs),
            "rounds": [x.samples_per_s for x in rs],
            "step_ms": statistics.median(x.step_ms for x in rs),
            "wait": statistics.median(x.wait_share for x in rs),
            "cpu_ms": (statistics.median(x.cpu_ms for x in rs)
                       if all(x.cpu_ms is not None for x in rs) else None),
            "new_keys": (statistics.median(x.new_keys_per_step for x in rs)
                         if rs[0].new_keys_per_step is not None else None),
            "steps": len(rs[0].step_s)}
    ratio_rounds = [ratios_of_round(r) for r in rounds]
    keys = [k for k, _ in TARGETS] + list(REPORTED)
    cpu_rounds = [cpu_of_round(r) for r in rounds]
    return {"per": per, "ratios": _medians(ratio_rounds, keys),
            "cpu": _medians(cpu_rounds, cpu_rounds[0] if cpu_rounds else ()),
            "cores": len(usable_cpus())}


def _medians(per_round: list, keys) -> dict:
    """``{key: {"median", "rounds"}}`` over rounds' dicts, for the keys every round has."""
    return {k: {"median": statistics.median(r[k] for r in per_round),
                "rounds": [r[k] for r in per_round]}
            for k in keys if per_round and all(k in r for r in per_round)}


def print_summary(s):
    print("\nmedian over rounds:")
    for v, p in s["per"].items():
        cpu = f"  CPU {p['cpu_ms']:6.1f} core-ms" if p["cpu_ms"] is not None else ""
        print(f"  {LABELS[v]:78s} {p['samples']:10,.0f} samples/s  {p['step_ms']:7.1f} ms  "
              f"input wait {_pct(p['wait']):>6s}{cpu}")
    for k, x in s["cpu"].items():
        print(f"  {k}: {x['median']:.2f} "
              f"(rounds: {listed(x['rounds'])})")
    for (k, target) in TARGETS:
        if k in s["ratios"]:
            x = s["ratios"][k]
            print(f"  {k}: {x['median']:.2f} (rounds: {listed(x['rounds'])}) "
                  f"target >= {target:g}: {'PASS' if x['median'] >= target else 'MISS'}")
    for k in REPORTED:
        if k in s["ratios"]:
            x = s["ratios"][k]
            print(f"  {k}: {x['median']:.2f} (rounds: {listed(x['rounds'])}) "
                  "no target (targets are evaluated on (d) and d_tf2)")


def _pct(x):
    return "n/a" if x is None or math.isnan(x) else f"{100 * x:.2f}%"


def _fmt(v):
    return f"{v:.2f}" if abs(v) >= 0.005 else "0"


def _signed(v):
    return f"{v:+.2f}" if abs(v) >= 0.005 else "0"


TRIVIAL_MS = 0.05   # findings leave out parts below this (ms per step)

PROFILE_RUNS = (
    ("a_ms", "(a) ceiling"),
    ("c_ms", "(c) plain TF, lazy Adam"),
    ("d_ms", "(d) sparseflow"),
    ("d_prefilled_ms", "(d), input processed ahead (no key processing during the steps)"),
    ("d_parallel_ms", "(d), `num_parallel_calls=AUTOTUNE` in the map (as d_par)"),
)


def _ops_total(cats) -> float:
    from e2e_profile import OVERLAPPING

    return sum(x for k, x in cats.items() if k not in OVERLAPPING)


def _inside(prof) -> list:
    """(d)'s sparseflow nodes that ran, each kind apart, as dicts: ``cat`` (category),
    ``fn`` (node name), ``kind`` (numpy function or compiled op), ``types`` (op types),
    ``ms`` and ``nodes`` per step, ``inner``: the wrapped calls inside a numpy function
    [(label, calls per step, ms per step, items, items2)], its kernel (``KERNEL_OF``) and the
    bookkeeping that was called; none inside a compiled op (its node is its kernel)."""
    from e2e_profile import BOOKKEEPING_OF, COMPILED_OP, KERNEL_OF, NODE_CATEGORIES, NUMPY_FUNCTION

    k = prof["kernels"]
    cats, nodes, types = prof["d_cats"], prof["d_nodes"], prof.get("d_op_types", {})
    out = []
    for fn, (as_numpy, as_op) in NODE_CATEGORIES.items():
        for cat, kind in ((as_numpy, NUMPY_FUNCTION), (as_op, COMPILED_OP)):
            if not nodes.get(cat):
                continue
            inner = []
            if kind == NUMPY_FUNCTION:
                labels = [lab for lab in (KERNEL_OF[fn],) if lab is not None]
                labels += [lab for lab in BOOKKEEPING_OF[fn] if k[lab]["calls"]]
                inner = [(lab, k[lab]["calls"], k[lab]["ms"], k[lab]["items"],
                          k[lab]["items2"]) for lab in labels]
            out.append({"cat": cat, "fn": fn, "kind": kind, "types": types.get(cat, []),
                        "ms": cats.get(cat, 0.0), "nodes": nodes[cat], "inner": inner})
    return out


def _not_in_a_node(prof, inside) -> tuple[list, list]:
    """The bookkeeping calls (``BOOKKEEPING_OF``) that ran outside a numpy function of their
    node [(label, calls per step, ms per step)], and those a compiled node left uncalled
    [label]."""
    from e2e_profile import BOOKKEEPING_OF, COMPILED_OP, NUMPY_FUNCTION

    k = prof["kernels"]
    kinds = {(e["fn"], e["kind"]) for e in inside}
    stray, uncalled = [], []
    for fn, labels in BOOKKEEPING_OF.items():
        for lab in labels:
            if k[lab]["calls"] and (fn, NUMPY_FUNCTION) not in kinds:
                stray.append((lab, k[lab]["calls"], k[lab]["ms"]))
            elif not k[lab]["calls"] and (fn, COMPILED_OP) in kinds:
                uncalled.append(lab)
    return stray, uncalled


def _node_rows(fn, unique, keys) -> str:
    """What sparseflow node ``fn``'s kernel reads and writes per step."""
    from e2e_profile import GATHER_FN, GRAD_FN

    if fn == GATHER_FN:
        return f"{unique:,.0f} unique rows -> {keys:,.0f} keys"
    if fn == GRAD_FN:
        return f"{keys:,.0f} keys -> {unique:,.0f} unique rows"
    return f"{unique:,.0f} unique rows"


# Per sparseflow node, as a numpy function: its wrapped kernel as the report names it
# (``KERNEL_OF``), and the per-table Python around the kernels.
_KERNEL_NAMES = {"sparseflow_gather": "`expand_tables`", "sparseflow_update": "`_update_tables`"}
_PYTHON_AROUND = {"sparseflow_gather": "`gather_all` (`sparseflow/lookup.py`)",
                  "sparseflow_gather_grad": "the gradient's numpy function",
                  "sparseflow_update": "`apply` (`sparseflow/optimizers/base.py`)"}


def _kernel_where(inside, fn) -> str:
    """Which kernel did node ``fn``'s work: a compiled op's (its node) or the wrapped call
    inside its numpy function; both where the node ran as both."""
    from e2e_profile import COMPILED_OP, KERNEL_OF

    parts = []
    for e in inside:
        if e["fn"] != fn:
            continue
        if e["kind"] == COMPILED_OP:
            types = ", ".join(f"`{t}`" for t in e["types"])
            parts.append(f"compiled op {types}: its node" if types else "compiled op: its node")
        elif KERNEL_OF[fn] is not None:
            parts.append(f"{_KERNEL_NAMES.get(fn, KERNEL_OF[fn])} in its numpy function")
        else:
            parts.append("not timed apart in its numpy function")
    return " + ".join(parts) or "did not run"


def _inside_intro(inside, n_tables) -> str:
    """The sentence before the table of what is inside (d)'s sparseflow nodes: what a node's
    time is, for the kinds that ran."""
    from e2e_profile import COMPILED_OP, NUMPY_FUNCTION

    kinds = {e["kind"] for e in inside}
    text = "Inside (d)'s sparseflow nodes, in the same traced steps (ms per step)."
    if COMPILED_OP in kinds:
        text += (" A compiled op runs no Python: its node is its kernel, over the batch's keys "
                 "and unique rows (as the tables' `KeyProcessor.process_unique` counted them, "
                 f"{n_tables} tables).")
    if NUMPY_FUNCTION in kinds:
        text += (" A numpy function's node holds the calls timed below it; the rest of the "
                 "node is its numpy_function call, argument conversion, the Python around the "
                 "calls and any wait for the GIL.")
    return text


# Why a compiled node leaves a bookkeeping call uncalled, where the report knows it.
_WHY_UNCALLED = {"KeyProcessor.release": (
    "the compiled gather queues the tables' releases; each key processor applies them the "
    "next time it takes its lock, e.g. in `process_unique` in the tf.data thread")}


def _inside_table(prof) -> list:
    """The lines of the table of what is inside (d)'s sparseflow nodes, with its intro and,
    after it, the bookkeeping calls that a compiled node left uncalled."""
    from e2e_profile import COMPILED_OP, EXPAND, GATHER_FN, HOST_GATHER, UPDATE

    inside = _inside(prof)
    lines = ["", _inside_intro(inside, prof["n_tables"]), "",
             "| node / inside it | nodes or calls per step | rows per step | ms per step |",
             "|---|---:|---|---:|"]
    kinds_of = {}
    for e in inside:
        kinds_of.setdefault(e["fn"], set()).add(e["kind"])
    for e in inside:
        types = ", ".join(f"`{t}`" for t in e["types"])
        name = f"`{e['fn']}` {e['kind']}" + (f" ({types})" if types else "")
        if e["kind"] == COMPILED_OP:
            # Its node is its kernel; the batch's rows, unless the node also ran as a numpy
            # function (some tables each way: the counts are of every table).
            nk = prof["node_kernels"][e["fn"]]
            rows = (_node_rows(e["fn"], nk["unique"], nk["keys"])
                    if kinds_of[e["fn"]] == {COMPILED_OP} else "")
            lines.append(f"| {name}, its kernel | {e['nodes']:g} | {rows} | {e['ms']:.2f} |")
            continue
        lines.append(f"| {name} | {e['nodes']:g} | | {e['ms']:.2f} |")
        for lab, calls, ms, items, items2 in e["inner"]:
            rows = ""
            if lab == EXPAND:
                rows = _node_rows(GATHER_FN, items, items2)
            elif lab == UPDATE:
                rows = f"{items:,.0f} unique rows"
            name = "lazy Adam kernel, every table (optimizer `_update_tables`)" if lab == UPDATE \
                else f"`{lab}`"
            lines.append(f"| &nbsp;&nbsp;{name} | {calls:g} | {rows} | {ms:.2f} |")
        rest = e["ms"] - sum(ms for _, _, ms, _, _ in e["inner"])
        lines.append(f"| &nbsp;&nbsp;rest of the node | | | {rest:.2f} |")
    stray, uncalled = _not_in_a_node(prof, inside)
    for lab, calls, ms in stray:
        lines.append(f"| `{lab}` (outside a numpy function) | {calls:g} | | {ms:.2f} |")
    hg = prof["kernels"][HOST_GATHER]
    if hg["calls"]:
        lines.append(f"| `HostRows.gather` (the per-table path; unexpected here) | "
                     f"{hg['calls']:g} | {hg['items']:,.0f} rows | {hg['ms']:.2f} |")
    if uncalled:
        lines += ["", "Not called in the traced steps: " + ", ".join(
            f"`{lab}`" + (f" ({_WHY_UNCALLED[lab]})" if lab in _WHY_UNCALLED else "")
            for lab in uncalled) + "."]
    return lines


def render_profile(prof) -> str:
    from e2e_profile import CATEGORIES, DEDUP, PROCESS, SPARSEFLOW_NODES

    cats = {v: prof[f"{v}_cats"] for v in ("a", "c", "d")}
    nodes = {v: prof[f"{v}_nodes"] for v in ("a", "c", "d")}
    lines = [
        (f"Op time per step by part (ms; per-step mean of {prof['traced_steps']} traced steps, "
         "median over rounds; ops run concurrently, so parts overlap):"),
        "",
        "| part | (a) ceiling | (c) TF lazy Adam | (d) sparseflow | d - a | d - c |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for c in CATEGORIES:
        a, cc, d = (cats[v].get(c, 0.0) for v in ("a", "c", "d"))
        if max(a, cc, d) < 0.005:
            continue
        label = c
        if c in SPARSEFLOW_NODES:
            label += f" ({nodes['d'].get(c, 0):g} per step in (d))"
        lines.append(f"| {label} | {_fmt(a)} | {_fmt(cc)} | {_fmt(d)} | {_signed(d - a)} | "
                     f"{_signed(d - cc)} |")
    tot = {v: _ops_total(cats[v]) for v in cats}
    lines.append(f"| sum of all ops | {tot['a']:.1f} | {tot['c']:.1f} | {tot['d']:.1f} | "
                 f"{tot['d'] - tot['a']:+.1f} | {tot['d'] - tot['c']:+.1f} |")
    lines.append(f"| traced step, wall | {prof['a_traced_ms']:.1f} | {prof['c_traced_ms']:.1f} "
                 f"| {prof['d_traced_ms']:.1f} | "
                 f"{prof['d_traced_ms'] - prof['a_traced_ms']:+.1f} | "
                 f"{prof['d_traced_ms'] - prof['c_traced_ms']:+.1f} |")
    lines += _inside_table(prof)
    kp = prof["kernels"][PROCESS]
    dd = prof["kernels"][DEDUP]
    src_w, src_c = prof["source_ms"], prof["source_cpu_ms"]
    lines += [
        "",
        ("The input pipeline alone (only `IteratorGetNext` run; ms per batch; CPU = the "
         "process's CPU time, all threads):"),
        "",
        "| what | wall | CPU | wall over the source | CPU over the source |",
        "|---|---:|---:|---:|---:|",
        f"| source alone ((a)'s graph) | {src_w:.2f} | {src_c:.2f} | | |",
    ]
    for key, label in (("pipeline", "(d)'s pipeline, sequential map"),
                       ("pipeline_parallel", "same, `num_parallel_calls=AUTOTUNE`")):
        w, c = prof[f"{key}_ms"], prof[f"{key}_cpu_ms"]
        lines.append(f"| {label} | {w:.2f} | {c:.2f} | {w - src_w:+.2f} | {c - src_c:+.2f} |")
    lines += [
        "",
        (f"During (d)'s traced steps the batch's one dedup call (`dedup_batch`) took "
         f"{dd['ms']:.2f} ms per batch and the tables' `KeyProcessor.process_unique` "
         f"{kp['ms']:.2f} ms ({kp['calls']:g} calls, {kp['items']:,.0f} keys, "
         f"{kp['items2']:,.0f} unique rows), wall time in the tf.data thread."),
        "",
        "Untraced steps, interleaved in the same rounds (ms per step, median over rounds):",
        "",
        "| run | ms/step | samples/s | vs (a) | input wait |",
        "|---|---:|---:|---:|---:|",
    ]
    a = prof["a_ms"]
    for key, label in PROFILE_RUNS:
        w = prof.get(key.replace("_ms", "_wait"))
        wait = "" if w is None or math.isnan(w) else _pct(w)
        lines.append(f"| {label} | {prof[key]:.1f} | {ev.BATCH / prof[key] * 1e3:,.0f} | "
                     f"{a / prof[key]:.2f} | {wait} |")
    return "\n".join(lines)


def _per_round(prof, key_a, key_b) -> str:
    r = prof["rounds"]
    xs = [x - y for x, y in zip(r.get(key_a, []), r.get(key_b, []))]
    if len(xs) < 2:
        return ""
    return " (per round: " + ", ".join(f"{x:+.1f}" for x in xs) + ")"


def _rounds(prof, key) -> str:
    xs = prof["rounds"].get(key, [])
    if len(xs) < 2:
        return ""
    return "; per round " + ", ".join(f"{x:+.2f}" for x in xs)


def _top(prof, *cats) -> str:
    """(d)'s 3 largest node groups of ``cats`` (last profile round)."""
    tops = sorted((t for c in cats for t in prof["d_top"].get(c, [])), key=lambda t: -t[2])
    return ", ".join(f"`{name}` {ms:.2f}" + (f" ({k:g} nodes)" if k > 1 else "")
                     for name, k, ms in tops[:3] if ms >= 0.005)


def _ns(ms, n) -> str:
    """``ms`` per step over ``n`` items per step, in ns each."""
    return f"{ms * 1e6 / n:.0f} ns" if n else "n/a"


def _numpy_overhead(inside) -> float:
    """ms per step of (d)'s numpy function nodes beyond the calls timed inside them (a
    compiled op's node is all kernel: none)."""
    from e2e_profile import NUMPY_FUNCTION

    return sum(e["ms"] - sum(ms for _, _, ms, _, _ in e["inner"])
               for e in inside if e["kind"] == NUMPY_FUNCTION)


def _nodes_finding(prof, inside) -> str:
    """The findings' line on (d)'s sparseflow nodes: their time, their kernels' (a compiled
    op's node, or the call timed inside a numpy function), the bookkeeping inside numpy
    functions and, where any ran, the numpy functions' own overhead."""
    from e2e_profile import BOOKKEEPING_OF, GATHER_FN, GRAD_FN, NUMPY_FUNCTION, UPDATE_FN

    nk, n_tables = prof["node_kernels"], prof["n_tables"]
    g, s, u = (nk[fn] for fn in (GATHER_FN, GRAD_FN, UPDATE_FN))
    numpy_fns = [e for e in inside if e["kind"] == NUMPY_FUNCTION]
    bookkeeping = {lab for labels in BOOKKEEPING_OF.values() for lab in labels}
    books = [(lab, ms) for e in numpy_fns for lab, _, ms, _, _ in e["inner"]
             if lab in bookkeeping]
    names = ", ".join(f"{e['nodes']:g} x `{e['fn']}` {e['kind']}" for e in inside)
    parts = " + ".join(f"{e['ms']:.2f}" for e in inside)
    line = (
        f"  - sparseflow's nodes ({names or 'none'}): {sum(e['ms'] for e in inside):.2f} ms "
        f"({parts or '0'}). Their kernels take {g['ms'] + s['ms'] + u['ms']:.2f} ms: the "
        f"gather {g['ms']:.2f} ({_kernel_where(inside, GATHER_FN)}; {g['unique']:,.0f} unique "
        f"rows read, {g['keys']:,.0f} keys written; {_ns(g['ms'], g['keys'])} per key), the "
        f"gradient's sum {s['ms']:.2f} ({_kernel_where(inside, GRAD_FN)}; "
        f"{_ns(s['ms'], s['keys'])} per key), the lazy Adam update {u['ms']:.2f} "
        f"({_kernel_where(inside, UPDATE_FN)}; {_ns(u['ms'], u['unique'])} per unique row)")
    if books:
        line += (f"; the tables' {' and '.join(f'`{lab}`' for lab, _ in books)} "
                 f"{sum(ms for _, ms in books):.2f} ms")
    if not numpy_fns:
        return line + ". No numpy function runs in the step: each node's time is its kernel's."
    overhead = _numpy_overhead(inside)
    return line + (
        f". The other {overhead:.2f} ms of the numpy function nodes is numpy_function call "
        "and argument conversion, the Python around the calls and any wait for the GIL (not "
        f"measured apart), {overhead * 1e3 / n_tables:.0f} us per table per step.")


def render_findings(prof, summary, cap) -> str:
    """Where (d)'s extra time over (a) goes, with this run's numbers only."""
    from e2e_profile import (
        DEDUP,
        DENSE_ADAM,
        GATHER_FN,
        GRAD_FN,
        INPUT,
        LOOKUP_BWD,
        LOOKUP_FWD,
        MODEL_BWD,
        MODEL_FWD,
        NUMPY_FUNCTION,
        PROCESS,
        SPARSE_OTHER,
        TRIANGLE,
        UPDATE_FN,
    )

    a_c, c_c, d_c = prof["a_cats"], prof["c_cats"], prof["d_cats"]
    k, nk = prof["kernels"], prof["node_kernels"]
    n_tables, cpus = prof["n_tables"], prof.get("cpus", os.cpu_count())
    a, d, pre, par = prof["a_ms"], prof["d_ms"], prof["d_prefilled_ms"], prof["d_parallel_ms"]
    gap, contention, rest = d - a, d - pre, pre - a
    key_cpu = prof["pipeline_cpu_ms"] - prof["source_cpu_ms"]
    key_cpu_par = prof["pipeline_parallel_cpu_ms"] - prof["source_cpu_ms"]
    key_wall = prof["pipeline_ms"] - prof["source_ms"]
    kp = k[PROCESS]["ms"] + k[DEDUP]["ms"]
    inside = _inside(prof)
    numpy_fns = [e for e in inside if e["kind"] == NUMPY_FUNCTION]
    n_py = sum(e["nodes"] for e in numpy_fns)
    py_names = ", ".join(f"`{e['fn']}`" for e in numpy_fns)
    plural = "" if n_py == 1 else "s"
    overhead = _numpy_overhead(inside)
    g, gs, u = (nk[fn] for fn in (GATHER_FN, GRAD_FN, UPDATE_FN))
    kern = g["ms"] + gs["ms"] + u["ms"]
    lf, lb = d_c.get(LOOKUP_FWD, 0.0), d_c.get(LOOKUP_BWD, 0.0)
    dm, cm = prof["d_model"], prof["c_model"]
    # The model's ops (a) also runs: the same work; and those only (d) runs (the part of the
    # embeddings' gradient inside the model that (a)'s constant embeddings skip).
    slower = dm["shared_ms"] - dm["shared_a_ms"]
    wait_diff = d_c.get(INPUT, 0.0) - a_c.get(INPUT, 0.0)
    ops_diff = _ops_total(d_c) - _ops_total(a_c)
    par_change = (par - d) / d
    per = summary["per"]
    main_par = ""
    if "d" in per and "d_par" in per:
        main_par = (f"; main rounds: d_par {per['d_par']['step_ms']:.1f} against (d) "
                    f"{per['d']['step_ms']:.1f} ms/step")
    if contention > 0:
        kp_head = (f"- **Key processing during the steps: {contention:+.1f} ms/step** ((d) "
                   f"minus (d) with its input processed ahead, {pre:.1f} ms/step"
                   f"{_per_round(prof, 'd_ms', 'd_prefilled_ms')}). ")
    else:
        kp_head = ("- **Key processing during the steps: no cost measured**: (d) with its "
                   f"input processed ahead ran {pre:.1f} ms/step, {-contention:.1f} ms slower "
                   f"than (d){_per_round(prof, 'd_ms', 'd_prefilled_ms')}, so this run does not "
                   "resolve it. ")
    lines = [
        (f"Where (d)'s extra {gap:.1f} ms per step over (a) goes ((d) {d:.1f} ms/step, "
         f"{a / d:.2f} of (a)'s throughput; untraced steps, profile rounds). Wall-time parts "
         "come from the runs that change one thing; op times come from the traced steps, "
         f"where ops overlap on the {cpus} cores, so they show what runs, not how much of the "
         "wall time it costs:"),
        "",
        (kp_head
         + f"The pipeline alone costs {key_cpu:.1f} ms of CPU per batch over the source "
         f"({key_wall:+.1f} ms wall) with the sequential map, {key_cpu_par:.1f} ms CPU with a "
         f"parallel map; during (d)'s traced steps the batch's dedup and its "
         f"{k[PROCESS]['calls']:g} `KeyProcessor.process_unique` calls took {kp:.1f} ms per "
         "batch in the tf.data thread, "
         f"running alongside the step. With a parallel map (d) ran {par:.1f} ms/step "
         f"({100 * par_change:+.0f}%{main_par}); input wait (d) {_pct(prof.get('d_wait'))}, "
         f"parallel map {_pct(prof.get('d_parallel_wait'))}."),
        (f"- **The rest, input processed ahead: {rest:+.1f} ms/step** over (a). In op time "
         "per traced step, (d) against (a):"),
        _nodes_finding(prof, inside),
        (f"  - other lookup ops: {lf:.2f} ms forward, {lb:.2f} ms backward; largest: "
         f"{_top(prof, LOOKUP_FWD, LOOKUP_BWD) or 'none'}."),
        (f"  - the embeddings' share of the dense backward: of the model's ops (fwd + loss, "
         f"bwd, dense Adam), (d) runs {dm['extra_n']:g} that (a) does not "
         f"({dm['extra_ms']:.2f} ms; (c): {cm['extra_n']:g}, {cm['extra_ms']:.2f} ms) and (a) "
         f"{dm['a_only_n']:g} that (d) does not ({dm['a_only_ms']:.2f} ms)"
         + (": (a)'s graph runs the same model ops, so the model does no extra work for "
            "trainable embeddings. " if dm["extra_ms"] < TRIVIAL_MS else ". ")
         + f"The {dm['shared_n']:g} model ops both run took {dm['shared_ms']:.2f} ms in (d) "
         f"against {dm['shared_a_ms']:.2f} in (a) ({slower:+.2f}"
         f"{_rounds(prof, 'd_model_slower_ms')}; (c) {cm['shared_ms']:.2f}): the same work, "
         "so the difference is those ops taking longer or shorter, not more work."),
        f"  - input wait in the traced steps: {_signed(wait_diff)} ms.",
        (f"  - all ops, (d) - (a): {ops_diff:+.1f} ms; traced step wall: "
         f"{prof['d_traced_ms'] - prof['a_traced_ms']:+.1f} ms."),
        (f"- Every variant's ceiling, not sparseflow's tables: the dot interaction's triangle "
         f"gather (`tf.gather(..., axis=1)` in `sparseflow/models/layers.py`, forward and "
         f"gradient) takes {a_c.get(TRIANGLE, 0.0):.2f} of (a)'s {_ops_total(a_c):.1f} ms of "
         "op time."),
    ]
    # What is left between (d) and (a), largest first.
    items = [
        (contention, "wall", (
         f"key processing competing with the step: {key_cpu:.1f} ms CPU per batch next to a "
         f"{pre:.1f} ms step on {cpus} cores. Less CPU per batch in `sparseflow/pipeline` "
         f"(`dedup_batch` and `KeyProcessor.process_unique`, {kp:.1f} ms per batch over "
         f"{n_tables} tables) gains up to "
         f"this much. The parallel map ran {par:.1f} against {d:.1f} ms/step here "
         f"({100 * par_change:+.0f}%{main_par}) and makes admission order follow processing "
         "order.")),
        (overhead, "op time", (
         f"numpy_function overhead: {overhead:.2f} ms beyond the timed calls inside the "
         f"sparseflow numpy function{plural} ({py_names}; {n_py:g} node{plural} per step), "
         f"{overhead * 1e3 / n_tables:.0f} us per table: the numpy_function call and "
         "argument conversion, any wait for the GIL, and the per-table Python of "
         f"{' and '.join(_PYTHON_AROUND[e['fn']] for e in numpy_fns)}, not measured apart.")),
        (kern, "op time", (
         f"the kernels: {kern:.2f} ms (the gather {g['ms']:.2f}, "
         f"{_kernel_where(inside, GATHER_FN)}; the gradient's sum {gs['ms']:.2f}, "
         f"{_kernel_where(inside, GRAD_FN)}; lazy Adam {u['ms']:.2f}, "
         f"{_kernel_where(inside, UPDATE_FN)}), the sparse work itself: "
         f"{_ns(g['ms'], g['keys'])} per key to gather and expand, "
         f"{_ns(gs['ms'], gs['keys'])} per key to sum, "
         f"{_ns(u['ms'], u['unique'])} per unique row to update.")),
        (lf + lb, "op time", (
         f"TF ops around sparseflow's nodes (splitting the gather's outputs per feature, "
         f"joining their gradients): {lf + lb:.2f} ms (largest: "
         f"{_top(prof, LOOKUP_FWD, LOOKUP_BWD) or 'none'}).")),
        (slower, "op time", (
         f"the dense model's own ops took {slower:.2f} ms more in (d) than the same ops in "
         "(a): not extra work but the same ops taking longer in (d)'s step (what shares "
         "the cores with them, or noise; not measured apart), so nothing to remove in the "
         "model itself.")),
        (dm["extra_ms"], "op time", (
         f"model ops only (d) runs: {dm['extra_ms']:.2f} ms ({dm['extra_n']:g} ops; those "
         "(a)'s constant embeddings skip, e.g. their gradient), needed by any embedding "
         "training.")),
    ]
    items = sorted((x for x in items if x[0] >= TRIVIAL_MS), key=lambda x: -x[0])
    lines += ["", ("What is left between (d) and (a), largest first (ms per step; wall from the "
                   "untraced runs, op time from the traced ones, not additive):"), ""]
    lines += [f"{i}. {v:.2f} ({unit}), {text}" for i, (v, unit, text) in enumerate(items, 1)]
    if "c" in per and "a" in per:
        ca = per["c"]["samples"] / per["a"]["samples"]
        c_sparse = c_c.get(SPARSE_OTHER, 0.0)
        c_model = c_c.get(MODEL_FWD, 0.0) + c_c.get(MODEL_BWD, 0.0) + c_c.get(DENSE_ADAM, 0.0)
        note = (f"On the targets: d/c >= 1.5 needs d >= {1.5 * ca:.2f} x (a) here, since (c) "
                f"runs at {ca:.2f} of the ceiling (main rounds). In (c)'s traced steps the "
                f"dense model (fwd, bwd, dense Adam) takes {c_model:.1f} of "
                f"{_ops_total(c_c):.1f} ms of op time and its lazy Adam ops {c_sparse:.1f}.")
        bs = [per[b]["samples"] for b in ("b", "b_tf2") if b in per]
        if bs:
            ba = max(bs) / per["a"]["samples"]
            note += (f" d/b >= 10 needs d >= {10 * ba:.2f} x (a): (b) runs at {ba:.2f} of the "
                     f"ceiling while updating all {sum(ev.capacities(cap)) / 1e6:.1f} M rows "
                     "of weights, m and v every step.")
        if "d_par" in per:
            note += (f" d_par ran at {per['d_par']['samples'] / per['a']['samples']:.2f} of "
                     "the ceiling in the main rounds; the targets are evaluated on (d).")
        lines += ["", note]
    return "\n".join(lines)


def render_cpu(summary) -> list:
    """The paragraph and table of what the variants' CPU per step allows d/c and d/b
    (``cpu_of_round``), or []."""
    c, cores = summary["cpu"], summary["cores"]
    if not c:
        return []
    busy = ", ".join(f"({v}) {c[f'{v} busy']['median']:.2f}" for v in "abcd"
                     if f"{v} busy" in c)
    lines = ["", (f"**What the CPU allows.** The CPU/step column is the process's CPU time "
                  "over the untraced steps: every thread, the step's ops and the key pipeline "
                  "beside them. At equal busy cores two steps' times stand as their CPU, so "
                  "(d) can pass a baseline by more than their CPU ratio only by keeping more "
                  f"of the {cores} cores busy than the baseline does. Busy cores (CPU/step "
                  f"over ms/step, median): {busy}. CPU ratios per round, median; \"tables "
                  "that cost nothing\" is (d) = (a), since any table implementation runs "
                  "every op of the ceiling's model besides its own ((b): the Session "
                  "variant's CPU; the TF2 one's is not measured):"),
              "", "| ratio | target | baseline's CPU / (d)'s | baseline's CPU / (a)'s (tables "
                  "that cost nothing) |", "|---|---:|---:|---:|"]
    for key, target in TARGETS[1:3]:
        if f"{key} as is" in c:
            as_is, any_ = c[f"{key} as is"], c[f"{key} any"]
            lines.append(f"| {key} | >= {target:g} | {as_is['median']:.2f} "
                         f"({listed(as_is['rounds'])}) | {any_['median']:.2f} "
                         f"({listed(any_['rounds'])}) |")
    return lines


def render(summary, prof, args, n, load_start, load_end, elapsed) -> str:
    per, ratios = summary["per"], summary["ratios"]
    cmd = ".venv/bin/python benchmarks/e2e.py --write"
    if args.rounds != DEFAULT_ROUNDS:   # the command that reproduces this run
        cmd = f".venv/bin/python benchmarks/e2e.py --rounds {args.rounds} --write"
    if args.quick:
        cmd = ".venv/bin/python benchmarks/e2e.py --quick --write"
    lines = [
        SECTION,
        "",
        (f"Command: `{cmd}` (about {elapsed / 60:.0f} min: {args.rounds} interleaved rounds "
         f"of every variant, the first variant rotating from round to round, then {args.profile_rounds} of the profile; without `--write` it "
         "only prints; `--quick` is a smoke run of under a minute)."),
        "",
        (f"Machine: {machine_line(TF=tf.__version__, numpy=np.__version__)}. Load average "
         f"{load_start:.2f} at the start, {load_end:.2f} at the end (other jobs share the "
         "machine; single runs move by 30% or more with it, hence rounds and medians)."),
        "",
        (f"Workload: batches of {ev.BATCH} generated rows, 26 single-hot Criteo-shaped "
         "categorical features (Zipf keys over Kaggle Criteo's cardinalities, "
         "`sparseflow.synthetic.criteo_keys`) and 13 dense features; tables of "
         f"min(cardinality, {args.cap:,}) rows, dim {ev.DIM} "
         f"({sum(ev.capacities(args.cap)):,} rows in all); "
         "`sparseflow.models.DLRM(bottom_mlp=(64, 16), top_mlp=(256, 128), n_outputs=1, "
         "interaction=\"dot\")` for the dense math of every variant; Adam everywhere "
         "(lr 1e-3, betas 0.9/0.999, eps 1e-8); sparseflow with admission on "
         "(`access_threshold=1`) and timestamps on (each row carries its time; every "
         "sparseflow variant extracts the batch's timestamp and refreshes its keys' last-seen "
         f"times, as for eviction). {n} distinct batches ({n * ev.BATCH:,} rows), "
         f"{args.warmup} warm-up steps ({args.warmup_b} for (b)), then {args.steps} timed "
         f"steps ({args.steps_b} for (b), ~0.25 s each)."),
        "",
        ("| variant | samples/s (median) | per round | ms/step | CPU/step (core-ms) | "
         "input wait | timed steps |"),
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for v, p in per.items():
        rounds = ", ".join(f"{x / 1e3:.0f}k" for x in p["rounds"])
        cpu = f"{p['cpu_ms']:.1f}" if p["cpu_ms"] is not None else "n/a"
        lines.append(f"| {LABELS[v]} | {p['samples']:,.0f} | {rounds} | {p['step_ms']:.1f} | "
                     f"{cpu} | {_pct(p['wait'])} | {p['steps']} |")
    if "d" in per and per["d"]["new_keys"] is not None:
        lines += ["", (f"(d)'s tables took {per['d']['new_keys']:,.0f} new keys per timed "
                       "step (median over rounds): the stream keeps bringing new keys.")]
    lines += ["", "| ratio | median | per round | target | |", "|---|---:|---|---:|---|"]
    for k, target in TARGETS:
        if k in ratios:
            x = ratios[k]
            lines.append(f"| {k} | **{x['median']:.2f}** | "
                         f"{listed(x['rounds'])} | >= {target:g} | "
                         f"{'met' if x['median'] >= target else 'missed'} |")
    for k in REPORTED:
        if k in ratios:
            x = ratios[k]
            lines.append(f"| {k} | {x['median']:.2f} | "
                         f"{listed(x['rounds'])} | none: the targets "
                         "are evaluated on (d) and the faces' main loops | |")
    if "d" in per:
        w = per["d"]["wait"]
        lines.append(f"| (d) input wait | **{_pct(w)}** | | < {100 * WAIT_TARGET:g}% | "
                     f"{'met' if w < WAIT_TARGET else 'missed'} |")
    lines += render_cpu(summary)
    lines += ["", ("d/b uses the faster of the two (b) variants. d_par is (d) with a parallel "
                   "map: new keys are admitted, and get their rows, in the order batches "
                   "finish processing, which varies from run to run; (d)'s sequential map is "
                   "deterministic, so the targets are evaluated on (d). With access_threshold 1, "
                   "as here, the order changes only which row a key gets, never a value (a new "
                   "row's initial values depend on the key alone): d_par's losses equal (d)'s; "
                   "YAML jobs allow a parallel map in exactly this case "
                   "(`data.parallel_map: true`) but map sequentially by default. "
                   "d_tf2 runs the TF2 API as TPUEmbedding's documentation runs its loop: the "
                   "iterator goes into the `tf.function` and a `tf.range` loop runs 10 steps per "
                   "call (a step's time is its call's over 10; its input wait is inside the call, "
                   "not measured apart); d_tf2_1 calls the function once per step. Their final "
                   "losses differ from (d)'s only by the steps (d) runs in its traced steps; "
                   "the TF2 and Session paths give the same losses step for step "
                   "(tests/test_tf2.py). d_est builds (d)'s graph from a `model_fn` and runs "
                   "`sparseflow.estimator.Estimator.train` with `RunConfig`'s defaults; its "
                   "step runs from one step's `before_run` to the next's (the Estimator's hooks "
                   "and loop included). d_yaml is the YAML job of the same workload "
                   "(`e2e_variants.yaml_job_text`: the batches from a Parquet copy, read in "
                   "order, the same tables, timestamps, DLRM and optimizers): the job's own "
                   "graph (`sparseflow.jobs.graph.JobGraph`: its Parquet reader, its insert "
                   "function's map, sequential by default), timed by the "
                   "same loop as (d)."),
              "", METHOD.strip()]
    if prof is not None:
        lines += ["", "### Profile of (d) against (a) and (c)", "", PROFILE_METHOD.strip(), "",
                  render_profile(prof), "", render_findings(prof, summary, args.cap)]
    return "\n".join(lines) + "\n"


METHOD = """
Method:

- Data: the batches are generated with numpy before anything is timed, enough distinct
  batches that no run sees one twice (warm-up + timed + traced steps + what the prefetch
  reads ahead), so (d)'s tables, empty at the start of every run, keep receiving new keys
  from the Zipf tails as in training. They reach every variant through the same tf.data
  source: `Dataset.from_tensor_slices` over placeholders fed once when the iterator is
  initialised (no graph constants), one dict element per batch (26 int64 `[4096]` key
  tensors, dense `[4096, 13]`, label `[4096, 1]`, timestamp `[4096]`), `prefetch(2)`; (d)
  maps it through
  `get_asc_insert_func` (sequential map, as `examples/session_demo.py`), d_par the same with
  `num_parallel_calls=tf.data.AUTOTUNE`.
- Execution: (a), (b), (c), (d) are `tf.compat.v1` graphs run by a `Session`, each built in a
  fresh `tf.Graph` (and, for (d), a fresh `sf.init()` ... `sf.terminate_config_initializer()`).
  Keras 3's `keras.optimizers.Adam` cannot train in a Session: in a v1 graph its
  `apply_gradients` returns its iteration variable, no op to run (`Session.run` rejects it),
  and `tf_keras.optimizers.Adam` (the Keras 2 "new" optimizer) builds but its returned op
  leaves the variables unchanged. So (b) in a Session uses `tf_keras.optimizers.legacy.Adam`,
  which trains; and (b) is also run the way a TF 2.21 user writes it, Keras 3's Adam in a
  `tf.function` (jit off). Both Keras Adams update the full tables every step (Keras 2 decays
  m and v and writes w densely in its sparse path; Keras 3 densifies the IndexedSlices
  gradient), hence their speed. (a) also runs in TF2 (`tf.function`, jit off, the same
  `tf.compat.v1.train.AdamOptimizer`) to show whether Session vs tf.function matters.
- (c): per feature `tf.unique(key mod vocabulary)`, gather of the unique rows, expand by the
  restore vector; the table gradient then arrives as IndexedSlices over unique rows
  (segment-summed by the expand's gradient), and the update gathers m, v, w of those rows
  and `scatter_update`s them (the fastest non-XLA formulation in `bench_lazy_adam.py` at
  dim 16); one step counter for bias correction.
- (d): sparseflow's table memory is committed after `start_asc_pipeline()`
  (`SparseTable.reserve_memory()`), as the tf.Variable baselines commit theirs at
  initialisation, outside the timing.
- Timing: warm-up steps first (numba cache loads, first allocations, tf.function tracing);
  then every step is timed with `time.perf_counter` around `Session.run`; samples/s =
  4096 x timed steps / their total time. Variants run interleaved in the order listed,
  then again, and each variant's number is the median over rounds; each ratio is computed
  per round and the median reported.
- Input wait: every N-th step (`--trace-every`, default 10) runs with
  `RunOptions(trace_level=FULL_TRACE)` and is not timed; the wall time of its
  `IteratorGetNext` node (from `run_metadata.step_stats`) is how long that step waited for its
  batch. Reported: mean wait of the traced steps / mean untraced step time. In TF2 the wait
  is the wall time of `next(iterator)` in Python (the eager dict of 28 tensors costs ~0.1 ms
  even when the batch is ready).
"""

PROFILE_METHOD = """
Per-op times come from (a), (c) and (d) runs with every step traced (FULL_TRACE), each node's
wall time (`all_end_rel_micros`) summed per category and averaged per step; TF runs ops
concurrently on the cores, so categories overlap and sum to more than the step. sparseflow's
nodes are found by name under their name scopes (`lookup/sparseflow_gather`,
`gradients/.../sparseflow_gather_grad`, `sparse_adam/sparseflow_update`), and each is a numpy
function or a compiled op by its op type in the graph the run built (`PyFunc`,
`PyFuncStateless`, `EagerPyFunc`: a numpy function; any other: a compiled op). A compiled op
runs no Python: its node is its kernel, over the batch's keys and unique rows as the tables'
`KeyProcessor.process_unique` counted them. In a numpy function, the traced (d) run times the
calls inside with wrappers installed in this process only (nothing in sparseflow/ is
changed): `expand_tables` as `sparseflow.lookup` calls it (its `bk` module name), the
optimizer's `_update_tables` (the lazy Adam kernel over every table), the tables'
`KeyProcessor.release` and `updated`; the batch's `dedup_batch` and the tables'
`process_unique` are timed in the tf.data thread. The input pipeline alone runs (d)'s graph
fetching only `IteratorGetNext`, against (a)'s graph (the source alone), with wall and process
CPU time per batch. "Input processed ahead" runs (d) on a finite stream with a prefetch
buffer as long as the timed window and waits, after the warm-up, until the process is idle,
so no key processing runs during the timed steps. Each profile round runs every one of these
back to back; medians over rounds.
"""


if __name__ == "__main__":
    sys.exit(main())
