"""SGD, Adagrad and FTRL, as a user builds them, against a numpy reference of the update rules.

The kernels are checked against TF's raw training ops in test_optimizer_kernels.py; this file
checks everything between ``create_hash_optimizer(...)`` and the kernel: which hyper-parameter
reaches which argument, each slot's initial value for a new row, lazy updates of summed
duplicate gradients, and the three row storages (host rows, device rows, a tiered table) and
the by-address path of dynamic expansion.

Each test trains one table for STEPS batches with duplicate keys under the loss
``sum(0.5 * emb**2 + a * emb)`` (``a`` a random per-batch input), so the gradient of an
occurrence is ``emb + a``: it depends on the weights, and any wrong update compounds over the
steps. The reference replays the batches in float64 numpy from the rules as TF publishes them
(``ApplyGradientDescent``, ``ApplyAdagrad``, ``ApplyFtrl`` without shrinkage) and must match
every step's loss and every key's weights and slots at the end. Every hyper-parameter is set
to a distinct, non-default value, so two of them swapped in the wiring give other numbers.
"""

import numpy as np
import pytest
import tensorflow as tf

import sparseflow as sf
from sparseflow.embed.initializers import init_rows
from sparseflow.optimizers import (adagrad, adagrad_by_addr, ftrl, gradient_descent,
                                   gradient_descent_by_addr)
from tests.pipeline_utils import make_batch_iterator, run_all, sorted_state

B, IDS, DIM, STEPS, VOCAB = 6, 3, 4, 6, 40
LOCAL_EMB, ADDRESS = "ASCEND_SPARSE_LOOKUP_LOCAL_EMB", "ASCEND_SPARSE_LOOKUP_ID_OFFSET"

# Distinct, non-default values: FTRL l1 != l2, a power other than -0.5 (the sqrt shortcut),
# initial accumulators other than TF's 0.1 and Rec SDK's 0.9.
HPARAMS = {
    "sgd": dict(learning_rate=0.3, weight_decay=0.004),
    "adagrad": dict(learning_rate=0.15, initial_accumulator_value=0.35),
    "ftrl": dict(learning_rate=0.2, learning_rate_power=-0.3, initial_accumulator_value=0.25,
                 l1_regularization_strength=0.2, l2_regularization_strength=0.07),
}
CREATE = {"sgd": gradient_descent.create_hash_optimizer, "adagrad": adagrad.create_hash_optimizer,
          "ftrl": ftrl.create_hash_optimizer}
CREATE_BY_ADDRESS = {"sgd": gradient_descent_by_addr.create_hash_optimizer_by_addr,
                     "adagrad": adagrad_by_addr.create_hash_optimizer_by_address}
SLOTS = {"sgd": (), "adagrad": ("accumulator",), "ftrl": ("accum", "linear")}


def _storage(kind, tmp_path) -> dict:
    """create_table arguments: every row on the host or the device, or a fast tier of 20 slots
    (a batch has at most 18 keys) over homes for all rows, so rows move every few steps."""
    return {
        "host": dict(device_vocabulary_size=2 * VOCAB, rows_on="host"),
        "device": dict(device_vocabulary_size=2 * VOCAB, rows_on="device"),
        "device_over_host": dict(device_vocabulary_size=20, host_vocabulary_size=2 * VOCAB,
                                 rows_on="device"),
        "host_over_disk": dict(device_vocabulary_size=10, host_vocabulary_size=10,
                               ssd_vocabulary_size=2 * VOCAB, ssd_data_path=str(tmp_path),
                               rows_on="host"),
        "by_address": dict(device_vocabulary_size=2 * VOCAB, expansion_block_rows=8),
    }[kind]


def _data(seed):
    """STEPS batches of B x IDS keys, column 0 from 5 hot keys (duplicates in every batch),
    and the loss's per-position coefficients ``a``."""
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, VOCAB, (B * STEPS, IDS)).astype(np.int64)
    keys[:, 0] = rng.integers(0, 5, B * STEPS)
    a = rng.normal(0.0, 1.0, (B * STEPS, IDS, DIM)).astype(np.float32)
    return {"f": keys, "a": a}


def _train(optimizer, kind, data, tmp_path):
    """Trains through sparseflow; returns (losses, sorted table state, init spec, stats)."""
    by_address = kind == "by_address"
    with tf.Graph().as_default():
        sf.init(use_dynamic_expansion=by_address)
        spec = sf.FeatureSpec("f", table_name="t")
        table = sf.create_table(tf.int64, DIM, "t",
                                tf.compat.v1.random_normal_initializer(stddev=0.5, seed=4),
                                **_storage(kind, tmp_path))
        it = make_batch_iterator(data, B, [spec], read_ahead=False)
        batch = it.get_next()
        emb = sf.sparse_lookup(table, spec, batch=batch)
        loss = tf.reduce_sum(0.5 * emb * emb + batch["a"] * emb)
        hparams = HPARAMS[optimizer]
        if by_address:
            addresses = tf.compat.v1.get_collection(ADDRESS)
            grads = tf.gradients(loss, tf.compat.v1.get_collection(LOCAL_EMB))
            train = CREATE_BY_ADDRESS[optimizer](**hparams).apply_gradients(
                list(zip(grads, addresses)))
        else:
            train = CREATE[optimizer](**hparams).apply_gradients(
                [(tf.gradients(loss, table)[0], table)])
        sf.start_asc_pipeline()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            losses = [l for _, l in run_all(sess, [train, loss], it)]
            state = sorted_state(table, sess)
        stats, init_spec = table.stats(), table.rows.init_spec
        sf.terminate_config_initializer()
    return np.array(losses), state, init_spec, stats


# -- the reference ------------------------------------------------------------------------------

def _sgd(w, slots, g, learning_rate, weight_decay):
    # sparseflow's documented SGD: TF's ApplyGradientDescent on g + weight_decay * w.
    w -= learning_rate * (g + weight_decay * w)


def _adagrad(w, slots, g, learning_rate, initial_accumulator_value):
    # TF ApplyAdagrad: accum += g^2; var -= lr * g / sqrt(accum).
    (accum,) = slots
    accum += g * g
    w -= learning_rate * g / np.sqrt(accum)


def _ftrl(w, slots, g, learning_rate, learning_rate_power, initial_accumulator_value,
          l1_regularization_strength, l2_regularization_strength):
    # TF ApplyFtrl (McMahan et al. 2013, FTRL-Proximal), l2_shrinkage = 0:
    #   accum_new = accum + g^2
    #   linear += g - (accum_new^-p - accum^-p) / lr * var          (p = learning_rate_power)
    #   quadratic = accum_new^-p / lr + 2 * l2
    #   var = (sign(linear) * l1 - linear) / quadratic  if |linear| > l1  else 0
    accum, linear = slots
    l1, l2, lr, power = (l1_regularization_strength, l2_regularization_strength,
                         learning_rate, learning_rate_power)
    accum_new = accum + g * g
    linear += g - (accum_new ** -power - accum ** -power) / lr * w
    quadratic = accum_new ** -power / lr + 2.0 * l2
    w[:] = np.where(np.abs(linear) > l1, (np.sign(linear) * l1 - linear) / quadratic, 0.0)
    accum[:] = accum_new


RULES = {"sgd": _sgd, "adagrad": _adagrad, "ftrl": _ftrl}


def _initial_slots(optimizer):
    """Each slot's value in a new row: the initial accumulator, FTRL's linear term 0."""
    if optimizer == "sgd":
        return ()
    accumulator = HPARAMS[optimizer]["initial_accumulator_value"]
    return (accumulator,) if optimizer == "adagrad" else (accumulator, 0.0)


def _reference(optimizer, data, init_spec):
    """Replays the batches in float64 on a dense [VOCAB, DIM] table: per step the loss, the
    summed gradient of each distinct key, one update of those keys' rows (weights and slots),
    no change to any other row. Returns (losses, weights, slots by name)."""
    init = np.zeros((VOCAB, DIM), np.float32)  # key k starts where sparseflow starts it
    init_rows(init, np.arange(VOCAB, dtype=np.int32), np.arange(VOCAB, dtype=np.int64),
              init_spec, DIM)
    w = init.astype(np.float64)
    slots = [np.full((VOCAB, DIM), v) for v in _initial_slots(optimizer)]
    losses = []
    for step in range(STEPS):
        keys = data["f"][step * B:(step + 1) * B].reshape(-1)
        a = data["a"][step * B:(step + 1) * B].reshape(-1, DIM).astype(np.float64)
        emb = w[keys]
        losses.append(np.sum(0.5 * emb * emb + a * emb))
        uniq, inverse = np.unique(keys, return_inverse=True)
        assert uniq.shape[0] < keys.shape[0]  # the batch repeats keys
        g = np.zeros((uniq.shape[0], DIM))
        np.add.at(g, inverse.reshape(-1), emb + a)  # duplicates' gradients summed
        rows_w, rows_slots = w[uniq], [s[uniq] for s in slots]
        RULES[optimizer](rows_w, rows_slots, g, **HPARAMS[optimizer])
        w[uniq] = rows_w
        for s, new in zip(slots, rows_slots):
            s[uniq] = new
    return np.array(losses), w, dict(zip(SLOTS[optimizer], slots))


# -- the tests ----------------------------------------------------------------------------------

CASES = [(opt, kind) for opt in ("sgd", "adagrad", "ftrl")
         for kind in ("host", "device", "device_over_host", "host_over_disk")]
CASES += [("sgd", "by_address"), ("adagrad", "by_address")]  # Rec SDK has no FTRL by address


@pytest.mark.parametrize("optimizer, kind", CASES)
def test_training_matches_the_numpy_reference(optimizer, kind, tmp_path):
    data = _data(seed=len(optimizer))
    losses, state, init_spec, stats = _train(optimizer, kind, data, tmp_path)
    ref_losses, ref_w, ref_slots = _reference(optimizer, data, init_spec)

    assert losses.shape == (STEPS,)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-5)
    keys = state["keys"]
    np.testing.assert_array_equal(keys, np.unique(data["f"]))
    np.testing.assert_allclose(state["weights"], ref_w[keys], rtol=1e-5, atol=1e-6)
    for name, values in ref_slots.items():
        np.testing.assert_allclose(state[name], values[keys], rtol=1e-5, atol=1e-6,
                                   err_msg=name)
    if kind in ("device_over_host", "host_over_disk"):
        assert stats["rows_swapped_out"] > 0  # the fast tier churned
    if optimizer == "ftrl":  # both sides of the l1 threshold were exercised
        assert (ref_w[keys] == 0).any() and (ref_w[keys] != 0).mean() > 0.5

