"""A what-if prototype for the profile of ``benchmarks/e2e.py``: sparseflow's (d) with the
per-table numpy functions fused. NOT a sparseflow API; it only measures a suggestion.

(d) runs, per step, 26 gather numpy functions (one per table), 26 TF gathers that expand the
unique rows by each feature's restore vector, their 26 segment-sum gradients, ~100 small TF
ops that slice each table's rows and restore vector out of the batch, and 26 update numpy
functions. The prototype does the same work with two numpy functions per step:

- gather: one call takes the insert function's flat rows/restore array and its sizes, and
  for every table gathers its unique rows, then expands them by the restore vector straight
  into one ``[26 * B, dim]`` output (no per-table slicing or expanding ops in the graph);
- update: one call takes that output's gradient ``[26 * B, dim]`` and, per table, sums it
  into the unique rows by the restore vector (a direct index: no hashing, no TF
  segment-sum) and applies ``apply_lazy_adam(..., assume_unique=True)`` to them.

Tables, key processing, admission, the dense model and the dense optimizer are (d)'s.
"""

from __future__ import annotations

import threading

import e2e_variants as ev
import numba
import numpy as np
import tensorflow as tf

import sparseflow as sf
from sparseflow.ops.optimizer_kernels import apply_lazy_adam


@numba.njit(nogil=True, boundscheck=False)
def gather_expand(storage, rows, restore, dim, out):
    """out[i] = storage[rows[restore[i]], :dim] (zeros where the row is -1), reading each
    unique row from the table once."""
    uniq = np.empty((rows.shape[0], dim), np.float32)
    for u in range(rows.shape[0]):
        r = rows[u]
        for j in range(dim):
            uniq[u, j] = storage[r, j] if r >= 0 else 0.0
    for i in range(restore.shape[0]):
        src = uniq[restore[i]]
        dst = out[i]
        for j in range(dim):
            dst[j] = src[j]


@numba.njit(nogil=True, boundscheck=False)
def segment_sum(grads, restore, n_unique):
    """Sums the rows of grads [n, dim] into [n_unique, dim] by restore."""
    out = np.zeros((n_unique, grads.shape[1]), np.float32)
    for i in range(restore.shape[0]):
        src = grads[i]
        dst = out[restore[i]]
        for j in range(grads.shape[1]):
            dst[j] += src[j]
    return out


def build_sparseflow_fused(data, cap, prefetch=ev.PREFETCH, take=None,
                           parallel_map=None) -> ev.Built:
    sf.init()
    try:
        specs = [sf.FeatureSpec(f, table_name=f"t_{f}", access_threshold=1)
                 for f in ev.FEATURES]
        tables = [sf.create_table(tf.int64, ev.DIM, f"t_{f}",
                                  tf.compat.v1.truncated_normal_initializer(stddev=ev.STDDEV),
                                  device_vocabulary_size=v)
                  for f, v in zip(ev.FEATURES, ev.capacities(cap))]
        ds, feed = ev.source_v1(data)
        if take is not None:
            ds = ds.take(take)
        ds = ds.map(sf.get_asc_insert_func(tgt_key_specs=specs, is_training=True),
                    num_parallel_calls=parallel_map).prefetch(prefetch)
        it, batch, get_next = ev._iterator(ds)
        plan = sf.config.runtime().insert_plans[-1]
        assert list(plan.tables) == [t.table_name for t in tables]
        flat, sizes = batch[plan.flat_key], batch[plan.sizes_key]
        n_tables, dim, b = len(tables), ev.DIM, ev.BATCH
        # A sparse optimizer bound to the tables fixes their [w | m | v] row layout.
        opt = sf.optimizers.lazy_adam.create_hash_optimizer(
            learning_rate=ev.HP["learning_rate"], beta1=ev.HP["beta1"], beta2=ev.HP["beta2"],
            epsilon=ev.HP["epsilon"], name="sparse_adam")
        for t in tables:
            t.rows.bind_optimizer(opt)

        def parts(flat, sizes):
            ends = np.cumsum(sizes[:2 * n_tables])
            starts = ends - sizes[:2 * n_tables]
            for j in range(n_tables):
                rows = flat[starts[j]:ends[j]]
                restore = flat[starts[n_tables + j]:ends[n_tables + j]]
                yield j, rows, restore

        @tf.autograph.experimental.do_not_convert
        def gather_all(flat, sizes):
            out = np.empty((n_tables * b, dim), np.float32)
            for j, rows, restore in parts(flat, sizes):
                gather_expand(tables[j].rows.allocate(), rows, restore, dim,
                              out[j * b:(j + 1) * b])
            return out

        step = [0]
        lock = threading.Lock()

        @tf.autograph.experimental.do_not_convert
        def update_all(flat, sizes, grads):
            with lock:
                step[0] += 1
                t_ = step[0]
            grads = np.ascontiguousarray(grads, np.float32)
            for j, rows, restore in parts(flat, sizes):
                summed = segment_sum(grads[j * b:(j + 1) * b], restore, rows.shape[0])
                apply_lazy_adam(tables[j].rows.allocate(), rows, summed,
                                learning_rate=ev.HP["learning_rate"], beta1=ev.HP["beta1"],
                                beta2=ev.HP["beta2"], epsilon=ev.HP["epsilon"], step=t_,
                                assume_unique=True)
                p = tables[j].processor
                with p.lock:
                    p.dirty[rows[rows >= 0]] = True
            return np.int64(t_)

        with tf.name_scope("lookup"):
            emb_all = tf.numpy_function(gather_all, [flat, sizes], tf.float32, stateful=True,
                                        name="sparseflow_gather_all")
            emb_all.set_shape([n_tables * b, dim])
            embs = tf.unstack(tf.reshape(emb_all, [n_tables, b, dim]))
        model = ev.new_model()
        loss = ev.bce(batch["label"], model(batch["dense"], embs))
        dense_vars = list(model.trainable_variables)
        grads = tf.gradients(loss, dense_vars + [emb_all])
        dense_opt = tf.compat.v1.train.AdamOptimizer(
            ev.HP["learning_rate"], ev.HP["beta1"], ev.HP["beta2"], ev.HP["epsilon"],
            name="dense_adam")
        with tf.name_scope("sparse_adam"):
            update = tf.numpy_function(update_all, [flat, sizes, grads[-1]], tf.int64,
                                       stateful=True, name="sparseflow_update_all")
        train_op = tf.group(dense_opt.apply_gradients(zip(grads[:-1], dense_vars)), update)
        sf.start_asc_pipeline()
    except BaseException:
        sf.terminate_config_initializer()
        raise

    def after_init():
        for t in tables:
            t.reserve_memory()

    return ev.Built(train_op, loss, it.initializer, feed, get_next,
                    [tf.compat.v1.global_variables_initializer()], after_init=after_init,
                    close=sf.terminate_config_initializer,
                    new_keys=lambda: sum(t.size() for t in tables), tables=tables)
