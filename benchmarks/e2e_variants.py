"""The training variants of ``benchmarks/e2e.py``: one builder per way of training the same
DLRM on the same Criteo-shaped stream, and the loops that time them.

Every graph variant is built in its own ``tf.Graph`` and run in a ``tf.compat.v1.Session``;
the TF2 variants run eagerly with a ``tf.function`` step (jit off). All of them use
``sparseflow.models.DLRM`` for the dense math and the same tf.data source (see
``source_v1`` / ``source_v2``).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf

import sparseflow as sf
from sparseflow.models.dlrm import DLRM
from sparseflow.optimizers import lazy_adam
from sparseflow.synthetic import CRITEO_CARDINALITIES, criteo_keys, key_weight

BATCH = 4096
DIM = 16
N_DENSE = 13
FEATURES = tuple(f"C{j + 1}" for j in range(len(CRITEO_CARDINALITIES)))
HP = {"learning_rate": 1e-3, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8}
PREFETCH = 2
# The first batch's time (seconds): (d) extracts every batch's timestamp, as Rec SDK jobs
# with eviction do.
T0 = 1_700_000_000
STDDEV = 0.05  # every table starts truncated-normal(0, 0.05)
TF2_STEPS_PER_CALL = 10  # d_tf2: steps per tf.function call (a tf.range loop, as TPUEmbedding's)


# ------------------------------------------------------------------------------------------
# Data
# ------------------------------------------------------------------------------------------


@dataclass
class Data:
    """Pre-generated batches: ``keys[j]`` int64 ``[N, B]`` (feature C(j+1), contiguous per
    feature), ``dense`` float32 ``[N, B, 13]``, ``label`` float32 ``[N, B, 1]``,
    ``timestamp`` int64 ``[N, B]`` (each row's time in seconds; batches move forward)."""

    keys: np.ndarray
    dense: np.ndarray
    label: np.ndarray
    timestamp: np.ndarray

    @property
    def n_batches(self) -> int:
        return self.dense.shape[0]

    def arrays(self) -> dict[str, np.ndarray]:
        out = {f: self.keys[j] for j, f in enumerate(FEATURES)}
        out["dense"] = self.dense
        out["label"] = self.label
        out["timestamp"] = self.timestamp
        return out


def make_data(n_batches: int, seed: int = 0) -> Data:
    """``n_batches`` distinct Criteo-shaped batches (``sparseflow.synthetic.criteo_keys``:
    Zipf ranks over the full Kaggle cardinalities, scattered over int64), 13 log-normal-ish
    dense features, and labels that depend on hidden per-key effects and the dense features."""
    rng = np.random.default_rng(seed)
    keys = np.empty((len(FEATURES), n_batches, BATCH), np.int64)
    for b in range(n_batches):
        keys[:, b, :] = criteo_keys(rng, BATCH).T
    dense = np.log1p(rng.exponential(4.0, (n_batches, BATCH, N_DENSE))).astype(np.float32)
    logit = -1.0 + 0.3 * (dense[..., 0] - dense[..., 1])
    for j in (0, 2, 3, 7, 11):
        logit += key_weight(keys[j], salt=j)
    label = (rng.random(logit.shape) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
    # A minute of traffic per batch, its rows' times spread over it.
    timestamp = (T0 + 60 * np.arange(n_batches, dtype=np.int64)[:, None]
                 + rng.integers(0, 60, (n_batches, BATCH)))
    return Data(keys=keys, dense=dense, label=label[..., None], timestamp=timestamp)


def source_v1(data: Data):
    """Graph-mode source: ``from_tensor_slices`` over placeholders fed once at iterator
    initialisation (no graph constants; the GraphDef stays small), repeated.

    Returns:
      (dataset, feed dict for the iterator's initializer).
    """
    arrays = data.arrays()
    phs = {k: tf.compat.v1.placeholder(tf.as_dtype(a.dtype), a.shape, name=f"src_{k}")
           for k, a in arrays.items()}
    return tf.data.Dataset.from_tensor_slices(phs).repeat(), {phs[k]: a for k, a in arrays.items()}


def source_v2(data: Data) -> tf.data.Dataset:
    """The same source eagerly (the arrays become eager tensors once)."""
    return tf.data.Dataset.from_tensor_slices(data.arrays()).repeat()


def capacities(cap: int) -> list[int]:
    """Rows per table: min(cardinality, cap)."""
    return [min(c, cap) for c in CRITEO_CARDINALITIES]


def new_model() -> DLRM:
    return DLRM(bottom_mlp=(64, 16), top_mlp=(256, 128), n_outputs=1, interaction="dot", seed=0)


def bce(labels, logits):
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))


# ------------------------------------------------------------------------------------------
# Graph-mode variants
# ------------------------------------------------------------------------------------------


@dataclass
class Built:
    """A graph variant, built: what the timing loop runs."""

    train_op: tf.Operation
    loss: tf.Tensor
    iterator_init: tf.Operation
    feed: dict
    get_next_name: str
    init_ops: list = field(default_factory=list)
    after_init: Callable[[], None] | None = None   # e.g. reserve sparseflow row memory
    close: Callable[[], None] | None = None
    new_keys: Callable[[], int] | None = None      # keys owning a row, over all tables
    tables: list = field(default_factory=list)
    sparse_opt: object = None


def _iterator(ds):
    it = tf.compat.v1.data.make_initializable_iterator(ds)
    batch = it.get_next()
    get_next = next(iter(batch.values())).op.name
    return it, batch, get_next


def _dense_train_op(loss, var_list, extra_grads=()):
    opt = tf.compat.v1.train.AdamOptimizer(HP["learning_rate"], HP["beta1"], HP["beta2"],
                                           HP["epsilon"], name="dense_adam")
    grads = tf.gradients(loss, var_list)
    return opt.apply_gradients(zip(grads, var_list))


def build_dense_ceiling(data: Data, cap: int) -> Built:
    """(a) the dense part alone: every embedding is the same constant [B, 16] tensor."""
    ds, feed = source_v1(data)
    it, batch, get_next = _iterator(ds.prefetch(PREFETCH))
    model = new_model()
    const = tf.fill([BATCH, DIM], tf.constant(0.01, tf.float32), name="const_embedding")
    loss = bce(batch["label"], model(batch["dense"], [const] * len(FEATURES)))
    train_op = _dense_train_op(loss, list(model.trainable_variables))
    return Built(train_op, loss, it.initializer, feed, get_next,
                 [tf.compat.v1.global_variables_initializer()])


def _tf_tables(cap: int, trainable: bool):
    with tf.name_scope("tables"):
        return [tf.Variable(tf.random.truncated_normal([v, DIM], stddev=STDDEV, seed=j + 1),
                            trainable=trainable, name=f"table_{f}")
                for j, (f, v) in enumerate(zip(FEATURES, capacities(cap)))]


def build_keras_adam(data: Data, cap: int) -> Built:
    """(b) plain TF: fixed-size tables (key mod vocabulary), ``tf.nn.embedding_lookup``,
    one Keras 2 Adam (``tf_keras.optimizers.legacy.Adam``) over tables and dense variables.
    Its sparse path (``_resource_apply_sparse``) decays m and v and writes w over the WHOLE
    table every step: it is not lazy."""
    import tf_keras

    ds, feed = source_v1(data)
    it, batch, get_next = _iterator(ds.prefetch(PREFETCH))
    tables = _tf_tables(cap, trainable=True)
    with tf.name_scope("lookup"):
        embs = [tf.nn.embedding_lookup(t, tf.math.floormod(batch[f], v))
                for t, f, v in zip(tables, FEATURES, capacities(cap))]
    model = new_model()
    loss = bce(batch["label"], model(batch["dense"], embs))
    var_list = list(model.trainable_variables) + tables
    opt = tf_keras.optimizers.legacy.Adam(learning_rate=HP["learning_rate"], beta_1=HP["beta1"],
                                          beta_2=HP["beta2"], epsilon=HP["epsilon"])
    grads = tf.gradients(loss, var_list)
    train_op = opt.apply_gradients(zip(grads, var_list))
    return Built(train_op, loss, it.initializer, feed, get_next,
                 [tf.compat.v1.global_variables_initializer()])


def build_tf_lazy_adam(data: Data, cap: int) -> Built:
    """(c) plain TF, same tables, hand-written lazy Adam.

    Lookup dedups first: ``tf.unique`` of ``key mod vocabulary``, gather the unique rows,
    expand with the restore vector. The table's gradient is then an ``IndexedSlices`` over the
    unique rows whose values the expand's gradient already segment-summed
    (``unsorted_segment_sum``). Update (bench_lazy_adam's fastest non-XLA formulation at dim
    16): gather m, v, w of those rows, Adam math, ``scatter_update`` of m, v and w; one step
    counter for bias correction.
    """
    ds, feed = source_v1(data)
    it, batch, get_next = _iterator(ds.prefetch(PREFETCH))
    tables = _tf_tables(cap, trainable=False)
    embs = []
    with tf.name_scope("lookup"):
        for t, f, v in zip(tables, FEATURES, capacities(cap)):
            uniq, restore = tf.unique(tf.math.floormod(batch[f], v), out_idx=tf.int32)
            embs.append(tf.gather(tf.gather(t, uniq), restore))
    model = new_model()
    loss = bce(batch["label"], model(batch["dense"], embs))
    dense_vars = list(model.trainable_variables)
    grads = tf.gradients(loss, dense_vars + tables)
    dense_opt = tf.compat.v1.train.AdamOptimizer(HP["learning_rate"], HP["beta1"], HP["beta2"],
                                                 HP["epsilon"], name="dense_adam")
    dense_op = dense_opt.apply_gradients(zip(grads[:len(dense_vars)], dense_vars))
    with tf.name_scope("lazy_adam"):
        step = tf.Variable(0.0, trainable=False, name="step")
        t_ = tf.compat.v1.assign_add(step, 1.0)
        b1, b2 = tf.constant(HP["beta1"]), tf.constant(HP["beta2"])
        lr_t = HP["learning_rate"] * tf.sqrt(1.0 - tf.pow(b2, t_)) / (1.0 - tf.pow(b1, t_))
        updates = []
        for w, g in zip(tables, grads[len(dense_vars):]):
            assert isinstance(g, tf.IndexedSlices), type(g)
            m = tf.Variable(tf.zeros(w.shape), trainable=False, name="m")
            v = tf.Variable(tf.zeros(w.shape), trainable=False, name="v")
            idx, gv = g.indices, g.values   # unique rows (tf.unique above), summed gradients
            m_t = b1 * tf.gather(m, idx) + (1.0 - b1) * gv
            v_t = b2 * tf.gather(v, idx) + (1.0 - b2) * (gv * gv)
            w_t = tf.gather(w, idx) - lr_t * m_t / (tf.sqrt(v_t) + HP["epsilon"])
            updates += [m.scatter_update(tf.IndexedSlices(m_t, idx)).op,
                        v.scatter_update(tf.IndexedSlices(v_t, idx)).op,
                        w.scatter_update(tf.IndexedSlices(w_t, idx)).op]
    train_op = tf.group(dense_op, *updates)
    return Built(train_op, loss, it.initializer, feed, get_next,
                 [tf.compat.v1.global_variables_initializer()])


def build_sparseflow(data: Data, cap: int, prefetch: int = PREFETCH, take: int | None = None,
                     parallel_map=None, reserve: bool = True) -> Built:
    """(d) sparseflow's Rec SDK flow: a FeatureSpec (access_threshold=1) and a table
    (device_vocabulary_size = min(card, cap)) per feature, a timestamp FeatureSpec (every
    key's last-seen time is refreshed, as for eviction), ``get_asc_insert_func`` in the
    dataset map (sequential, as examples/session_demo.py), ``sparse_lookup``, lazy Adam from
    ``create_hash_optimizer`` on the tables and ``tf.compat.v1.train.AdamOptimizer`` on the
    dense variables, ``start_asc_pipeline``, Session.

    ``parallel_map`` is the map's ``num_parallel_calls`` (None: sequential; ``d_par`` passes
    ``tf.data.AUTOTUNE``); ``take`` ends the stream after that many batches (the profile's
    pre-filled run);
    ``reserve`` commits the tables' row memory after start (``SparseTable.reserve_memory``),
    as the tf.Variable baselines commit theirs at initialisation, outside the timing.
    """
    sf.init()
    try:
        specs, timestamp = _sparseflow_specs()
        tables = _sparseflow_tables(cap)
        ds, feed = source_v1(data)
        if take is not None:
            ds = ds.take(take)
        ds = ds.map(sf.get_asc_insert_func(tgt_key_specs=specs + [timestamp], is_training=True),
                    num_parallel_calls=parallel_map).prefetch(prefetch)
        it, batch, get_next = _iterator(ds)
        loss, train_op, sparse_opt = _sparseflow_train(batch, tables, specs)
        sf.start_asc_pipeline()
    except BaseException:
        sf.terminate_config_initializer()
        raise

    def after_init():
        if reserve:
            for t in tables:
                t.reserve_memory()

    return Built(train_op, loss, it.initializer, feed, get_next,
                 [tf.compat.v1.global_variables_initializer()], after_init=after_init,
                 close=sf.terminate_config_initializer,
                 new_keys=lambda: sum(t.size() for t in tables), tables=tables,
                 sparse_opt=sparse_opt)


def _sparseflow_specs():
    """(d)'s FeatureSpecs: one per feature (admission at the first occurrence), and the
    batch's timestamp."""
    specs = [sf.FeatureSpec(f, table_name=f"t_{f}", access_threshold=1) for f in FEATURES]
    return specs, sf.FeatureSpec("timestamp", is_timestamp=True)


def _sparseflow_tables(cap: int) -> list:
    return [sf.create_table(tf.int64, DIM, f"t_{f}",
                            tf.compat.v1.truncated_normal_initializer(stddev=STDDEV),
                            device_vocabulary_size=v)
            for f, v in zip(FEATURES, capacities(cap))]


def _sparseflow_train(batch: dict, tables: list, specs: list, extra_ops=()):
    """(d)'s model on a processed batch: lookups, the DLRM, lazy Adam on the tables and
    ``AdamOptimizer`` on the dense variables. Returns (loss, train op, sparse optimizer)."""
    with tf.name_scope("lookup"):
        embs = [sf.sparse_lookup(t, s, is_train=True, batch=batch, name=f"lookup_{s.name}")
                for t, s in zip(tables, specs)]
    model = new_model()
    loss = bce(batch["label"], model(batch["dense"], embs))
    dense_vars, sparse_vars = sf.get_dense_and_sparse_variable()
    grads = tf.gradients(loss, dense_vars + sparse_vars)
    dense_opt = tf.compat.v1.train.AdamOptimizer(HP["learning_rate"], HP["beta1"],
                                                 HP["beta2"], HP["epsilon"], name="dense_adam")
    sparse_opt = lazy_adam.create_hash_optimizer(
        learning_rate=HP["learning_rate"], beta1=HP["beta1"], beta2=HP["beta2"],
        epsilon=HP["epsilon"], name="sparse_adam")
    train_op = tf.group(
        dense_opt.apply_gradients(zip(grads[:len(dense_vars)], dense_vars)),
        sparse_opt.apply_gradients(zip(grads[len(dense_vars):], sparse_vars)), *extra_ops)
    return loss, train_op, sparse_opt


def build_sparseflow_parallel(data: Data, cap: int, **kw) -> Built:
    """``d_par``: (d) exactly, but the insert function's map runs with
    ``num_parallel_calls=tf.data.AUTOTUNE``. Batches are then processed concurrently, so the
    order in which new keys are admitted (and get their rows) follows the processing order,
    which varies from run to run; (d)'s sequential map is the deterministic configuration."""
    kw.setdefault("parallel_map", tf.data.AUTOTUNE)
    return build_sparseflow(data, cap, **kw)


GRAPH_BUILDERS = {"a": build_dense_ceiling, "b": build_keras_adam, "c": build_tf_lazy_adam,
                  "d": build_sparseflow, "d_par": build_sparseflow_parallel}


# ------------------------------------------------------------------------------------------
# Timing
# ------------------------------------------------------------------------------------------


@dataclass
class RunResult:
    step_s: list            # untraced step wall times
    wait_s: list            # input wait of each traced step (IteratorGetNext wall time)
    traces: list            # RunMetadata of the traced steps (kept when asked)
    loss: float
    new_keys_per_step: float | None = None
    # Process CPU time (every thread: the step's ops and the key pipeline beside it) of each
    # untraced step, for the variants run_graph times; None for the others.
    cpu_s: list | None = None

    @property
    def samples_per_s(self) -> float:
        return BATCH * len(self.step_s) / sum(self.step_s)

    @property
    def step_ms(self) -> float:
        return 1e3 * sum(self.step_s) / len(self.step_s)

    @property
    def cpu_ms(self) -> float | None:
        """Mean process CPU per untraced step, core-ms (None where not measured)."""
        if not self.cpu_s:
            return None
        return 1e3 * sum(self.cpu_s) / len(self.cpu_s)

    @property
    def wait_share(self) -> float:
        """Mean input wait of the traced steps over the mean untraced step time."""
        if not self.wait_s:
            return float("nan")
        return (sum(self.wait_s) / len(self.wait_s)) / (sum(self.step_s) / len(self.step_s))


def node_times(run_metadata) -> list[tuple[str, float, float]]:
    """(node name, start us, wall us) of every node of a traced step."""
    out = []
    for dev in run_metadata.step_stats.dev_stats:
        for ns in dev.node_stats:
            out.append((ns.node_name, ns.all_start_micros, ns.all_end_rel_micros))
    return out


def input_wait_us(run_metadata, get_next_name: str) -> float:
    return sum(dur for name, _, dur in node_times(run_metadata) if name == get_next_name)


def session_config():
    return tf.compat.v1.ConfigProto()


def run_graph(builder, data: Data, cap: int, warmup: int, steps: int, trace_every: int,
              keep_traces: bool = False, hook: Callable | None = None, **build_kw) -> RunResult:
    """Builds a variant in a fresh graph and times ``steps`` untraced steps after ``warmup``;
    every ``trace_every``-th step is traced (FULL_TRACE) for the input wait and is not timed.

    ``trace_every`` 1 traces every step (profile; then ``step_s`` holds the traced steps'
    wall times). ``hook(sess, built)`` runs after the warm-up (the profile waits there).
    """
    graph = tf.Graph()
    built = None
    sess = None
    try:
        with graph.as_default():
            tf.compat.v1.set_random_seed(0)
            built = builder(data, cap, **build_kw)
            sess = tf.compat.v1.Session(graph=graph, config=session_config())
            sess.run(built.init_ops)
            if built.after_init is not None:
                built.after_init()
            sess.run(built.iterator_init, feed_dict=built.feed)
            for _ in range(warmup):
                sess.run(built.train_op)
            if hook is not None:
                hook(sess, built)
            keys0 = built.new_keys() if built.new_keys else None
            opts = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
            step_s, wait_s, traces, cpu_s = [], [], [], []
            i = 0
            n_done = 0
            while n_done < steps:
                i += 1
                traced = trace_every > 0 and i % trace_every == 0
                if traced:
                    md = tf.compat.v1.RunMetadata()
                    t0 = time.perf_counter()
                    sess.run(built.train_op, options=opts, run_metadata=md)
                    dt = time.perf_counter() - t0
                    wait_s.append(input_wait_us(md, built.get_next_name) * 1e-6)
                    if keep_traces:
                        traces.append(md)
                    if trace_every == 1:
                        step_s.append(dt)
                        n_done += 1
                else:
                    c0, t0 = time.process_time(), time.perf_counter()
                    sess.run(built.train_op)
                    step_s.append(time.perf_counter() - t0)
                    cpu_s.append(time.process_time() - c0)
                    n_done += 1
            new = None
            if built.new_keys is not None:
                new = (built.new_keys() - keys0) / i
            loss = float(sess.run(built.loss)) if hook is None else float("nan")
            return RunResult(step_s, wait_s, traces, loss, new,
                             cpu_s if trace_every != 1 else None)
    finally:
        if sess is not None:
            sess.close()
        if built is not None and built.close is not None:
            built.close()
        del built, sess, graph
        gc.collect()


def run_sparseflow_tf2(data: Data, cap: int, warmup: int, steps: int,
                       steps_per_call: int = 1) -> RunResult:
    """``d_tf2``: (d) through the TF2 API: a ``sparseflow.tf2.TableConfig`` (capacity
    min(card, cap), truncated normal 0.05) and ``FeatureConfig`` per feature, one
    ``Embedding`` with ``sparseflow.tf2.Adam`` (lazy), ``Embedding.preprocess`` in the dataset
    map (sequential), and a ``tf.function`` (jit off) taking the iterator, as TPUEmbedding's
    training loop does: ``steps_per_call`` steps in a ``tf.range`` loop, each doing next,
    enqueue, dequeue, the DLRM, ``apply_gradients`` and ``tf.compat.v1.train.AdamOptimizer``
    on the dense variables (as the Session variant). A step's time is its call's over
    ``steps_per_call``; the input wait is inside the call, not measured apart."""
    from sparseflow import tf2

    features = {f: tf2.FeatureConfig(tf2.TableConfig(
        v, DIM, tf.compat.v1.truncated_normal_initializer(stddev=STDDEV), combiner="sum",
        name=f"t_{f}")) for f, v in zip(FEATURES, capacities(cap))}
    embedding = tf2.Embedding(features, tf2.Adam(HP["learning_rate"], HP["beta1"], HP["beta2"],
                                                 HP["epsilon"]))
    embedding.reserve_memory()   # as (d) reserves its tables' memory, outside the timing
    ds = source_v2(data).map(lambda b: (embedding.preprocess({f: b[f] for f in FEATURES},
                                                             timestamp=b["timestamp"]),
                                        b["dense"], b["label"]))
    it = iter(ds.prefetch(PREFETCH))
    model = new_model()
    opt = tf.compat.v1.train.AdamOptimizer(HP["learning_rate"], HP["beta1"], HP["beta2"],
                                           HP["epsilon"])

    def one_step(iterator):
        keys, dense, label = next(iterator)
        embedding.enqueue(keys, training=True)
        with tf.GradientTape() as tape:
            activations = embedding.dequeue()
            tape.watch(activations)
            loss = bce(label, model(dense, [activations[f] for f in FEATURES]))
        var_list = list(model.trainable_variables)
        grads, act_grads = tape.gradient(loss, [var_list, activations])
        embedding.apply_gradients(act_grads)
        opt.apply_gradients(zip(grads, var_list))
        return loss

    @tf.function(jit_compile=False)
    def train(iterator, n):
        loss = tf.constant(0.0)
        for _ in tf.range(n):
            loss = one_step(iterator)
        return loss

    n = tf.constant(steps_per_call)
    for _ in range(max(1, warmup // steps_per_call)):
        train(it, n)
    step_s = []
    loss = None
    for _ in range(max(1, steps // steps_per_call)):
        t0 = time.perf_counter()
        loss = train(it, n)
        loss.numpy()
        step_s += [(time.perf_counter() - t0) / steps_per_call] * steps_per_call
    return RunResult(step_s, [], [], float(loss))


def run_sparseflow_estimator(data: Data, cap: int, warmup: int, steps: int) -> RunResult:
    """``d_est``: (d)'s graph through ``sparseflow.estimator.Estimator.train`` with
    ``RunConfig``'s defaults (a log line and summaries every 100 steps, checkpoints every
    600 s): the specs and (d)'s source and map in ``input_fn``, the tables and model in
    ``model_fn``. ``input_fn`` returns the batch of an iterator of its own, which a hook
    initialises with (d)'s feed (the Estimator's own iterator could not feed (d)'s
    placeholders), and the hook commits the tables' memory there, as (d) does. A step's time
    runs from one step's ``before_run`` to the next's: the Estimator's hooks and loop
    included."""
    import shutil
    import tempfile

    from sparseflow import estimator as est

    holder = {}

    def input_fn():
        holder["specs"], timestamp = _sparseflow_specs()
        ds, feed = source_v1(data)
        ds = ds.map(sf.get_asc_insert_func(tgt_key_specs=holder["specs"] + [timestamp],
                                           is_training=True)).prefetch(PREFETCH)
        it = tf.compat.v1.data.make_initializable_iterator(ds)
        holder["init"] = (it.initializer, feed)
        return it.get_next()

    def model_fn(features, mode):
        holder["tables"] = _sparseflow_tables(cap)
        step = tf.compat.v1.train.get_or_create_global_step()
        loss, train_op, _ = _sparseflow_train(features, holder["tables"], holder["specs"],
                                              [tf.compat.v1.assign_add(step, 1)])
        holder["loss"] = loss
        return est.EstimatorSpec(mode, loss=loss, train_op=train_op)

    class Timer(tf.compat.v1.train.SessionRunHook):
        def __init__(self):
            self.count, self.last, self.step_s, self.loss = 0, None, [], float("nan")

        def after_create_session(self, session, coord):
            op, feed = holder["init"]
            session.run(op, feed_dict=feed)
            for table in holder["tables"]:
                table.reserve_memory()

        def before_run(self, run_context):
            now = time.perf_counter()
            if self.count > warmup:
                self.step_s.append(now - self.last)
            self.last = now
            self.count += 1
            return tf.compat.v1.train.SessionRunArgs(holder["loss"])

        def after_run(self, run_context, run_values):
            self.loss = float(run_values.results)

    model_dir = tempfile.mkdtemp(prefix="e2e-estimator-")
    timer = Timer()
    sf.init()
    try:
        est.Estimator(model_fn, model_dir=model_dir).train(input_fn, hooks=[timer],
                                                           steps=warmup + steps + 1)
    finally:
        sf.terminate_config_initializer()
        shutil.rmtree(model_dir, ignore_errors=True)
        gc.collect()
    return RunResult(timer.step_s, [], [], timer.loss)


def yaml_job_text(parquet: str, cap: int, batches: int) -> str:
    """The YAML job of (d)'s workload: the batches from a Parquet file in order (no
    shuffling), the same tables (admission at the first occurrence, truncated normal 0.05),
    timestamps, DLRM and optimizers."""
    tables = "\n".join(f"  t_{f}: {{vocabulary_size: {v}}}"
                       for f, v in zip(FEATURES, capacities(cap)))
    features = "\n".join(f"  {f}: {{table: t_{f}}}" for f in FEATURES)
    adam = (f"beta1: {HP['beta1']}, beta2: {HP['beta2']}, epsilon: {HP['epsilon']!r}, "
            f"learning_rate: {HP['learning_rate']!r}")
    return f"""name: e2e
data: {{source: parquet, train: [{parquet}], shuffle_buffer: 0}}
columns:
  labels: [label]
  dense: [{", ".join(f"I{i + 1}" for i in range(N_DENSE))}]
  dense_transform: none
  sparse: [{", ".join(FEATURES)}]
  timestamp: timestamp
tables:
  defaults:
    dim: {DIM}
    initializer: {{name: truncated_normal, stddev: {STDDEV}}}
    access_threshold: 1
{tables}
features:
{features}
optimizer:
  sparse: {{name: lazy_adam, {adam}}}
  dense: {{name: adam, {adam}}}
model: {{name: dlrm, bottom_mlp: [64, 16], top_mlp: [256, 128]}}
schedule: {{batch_size: {BATCH}, max_steps: {batches}, log_every: 10}}
output: {{dir: unused, tensorboard: false}}
"""


# Record batches Arrow's scanner (the YAML job's Parquet reader streams through it)
# decodes ahead of what it hands over: pyarrow's default `batch_readahead`.
_SCANNER_READ_AHEAD = 16


def write_parquet(data: Data, path: str) -> None:
    """(d)'s batches, in order, as one Parquet file of rows, followed by as many rows again
    as the reader decodes ahead (the same batches from the start, cyclically), which no
    run reaches.

    Without those rows a run's whole file (83 batches on 2 cores) is decoded ahead during its
    warm-up, and the timed steps would never pay for decoding Parquet; with them the
    reader keeps decoding during the timed steps, as it does in a job over files longer
    than its read-ahead."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sparseflow.jobs.readers import READ_ROWS

    extra = -(-(_SCANNER_READ_AHEAD + 1) * READ_ROWS // BATCH)
    order = np.arange(data.n_batches + extra) % data.n_batches
    rows = len(order) * BATCH
    columns = {"label": data.label[order].reshape(rows)}
    for i in range(N_DENSE):
        columns[f"I{i + 1}"] = data.dense[order, :, i].reshape(rows)
    for j, f in enumerate(FEATURES):
        columns[f] = data.keys[j][order].reshape(rows)
    columns["timestamp"] = data.timestamp[order].reshape(rows)
    pq.write_table(pa.table(columns), path, row_group_size=16 * BATCH)


def build_yaml_job(data: Data, cap: int, parquet: str) -> Built:
    """``d_yaml``: (d)'s workload as a YAML job (:func:`yaml_job_text`): the job's own graph
    (``sparseflow.jobs``: its Parquet reader, its insert function's map, DLRM, optimizers),
    run by the same timing loop as the other graphs."""
    from sparseflow.jobs.graph import JobGraph
    from sparseflow.jobs.schema import parse_config

    cfg = parse_config(yaml_job_text(parquet, cap, data.n_batches))
    sf.init()
    try:
        job = JobGraph.build(cfg, training=True, evaluation=False)
    except BaseException:
        sf.terminate_config_initializer()
        raise
    get_next = next(op.name for op in tf.compat.v1.get_default_graph().get_operations()
                    if op.type.startswith("IteratorGetNext"))
    tables = list(job.tables.values())

    def after_init():
        for t in tables:
            t.reserve_memory()

    return Built(job.train_op, job.train.loss, job.train_iterator.initializer,
                 {job.train_skip: 0}, get_next, [tf.compat.v1.global_variables_initializer()],
                 after_init=after_init, close=sf.terminate_config_initializer,
                 new_keys=lambda: sum(t.size() for t in tables), tables=tables)


def run_tf2(variant: str, data: Data, cap: int, warmup: int, steps: int) -> RunResult:
    """TF2 variants: ``a_tf2`` (the dense ceiling, ``tf.compat.v1.train.AdamOptimizer`` as in
    the Session variant) and ``b_tf2`` (tables + Keras 3 ``keras.optimizers.Adam``, which is
    what ``tf.keras`` is in TF 2.21; it turns the tables' IndexedSlices gradients dense).
    Eager iterator, ``tf.function`` step (jit off); input wait = wall time of ``next(it)``."""
    it = iter(source_v2(data).prefetch(PREFETCH))
    model = new_model()
    caps = capacities(cap)
    first = next(it)
    const = tf.fill([BATCH, DIM], tf.constant(0.01, tf.float32))
    if variant == "a_tf2":
        tables = []
        opt = tf.compat.v1.train.AdamOptimizer(HP["learning_rate"], HP["beta1"], HP["beta2"],
                                               HP["epsilon"])
    else:
        import keras

        tables = [tf.Variable(tf.random.truncated_normal([v, DIM], stddev=STDDEV, seed=j + 1),
                              name=f"table_{f}") for j, (f, v) in enumerate(zip(FEATURES, caps))]
        opt = keras.optimizers.Adam(learning_rate=HP["learning_rate"], beta_1=HP["beta1"],
                                    beta_2=HP["beta2"], epsilon=HP["epsilon"])

    def forward(batch):
        if tables:
            embs = [tf.nn.embedding_lookup(t, tf.math.floormod(batch[f], v))
                    for t, f, v in zip(tables, FEATURES, caps)]
        else:
            embs = [const] * len(FEATURES)
        return bce(batch["label"], model(batch["dense"], embs))

    forward(first)  # builds the model's variables eagerly
    var_list = list(model.trainable_variables) + tables

    @tf.function(jit_compile=False)
    def step(batch):
        with tf.GradientTape() as tape:
            loss = forward(batch)
        grads = tape.gradient(loss, var_list)
        opt.apply_gradients(zip(grads, var_list))
        return loss

    for _ in range(warmup):
        step(next(it))
    step_s, wait_s = [], []
    loss = None
    for _ in range(steps):
        t0 = time.perf_counter()
        batch = next(it)
        t1 = time.perf_counter()
        loss = step(batch)
        loss.numpy()  # the step's result is ready (eager ops are async only on GPUs)
        t2 = time.perf_counter()
        step_s.append(t2 - t0)
        wait_s.append(t1 - t0)
    return RunResult(step_s, wait_s, [], float(loss))
