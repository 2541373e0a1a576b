"""Device-resident rows of one table: weights and optimizer slots in ``tf.Variable``s.

The host rows (``host_rows.py``) keep every row in one numpy array that numba kernels read and
update. A device table keeps its rows where TensorFlow computes — on the accelerator when one
is visible — and gathers and updates them with TF ops, so embeddings never cross the
host/device boundary. The key processor still maps keys to rows on the host; what a device
table needs from it per batch is the unique rows and, for rows that were just assigned, their
initial values (drawn on the host, per key, exactly as host rows draw them).

Every op here is built once per graph (placeholders where values vary), so a finalized graph
(``MonitoredTrainingSession``) can still checkpoint and restore the rows.

Placement rule (:func:`default_device`): the first GPU when TensorFlow sees one, else the CPU.
On a CPU-only machine host rows are the faster choice (numba kernels, no TF op overhead per
table), which is why tables default to host rows there.
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf


def default_device() -> str:
    """``"/GPU:0"`` when TensorFlow sees a GPU, else ``"/CPU:0"``."""
    return "/GPU:0" if tf.config.list_physical_devices("GPU") else "/CPU:0"


class DeviceRows:
    """Rows ``[capacity, dim]`` and one ``[capacity, dim]`` variable per optimizer slot.

    Args:
      name: the table's name (variable names derive from it).
      capacity: rows, >= 1.
      dim: embedding width, >= 1.
      slot_names: the optimizer's slots, in order (e.g. ``("momentum", "velocity")``).
      slot_values: each slot's value in a new row.
      device: where the variables live; default :func:`default_device`.

    Build it inside the graph that trains the table.
    """

    def __init__(self, name: str, capacity: int, dim: int, slot_names=(), slot_values=(),
                 device: str | None = None):
        self.name = name
        self.capacity = int(capacity)
        self.dim = int(dim)
        self.slot_names = tuple(slot_names)
        self.slot_values = tuple(float(v) for v in slot_values)
        self.device = device or default_device()
        with tf.device(self.device), tf.compat.v1.variable_scope(None, f"{name}_device_rows"):
            self.weights = tf.Variable(tf.zeros([self.capacity, self.dim]), trainable=False,
                                       name="weights")
            self.slots = [tf.Variable(tf.zeros([self.capacity, self.dim]), trainable=False,
                                      name=slot) for slot in self.slot_names]
        self._read_rows = tf.compat.v1.placeholder(tf.int32, [None], f"{name}_read_rows")
        self._read = [tf.gather(v, self._read_rows) for v in self.variables]
        self._write_rows = tf.compat.v1.placeholder(tf.int32, [None], f"{name}_write_rows")
        self._write_values = [tf.compat.v1.placeholder(tf.float32, [None, self.dim])
                              for _ in self.variables]
        self._write = tf.group(*[tf.compat.v1.scatter_update(v, self._write_rows, x)
                                 for v, x in zip(self.variables, self._write_values)])

    @property
    def variables(self) -> list:
        """The weights variable, then each slot's."""
        return [self.weights, *self.slots]

    # -- graph ops -----------------------------------------------------------------------

    def gather(self, rows: tf.Tensor) -> tf.Tensor:
        """float32 ``[len(rows), dim]``: the weights of ``rows`` (int32), zeros where < 0."""
        valid = rows >= 0
        with tf.device(self.device):
            values = tf.gather(self.weights, tf.maximum(rows, 0))
        return tf.where(tf.expand_dims(valid, 1), values, tf.zeros_like(values))

    def initialize(self, rows: tf.Tensor, weights: tf.Tensor) -> tf.Operation:
        """Writes new rows: ``weights`` (float32 ``[n, dim]``) and every slot's initial value.

        ``rows`` (int32 ``[n]``) must be distinct and >= 0: rows the key processor just
        assigned (fresh, or reused after an eviction, whose old slots must not survive).
        """
        ops = [tf.compat.v1.scatter_update(self.weights, rows, weights)]
        for slot, value in zip(self.slots, self.slot_values):
            ops.append(tf.compat.v1.scatter_update(
                slot, rows, tf.fill([tf.shape(rows)[0], self.dim], value)))
        return tf.group(*ops)

    def apply_lazy_adam(self, rows: tf.Tensor, grads: tf.Tensor, step: tf.Tensor, *,
                        learning_rate: float, beta1: float, beta2: float,
                        epsilon: float) -> tf.Operation:
        """Lazy Adam on ``rows`` (int32 ``[U]``, distinct; -1 skipped) with ``grads``
        (float32 ``[U, dim]``) at ``step`` (int64 scalar, 1-based), as
        ``ops.optimizer_kernels.apply_lazy_adam`` computes it on host rows."""
        if self.slot_names != ("momentum", "velocity"):
            raise ValueError(f"Table `{self.name}` has slots {list(self.slot_names)}; lazy Adam "
                             "needs ['momentum', 'velocity'].")
        keep = tf.where(rows >= 0)[:, 0]
        rows, grads = tf.gather(rows, keep), tf.gather(grads, keep)
        m_var, v_var = self.slots
        b1, b2 = np.float32(beta1), np.float32(beta2)
        # As the host kernel: betas rounded to float32, powers in float64, rounded once.
        t = tf.cast(step, tf.float64)
        one = tf.constant(1.0, tf.float64)
        b1_t = tf.pow(tf.constant(float(b1), tf.float64), t)
        b2_t = tf.pow(tf.constant(float(b2), tf.float64), t)
        lr_t = tf.cast(learning_rate * tf.sqrt(one - b2_t) / (one - b1_t), tf.float32)
        with tf.device(self.device):
            m = b1 * tf.gather(m_var, rows) + (np.float32(1.0) - b1) * grads
            v = b2 * tf.gather(v_var, rows) + (np.float32(1.0) - b2) * (grads * grads)
            w = tf.gather(self.weights, rows) - lr_t * m / (tf.sqrt(v) + np.float32(epsilon))
            return tf.group(tf.compat.v1.scatter_update(m_var, rows, m),
                            tf.compat.v1.scatter_update(v_var, rows, v),
                            tf.compat.v1.scatter_update(self.weights, rows, w))

    def apply_sgd(self, rows: tf.Tensor, grads: tf.Tensor, *, learning_rate: float,
                  weight_decay: float | None = None) -> tf.Operation:
        """SGD on ``rows`` (distinct; -1 skipped), with optional weight decay
        (``w -= lr * (g + weight_decay * w)``, as the host kernel)."""
        keep = tf.where(rows >= 0)[:, 0]
        rows, grads = tf.gather(rows, keep), tf.gather(grads, keep)
        with tf.device(self.device):
            w = tf.gather(self.weights, rows)
            if weight_decay:
                grads = grads + np.float32(weight_decay) * w
            return tf.compat.v1.scatter_update(self.weights, rows,
                                               w - np.float32(learning_rate) * grads).op

    def apply_adagrad(self, rows: tf.Tensor, grads: tf.Tensor, *,
                      learning_rate: float) -> tf.Operation:
        """Adagrad on ``rows`` (distinct; -1 skipped): ``acc += g^2; w -= lr * g / sqrt(acc)``."""
        keep = tf.where(rows >= 0)[:, 0]
        rows, grads = tf.gather(rows, keep), tf.gather(grads, keep)
        (acc_var,) = self.slots
        with tf.device(self.device):
            acc = tf.gather(acc_var, rows) + grads * grads
            w = tf.gather(self.weights, rows) - np.float32(learning_rate) * grads / tf.sqrt(acc)
            return tf.group(tf.compat.v1.scatter_update(acc_var, rows, acc),
                            tf.compat.v1.scatter_update(self.weights, rows, w))

    # -- host side: checkpoints and swapping ---------------------------------------------

    def read(self, sess, rows: np.ndarray) -> np.ndarray:
        """float32 ``[len(rows), dim * (1 + n_slots)]``: ``[weights | slots]`` of ``rows``,
        the host rows' layout (what checkpoints and the host tier store)."""
        rows = np.ascontiguousarray(rows, np.int32)
        if rows.shape[0] == 0:
            return np.zeros((0, self.dim * len(self.variables)), np.float32)
        parts = sess.run(self._read, {self._read_rows: rows})
        return np.ascontiguousarray(np.concatenate(parts, axis=1))

    def write(self, sess, rows: np.ndarray, values: np.ndarray) -> None:
        """Writes ``values`` (host layout ``[n, dim * (1 + n_slots)]``) into ``rows``."""
        rows = np.ascontiguousarray(rows, np.int32)
        if rows.shape[0] == 0:
            return
        values = np.asarray(values, np.float32)
        if values.shape != (rows.shape[0], self.dim * len(self.variables)):
            raise ValueError(f"Table `{self.name}`: values of shape {values.shape} do not fit "
                             f"{rows.shape[0]} rows of width {self.dim * len(self.variables)}.")
        feed = {self._write_rows: rows}
        for i, placeholder in enumerate(self._write_values):
            feed[placeholder] = values[:, i * self.dim:(i + 1) * self.dim]
        sess.run(self._write, feed)


def bias_corrected_rate(learning_rate: float, beta1: float, beta2: float, step: int) -> float:
    """Adam's step size at ``step`` as the host kernel computes it (for tests and callers
    that precompute it)."""
    b1, b2 = float(np.float32(beta1)), float(np.float32(beta2))
    return learning_rate * math.sqrt(1.0 - b2 ** step) / (1.0 - b1 ** step)
