"""Helpers for tests that run the Rec SDK flow in a tf.compat.v1 Session."""

import numpy as np
import tensorflow as tf

import sparseflow as sf
from sparseflow.checkpoint.table_state import capture
from sparseflow.optimizers import lazy_adam


def make_batch_iterator(data: dict, batch_size: int, specs, is_training=True, read_ahead=True,
                        **map_kwargs):
    """Initializable iterator over ``data`` (dict of arrays) mapped through the insert func.

    ``read_ahead=False`` turns off tf.data's injected prefetch, for tests that compare the key
    state with the batches consumed so far.
    """
    ds = tf.data.Dataset.from_tensor_slices(data).batch(batch_size, drop_remainder=True)
    ds = ds.map(sf.get_asc_insert_func(tgt_key_specs=specs, is_training=is_training), **map_kwargs)
    if not read_ahead:
        options = tf.data.Options()
        options.experimental_optimization.inject_prefetch = False
        ds = ds.with_options(options)
    return tf.compat.v1.data.make_initializable_iterator(ds)


def run_all(sess, fetches, iterator=None):
    """Runs ``fetches`` until the iterator is exhausted; returns the list of results."""
    if iterator is not None:
        sess.run(iterator.initializer)
    out = []
    while True:
        try:
            out.append(sess.run(fetches))
        except tf.errors.OutOfRangeError:
            return out


def reference_lazy_adam(var, m, v, step, grad, lr, beta1=0.9, beta2=0.999, epsilon=1e-8):
    """Plain-TF lazy Adam on dense variables from an IndexedSlices gradient."""
    uniq, idx = tf.unique(grad.indices)
    g = tf.math.unsorted_segment_sum(grad.values, idx, tf.shape(uniq)[0])
    t = tf.cast(step.assign_add(1), tf.float32)
    lr_t = lr * tf.sqrt(1.0 - beta2 ** t) / (1.0 - beta1 ** t)
    m_new = beta1 * tf.gather(m, uniq) + (1.0 - beta1) * g
    v_new = beta2 * tf.gather(v, uniq) + (1.0 - beta2) * g * g
    update = lr_t * m_new / (tf.sqrt(v_new) + epsilon)
    return tf.group(var.scatter_sub(tf.IndexedSlices(update, uniq)),
                    m.scatter_update(tf.IndexedSlices(m_new, uniq)),
                    v.scatter_update(tf.IndexedSlices(v_new, uniq)))


def int_keys(rng, vocab, shape, dtype=np.int64):
    return rng.integers(0, vocab, shape).astype(dtype)


def sorted_state(table, sess=None) -> dict:
    """A table's checkpointable state (``checkpoint.table_state.capture``), sorted by key
    (``sess``: the session a device table is read through)."""
    s = capture(table, sess=sess)
    order = np.argsort(s.keys)
    state = dict(keys=s.keys[order], weights=s.weights[order], counts=s.counts[order],
                 last_seen=s.last_seen[order], counted=np.sort(s.counted_keys),
                 clock=np.int64(s.clock), steps=np.int64(s.optimizer_steps))
    state.update({name: values[order] for name, values in s.slots.items()})
    return state


def lookup_training(table, specs, data, batch_size, read_ahead=True, lr=0.1):
    """Iterator, train op (lazy Adam on sum(emb^2)) and Saver for ``table`` fed by ``data``;
    starts the pipeline. A dense variable exists so that the TF Saver has something to save."""
    it = make_batch_iterator(data, batch_size, specs, read_ahead=read_ahead)
    emb = sf.sparse_lookup(table, specs[0], batch=it.get_next())
    train = lazy_adam.create_hash_optimizer(lr).apply_gradients(
        [(tf.gradients(tf.reduce_sum(emb * emb), table)[0], table)])
    tf.compat.v1.get_variable("dense", initializer=tf.ones([2]))
    saver = sf.Saver(max_to_keep=2)
    sf.start_asc_pipeline()
    return it, train, saver


def two_table_data(seed: int, n_rows: int, v1: int, v2: int, drift: int = 0) -> dict:
    """The two-table task of the equivalence tests: f1 (4 ids) and f2 (2 ids) from a
    vocabulary of ``v1``, f3 (3 ids) from ``v2``, and labels that depend on the keys. With
    ``drift``, batch i of 32 rows shifts f1's keys by ``i * drift`` (new keys every batch)."""
    rng = np.random.default_rng(seed)
    data = {"f1": int_keys(rng, v1, (n_rows, 4)), "f2": int_keys(rng, v1, (n_rows, 2)),
            "f3": int_keys(rng, v2, (n_rows, 3))}
    if drift:
        data["f1"] += (np.arange(n_rows) // 32 * drift)[:, None]
    data["label"] = ((data["f1"][:, 0] % 3 == 0) | (data["f3"][:, 0] % 2 == 0)).astype(np.float32)
    return data


def linear_tower(pooled: list, label: tf.Tensor) -> tf.Tensor:
    """Mean logistic loss of a fixed-initialised linear layer over the concatenated pooled
    embeddings (the dense part of the equivalence tests)."""
    x = tf.concat(pooled, axis=1)
    w0 = np.random.default_rng(5).normal(0, 0.3, (int(x.shape[1]), 1)).astype(np.float32)
    w = tf.compat.v1.get_variable("w", initializer=w0)
    logit = tf.squeeze(tf.matmul(x, w), 1)
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logit))


def sgd_and_sparse_train_op(loss: tf.Tensor, sparse_optimizer, lr: float = 0.1):
    """One training op: the dense variables by plain SGD (``lr``), every table by
    ``sparse_optimizer``."""
    dense, sparse = sf.get_dense_and_sparse_variable()
    grads = tf.gradients(loss, dense + sparse)
    return tf.group(
        tf.compat.v1.train.GradientDescentOptimizer(lr).apply_gradients(
            zip(grads[:len(dense)], dense)),
        sparse_optimizer.apply_gradients(zip(grads[len(dense):], sparse)))


def train_pooled_lazy_adam(data: dict, batch_size: int, specs, tables, read_ahead=True,
                           inspect=None):
    """Trains in the current graph (after ``sf.init()`` and the tables): each spec's rows
    from ``tables[k]`` pooled by sum into :func:`linear_tower`, the dense part by SGD and
    the tables by lazy Adam (lr 0.05), over every batch of ``data``; then
    ``terminate_config_initializer``. Returns ``(losses, inspect())``, ``inspect`` (if
    given) called in the Session after the last step."""
    it = make_batch_iterator(data, batch_size, specs, read_ahead=read_ahead)
    batch = it.get_next()
    pooled = [tf.reduce_sum(sf.sparse_lookup(t, s, batch=batch), 1)
              for t, s in zip(tables, specs)]
    loss = linear_tower(pooled, batch["label"])
    train = sgd_and_sparse_train_op(loss, lazy_adam.create_hash_optimizer(0.05), 0.1)
    sf.start_asc_pipeline()
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        losses = [l for _, l in run_all(sess, [train, loss], it)]
        inspected = inspect() if inspect is not None else None
    sf.terminate_config_initializer()
    return losses, inspected


def assert_same_training(run, reference, steps: int | None = None) -> None:
    """``run`` and ``reference`` are (losses, {table: (keys, embeddings)}, ...): the same
    losses (1e-5), the same keys and embeddings."""
    losses, tables, ref_losses, ref_tables = run[0], run[1], reference[0], reference[1]
    assert len(losses) == len(ref_losses)
    if steps is not None:
        assert len(losses) == steps
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    for name, (keys, emb) in ref_tables.items():
        np.testing.assert_array_equal(tables[name][0], keys)
        np.testing.assert_allclose(tables[name][1], emb, rtol=1e-5, atol=1e-6)


def item_user_ids(seed: int = 0, n: int = 1024):
    """Raw ids of two features (``items`` [n, 3] in [0, 300), ``users`` [n] in [0, 100))
    and a label that depends on them, for the Keras layers' tests."""
    rng = np.random.default_rng(seed)
    items = rng.integers(0, 300, (n, 3)).astype(np.int64)
    users = rng.integers(0, 100, n).astype(np.int64)
    label = ((items[:, 0] % 3 == 0) | (users % 4 == 0)).astype(np.float32)
    return {"items": items, "users": users}, label


def batched(features: dict, label, batch_size: int) -> tf.data.Dataset:
    """``(features, label)`` rows in batches of ``batch_size``, for ``model.fit``."""
    return tf.data.Dataset.from_tensor_slices((features, label)).batch(batch_size)
