"""Estimator overhead: training throughput through ``sparseflow.estimator`` against the same
model trained in a hand-written ``tf.compat.v1.Session`` loop on sparseflow's Session API.

Workload: the little-demo model of ``bench_facade_overhead.py`` (a user table of dim 32 read by
three lookups of ``user_ids`` [B, 8], an item table of dim 8 read by ``item_ids`` [B, 16], MLP
256-128, dense Adam and lazy Adam), FeatureSpec mode.

  session    the graph built by hand, ``start_asc_pipeline()``, a ``Session`` loop
  estimator  the same graph from a ``model_fn`` / ``input_fn``, ``Estimator.train`` with
             ``RunConfig``'s defaults (a log line and summaries every 100 steps, checkpoints
             every 600 s) and a ``MonitoredSession`` with the Estimator's hooks

Each variant runs in its own process, alternating which goes first; a round times ``--steps``
steps after ``--warmup`` (the Estimator's by a hook: its checkpoint at session creation and at
the end are outside the window). Result: the median over rounds of the per-round ratio
estimator/session (target >= 0.95).

    .venv/bin/python benchmarks/bench_estimator.py [--rounds 5] [--steps 120] [--write]
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

from bench_facade_overhead import (EXTRA_USER_LOOKUPS, USER_RANGE, dataset,  # noqa: E402
                                   make_data, two_head_loss)

SECTION = "## Estimator overhead (little_demo model, FeatureSpec mode)"


def build(tf, sf, specs_holder, batch, mode_is_train=True):
    """The model on sparseflow's API, from a batch dict; returns (loss, train op)."""
    from sparseflow.optimizers import lazy_adam
    specs = specs_holder["specs"]
    tables = [sf.create_table(tf.int64, dim, name, tf.compat.v1.truncated_normal_initializer(),
                              device_vocabulary_size=2 * USER_RANGE)
              for name, dim in (("user_table", 32), ("item_table", 8))]
    lookup_tables = [tables[0], tables[1]] + [tables[0]] * EXTRA_USER_LOOKUPS
    embeddings = [tf.reduce_sum(sf.sparse_lookup(t, spec, batch=batch), axis=1)
                  for spec, t in zip(specs, lookup_tables)]
    loss = two_head_loss(tf, embeddings, batch)
    dense_variables = tf.compat.v1.trainable_variables()
    train = tf.group(
        tf.compat.v1.train.AdamOptimizer(0.001).minimize(loss, var_list=dense_variables),
        lazy_adam.create_hash_optimizer(0.001).apply_gradients(
            list(zip(tf.gradients(loss, tables), tables))),
        tf.compat.v1.assign_add(tf.compat.v1.train.get_or_create_global_step(), 1))
    return loss, train


def make_specs(sf):
    specs = [sf.FeatureSpec("user_ids", table_name="user_table"),
             sf.FeatureSpec("item_ids", table_name="item_table")]
    return specs + [sf.FeatureSpec("user_ids", table_name="user_table")
                    for _ in range(EXTRA_USER_LOOKUPS)]


def session_worker(tf, sf, data, batch_size, warmup, steps) -> dict:
    from report import timed_steps
    sf.init(use_dynamic=True)
    tf.compat.v1.train.get_or_create_global_step()
    holder = {"specs": make_specs(sf)}
    iterator = tf.compat.v1.data.make_initializable_iterator(dataset(
        tf, data, batch_size, sf.get_asc_insert_func(tgt_key_specs=holder["specs"],
                                                     is_training=True)))
    loss, train = build(tf, sf, holder, iterator.get_next())
    sf.start_asc_pipeline()
    with tf.compat.v1.Session() as sess:
        sess.run([iterator.initializer, tf.compat.v1.global_variables_initializer()])
        timed = timed_steps(sess, [train, loss], warmup, steps)
    elapsed, value = timed.seconds, timed.last[1]
    return {"elapsed": elapsed, "final_loss": float(value)}


def estimator_worker(tf, sf, data, batch_size, warmup, steps) -> dict:
    from sparseflow import estimator as est
    holder = {}

    def input_fn():
        holder["specs"] = make_specs(sf)
        return dataset(tf, data, batch_size, sf.get_asc_insert_func(
            tgt_key_specs=holder["specs"], is_training=True))

    def model_fn(features, mode):
        loss, train = build(tf, sf, holder, features)
        tf.compat.v1.add_to_collection("bench_loss", loss)
        return est.EstimatorSpec(mode, loss=loss, train_op=train)

    class Timer(tf.compat.v1.train.SessionRunHook):
        def __init__(self):
            self.count, self.start, self.elapsed, self.loss = 0, None, None, None

        def begin(self):
            self._loss = tf.compat.v1.get_collection("bench_loss")[0]

        def before_run(self, run_context):
            if self.count == warmup:
                self.start = time.perf_counter()
            return tf.compat.v1.train.SessionRunArgs(self._loss)

        def after_run(self, run_context, run_values):
            self.count += 1
            if self.count == warmup + steps:
                self.elapsed = time.perf_counter() - self.start
                self.loss = float(run_values.results)

    model_dir = tempfile.mkdtemp(prefix="bench-estimator-")
    try:
        timer = Timer()
        sf.init(use_dynamic=True)
        est.Estimator(model_fn, model_dir=model_dir).train(input_fn, hooks=[timer],
                                                           steps=warmup + steps)
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)
    return {"elapsed": timer.elapsed, "final_loss": timer.loss}


def worker(variant: str, batch_size: int, warmup: int, steps: int) -> dict:
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    import sparseflow as sf
    data = make_data(warmup + steps + 1, batch_size)
    run = estimator_worker if variant == "estimator" else session_worker
    out = run(tf, sf, data, batch_size, warmup, steps)
    out["samples_per_s"] = steps * batch_size / out["elapsed"]
    out["ms_per_step"] = 1e3 * out["elapsed"] / steps
    return out


def main() -> None:
    from report import ratio_main
    out = ratio_main(__file__, __doc__.splitlines()[0], "estimator", "session", worker)
    if out is None:
        return
    ratio = out["result"]["ratio"]
    verdict = "met" if ratio >= 0.95 else "missed"
    print(f"estimator/session throughput: {ratio:.3f} (target >= 0.95: {verdict})")
    if out["args"].write:
        write_section(out["args"], out["result"], verdict, out["header"])


def write_section(args, result, verdict, header) -> None:
    from report import replace_section
    ratio, per_round, rows = result["ratio"], result["per_round"], result["rows"]
    replace_section(f"""{SECTION}

{header}

Workload: the model of the facade benchmark above (little_demo's tables and lookups, MLP 256-128, Adam and lazy Adam), batches of {args.batch} rows, FeatureSpec mode. `session` builds the graph by hand and runs a `tf.compat.v1.Session` loop; `estimator` builds the same graph from a `model_fn` and `input_fn` and runs `sparseflow.estimator.Estimator.train` with `RunConfig`'s defaults (a log line and summaries every 100 steps, checkpoints every 600 s) through `MonitoredSession` and the Estimator's hooks. {args.warmup} warm-up steps, then {args.steps} timed steps per round (the Estimator's by a hook, so its checkpoints at session creation and at the end are outside the window).

| variant | samples/s (median) | per round | ms/step (median) |
|---|---:|---|---:|
{rows}

| ratio | median | per round | target | |
|---|---:|---|---:|---|
| estimator/session | **{ratio:.3f}** | {per_round} | >= 0.95 | {verdict} |

Both variants end every round with the same loss (checked): the same graph, seeds and batches. What the Estimator adds per step is its hooks' Python (`MonitoredSession` wraps each `run` in every hook's `before_run`/`after_run`; the loss is fetched with the train op), and every 100 steps a summary and a log line.
""")


if __name__ == "__main__":
    main()
