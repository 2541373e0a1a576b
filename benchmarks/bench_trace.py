"""The first step of a TF2 training loop: how long tracing takes with sparseflow's code left
out of autograph (``sparseflow/autograph_rules.py``) against rewritten by it.

Workload: a Criteo-shaped step on 26 tables (dim 16, batch 1024) and a DLRM, as a user writes
it: a ``tf.function`` over either one ``tf2.Embedding`` of the 26 tables (``tf2``) or 26 Keras
``SparseEmbedding`` layers (``keras``). Each run is a fresh process (autograph caches what it
rewrote for the process's life); the ``rewritten`` variant takes the rule off before the first
call. First call: trace plus one step; then 20 steps are timed, to show the traced graphs run
alike (the losses must match).

    .venv/bin/python benchmarks/bench_trace.py [--rounds 3] [--write]
"""

from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402

FACES = ("tf2", "keras")
VARIANTS = ("left_out", "rewritten")
BATCH, DIM, STEPS = 1024, 16, 20


def worker(face: str, variant: str) -> dict:
    """One process: the face's first call and its next ``STEPS`` steps."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import tensorflow as tf
    from tensorflow.python.autograph.core import config

    from sparseflow import tf2
    from sparseflow.keras import SparseEmbedding
    from sparseflow.models import DLRM
    from sparseflow.synthetic import CRITEO_CARDINALITIES, criteo_keys

    if variant == "rewritten":
        config.CONVERSION_RULES = tuple(r for r in config.CONVERSION_RULES
                                        if not r.matches("sparseflow"))
    caps = [min(c, 100_000) for c in CRITEO_CARDINALITIES]
    init = tf.compat.v1.truncated_normal_initializer(stddev=0.05, seed=1)
    model = DLRM(bottom_mlp=(64, DIM), top_mlp=(256, 128), seed=0)
    rng = np.random.default_rng(0)
    batches = [(criteo_keys(rng, BATCH, caps), rng.normal(size=(BATCH, 13)).astype(np.float32),
                (rng.random(BATCH) < 0.25).astype(np.float32)) for _ in range(STEPS + 1)]
    if face == "tf2":
        embedding = tf2.Embedding(
            {f"c{j}": tf2.FeatureConfig(tf2.TableConfig(c, DIM, init, name=f"t{j}"))
             for j, c in enumerate(caps)}, tf2.Adam(1e-3))

        def embed(keys):   # the activations, and what the tape differentiates
            embedding.enqueue({f"c{j}": keys[:, j] for j in range(26)}, training=True)
            act = embedding.dequeue()
            pooled = [act[f"c{j}"] for j in range(26)]
            return pooled, pooled

        def apply(grads):
            embedding.apply_gradients({f"c{j}": grads[j] for j in range(26)})
    else:
        layers = [SparseEmbedding(c, DIM, initializer=init, optimizer=tf2.Adam(1e-3),
                                  combiner="sum", name=f"t{j}") for j, c in enumerate(caps)]

        def embed(keys):   # the layers apply their gradients in the backward pass
            return ([layer(keys[:, j:j + 1], training=True) for j, layer in enumerate(layers)],
                    [layer.anchor for layer in layers])

        def apply(grads):
            pass

    @tf.function
    def step(keys, dense, labels):
        with tf.GradientTape() as tape:
            pooled, sources = embed(keys)
            if face == "tf2":   # activations; a layer's anchor is a Keras variable, watched
                tape.watch(sources)
            logits = tf.squeeze(model(dense, pooled), 1)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels,
                                                                          logits=logits))
        grads = tape.gradient(loss, sources + list(model.trainable_variables))
        apply(grads)
        for var, grad in zip(model.trainable_variables, grads[26:]):
            var.assign_sub(1e-3 * grad)
        return loss

    begin = time.perf_counter()
    step(*batches[0])
    first = time.perf_counter() - begin
    begin = time.perf_counter()
    for batch in batches[1:]:
        loss = step(*batch)
    return {"first_s": first, "step_ms": 1000 * (time.perf_counter() - begin) / STEPS,
            "final_loss": float(loss)}


def run(face: str, variant: str) -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return report.worker_result(__file__, [face, variant], root, cwd=root,
                                TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")


def main() -> None:
    args = report.command_line(__doc__.splitlines()[0], worker, 2, rounds=3)
    if args is None:
        return
    runs = {(f, v): [] for f in FACES for v in VARIANTS}
    for r in range(args.rounds):
        for face in FACES:
            for variant in (VARIANTS if r % 2 == 0 else VARIANTS[::-1]):
                runs[face, variant].append(run(face, variant))
                x = runs[face, variant][-1]
                print(f"round {r + 1} {face} {variant}: first call {x['first_s']:.2f} s, "
                      f"step {x['step_ms']:.1f} ms, loss {x['final_loss']:.6f}", flush=True)
    rows, ratios = [], []
    for face in FACES:
        a, b = runs[face, "left_out"], runs[face, "rewritten"]
        for x, y in zip(a, b):
            if abs(x["final_loss"] - y["final_loss"]) > 1e-5:
                raise RuntimeError(f"{face}: the variants trained differently: "
                                   f"{x['final_loss']} against {y['final_loss']}")
        per_round = [y["first_s"] / x["first_s"] for x, y in zip(a, b)]
        ratio = statistics.median(per_round)
        ratios.append(f"| {face} | **{ratio:.2f}x** | "
                      + ", ".join(f"{p:.2f}" for p in per_round) + " |")
        for variant, results in (("left out of autograph", a), ("rewritten by autograph", b)):
            rows.append(f"| {face} | {variant} | "
                        f"{statistics.median(r['first_s'] for r in results):.2f} | "
                        + ", ".join(f"{r['first_s']:.2f}" for r in results)
                        + f" | {statistics.median(r['step_ms'] for r in results):.1f} |")
    import tensorflow as tf
    section = "\n".join([
        "## First step of a TF2 loop: tracing with sparseflow left out of autograph",
        "",
        f"Command: `.venv/bin/python benchmarks/bench_trace.py --rounds {args.rounds} "
        "--write`.",
        "",
        f"Machine: {report.machine_line(TF=tf.__version__)}.",
        "",
        "Workload: a `tf.function` step over 26 Criteo-shaped tables (capped at 100,000 rows, "
        f"dim {DIM}, batch {BATCH}) and a DLRM, through one `tf2.Embedding` (`tf2`) or 26 "
        "Keras `SparseEmbedding` layers (`keras`); each run a fresh process, first call = "
        f"trace + one step, then {STEPS} steps timed. `rewritten` takes "
        "`sparseflow.autograph_rules`' entry off autograph's do-not-convert list, as before "
        "it existed; both variants end on the same loss in every round.",
        "",
        "| face | sparseflow's code | first call, s (median) | per round | step ms (median) |",
        "|---|---|---:|---|---:|",
        *rows,
        "",
        "| face | first call, rewritten / left out | per round |",
        "|---|---:|---|",
        *ratios,
    ])
    report.publish(section, args.write)


if __name__ == "__main__":
    main()
