"""One run of benchmarks/bench_ranks.py: a Criteo-shaped model trained through one face, as
1 process or as one of N ranks (``sparseflow launch``); prints one JSON line of results.

    python benchmarks/ranks_worker.py session|estimator|tf2|keras|keras_group STEPS GLOBAL_BATCH
                                      [WORKDIR]

Workload: 26 single-hot Criteo-shaped features (Kaggle Criteo's cardinalities capped at
200,000 rows per table, so that every run fits in memory), one table each, dim 16, lazy Adam
on the tables; a 416-256-1 tower (Adam in the Session face, SGD in the TF2 face) whose
gradients are all-reduced with "sum"; loss = the local rows' sum over the global batch.
Rank r of N trains rows [r B/N, (r+1) B/N) of every global batch of B rows. Steps after the
first 3 (which trace and warm up) are timed.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from sparseflow.synthetic import CRITEO_CARDINALITIES, criteo_keys  # noqa: E402

DIM, WARMUP, CAP = 16, 3, 200_000
CARDINALITIES = [min(c, CAP) for c in CRITEO_CARDINALITIES]
HIDDEN = 256


def batches(steps: int, global_batch: int, rank: int, size: int) -> list:
    """This rank's part of each global batch: [(keys [b, 26], labels [b])], generated before
    anything is timed, as e2e.py's batches are (generated during the steps, every rank drew
    each whole global batch, ~2.5 ms of CPU a step, on its one core beside its step)."""
    rng = np.random.default_rng(0)
    local = global_batch // size
    out = []
    for _ in range(steps):
        keys = criteo_keys(rng, global_batch, CARDINALITIES)
        labels = (rng.random(global_batch) < 0.25).astype(np.float32)
        out.append((keys[rank * local:(rank + 1) * local].copy(),
                    labels[rank * local:(rank + 1) * local].copy()))
    return out


def tower_weights():
    rng = np.random.default_rng(1)
    return (rng.normal(0, 0.05, (26 * DIM, HIDDEN)).astype(np.float32),
            rng.normal(0, 0.05, (HIDDEN, 1)).astype(np.float32))


def exchange_bytes(widths: list, size: int, n_tables: int, reply_dim: int,
                   dense_params: int) -> float:
    """Mean bytes one rank sends per training step (``batch_exchange.step_bytes``): the
    exchange of the 26 tables' keys, rows (``reply_dim`` wide: a has-row flag in the Session
    face) and gradients, and a ring all-reduce of the dense gradients and the loss."""
    from sparseflow.distributed.batch_exchange import step_bytes

    return step_bytes(widths, size, n_tables, DIM, flags=reply_dim > DIM,
                      dense_parameters=dense_params + 1)


def _session_specs(sf) -> list:
    return [sf.FeatureSpec(f"c{j}", table_name=f"t{j}") for j in range(26)]


def _session_dataset(sf, specs, steps: int, global_batch: int, rank: int, size: int):
    """This rank's batches as the Session API reads them: mapped by the insert function."""
    local = global_batch // size
    data = [{**{f"c{j}": np.ascontiguousarray(keys[:, j]) for j in range(26)},
             "label": labels} for keys, labels in batches(steps, global_batch, rank, size)]

    def gen():
        yield from data

    signature = {**{f"c{j}": tf.TensorSpec([local], tf.int64) for j in range(26)},
                 "label": tf.TensorSpec([local], tf.float32)}
    ds = tf.data.Dataset.from_generator(gen, output_signature=signature)
    return ds.map(sf.get_asc_insert_func(tgt_key_specs=specs)).prefetch(2)


def _session_model(sf, specs, batch, global_batch: int):
    """The tables, the tower and their optimizers on the Session API: (train op, dense
    variables)."""
    from sparseflow.distributed import collectives
    from sparseflow.optimizers import lazy_adam

    tables = [sf.create_table(tf.int64, DIM, f"t{j}",
                              tf.compat.v1.truncated_normal_initializer(stddev=0.05),
                              device_vocabulary_size=c)
              for j, c in enumerate(CARDINALITIES)]
    x = tf.concat([sf.sparse_lookup(t, s, batch=batch) for t, s in zip(tables, specs)], 1)
    w1, w2 = tower_weights()
    w1, w2 = tf.compat.v1.get_variable("w1", initializer=w1), tf.compat.v1.get_variable(
        "w2", initializer=w2)
    loss = _tower_loss(x, w1, w2, batch["label"], global_batch)
    dense, sparse = sf.get_dense_and_sparse_variable()
    grads = tf.gradients(loss, dense + sparse)
    dense_grads = [collectives.all_reduce(g, "sum") for g in grads[:len(dense)]]
    train = tf.group(
        tf.compat.v1.train.AdamOptimizer(0.001).apply_gradients(
            zip(dense_grads, dense), global_step=tf.compat.v1.train.get_or_create_global_step()),
        lazy_adam.create_hash_optimizer(0.01).apply_gradients(zip(grads[len(dense):], sparse)))
    return train, dense


def _session_bytes(sf, size: int, dense) -> float:
    rt = sf.runtime.current()
    widths = [w for r in rt.routers.values() for w in list(r.widths)[WARMUP:]]
    n_dense = sum(int(np.prod(v.shape)) for v in dense)
    return exchange_bytes(widths, size, 26, DIM + 1, n_dense)


def _session_width(sf) -> float:
    """The mean agreed width m of the timed steps' exchanges (0.0 on one rank)."""
    rt = sf.runtime.current()
    widths = [w for r in rt.routers.values() for w in list(r.widths)[WARMUP:]]
    return float(np.mean(widths)) if widths else 0.0


def _timed_session(step, steps: int, init=None) -> float:
    """Seconds of ``steps - WARMUP`` runs of ``step`` in a Session, after ``init`` and the
    warm-up runs."""
    with tf.compat.v1.Session() as sess:
        if init is not None:
            sess.run(init)
        for _ in range(WARMUP):
            sess.run(step)
        begin = time.perf_counter()
        for _ in range(steps - WARMUP):
            sess.run(step)
        return time.perf_counter() - begin


def session(steps: int, global_batch: int, workdir: str) -> dict:
    import sparseflow as sf
    from sparseflow.distributed import collectives

    tf.compat.v1.disable_eager_execution()
    sf.init()
    rank, size = collectives.rank_and_size()
    specs = _session_specs(sf)
    ds = _session_dataset(sf, specs, steps, global_batch, rank, size)
    batch = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
    train, dense = _session_model(sf, specs, batch, global_batch)
    sf.start_asc_pipeline()
    seconds = _timed_session(train, steps, tf.compat.v1.global_variables_initializer())
    stages = {}
    for router in sf.runtime.current().routers.values():
        for stage, total in router.seconds.items():
            stages[stage] = stages.get(stage, 0.0) + 1e3 * total / steps
    return {"rank": rank, "size": size, "seconds": seconds,
            "bytes": _session_bytes(sf, size, dense), "width": _session_width(sf),
            "dense": sum(int(np.prod(v.shape)) for v in dense), "stage_ms": stages}


def estimator(steps: int, global_batch: int, workdir: str) -> dict:
    """The Session model from a ``model_fn`` / ``input_fn`` through ``Estimator.train`` (every
    rank given the same ``model_dir``), timed by a hook after the warm-up steps."""
    import sparseflow as sf
    from sparseflow import estimator as est
    from sparseflow.distributed import collectives

    tf.compat.v1.disable_eager_execution()
    rank, size = collectives.rank_and_size()
    holder = {}

    def input_fn():
        holder["specs"] = _session_specs(sf)
        return _session_dataset(sf, holder["specs"], steps, global_batch, rank, size)

    def model_fn(features, mode):
        train, holder["dense"] = _session_model(sf, holder["specs"], features, global_batch)
        return est.EstimatorSpec(mode, loss=tf.constant(0.0), train_op=train)

    class Timer(tf.compat.v1.train.SessionRunHook):
        count, started, seconds, bytes, width = 0, None, None, None, 0.0

        def before_run(self, run_context):
            if self.count == WARMUP:
                self.started = time.perf_counter()

        def after_run(self, run_context, run_values):
            self.count += 1
            if self.count == steps:
                self.seconds = time.perf_counter() - self.started
                self.bytes = _session_bytes(sf, size, holder["dense"])
                self.width = _session_width(sf)

    timer = Timer()
    sf.init()
    est.Estimator(model_fn, model_dir=os.path.join(workdir, "model")).train(
        input_fn, hooks=[timer], steps=steps)
    return {"rank": rank, "size": size, "seconds": timer.seconds, "bytes": timer.bytes,
            "width": timer.width,
            "dense": sum(int(np.prod(v.shape)) for v in holder["dense"])}


def _timed_run(strategy, replica_step, ds, steps: int) -> float:
    """Seconds of the steps after the warm-up, each ``strategy.run(replica_step, batch)``
    in one ``tf.function`` (the routed buffers' widths change every step: one trace for all
    of them)."""
    @tf.function(reduce_retracing=True)
    def step(*batch):
        return strategy.run(replica_step, args=batch)

    it = iter(ds)
    for _ in range(WARMUP):
        step(*next(it))
    begin = time.perf_counter()
    for _ in range(steps - WARMUP):
        step(*next(it))
    return time.perf_counter() - begin


def _tower_loss(x, w1, w2, labels, global_batch: int):
    """The 416-256-1 tower's loss: the local rows' sum over the global batch."""
    logit = tf.squeeze(tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w2), 1)
    return tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(
        labels=labels, logits=logit)) / global_batch


def _raw_ids(steps: int, global_batch: int, ranks, preprocess=None) -> tf.data.Dataset:
    """This rank's batches of raw ids ``[b, 26]`` and labels, mapped by ``preprocess`` (the
    TF2 face's key processing in the pipeline; None for the Keras faces, whose layers process
    the ids in the step), prefetched."""
    local = global_batch // ranks.size
    data = batches(steps, global_batch, ranks.rank, ranks.size)

    def gen():
        yield from data

    ds = tf.data.Dataset.from_generator(gen, output_signature=(
        tf.TensorSpec([local, 26], tf.int64), tf.TensorSpec([local], tf.float32)))
    return (ds if preprocess is None else ds.map(preprocess)).prefetch(2)


def _one_exchange_result(embedding, ranks, seconds: float, dense: tuple) -> dict:
    """The result of a face whose 26 tables are one ``tf2.Embedding`` (one exchange a step):
    its agreed widths after the warm-up give the bytes one rank sends."""
    sharding = embedding._sharding   # noqa: SLF001 -- the benchmark reads the widths
    widths = list(sharding.router.widths)[WARMUP:] if sharding is not None else []
    n_dense = int(sum(v.shape.num_elements() for v in dense))
    return {"rank": ranks.rank, "size": ranks.size, "seconds": seconds,
            "bytes": exchange_bytes(widths, ranks.size, 26, DIM, n_dense),
            "width": float(np.mean(widths)) if widths else 0.0, "dense": n_dense}


def tf2_face(steps: int, global_batch: int, workdir: str) -> dict:
    from sparseflow import tf2
    from sparseflow.distributed.ranks import detect

    ranks = detect()
    strategy = (tf.distribute.MultiWorkerMirroredStrategy() if ranks.size > 1
                else tf.distribute.get_strategy())
    init = tf.compat.v1.truncated_normal_initializer(stddev=0.05)
    features = {f"c{j}": tf2.FeatureConfig(tf2.TableConfig(c, DIM, initializer=init,
                                                           name=f"t{j}"), name=f"c{j}")
                for j, c in enumerate(CARDINALITIES)}
    with strategy.scope():
        embedding = tf2.Embedding(features, tf2.Adam(0.01))
    w1, w2 = (tf.Variable(w) for w in tower_weights())
    ds = _raw_ids(steps, global_batch, ranks, preprocess=lambda k, y: (
        embedding.preprocess({f"c{j}": k[:, j] for j in range(26)}), y))

    def replica_step(batch, labels):
        embedding.enqueue(batch)
        with tf.GradientTape() as tape:
            acts = embedding.dequeue()
            tape.watch(acts)
            x = tf.concat([acts[f"c{j}"] for j in range(26)], 1)
            loss = _tower_loss(x, w1, w2, labels, global_batch)
        grads, g1, g2 = tape.gradient(loss, [acts, w1, w2])
        embedding.apply_gradients(grads)
        g1, g2 = tf.distribute.get_replica_context().all_reduce("sum", [g1, g2])
        w1.assign_sub(0.01 * g1)
        w2.assign_sub(0.01 * g2)
        return loss

    seconds = _timed_run(strategy, replica_step, ds, steps)
    return _one_exchange_result(embedding, ranks, seconds, (w1, w2))


def keras_face(steps: int, global_batch: int, workdir: str) -> dict:
    """One ``sparseflow.keras.SparseEmbedding`` layer per table (each its own lazy Adam,
    applied in the backward pass) in the same custom loop as the TF2 face."""
    from sparseflow import tf2
    from sparseflow.distributed.ranks import detect
    from sparseflow.keras import SparseEmbedding

    ranks = detect()
    strategy = (tf.distribute.MultiWorkerMirroredStrategy() if ranks.size > 1
                else tf.distribute.get_strategy())
    init = tf.compat.v1.truncated_normal_initializer(stddev=0.05)
    with strategy.scope():
        layers = [SparseEmbedding(c, DIM, initializer=init, optimizer=tf2.Adam(0.01),
                                  combiner="sum", name=f"t{j}")
                  for j, c in enumerate(CARDINALITIES)]
    w1, w2 = (tf.Variable(w) for w in tower_weights())
    ds = _raw_ids(steps, global_batch, ranks)

    def replica_step(keys, labels):
        with tf.GradientTape() as tape:
            x = tf.concat([layer(keys[:, j:j + 1], training=True)
                           for j, layer in enumerate(layers)], 1)
            loss = _tower_loss(x, w1, w2, labels, global_batch)
        anchors = [layer.anchor for layer in layers]
        grads = tape.gradient(loss, [w1, w2] + anchors)   # the anchors' apply the tables'
        g1, g2 = tf.distribute.get_replica_context().all_reduce("sum", grads[:2])
        w1.assign_sub(0.01 * g1)
        w2.assign_sub(0.01 * g2)
        return loss

    seconds = _timed_run(strategy, replica_step, ds, steps)
    widths = []
    for layer in layers:
        sharding = layer.embedding._sharding   # noqa: SLF001 -- the benchmark reads the widths
        if sharding is not None:
            widths.append(list(sharding.router.widths)[WARMUP:])
    # Each layer exchanges its own table: 26 exchanges of one table a step.
    n_dense = int(w1.shape.num_elements() + w2.shape.num_elements())
    per_layer = [exchange_bytes(w, ranks.size, 1, DIM, 0) for w in widths]
    others = ranks.size - 1
    dense_bytes = 2.0 * others / ranks.size * n_dense * 4
    return {"rank": ranks.rank, "size": ranks.size, "seconds": seconds,
            "bytes": float(sum(per_layer)) + dense_bytes,
            "width": float(np.mean([np.mean(w) for w in widths if w])) if widths else 0.0,
            "dense": n_dense}


def keras_group_face(steps: int, global_batch: int, workdir: str) -> dict:
    """One ``sparseflow.keras.DistributedEmbedding`` layer holding the 26 tables (one lazy
    Adam, applied in the backward pass; one exchange a step) in the same custom loop as the
    TF2 face; ids processed in the layer, as ``keras_face``'s layers do."""
    from sparseflow import tf2
    from sparseflow.distributed.ranks import detect
    from sparseflow.keras import DistributedEmbedding

    ranks = detect()
    strategy = (tf.distribute.MultiWorkerMirroredStrategy() if ranks.size > 1
                else tf.distribute.get_strategy())
    init = tf.compat.v1.truncated_normal_initializer(stddev=0.05)
    features = {f"c{j}": tf2.FeatureConfig(tf2.TableConfig(c, DIM, initializer=init,
                                                           combiner="sum", name=f"t{j}"))
                for j, c in enumerate(CARDINALITIES)}
    with strategy.scope():
        layer = DistributedEmbedding(features, optimizer=tf2.Adam(0.01), name="tables")
    w1, w2 = (tf.Variable(w) for w in tower_weights())
    ds = _raw_ids(steps, global_batch, ranks)

    def replica_step(keys, labels):
        with tf.GradientTape() as tape:
            acts = layer({f"c{j}": keys[:, j:j + 1] for j in range(26)}, training=True)
            x = tf.concat([acts[f"c{j}"] for j in range(26)], 1)
            loss = _tower_loss(x, w1, w2, labels, global_batch)
        grads = tape.gradient(loss, [w1, w2, layer.anchor])   # the anchor's applies the tables
        g1, g2 = tf.distribute.get_replica_context().all_reduce("sum", grads[:2])
        w1.assign_sub(0.01 * g1)
        w2.assign_sub(0.01 * g2)
        return loss

    seconds = _timed_run(strategy, replica_step, ds, steps)
    return _one_exchange_result(layer.embedding, ranks, seconds, (w1, w2))


def exchange_face(steps: int, global_batch: int, workdir: str) -> dict:
    """Only the collectives of a face's training step, on buffers of the widths that face
    measured (environment: ``SF_BENCH_WIDTH`` the mean agreed width m of one exchange,
    ``SF_BENCH_REPLY`` the reply's floats per key (17 with the Session faces' has-row flag,
    else 16), ``SF_BENCH_EXCHANGES`` exchanges per step (1; the Keras face: 26, one per
    table), ``SF_BENCH_DENSE`` dense parameters all-reduced): per exchange, as
    ``BatchExchange`` runs them, the counts' all-to-all (which carries the width agreement),
    the keys' all-to-all, the rows' all-to-all back, then the gradients' all-to-all; then the
    dense gradients' all-reduce. Nothing else runs: the step's time is the exchange's time."""
    import sparseflow as sf
    from sparseflow.distributed import collectives, graph_world
    from sparseflow.distributed.sharding import PAD_KEY

    tf.compat.v1.disable_eager_execution()
    sf.init()
    rank, size = collectives.rank_and_size()
    width = int(round(float(os.environ["SF_BENCH_WIDTH"])))
    if width < 1:
        raise ValueError(f"SF_BENCH_WIDTH must be >= 1 (the width a 2-rank run measured); "
                         f"received {os.environ['SF_BENCH_WIDTH']!r}")
    reply_width = int(os.environ.get("SF_BENCH_REPLY", DIM + 1))
    n_exchanges = int(os.environ.get("SF_BENCH_EXCHANGES", "1"))
    dense = int(os.environ.get("SF_BENCH_DENSE", "0"))
    tables = 26 // n_exchanges
    ex = graph_world.current().exchange(tf.compat.v1.get_default_graph())
    done = []
    for _ in range(n_exchanges):
        send = tf.fill([size, width, 2], tf.constant(PAD_KEY, tf.int64))
        counts = tf.fill([size, tables], width // tables)
        received, _, _, rung = ex.all_to_all_dynamic(send, counts, PAD_KEY,
                                                     tf.constant(0, tf.int64),
                                                     with_rung=True)
        m = tf.shape(received)[1]
        back = ex.all_to_all(tf.zeros(tf.stack([size, m, reply_width])), rung=rung)
        with tf.control_dependencies([back]):
            grads = ex.all_to_all(tf.zeros(tf.stack([size, m, DIM])), rung=rung)
        done += [back, grads]
    with tf.control_dependencies(done[::2]):   # after the rows came back, as the backward
        reduced = collectives.all_reduce(tf.zeros([dense])) if dense else tf.constant(0.0)
    seconds = _timed_session(tf.group(*done, reduced), steps)
    return {"rank": rank, "size": size, "seconds": seconds, "bytes": 0.0, "width": width}


FACES = {"session": session, "estimator": estimator, "tf2": tf2_face, "keras": keras_face,
         "keras_group": keras_group_face, "exchange": exchange_face}

if __name__ == "__main__":
    face, steps, global_batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    workdir = sys.argv[4] if len(sys.argv) > 4 else "."
    result = FACES[face](steps, global_batch, workdir)
    result.update(face=face, steps=steps - WARMUP, global_batch=global_batch)
    print("RESULT " + json.dumps(result), flush=True)
