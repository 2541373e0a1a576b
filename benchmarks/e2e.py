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

Run (``--quick``: a smoke run in well under a minute; ``--write``: record the section of
BENCHMARKS.md):

    .venv/bin/python benchmarks/e2e.py [--steps 60] [--rounds 3] [--quick] [--write]

The profile of (d) against (a) that follows the rounds (``--profile-steps 0`` skips it) is in
``e2e_profile.py``; the variants are built in ``e2e_variants.py``; ``e2e_fused.py`` is a
what-if prototype the profile measures.
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
from report import machine_line, replace_section

SECTION = "## End-to-end throughput (Criteo-shaped DLRM)"
VARIANTS = ("a", "a_tf2", "b", "b_tf2", "c", "d")
LABELS = {
    "a": "(a) dense part alone, constant embeddings (ceiling), Session",
    "a_tf2": "(a) same, TF2 tf.function (jit off)",
    "b": "(b) plain TF, tf.Variable tables, Keras 2 Adam (tf_keras legacy), Session",
    "b_tf2": "(b) same, Keras 3 Adam, TF2 tf.function",
    "c": "(c) plain TF, same tables, hand-written lazy Adam, Session",
    "d": "(d) sparseflow, Session",
}
TARGETS = (("d/a", 0.7), ("d/c", 1.5), ("d/b", 10.0))
WAIT_TARGET = 0.05


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60,
                    help="timed (untraced) steps per variant and round (b, b_tf2: --steps-b)")
    ap.add_argument("--steps-b", type=int, default=20,
                    help="timed steps of the dense-Adam variants b and b_tf2 (~0.25 s per step)")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    ap.add_argument("--warmup-b", type=int, default=3, help="untimed steps of b and b_tf2")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median)")
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
    every = min(args.trace_every, 10)   # the profile's untraced runs trace every 10th step
    per_run = max(args.warmup + args.steps + math.ceil(args.steps / (every - 1)),
                  args.warmup + args.profile_steps)
    return per_run + ev.PREFETCH + 2


def run_variant(v, data, args):
    if v in ("a_tf2", "b_tf2"):
        steps, warm = (args.steps_b, args.warmup_b) if v == "b_tf2" else (args.steps, args.warmup)
        return ev.run_tf2(v, data, args.cap, warm, steps)
    steps, warm = (args.steps_b, args.warmup_b) if v == "b" else (args.steps, args.warmup)
    return ev.run_graph(ev.GRAPH_BUILDERS[v], data, args.cap, warm, steps, args.trace_every)


def ratios_of_round(r: dict) -> dict:
    """d/a, d/c, d/b of one round (b: the faster of b and b_tf2, the stricter ratio)."""
    out = {}
    if "d" not in r:
        return out
    d = r["d"].samples_per_s
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
        for v in args.variants:
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
                           rounds=args.profile_rounds)
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
            "new_keys": (statistics.median(x.new_keys_per_step for x in rs)
                         if rs[0].new_keys_per_step is not None else None),
            "steps": len(rs[0].step_s)}
    ratio_rounds = [ratios_of_round(r) for r in rounds]
    ratios = {k: {"median": statistics.median(rr[k] for rr in ratio_rounds),
                  "rounds": [rr[k] for rr in ratio_rounds]}
              for k, _ in TARGETS if ratio_rounds and k in ratio_rounds[0]}
    return {"per": per, "ratios": ratios}


def print_summary(s):
    print("\nmedian over rounds:")
    for v, p in s["per"].items():
        print(f"  {LABELS[v]:78s} {p['samples']:10,.0f} samples/s  {p['step_ms']:7.1f} ms  "
              f"input wait {_pct(p['wait']):>6s}")
    for (k, target) in TARGETS:
        if k in s["ratios"]:
            x = s["ratios"][k]
            print(f"  {k}: {x['median']:.2f} (rounds: {', '.join(f'{y:.2f}' for y in x['rounds'])}) "
                  f"target >= {target:g}: {'PASS' if x['median'] >= target else 'MISS'}")


def _pct(x):
    return "n/a" if x is None or math.isnan(x) else f"{100 * x:.2f}%"


def _losses(prof, key):
    return "/".join(f"{x:.5f}" for x in prof["rounds"].get(key, []))


def _fmt(v):
    return f"{v:.2f}" if abs(v) >= 0.005 else "0"


PROFILE_RUNS = (
    ("a_ms", "(a) ceiling"),
    ("c_ms", "(c) plain TF, lazy Adam"),
    ("d_ms", "(d) sparseflow"),
    ("d_prefilled_ms", "(d), input processed ahead (no key processing during the steps)"),
    ("d_parallel_ms", "(d), `num_parallel_calls=AUTOTUNE` in the map"),
    ("d_fused_ms", "(d'), fused gather/update prototype (`benchmarks/e2e_fused.py`)"),
    ("d_fused_parallel_ms", "(d'), fused, `num_parallel_calls=AUTOTUNE`"),
    ("d_fused_prefilled_ms", "(d'), fused, input processed ahead"),
)


def render_profile(prof) -> str:
    from e2e_profile import CATEGORIES

    cats = {v: prof[f"{v}_cats"] for v in ("a", "c", "d")}
    lines = [
        ("Op time per step by part (ms; per-step mean of the traced steps, median over "
         "rounds):"),
        "",
        "| part | (a) ceiling | (c) TF lazy Adam | (d) sparseflow | d - a | d - c |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for c in CATEGORIES:
        a, cc, d = (cats[v].get(c, 0.0) for v in ("a", "c", "d"))
        if max(a, cc, d) < 0.005:
            continue
        lines.append(f"| {c} | {_fmt(a)} | {_fmt(cc)} | {_fmt(d)} | {d - a:+.2f} | "
                     f"{d - cc:+.2f} |")
    tot = {v: sum(x for k, x in cats[v].items() if not k.startswith("model: "))
           for v in cats}
    lines.append(f"| sum of all ops | {tot['a']:.1f} | {tot['c']:.1f} | {tot['d']:.1f} | "
                 f"{tot['d'] - tot['a']:+.1f} | {tot['d'] - tot['c']:+.1f} |")
    lines.append(f"| traced step, wall | {prof['a_traced_ms']:.1f} | {prof['c_traced_ms']:.1f} "
                 f"| {prof['d_traced_ms']:.1f} | "
                 f"{prof['d_traced_ms'] - prof['a_traced_ms']:+.1f} | "
                 f"{prof['d_traced_ms'] - prof['c_traced_ms']:+.1f} |")
    lines += [
        "",
        "Inside (d)'s numpy functions, and its input pipeline (ms per step or batch):",
        "",
        "| what | ms |",
        "|---|---:|",
        ("| 26 gather kernels (`HostRows.gather`), inside the 26 gather numpy functions "
         f"({prof.get('unique rows', 0):,.0f} unique rows per step in all) | "
         f"{prof.get('gather kernel', 0):.2f} |"),
        ("| 26 lazy Adam calls (`LazyAdam._update`), inside the 26 update numpy functions | "
         f"{prof.get('lazy adam kernel', 0):.2f} |"),
        ("| 26 key processors (`KeyProcessor.process`), tf.data thread, during training | "
         f"{prof.get('key processor', 0):.2f} |"),
        f"| source alone (IteratorGetNext only, (a)'s graph) | {prof['source_ms']:.2f} |",
        ("| (d)'s input pipeline alone, sequential map (IteratorGetNext only) | "
         f"{prof['pipeline_ms']:.2f} |"),
        ("| same, `num_parallel_calls=tf.data.AUTOTUNE` | "
         f"{prof['pipeline_parallel_ms']:.2f} |"),
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


def render_findings(prof, summary, cap) -> str:
    """Where (d)'s extra time goes and what to change, with this run's numbers."""
    from e2e_profile import (
        GATHER_PY,
        LOOKUP_BWD,
        LOOKUP_FWD,
        SPARSE_OTHER,
        TRIANGLE,
        UPDATE_PY,
    )

    d_c = prof["d_cats"]
    a, d = prof["a_ms"], prof["d_ms"]
    contention = d - prof["d_prefilled_ms"]
    plumbing = d - prof["d_fused_ms"]
    both = d - prof["d_fused_prefilled_ms"]
    rest = prof["d_fused_prefilled_ms"] - a
    py_node = d_c.get(GATHER_PY, 0.0) + d_c.get(UPDATE_PY, 0.0)
    py_kernel = prof.get("gather kernel", 0.0) + prof.get("lazy adam kernel", 0.0)
    tf_lookup = d_c.get(LOOKUP_FWD, 0.0) + d_c.get(LOOKUP_BWD, 0.0)
    key_cpu = prof["pipeline_ms"] - prof["source_ms"]
    tri, a_ops = prof["a_cats"].get(TRIANGLE, 0.0), sum(
        x for k, x in prof["a_cats"].items() if not k.startswith("model: "))
    per = summary["per"]
    lines = [
        (f"Where (d)'s extra {d - a:.1f} ms per step over (a) goes (untraced steps above; op "
         "times overlap on two cores, so the wall-time split comes from the what-if runs):"),
        "",
        (f"- **Per-table plumbing around the host rows: {plumbing:.1f} ms/step** (d minus the "
         f"fused prototype d'). Per step (d) runs 52 numpy functions (26 gathers, 26 updates) "
         f"whose nodes take {py_node:.1f} ms against {py_kernel:.1f} ms in the kernels inside "
         f"them ({py_node - py_kernel:.1f} ms of numpy_function calls, argument conversion, "
         "Python and waiting for the GIL, which the tf.data thread's key processing also "
         "takes), plus, per feature, small TF ops that slice its rows and restore vector out "
         "of the batch's flat array, expand the unique rows (GatherV2) and segment-sum the "
         f"gradient back (UnsortedSegmentSum): {tf_lookup:.1f} ms of op time. (c) pays for the "
         "same expansion and segment sum in TF (its lookup rows above), so this is where (d) "
         "should win over (c) and does not yet."),
        (f"- **Key processing competing for the two cores: {contention:.1f} ms/step** (d minus "
         f"d with its input processed ahead). The pipeline alone costs {key_cpu:.1f} ms of "
         f"CPU per batch over the source; during training the 26 key processors take "
         f"{prof.get('key processor', 0):.1f} ms per batch, on the cores the step needs. A "
         f"parallel map spreads that work but does not remove it: {prof['d_parallel_ms']:.1f} "
         f"ms/step against {d:.1f}. Input wait: (d) {_pct(prof.get('d_wait'))}, d' "
         f"{_pct(prof.get('d_fused_wait'))}, d' with a parallel map "
         f"{_pct(prof.get('d_fused_parallel_wait'))}."),
        (f"- Both removed (d' with its input processed ahead): {both:.1f} ms/step saved; what "
         f"is left over (a), {rest:.1f} ms, is the sparse work itself (gather and lazy Adam "
         f"kernels, {py_kernel:.1f} ms), 2 numpy_function calls, the per-table Python in them, "
         "and the embeddings' share of the dense backward pass."),
        (f"- Not sparseflow's tables but every variant's ceiling: the dot interaction's "
         f"triangle gather (`tf.gather(..., axis=1)` over `[B, 27 * 27]` in "
         f"`sparseflow/models/layers.py`, and its gradient's transposes and segment sum) takes "
         f"{tri:.1f} of (a)'s {a_ops:.1f} ms of op time."),
        "",
        "Suggestions (expected gains from the runs above):",
        "",
        (f"1. Fuse the per-table numpy functions (`sparseflow/lookup.py`, "
         f"`sparseflow/optimizers/base.py`): one gather call per insert plan that reads the "
         "flat rows/restore array and its sizes directly, gathers each table's unique rows "
         "once and expands them by the restore vector inside the kernel into every "
         "feature's `[n, dim]` embeddings; and one update call per optimizer that sums each "
         "feature's `[n, dim]` gradient into its unique rows by the restore vector (a direct "
         "index: no hash, no TF UnsortedSegmentSum, no IndexedSlices) and runs the lazy kernel "
         f"with `assume_unique=True`. Measured with the prototype: {plumbing:.1f} ms/step, "
         f"{d / prof['d_fused_ms']:.2f}x throughput, with (d)'s math (final loss after the "
         f"profile's runs: (d) {_losses(prof, 'd_loss')}, d' {_losses(prof, 'd_fused_loss')})."),
        (f"2. Cut key-processing CPU (`sparseflow/pipeline`): one numba call per batch over "
         "every table instead of 26 `KeyProcessor.process` calls with Python glue between "
         "them, as the key-processing section above already suggests; up to "
         f"{contention:.1f} ms/step if it were free, about half that for halving it. Recommend "
         "`num_parallel_calls` in the map once the step is faster, to keep input wait down."),
        ("3. Then, in the fused calls, one numba kernel for all tables (no per-table argument "
         "checks, duplicate scans and dirty marking in Python): the remaining Python is about "
         "20-40 us per table, ~1 ms/step."),
        ("4. For the models' author: a cheaper triangle extraction in `DotInteraction` would "
         "speed every variant alike (it lowers d/a, since (a) gains relatively more)."),
    ]
    if "c" in per and "a" in per:
        ca = per["c"]["samples"] / per["a"]["samples"]
        lines += [
            "",
            (f"On the targets: d/c >= 1.5 needs d >= {1.5 * ca:.2f} x (a) here, since (c) "
             f"already runs at {ca:.2f} of the ceiling: at {ev.BATCH} x 26 keys per step the "
             f"tables see ~{prof.get('unique rows', 0):,.0f} unique rows per step, and (c)'s "
             f"TF gather/scatter update of them takes "
             f"{prof['c_cats'].get(SPARSE_OTHER, 0.0):.1f} ms of op time, so the dense model "
             "dominates every variant."),
        ]
        bs = [per[b]["samples"] for b in ("b", "b_tf2") if b in per]
        if bs:
            ba = max(bs) / per["a"]["samples"]
            lines[-1] += (f" d/b >= 10 needs d >= {10 * ba:.2f} x (a): (b) reads and "
                          f"writes all {sum(ev.capacities(cap)) / 1e6:.1f} M rows of weights, "
                          "m and v every step, which is memory-bound, not slow enough for "
                          "10x.")
    return "\n".join(lines)


def render(summary, prof, args, n, load_start, load_end, elapsed) -> str:
    per, ratios = summary["per"], summary["ratios"]
    cmd = ".venv/bin/python benchmarks/e2e.py --write"
    if args.quick:
        cmd = ".venv/bin/python benchmarks/e2e.py --quick --write"
    lines = [
        SECTION,
        "",
        (f"Command: `{cmd}` (about {elapsed / 60:.0f} min: {args.rounds} interleaved rounds "
         f"of every variant, then {args.profile_rounds} of the profile; without `--write` it "
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
         f"(`access_threshold=1`). {n} distinct batches ({n * ev.BATCH:,} rows), "
         f"{args.warmup} warm-up steps ({args.warmup_b} for (b)), then {args.steps} timed "
         f"steps ({args.steps_b} for (b), ~0.25 s each)."),
        "",
        "| variant | samples/s (median) | per round | ms/step | input wait | timed steps |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for v, p in per.items():
        rounds = ", ".join(f"{x / 1e3:.0f}k" for x in p["rounds"])
        lines.append(f"| {LABELS[v]} | {p['samples']:,.0f} | {rounds} | {p['step_ms']:.1f} | "
                     f"{_pct(p['wait'])} | {p['steps']} |")
    if "d" in per and per["d"]["new_keys"] is not None:
        lines += ["", (f"(d)'s tables took {per['d']['new_keys']:,.0f} new keys per timed "
                       "step (median over rounds): the stream keeps bringing new keys.")]
    lines += ["", "| ratio | median | per round | target | |", "|---|---:|---|---:|---|"]
    for k, target in TARGETS:
        if k in ratios:
            x = ratios[k]
            lines.append(f"| {k} | **{x['median']:.2f}** | "
                         f"{', '.join(f'{y:.2f}' for y in x['rounds'])} | >= {target:g} | "
                         f"{'met' if x['median'] >= target else 'missed'} |")
    if "d" in per:
        w = per["d"]["wait"]
        lines.append(f"| (d) input wait | **{_pct(w)}** | | < {100 * WAIT_TARGET:g}% | "
                     f"{'met' if w < WAIT_TARGET else 'missed'} |")
    lines += ["", "d/b uses the faster of the two (b) variants.", "", METHOD.strip()]
    if prof is not None:
        lines += ["", "### Profile of (d) against (a)", "", PROFILE_METHOD.strip(), "",
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
  tensors, dense `[4096, 13]`, label `[4096, 1]`), `prefetch(2)`; (d) maps it through
  `get_asc_insert_func` (sequential map, as `examples/session_demo.py`).
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
  4096 x timed steps / their total time. Variants run interleaved, a, a_tf2, b, b_tf2, c, d,
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
wall time (`all_end_rel_micros`) summed per category and averaged per step; TF runs two ops
at a time on two cores, so categories overlap and sum to more than the step. Kernel times
inside sparseflow's numpy functions are measured by wrapping `HostRows.gather`,
`LazyAdam._update` and `KeyProcessor.process` of this run's objects (nothing in sparseflow/
is changed). "Input processed ahead" runs (d) on a finite stream with a prefetch buffer
as long as the timed window and waits, after the warm-up, until the process is idle, so no
key processing runs during the timed steps. d' is a prototype of suggestion 1 below, built
from sparseflow's pieces inside `benchmarks/e2e_fused.py` (not a sparseflow API): the same
tables, key processing, admission and lazy Adam kernel, with two numpy functions per step
instead of 52. Each profile round runs every one of these back to back; medians over rounds.
"""

if __name__ == "__main__":
    sys.exit(main())
