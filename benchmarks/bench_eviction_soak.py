"""Eviction soak: admission + eviction over 2,000 training steps of a sliding key population.

The stream (generated per step, deterministic per step, identical in every run): batches of
1024 samples with two sparse features, ``user_ids`` (8 per sample) and ``item_ids`` (4 per
sample), an int64 timestamp (the step number, in seconds) and a label that depends on the keys.
Each feature has ``W`` popularity ranks drawn by a Zipf law; each rank holds one key at a time
and hands it over to a brand-new key every ``L`` steps, the ranks staggered over those ``L``
steps. So about ``W / L`` new keys arrive every step, at every popularity, and the keys they
replace stop appearing: a sliding key population.

The model is Rec SDK's flow in a ``tf.compat.v1`` graph: ``FeatureSpec``s with
``access_threshold=2`` and a timestamp spec, ``create_table``, ``get_asc_insert_func`` in
``dataset.map``, ``sparse_lookup``, a small dense tower, lazy Adam on the tables and Adam on the
tower, ``start_asc_pipeline()``, and a ``MonitoredTrainingSession``. With eviction on, the specs
set ``eviction_threshold=300`` (seconds = steps) and ``EvictHook(evict_enable=True,
evict_step_interval=100)`` evicts after every 100th global step.

Configurations, each in its own process (so that RSS is its own):

- ``off``: no eviction (no ``eviction_threshold``, no hook); tables sized for every key the
  stream ever admits.
- ``on-hook``: eviction by ``EvictHook`` every 100 global steps; tables of a fixed, smaller
  size that the ``off`` run outgrows by step ~450.
- ``on-call``: the same eviction, by ``sf.evict()`` after every 100th ``sess.run`` (no hook):
  separates eviction's own cost from the hook's.
- ``off-sketch``, ``on-sketch``: ``off`` and ``on-hook`` with
  ``admission_counter="sketch"`` (keys not yet admitted are counted in a fixed-memory
  count-min sketch, cleared at every eviction, instead of in the key index).

The processes run side by side but take turns: the parent runs 50 steps in one, then 50 in
the next (rotating the order every round), so that the load from other jobs on this shared
machine falls on every configuration alike (the eviction-on and -off runs are compared in
the same run, never against a number from another run). After every turn each reports the
time of its steps, its table statistics and its RSS (``VmRSS``). Throughput counts steps
51-2000 (the first 50 are warm-up); eviction runs inside the timed steps. The script checks
the targets: keys evicted, RSS flat from step 500 on (within 16 MB), throughput with
eviction on >= 0.90x of off.

    python benchmarks/bench_eviction_soak.py [--steps 2000] [--configs off,on-hook,...] [--write]
    python benchmarks/bench_eviction_soak.py --summary   # the stream's key counts, numpy only

About 2 minutes on 2 cores. ``--write`` replaces the ``## Eviction soak`` section of
BENCHMARKS.md (appends it if missing).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
from report import cpu_model, replace_section, rss_mb

from sparseflow.synthetic import key_weight, scatter_keys

BATCH = 1024
# feature -> (table, dim, ids per sample, popularity ranks W, key lifetime L in steps)
FEATURES = {
    "user_ids": ("user_table", 16, 8, 200_000, 400),
    "item_ids": ("item_table", 8, 4, 50_000, 400),
}
ZIPF_A = 1.05
ACCESS_THRESHOLD = 2
EVICTION_THRESHOLD = 300   # seconds; the timestamp is the step number
EVICT_EVERY = 100          # steps
WARMUP = 50                # steps not timed
TURN = 50                  # steps a configuration runs before the next one takes its turn
SEED = 2026
# config -> (how eviction runs: None, "hook" (EvictHook) or "call" (sf.evict() in the loop),
#            admission counter)
CONFIGS = {
    "off": (None, "exact"),
    "on-hook": ("hook", "exact"),
    "on-call": ("call", "exact"),
    "off-sketch": (None, "sketch"),
    "on-sketch": ("hook", "sketch"),
}


# -- the stream ----------------------------------------------------------------------------

class Stream:
    """Batch ``step`` of the sliding-population stream (numpy, deterministic per step)."""

    def __init__(self):
        self.cdf, self.phase = {}, {}
        for name, (_, _, _, ranks, life) in FEATURES.items():
            p = 1.0 / np.arange(1, ranks + 1, dtype=np.float64) ** ZIPF_A
            self.cdf[name] = np.cumsum(p) / p.sum()
            # Rank r hands its key over at steps where (step + phase[r]) % life == 0.
            self.phase[name] = (np.arange(ranks, dtype=np.uint64) * np.uint64(2654435761)
                                % np.uint64(life))

    def keys(self, name: str, step: int, u: np.ndarray) -> np.ndarray:
        _, _, _, ranks, life = FEATURES[name]
        rank = np.minimum(np.searchsorted(self.cdf[name], u), ranks - 1).astype(np.uint64)
        generation = (np.uint64(step) + self.phase[name][rank]) // np.uint64(life)
        # (generation, rank) -> a distinct int64 key per feature.
        return scatter_keys(generation * np.uint64(ranks) + rank,
                            salt=list(FEATURES).index(name) + 1)

    def batch(self, step: int) -> tuple:
        rng = np.random.default_rng((SEED, int(step)))
        out, effects = [], []
        for name, (_, _, per_sample, _, _) in FEATURES.items():
            k = self.keys(name, int(step), rng.random(BATCH * per_sample))
            effects.append(key_weight(k, salt=7))  # hidden per-key effect: a learnable label
            out.append(k.reshape(BATCH, per_sample))
        logit = 4.0 * np.concatenate([e.reshape(BATCH, -1) for e in effects], axis=1).mean(1)
        label = (rng.random(BATCH) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
        ts = np.full(BATCH, step, np.int64)
        return (*out, ts, label)


def stream_summary(steps: int) -> dict:
    """Exact counts of the stream (numpy only): keys ever seen, keys seen at least
    ACCESS_THRESHOLD times (every key the tables admit) — sizes the tables of the ``off`` run."""
    stream = Stream()
    counts = {name: {} for name in FEATURES}
    for step in range(steps):
        for name, arr in zip(FEATURES, stream.batch(step)):
            k, c = np.unique(arr, return_counts=True)
            d = counts[name]
            for key, n in zip(k.tolist(), c.tolist()):
                d[key] = d.get(key, 0) + n
    return {name: (len(d), sum(1 for n in d.values() if n >= ACCESS_THRESHOLD))
            for name, d in counts.items()}


# Capacities (rows). off: every key the stream admits in 2,000 steps fits (``--summary``
# counts them: of 907,952 user keys seen, 632,064 are seen at least twice; item: 271,895 and
# 236,513), scaled up for longer runs; on: a fixed bound far under that, which the user table
# would overflow by step ~450 without eviction; with it the peak is ~169k / ~67k rows.
CAPACITY = {
    "off": {"user_table": 700_000, "item_table": 260_000},
    "on": {"user_table": 200_000, "item_table": 80_000},
}


# -- one configuration (a worker process) ---------------------------------------------------

def worker(config: str, steps: int) -> None:
    """Builds the model for ``config`` and runs steps on the parent's command.

    Protocol (one JSON object per line on the original stdout; stdout itself is redirected to
    stderr so that nothing else lands there): prints ``{"ready": ...}``, then for every line
    ``N`` on stdin runs ``N`` steps and prints their report; ``0`` (or EOF) ends.
    """
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    import tensorflow as tf

    import sparseflow as sf
    from sparseflow.optimizers import lazy_adam
    from sparseflow.pipeline import eviction as eviction_module
    from sparseflow.pipeline import key_processor

    mode, counter = CONFIGS[config]
    evict_on = mode is not None
    capacity = CAPACITY["on" if evict_on else "off"]
    if not evict_on:  # admitted keys grow about linearly with the steps
        capacity = {t: int(n * max(1.0, steps / 2000)) for t, n in capacity.items()}

    # Instrumentation (the same cheap wrappers in every configuration): time spent in the key
    # processor (a tf.data thread) and in eviction (inside the training step).
    spent = {"process_s": 0.0, "process_calls": 0, "evict_s": 0.0, "evictions": 0,
             "hook_s": 0.0, "evict_ms": []}
    held_before = {}  # keys held just before this turn's eviction
    # Each table's key processing after the batch's one dedup call (insert_func).
    process = key_processor.KeyProcessor.process_unique

    def timed_process(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return process(self, *args, **kwargs)
        finally:
            spent["process_s"] += time.perf_counter() - start
            spent["process_calls"] += 1

    key_processor.KeyProcessor.process_unique = timed_process
    evict = eviction_module.evict

    def timed_evict(*args, **kwargs):
        held_before.update((name, t.size()) for name, t in tables.items())
        start = time.perf_counter()
        try:
            return evict(*args, **kwargs)
        finally:
            elapsed = time.perf_counter() - start
            spent["evict_s"] += elapsed
            spent["evictions"] += 1
            spent["evict_ms"].append(round(elapsed * 1e3, 2))

    eviction_module.evict = timed_evict  # EvictHook calls the module-level evict()
    after_run = eviction_module.EvictHook.after_run

    def timed_after_run(self, *args, **kwargs):  # the hook's whole cost, evict() included
        start = time.perf_counter()
        try:
            return after_run(self, *args, **kwargs)
        finally:
            spent["hook_s"] += time.perf_counter() - start

    eviction_module.EvictHook.after_run = timed_after_run

    tf.compat.v1.disable_eager_execution()
    tf.compat.v1.set_random_seed(0)
    sf.init()
    specs = [sf.FeatureSpec(name, table_name=table, access_threshold=ACCESS_THRESHOLD,
                            eviction_threshold=EVICTION_THRESHOLD if evict_on else None)
             for name, (table, *_rest) in FEATURES.items()]
    specs.append(sf.FeatureSpec("ts", is_timestamp=True))
    tables = {table: sf.create_table(tf.int64, dim, table,
                                     tf.compat.v1.truncated_normal_initializer(stddev=0.05),
                                     device_vocabulary_size=capacity[table],
                                     admission_counter=counter)
              for table, dim, *_rest in FEATURES.values()}

    stream = Stream()
    names = list(FEATURES) + ["ts", "label"]
    dtypes = [tf.int64] * (len(FEATURES) + 1) + [tf.float32]
    shapes = [[BATCH, f[2]] for f in FEATURES.values()] + [[BATCH], [BATCH]]

    def generate(step):
        out = tf.numpy_function(stream.batch, [step], dtypes, stateful=False,
                                name="soak_stream")
        for t, shape in zip(out, shapes):
            t.set_shape(shape)
        return dict(zip(names, out))

    dataset = tf.data.Dataset.range(steps).map(generate)
    dataset = dataset.map(sf.get_asc_insert_func(tgt_key_specs=specs, is_training=True))
    batch = tf.compat.v1.data.make_one_shot_iterator(dataset.prefetch(2)).get_next()

    pooled = [tf.reduce_sum(sf.sparse_lookup(tables[spec.table_name], spec, batch=batch,
                                             name=f"{spec.table_name}_lookup"), axis=1)
              for spec in specs if not spec.is_timestamp]
    x = tf.concat(pooled, axis=1)
    for i, width in enumerate((64, 32)):
        w = tf.compat.v1.get_variable(f"w{i}", [x.shape[1], width],
                                      initializer=tf.compat.v1.glorot_uniform_initializer(seed=i))
        b = tf.compat.v1.get_variable(f"b{i}", [width], initializer=tf.zeros_initializer())
        x = tf.nn.relu(tf.matmul(x, w) + b)
    w = tf.compat.v1.get_variable("out_w", [x.shape[1], 1],
                                  initializer=tf.compat.v1.glorot_uniform_initializer(seed=9))
    logits = tf.squeeze(tf.matmul(x, w), 1)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=batch["label"],
                                                                  logits=logits))

    global_step = tf.compat.v1.train.get_or_create_global_step()
    dense_vars, sparse_vars = sf.get_dense_and_sparse_variable()
    grads = tf.gradients(loss, dense_vars + sparse_vars)
    train_op = tf.group(
        tf.compat.v1.train.AdamOptimizer(0.002).apply_gradients(
            zip(grads[:len(dense_vars)], dense_vars), global_step=global_step),
        lazy_adam.create_hash_optimizer(learning_rate=0.01).apply_gradients(
            zip(grads[len(dense_vars):], sparse_vars)))
    sf.start_asc_pipeline()

    hooks = ([sf.EvictHook(evict_enable=True, evict_step_interval=EVICT_EVERY)]
             if mode == "hook" else [])

    def report(done, timed, seconds, losses):
        stats = {}
        for name, table in tables.items():
            s = table.stats()
            s["index_mib"] = table.processor.index.nbytes / 2**20
            s["rows_ever_used"] = table.processor.rows_ever_used
            stats[name] = s
        return {"config": config, "step": done, "timed_steps": timed, "seconds": seconds,
                "loss": float(np.mean(losses)) if losses else None, "rss_mb": rss_mb(),
                "stats": stats, "held_before_evict": dict(held_before) or None, **spent}

    with tf.compat.v1.train.MonitoredTrainingSession(
            hooks=hooks, checkpoint_dir=None, save_checkpoint_secs=None,
            save_summaries_steps=None, save_summaries_secs=None,
            log_step_count_steps=None) as sess:
        done = 0
        proto.write(json.dumps({"ready": config, "rss_mb": rss_mb()}) + "\n")
        for line in sys.stdin:
            n = int(line)
            if n <= 0:
                break
            timed, seconds, losses = 0, 0.0, []
            held_before.clear()
            for _ in range(n):
                start = time.perf_counter()
                _, value = sess.run([train_op, loss])
                if mode == "call" and (done + 1) % EVICT_EVERY == 0:
                    eviction_module.evict()  # sf.evict, timed like the hook's
                elapsed = time.perf_counter() - start
                done += 1
                losses.append(value)
                if done > WARMUP:
                    timed += 1
                    seconds += elapsed
            proto.write(json.dumps(report(done, timed, seconds, losses)) + "\n")
    sf.terminate_config_initializer()


# -- the parent: runs the configurations in turns --------------------------------------------

def soak(configs, steps: int) -> dict:
    procs = {}
    try:
        for config in configs:
            procs[config] = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--worker", config,
                 "--steps", str(steps)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        for config, proc in procs.items():
            ready = json.loads(proc.stdout.readline() or "null")
            if ready is None:
                raise RuntimeError(f"worker {config} did not start (its stderr is above)")
            print(f"{config}: graph built, RSS {ready['rss_mb']:.0f} MB", flush=True)
        reports = {config: [] for config in configs}
        rounds = (steps + TURN - 1) // TURN
        for r in range(rounds):
            n = min(TURN, steps - r * TURN)
            # Rotate who goes first: the order within a round must not favour anyone.
            for config in configs[r % len(configs):] + configs[:r % len(configs)]:
                proc = procs[config]
                proc.stdin.write(f"{n}\n")
                proc.stdin.flush()
                line = proc.stdout.readline()
                if not line:
                    raise RuntimeError(f"worker {config} died in round {r} (its stderr is above)")
                reports[config].append(json.loads(line))
            done = r * TURN + n
            if done % EVICT_EVERY and done != steps:
                continue
            print(f"step {done:5d}  " + "  ".join(
                f"{c}: {_sizes(reports[c][-1])} RSS {reports[c][-1]['rss_mb']:.0f} MB"
                for c in configs), flush=True)
        for proc in procs.values():
            proc.stdin.write("0\n")
            proc.stdin.flush()
        for proc in procs.values():
            proc.wait(timeout=120)
        return reports
    finally:
        for proc in procs.values():  # only the workers this function started
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _sizes(rep) -> str:
    return "/".join(f"{s['keys_held'] / 1000:.0f}k" for s in rep["stats"].values())


def throughput(reps) -> float:
    """Steps per second over every timed step (steps WARMUP+1 .. end)."""
    return sum(r["timed_steps"] for r in reps) / sum(r["seconds"] for r in reps)


BASELINE = {"on-hook": "off", "on-call": "off", "on-sketch": "off-sketch"}
LABEL = {
    "off": "off",
    "on-hook": "on, `EvictHook`",
    "on-call": "on, `sf.evict()` in the loop",
    "off-sketch": "off, sketch counter",
    "on-sketch": "on, `EvictHook`, sketch counter",
}


def summarize(reports: dict) -> dict:
    """Per configuration: throughput, ratio to its baseline, RSS drift, final statistics."""
    out = {}
    for config, reps in reports.items():
        last = reps[-1]
        row = {"steps_s": throughput(reps), "rss": [r["rss_mb"] for r in reps],
               "stats": last["stats"], "loss": last["loss"], "evict_s": last["evict_s"],
               "evictions": last["evictions"], "hook_s": last["hook_s"],
               "evict_ms": last["evict_ms"],
               "process_s": last["process_s"], "process_calls": last["process_calls"],
               "steps": last["step"], "timed": sum(r["timed_steps"] for r in reps),
               "seconds": sum(r["seconds"] for r in reps)}
        at_500 = [r for r in reps if r["step"] <= 500][-1]
        row["rss_500"], row["rss_end"] = at_500["rss_mb"], last["rss_mb"]
        row["index_500"], row["index_end"] = (sum(s["index_mib"] for s in r["stats"].values())
                                              for r in (at_500, last))
        base = BASELINE.get(config)
        if base in reports:
            row["baseline"] = base
            row["ratio"] = row["steps_s"] / throughput(reports[base])
            per_round = [a["timed_steps"] / a["seconds"] / (b["timed_steps"] / b["seconds"])
                         for a, b in zip(reps, reports[base]) if a["seconds"] and b["seconds"]]
            row["round_ratios"] = (float(np.median(per_round)), min(per_round), max(per_round))
        out[config] = row
    return out


def check(summary: dict) -> list[str]:
    """The soak's targets, as lines 'PASS ...' / 'FAIL ...'."""
    lines = []
    for config, row in summary.items():
        if config.startswith("on"):
            evicted = sum(s["keys_evicted"] for s in row["stats"].values())
            lines.append(f"{'PASS' if evicted > 0 else 'FAIL'} {config}: "
                         f"{evicted:,} keys evicted")
            drift = row["rss_end"] - row["rss_500"]
            lines.append(f"{'PASS' if abs(drift) <= 16 else 'FAIL'} {config}: RSS moved "
                         f"{drift:+.0f} MB from step 500 to the end (target: flat, |drift| <= 16)")
            if "ratio" in row:
                lines.append(f"{'PASS' if row['ratio'] >= 0.9 else 'FAIL'} {config}: "
                             f"throughput {row['ratio']:.3f}x of {row['baseline']} "
                             f"(target >= 0.90)")
        else:
            lines.append(f"INFO {config}: tables grew to " + ", ".join(
                f"{t} {s['keys_held']:,}" for t, s in row["stats"].items()))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description="eviction soak benchmark")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--configs", default=",".join(CONFIGS),
                        help=f"comma-separated subset of {','.join(CONFIGS)}")
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    parser.add_argument("--output", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "BENCHMARKS.md"),
        help="the file --write updates (default: BENCHMARKS.md)")
    parser.add_argument("--worker", choices=CONFIGS, help=argparse.SUPPRESS)
    parser.add_argument("--summary", action="store_true",
                        help="print the stream's key counts (numpy only, ~15 s) and exit")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.steps)
        return
    if args.summary:
        print(stream_summary(args.steps))
        return
    configs = tuple(args.configs.split(","))
    unknown = set(configs) - set(CONFIGS)
    if unknown:
        parser.error(f"unknown configs {sorted(unknown)}; choose from {list(CONFIGS)}")
    load = os.getloadavg()[0]
    start = time.perf_counter()
    reports = soak(configs, args.steps)
    wall = time.perf_counter() - start
    load_end = os.getloadavg()[0]
    summary = summarize(reports)
    print()
    for config, row in summary.items():
        ratio = (f", {row['ratio']:.3f}x of {row['baseline']} (per {TURN}-step turn: median "
                 f"{row['round_ratios'][0]:.3f}, {row['round_ratios'][1]:.2f}-"
                 f"{row['round_ratios'][2]:.2f})" if "ratio" in row else "")
        print(f"{config}: {row['steps_s']:.1f} steps/s{ratio}; RSS {row['rss_500']:.0f} MB at "
              f"step 500 -> {row['rss_end']:.0f} MB; loss {row['loss']:.4f}")
        for t, s in row["stats"].items():
            print(f"   {t}: {s}")
        print(f"   key processor {row['process_s']:.2f} s in {row['process_calls']} calls; "
              f"evict() {row['evict_s']:.2f} s in {row['evictions']} runs; "
              f"EvictHook.after_run {row['hook_s']:.2f} s; {row['seconds']:.2f} s timed")
    print()
    print("\n".join(check(summary)))
    print(f"wall {wall:.0f} s, load average {load:.2f} at start, {load_end:.2f} at end")
    if args.write:
        write_section(args.output, reports, summary, args.steps, load, load_end, wall)


def _k(n) -> str:
    return f"{n / 1000:.0f}k"


def curve_table(reports: dict) -> list[str]:
    """step -> keys held (user/item; before -> after the eviction) and RSS, every 100 steps."""
    configs = list(reports)
    head = ["step"]
    for c in configs:
        head += [f"{c}: keys held" + (" (before → after eviction)" if c.startswith("on") else ""),
                 f"{c}: RSS MB"]
        if c == "on-hook":
            head.append(f"{c}: key index MiB")
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for i, first_rep in enumerate(reports[configs[0]]):
        if first_rep["step"] % EVICT_EVERY and i != len(reports[configs[0]]) - 1:
            continue
        cells = [str(first_rep["step"])]
        for c in configs:
            rep = reports[c][i]
            after = "/".join(_k(s["keys_held"]) for s in rep["stats"].values())
            before = rep.get("held_before_evict")
            if before and "/".join(map(_k, before.values())) != after:
                after = "/".join(map(_k, before.values())) + " → " + after
            cells += [after, f"{rep['rss_mb']:.0f}"]
            if c == "on-hook":
                cells.append(f"{sum(s['index_mib'] for s in rep['stats'].values()):.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def write_section(path, reports, summary, steps, load, load_end, wall) -> None:
    """Replaces (or appends) the ``## Eviction soak`` section of BENCHMARKS.md."""
    import tensorflow as tf  # only for its version

    tables = ", ".join(f"`{t}` (`{f}`, dim {d}, {n} ids/sample, W={w:,} ranks, L={life})"
                       for f, (t, d, n, w, life) in FEATURES.items())
    lines = [
        "## Eviction soak", "",
        (f"Command: `.venv/bin/python benchmarks/bench_eviction_soak.py --write` (about "
         f"{wall / 60:.0f} min; without `--write` it only prints)."), "",
        (f"Machine: {os.cpu_count()} cores (`nproc`), {cpu_model()}; Python "
         f"{platform.python_version()}, TF {tf.__version__}, numpy {np.__version__}. Load average "
         f"{load:.2f} when the run started, {load_end:.2f} when it ended (other jobs share the "
         f"machine)."), "",
        (f"Workload: {steps:,} training steps of batch {BATCH} in Rec SDK's flow (`tf.compat.v1` "
         f"graph, `FeatureSpec`s with `access_threshold={ACCESS_THRESHOLD}` and a timestamp "
         f"spec, `create_table`, `get_asc_insert_func` in `dataset.map`, `sparse_lookup`, a "
         f"64-32-1 tower, lazy Adam on the tables and Adam on the tower, "
         f"`MonitoredTrainingSession`). Tables: {tables}. The stream is a sliding key "
         f"population: each feature has W Zipf({ZIPF_A}) popularity ranks, each rank holds one "
         f"key at a time and hands it to a brand-new key every L steps (ranks staggered), so "
         f"about W/L new keys arrive per step at every popularity and the keys they replace go "
         f"cold; the timestamp is the step number (seconds); labels depend on hidden per-key "
         f"effects. Eviction: `eviction_threshold={EVICTION_THRESHOLD}` s, run every "
         f"{EVICT_EVERY} steps, by `EvictHook(evict_enable=True, "
         f"evict_step_interval={EVICT_EVERY})` (global step) or by `sf.evict()` after every "
         f"{EVICT_EVERY}th `sess.run` (`on-call`). Tables hold "
         f"{CAPACITY['off']['user_table']:,}/{CAPACITY['off']['item_table']:,} rows with eviction "
         f"off (every key the stream admits fits) and "
         f"{CAPACITY['on']['user_table']:,}/{CAPACITY['on']['item_table']:,} with it on (the "
         f"off runs outgrow that by step ~450)."), "",
        ("Method: each configuration runs in its own process (so RSS is its own: `VmRSS` from "
         f"`/proc/self/status`); the processes take turns of {TURN} steps (the order rotates "
         "every round), so load from other jobs falls on all alike, and every turn reports its "
         f"step times, `table.stats()` and RSS. Throughput counts steps {WARMUP + 1}-{steps} "
         f"(the first {WARMUP} are warm-up); the eviction runs inside the timed steps. While a "
         "process waits for its turn its input pipeline fills its prefetch buffer (a few "
         "batches), alike in every configuration. "
         "`sketch` = `create_table(..., admission_counter=\"sketch\")`; the others count "
         "not-yet-admitted keys exactly in the key index (the default)."), "",
        (f"| configuration | steps/s | vs eviction off | per-turn ({TURN} steps) ratio: median "
         "(min-max) | "
         "keys held at end (user / item) | peak rows used | keys evicted | counted, not admitted "
         "(user) | user index MiB | RSS MB at step 500 → end | final loss |"),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for config, row in summary.items():
        st = list(row["stats"].values())
        user = st[0]
        ratio = f"**{row['ratio']:.3f}x**" if "ratio" in row else "baseline"
        rr = (f"{row['round_ratios'][0]:.3f} ({row['round_ratios'][1]:.2f}-"
              f"{row['round_ratios'][2]:.2f})" if "ratio" in row else "")
        counted = user["keys_counted_not_admitted"]
        held, peak, evicted = (" / ".join(f"{s[k]:,}" for s in st)
                               for k in ("keys_held", "rows_ever_used", "keys_evicted"))
        counted = "sketch" if counted is None else f"{counted:,}"
        lines.append(
            f"| {LABEL.get(config, config)} | {row['steps_s']:.1f} "
            f"({row['steps_s'] * BATCH / 1000:.0f}k samples/s) | {ratio} | {rr} | "
            f"{held} | {peak} | {evicted} | {counted} | {user['index_mib']:.1f} | "
            f"{row['rss_500']:.0f} → {row['rss_end']:.0f} "
            f"({row['rss_end'] - row['rss_500']:+.0f})"
            f" | {row['loss']:.4f} |")
    lines += ["", "Targets (checked by the script):", ""]
    lines += [f"- {line}" for line in check(summary)]
    lines += ["", ("Keys held (user/item, thousands; for eviction-on runs, before → after the "
                   "eviction of that step), RSS, and for `on-hook` the memory of both tables' key "
                   "index, every 100 steps:"), ""]
    lines += curve_table(reports)
    lines += ["", notes(summary)]
    replace_section("\n".join(lines) + "\n", path)


def notes(summary: dict) -> str:
    """What the numbers say, with this run's numbers filled in."""
    out = []
    hook, call = summary.get("on-hook"), summary.get("on-call")
    if hook:
        ms = hook["evict_ms"] or [0.0]
        read = (hook["hook_s"] - hook["evict_s"]) / hook["steps"] * 1e3
        out.append(
            f"Where eviction's cost goes (`on-hook`, {hook['seconds']:.1f} s timed): `evict()` "
            f"itself took {hook['evict_s']:.2f} s in {hook['evictions']} runs (median "
            f"{np.median(ms):.0f} ms, max {max(ms):.0f} ms, first {ms[0]:.0f} ms: a scan of "
            f"both tables' key index plus the deletes). "
            f"`EvictHook.after_run` took {hook['hook_s']:.2f} s in all, so "
            f"{hook['hook_s'] - hook['evict_s']:.2f} s ({read:.2f} ms per step, "
            f"{(hook['hook_s'] - hook['evict_s']) / hook['seconds']:.0%} of the timed time) is "
            f"the hook's "
            f"own overhead: it reads the global step with an extra `session.run` after *every* "
            f"step, due or not. That is a per-step cost, so it weighs more the smaller the "
            f"batch (here a step takes {1e3 / hook['steps_s']:.1f} ms)."
            + (f" `on-call` (the same eviction from the loop, no hook) ran at "
               f"{call['ratio']:.3f}x of off against the hook's {hook['ratio']:.3f}x." if call and
               "ratio" in call and "ratio" in hook else "")
            + f" The key processor (a tf.data thread, overlapping the step) took "
            f"{hook['process_s']:.1f} s with eviction on"
            + (f" and {summary['off']['process_s']:.1f} s with it off" if "off" in summary
               else "")
            + ": rows are reused instead of fresh ones being paged in, and the index stays "
            "smaller.")
    if hook and "off" in summary:
        off = summary["off"]
        u_on, u_off = hook["stats"]["user_table"], off["stats"]["user_table"]
        out.append(
            f"Finding (exact counting, the default): eviction never removes keys that were "
            f"counted but not admitted. They own no row, so they have no last-seen time and "
            f"`stale_keys` (ops/key_kernels.py) skips them; the index keeps every key seen once. "
            f"Here the user table ends with {u_on['keys_counted_not_admitted']:,} such keys with "
            f"eviction on — as many as with it off ({u_off['keys_counted_not_admitted']:,}) — "
            f"and its index grew to {u_on['index_mib']:.1f} MiB (it was presized for the "
            f"{CAPACITY['on']['user_table']:,}-row capacity, "
            f"{CAPACITY['on']['user_table'] / 0.75 * 16 / 2**20:.1f} MiB): about "
            f"{u_on['keys_counted_not_admitted'] / hook['steps']:.0f} keys (~21 bytes each) "
            f"per step, without bound. It is most of the (small) RSS drift of the eviction-on "
            f"run: from step 500 to the end both tables' index grew by "
            f"{hook['index_end'] - hook['index_500']:.1f} MiB and RSS by "
            f"{hook['rss_end'] - hook['rss_500']:.0f} MB. Small in {hook['steps']:,} steps, "
            f"but a long-running job with eviction on still grows; only "
            f"`admission_counter=\"sketch\"` bounds it (next paragraph).")
    sk, sk_off = summary.get("on-sketch"), summary.get("off-sketch")
    if sk and hook:
        a, b = sk["stats"]["user_table"]["keys_held"], hook["stats"]["user_table"]["keys_held"]
        out.append(
            f"The sketch counter keeps the index at its presized "
            f"{sk['stats']['user_table']['index_mib']:.1f} MiB, but it is cleared at every "
            f"eviction, so a key seen once before an eviction and once after is not admitted: "
            f"with eviction every {EVICT_EVERY} steps and `access_threshold="
            f"{ACCESS_THRESHOLD}` the user table holds {a:,} keys at the end against {b:,} with "
            f"exact counting ({a / b - 1:+.0%})."
            + (f" Without eviction the sketch over-counts a little instead: "
               f"{sk_off['stats']['user_table']['keys_held']:,} user keys admitted against "
               f"{summary['off']['stats']['user_table']['keys_held']:,} exactly."
               if sk_off and "off" in summary else ""))
    if "off" in summary:
        off = summary["off"]
        out.append(
            f"Eviction off, the table grows with the stream "
            f"({off['stats']['user_table']['keys_held']:,} user keys at the end) and so does "
            f"RSS ({off['rss_500']:.0f} → {off['rss_end']:.0f} MB from step 500): new keys keep "
            f"taking never-used rows, "
            f"whose pages are touched for the first time; with eviction on, rows are recycled "
            f"and the number of rows ever used stops at the peak working set. "
            f"`reserve_memory()` is not used: it would commit every row up front and hide "
            f"that curve.")
    return "\n\n".join(out)


if __name__ == "__main__":
    main()
