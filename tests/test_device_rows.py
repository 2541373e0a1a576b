"""DeviceRows: TF-variable rows whose gather and lazy updates match the host kernels."""

import numpy as np
import pytest
import tensorflow as tf

from sparseflow.embed.device_rows import DeviceRows, default_device
from sparseflow.ops.optimizer_kernels import (apply_adagrad, apply_ftrl, apply_lazy_adam,
                                               apply_sgd)

CAP, DIM = 40, 6


def _host_storage(rng, n_slots, slot_value=0.0):
    storage = np.full((CAP, DIM * (1 + n_slots)), slot_value, np.float32)
    storage[:, :DIM] = rng.normal(size=(CAP, DIM)).astype(np.float32)
    if n_slots == 2:  # Adam's velocity must be >= 0
        storage[:, DIM:] = np.abs(rng.normal(size=(CAP, 2 * DIM))).astype(np.float32)
    return storage


def _steps(rng, n=5):
    for _ in range(n):
        rows = rng.choice(CAP, 12, replace=False).astype(np.int32)
        rows[[2, 7]] = -1  # unadmitted keys: skipped
        yield rows, rng.normal(size=(12, DIM)).astype(np.float32)


@pytest.mark.parametrize("optimizer", ["adam", "sgd", "sgd_decay", "adagrad", "ftrl",
                                       "ftrl_power"])
def test_updates_match_the_host_kernels(graph, optimizer):
    rng = np.random.default_rng(1)
    slots = {"adam": ("momentum", "velocity"), "adagrad": ("accumulator",)}.get(optimizer, ())
    if optimizer.startswith("ftrl"):
        slots = ("accum", "linear")
    storage = _host_storage(rng, len(slots), 0.1 if optimizer == "adagrad" else 0.0)
    if optimizer.startswith("ftrl"):  # accum > 0
        storage[:, DIM:2 * DIM] = 0.1 + np.abs(storage[:, DIM:2 * DIM])
    ftrl_hp = dict(learning_rate_power=-0.5 if optimizer == "ftrl" else -0.7, l1=0.01, l2=0.02)
    dev = DeviceRows("t", CAP, DIM, slots, [0.0] * len(slots))
    rows_ph = tf.compat.v1.placeholder(tf.int32, [None])
    grads_ph = tf.compat.v1.placeholder(tf.float32, [None, DIM])
    step_ph = tf.compat.v1.placeholder(tf.int64, [])
    hp = dict(learning_rate=0.05)
    if optimizer == "adam":
        update = dev.apply_lazy_adam(rows_ph, grads_ph, step_ph, beta1=0.9, beta2=0.999,
                                     epsilon=1e-8, **hp)
    elif optimizer == "adagrad":
        update = dev.apply_adagrad(rows_ph, grads_ph, **hp)
    elif optimizer.startswith("ftrl"):
        update = dev.apply_ftrl(rows_ph, grads_ph, **ftrl_hp, **hp)
    else:
        update = dev.apply_sgd(rows_ph, grads_ph, weight_decay=1e-3 if "decay" in optimizer
                               else None, **hp)
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        dev.write(sess, np.arange(CAP), storage)
        for step, (rows, grads) in enumerate(_steps(rng), start=1):
            sess.run(update, {rows_ph: rows, grads_ph: grads, step_ph: step})
            if optimizer == "adam":
                apply_lazy_adam(storage, rows, grads, step=step, beta1=0.9, beta2=0.999,
                                epsilon=1e-8, **hp)
            elif optimizer == "adagrad":
                apply_adagrad(storage, rows, grads, **hp)
            elif optimizer.startswith("ftrl"):
                apply_ftrl(storage, rows, grads, **ftrl_hp, **hp)
            else:
                apply_sgd(storage, rows, grads, weight_decay=1e-3 if "decay" in optimizer
                          else 0.0, **hp)
        np.testing.assert_allclose(dev.read(sess, np.arange(CAP)), storage, rtol=1e-5,
                                   atol=1e-6)


def test_gather_zeros_for_minus_one_and_initialize_resets_slots(graph):
    dev = DeviceRows("t", CAP, DIM, ("momentum", "velocity"), (0.0, 0.0))
    rows = tf.constant([3, -1, 5], tf.int32)
    new_rows = tf.constant([3, 5], tf.int32)
    init = dev.initialize(new_rows, tf.fill([2, DIM], 2.0))
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        dev.write(sess, np.array([3, 5]), np.full((2, 3 * DIM), 7.0, np.float32))
        sess.run(init)
        values = sess.run(dev.gather(rows))
        stored = dev.read(sess, np.array([3, 5]))
    np.testing.assert_array_equal(values, [[2.0] * DIM, [0.0] * DIM, [2.0] * DIM])
    np.testing.assert_array_equal(stored[:, :DIM], 2.0)
    np.testing.assert_array_equal(stored[:, DIM:], 0.0)  # an evicted row's slots do not survive


def test_write_checks_the_layout(graph):
    dev = DeviceRows("t", CAP, DIM)
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        with pytest.raises(ValueError, match="width 6"):
            dev.write(sess, np.array([1]), np.zeros((1, 12), np.float32))


def test_default_device_is_the_cpu_without_a_gpu():
    expected = "/GPU:0" if tf.config.list_physical_devices("GPU") else "/CPU:0"
    assert default_device() == expected


def test_slots_bound_after_an_initialize_are_reset_by_it(graph):
    # The lookups (which build initialize) come before the optimizer (which binds the slots).
    dev = DeviceRows("t", CAP, DIM)
    rows = tf.compat.v1.placeholder(tf.int32, [None])
    init = dev.initialize(rows, tf.fill([tf.shape(rows)[0], DIM], 2.0))
    dev.bind_slots(("momentum", "velocity"), (0.0, 0.5))
    assert dev.width == 3 * DIM
    with pytest.raises(ValueError, match=r"already has optimizer slots \['momentum', "
                                         r"'velocity'\]; received \['accumulator'\]"):
        dev.bind_slots(("accumulator",), (0.1,))
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        dev.write(sess, np.array([4, 9]), np.full((2, 3 * DIM), 7.0, np.float32))
        sess.run(init, {rows: [4]})
        stored = dev.read(sess, np.array([4, 9]))
        dev.reset(sess)
        assert not dev.read(sess, np.array([9])).any()
    np.testing.assert_array_equal(stored[0], [2.0] * DIM + [0.0] * DIM + [0.5] * DIM)
    np.testing.assert_array_equal(stored[1], 7.0)   # another row: untouched
