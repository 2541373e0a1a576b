"""Device-resident rows of one table: weights and optimizer slots in ``tf.Variable``s.

The host rows (``host_rows.py``) keep every row in one numpy array that numba kernels read and
update. A device table (``create_table(..., rows_on="device")``) keeps its rows where
TensorFlow computes — on the accelerator when one is visible — and gathers and updates them
with TF ops, so embeddings never cross the host/device boundary. The key processor still maps
keys to rows on the host; what a device table needs from it per batch is the unique rows and,
for rows that were just assigned, their initial values (drawn on the host, per key, exactly as
host rows draw them), which wait in a :class:`~sparseflow.embed.pending_rows.PendingRows`
until the next training step writes them.

Two classes:

- :class:`DeviceRows`: the variables of one table in one graph and the TF ops over them.
  The weights exist from the start; the optimizer's slots are added
  when the sparse optimizer binds (:meth:`DeviceRows.bind_slots`), which happens after the
  lookups that gather the weights were built. The host-side read / write / reset ops are built
  once (:meth:`DeviceRows.build_io`, from ``start_asc_pipeline``) so that a finalized graph
  (``MonitoredTrainingSession``) can still checkpoint and restore the rows.
- :class:`DeviceTableRows`: what a :class:`~sparseflow.table.SparseTable` with device rows
  holds in place of ``HostRows``: the slot layout, the bound optimizer, the pending rows, the
  key processor's row-initialisation callback, and the session resolution for host-side reads.

Placement rule (:func:`default_device`): the first GPU when TensorFlow sees one, else the CPU.
On a CPU-only machine host rows are the faster choice (numba kernels, no TF op overhead per
table), which is why tables default to host rows there (``sparseflow.table.default_rows_on``).
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import tensorflow as tf

from sparseflow.embed.initializers import InitSpec, init_rows
from sparseflow.embed.pending_rows import PendingRows
from sparseflow.ops import init_kernels
from sparseflow.pipeline.graph_cache import graph_cache

# Every variable a DeviceRows creates. sparseflow.Saver leaves them out of the dense TF
# checkpoint: the sparse checkpoint holds the rows by key, in the host layout.
DEVICE_ROWS_COLLECTION = "SPARSEFLOW_DEVICE_ROWS_VARIABLES"


def default_device() -> str:
    """``"/GPU:0"`` when TensorFlow sees a GPU, else ``"/CPU:0"``."""
    return "/GPU:0" if tf.config.list_physical_devices("GPU") else "/CPU:0"


def add_control_input(op: tf.Operation, dependency: tf.Operation) -> None:
    """Makes ``op`` run after ``dependency`` (TF's private Operation._add_control_input,
    wrapped here so that a TF upgrade breaks one place and one test). Only before a session
    has run ``op``."""
    op._add_control_input(dependency)  # noqa: SLF001


def when_laid_out(members: list, build) -> tf.Operation:
    """A gate op that runs after ``build()`` (a tensor or op; None: nothing to wait for),
    built once the slot layout of every one of ``members`` (:class:`DeviceRows` of one
    graph) is fixed: now if their host-side ops exist, else by the last of their
    :meth:`DeviceRows.build_io` (``start_asc_pipeline``), which attaches it to the gate. A lookup built before the sparse
    optimizer (whose slots the ops must move too) waits on the gate."""
    graph = members[0].graph
    waiting = [m for m in members if not m.io_built]
    with graph.as_default(), graph.name_scope(None), tf.control_dependencies(None):
        if not waiting:
            built = build()
            with tf.control_dependencies([] if built is None else [built]):
                return tf.no_op(name="laid_out")
        gate = tf.no_op(name="laid_out")
    built = []

    def build_once():   # every waiting member calls it; the last one laid out builds
        if built or not all(m.io_built for m in members):
            return None
        built.append(build())
        return built[0]

    for member in waiting:
        member._deferred.append((build_once, gate))  # noqa: SLF001
    return gate


def tier_swap_section(graph) -> tf.CriticalSection:
    """The critical section every tiered table's swaps in ``graph`` run under: two lookups'
    swaps in one run must not interleave (one's move of a row into the fast tier would read
    its home before the other's write-back of it), whichever tables each one moves."""
    cache = graph_cache(graph, "tier_swap_section")
    if "section" not in cache:
        with graph.as_default(), graph.name_scope(None), tf.control_dependencies(None), \
                tf.device("/CPU:0"):
            cache["section"] = tf.CriticalSection(name="tier_swaps")
    return cache["section"]


class DeviceRows:
    """Rows ``[capacity, dim]`` and one ``[capacity, dim]`` variable per optimizer slot.

    Args:
      name: the table's name (variable names derive from it).
      capacity: rows, >= 1.
      dim: embedding width, >= 1.
      slot_names: the optimizer's slots, in order (e.g. ``("momentum", "velocity")``); may be
        left empty and bound later with :meth:`bind_slots`.
      slot_values: each slot's value in a new row.
      device: where the variables live; default :func:`default_device`.

    Build it inside the graph that trains the table (the current default graph).
    """

    def __init__(self, name: str, capacity: int, dim: int, slot_names=(), slot_values=(),
                 device: str | None = None):
        self.name = name
        self.capacity = int(capacity)
        self.dim = int(dim)
        self.device = device or default_device()
        self.graph = tf.compat.v1.get_default_graph()
        self.slot_names: tuple[str, ...] = ()
        self.slot_values: tuple[float, ...] = ()
        self.slots: list = []
        self.bound = False
        # (rows, done) of every initialize() op: slots bound later join them (see bind_slots).
        self._inits: list[tuple[tf.Tensor, tf.Operation]] = []
        self._io_layout = None    # the slot names the read / write ops were built for
        # (build, gate) of swaps waiting for the slot layout (see when_laid_out below).
        self._deferred: list = []
        self._critical_section = None
        with self._clean_context():
            self._scope = self.graph.unique_name(f"{name}_device_rows") + "/"
        self.weights = self._variable("weights")
        if slot_names:
            self.bind_slots(slot_names, slot_values)

    @contextlib.contextmanager
    def _clean_context(self):
        """The graph, at the top-level name scope, with no control dependencies."""
        with self.graph.as_default(), self.graph.name_scope(None), \
                tf.control_dependencies(None):
            yield

    def _variable(self, name: str) -> tf.Variable:
        """A ``[capacity, dim]`` float32 variable of zeros, in the global-variables collection
        (so ``global_variables_initializer`` initialises it) and in
        :data:`DEVICE_ROWS_COLLECTION`."""
        with self._clean_context(), self.graph.name_scope(self._scope), \
                tf.device(self.device):
            variable = tf.Variable(tf.zeros([self.capacity, self.dim]), trainable=False,
                                   name=name)
        tf.compat.v1.add_to_collection(DEVICE_ROWS_COLLECTION, variable)
        return variable

    @property
    def variables(self) -> list:
        """The weights variable, then each slot's (the host layout's column blocks)."""
        return [self.weights, *self.slots]

    @property
    def width(self) -> int:
        """Floats per row in the host layout ``[weights | slots]``."""
        return self.dim * (1 + len(self.slots))

    @property
    def io_built(self) -> bool:
        """Whether the host-side read / write ops exist (the slot layout is then fixed)."""
        return self._io_layout is not None

    def bind_slots(self, slot_names, slot_values) -> None:
        """Adds the optimizer's slot variables (zeros). (The step counter is the
        optimizer's, as for host rows: ``SparseOptimizer.steps``.)

        Every :meth:`initialize` op built before now also resets the new slots from here on,
        so rows initialised by lookups built before the optimizer get fresh slots too.

        Raises:
          ValueError: other slots are bound already.
        """
        names = tuple(slot_names)
        values = tuple(float(v) for v in slot_values)
        if len(values) != len(names):
            raise ValueError(f"Table `{self.name}`: {len(names)} slots {list(names)} but "
                             f"{len(values)} initial values.")
        if self.bound:
            if (names, values) != (self.slot_names, self.slot_values):
                raise ValueError(f"Table `{self.name}` already has optimizer slots "
                                 f"{list(self.slot_names)}; received {list(names)}.")
            return
        self.slot_names, self.slot_values = names, values
        self.slots = [self._variable(n) for n in names]
        self.bound = True
        for rows, done in self._inits:
            with self._clean_context(), self.graph.name_scope(self._scope):
                add_control_input(done, self._reset_slots(rows))

    # -- graph ops -----------------------------------------------------------------------

    def gather(self, rows: tf.Tensor) -> tf.Tensor:
        """float32 ``[len(rows), dim]``: the weights of ``rows`` (int32), zeros where < 0."""
        valid = rows >= 0
        with tf.device(self.device):
            values = tf.gather(self.weights, tf.maximum(rows, 0))
        return tf.where(tf.expand_dims(valid, 1), values, tf.zeros_like(values))

    def initialize(self, rows: tf.Tensor, weights: tf.Tensor) -> tf.Operation:
        """Writes new rows: ``weights`` (float32 ``[n, dim]``) and every slot's initial value
        (slots bound later included).

        ``rows`` (int32 ``[n]``) must be distinct and >= 0: rows the key processor just
        assigned (fresh, or reused after an eviction, whose old slots must not survive).
        """
        ops = [tf.compat.v1.scatter_update(self.weights, rows, weights)]
        if self.slots:
            ops.append(self._reset_slots(rows))
        done = tf.group(*ops)
        self._inits.append((rows, done))
        return done

    def exclusive(self, fn):
        """``fn()`` (returning tensors) run under this table's critical section: no two run
        at once within a session run. Lookups pop and write pending rows in it, so that
        two lookups of the table in one run (say a training and an evaluation batch) cannot
        interleave: the one that pops another batch's new rows has written them before that
        batch's own (later) pop returns and its gather reads them."""
        if self._critical_section is None:
            with self._clean_context(), self.graph.name_scope(self._scope), \
                    tf.device("/CPU:0"):
                self._critical_section = tf.CriticalSection(name="pending")
        return self._critical_section.execute(fn, exclusive_resource_access=False)

    def _reset_slots(self, rows: tf.Tensor) -> tf.Operation:
        return tf.group(*[tf.compat.v1.scatter_update(
            slot, rows, tf.fill([tf.shape(rows)[0], self.dim], value))
            for slot, value in zip(self.slots, self.slot_values)])

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

    def apply_ftrl(self, rows: tf.Tensor, grads: tf.Tensor, *, learning_rate: float,
                   learning_rate_power: float, l1: float, l2: float) -> tf.Operation:
        """FTRL-Proximal on ``rows`` (distinct; -1 skipped), slots ``[accum, linear]``, as
        ``ops.optimizer_kernels.apply_ftrl`` (TF's SparseApplyFtrl, no shrinkage)::

            accum_new = accum + g*g
            linear += g - (accum_new**p - accum**p) / lr * w          (p = -lr_power)
            w = (sign(linear)*l1 - linear) / (accum_new**p / lr + 2*l2) if |linear| > l1 else 0
        """
        keep = tf.where(rows >= 0)[:, 0]
        rows, grads = tf.gather(rows, keep), tf.gather(grads, keep)
        accum_var, linear_var = self.slots
        lr, f_l1 = np.float32(learning_rate), np.float32(l1)
        l2x2 = np.float32(2.0) * np.float32(l2)
        power = np.float32(learning_rate_power)
        with tf.device(self.device):
            accum = tf.gather(accum_var, rows)
            new_accum = accum + grads * grads
            if power == np.float32(-0.5):  # TF switches to sqrt, as the host kernel does
                p_new, p_old = tf.sqrt(new_accum), tf.sqrt(accum)
            else:
                p_new, p_old = tf.pow(new_accum, -power), tf.pow(accum, -power)
            w = tf.gather(self.weights, rows)
            linear = tf.gather(linear_var, rows) + (grads - (p_new - p_old) / lr * w)
            quadratic = p_new / lr + l2x2
            w = tf.where(linear > f_l1, (f_l1 - linear) / quadratic,
                         tf.where(linear < -f_l1, (-f_l1 - linear) / quadratic,
                                  tf.zeros_like(linear)))
            return tf.group(tf.compat.v1.scatter_update(accum_var, rows, new_accum),
                            tf.compat.v1.scatter_update(linear_var, rows, linear),
                            tf.compat.v1.scatter_update(self.weights, rows, w))

    def read_slots(self, slots: tf.Tensor) -> tf.Tensor:
        """float32 ``[len(slots), width]``: the rows in ``slots`` (int32), weights and every
        slot variable, in the host layout ``[weights | slots]`` (a tiered table's rows leaving
        the fast tier)."""
        with tf.device(self.device):
            return tf.concat([tf.gather(v, slots) for v in self.variables], 1)

    def write_slots(self, slots: tf.Tensor, values: tf.Tensor) -> list:
        """The scatters writing ``values`` (float32 ``[len(slots), width]``, host layout) into
        ``slots`` (int32, distinct) of the weights and every slot variable (a tiered table's
        rows entering the fast tier)."""
        values.set_shape([None, self.width])
        with tf.device(self.device):
            return [tf.compat.v1.scatter_update(v, slots, values[:, i * self.dim:(i + 1) * self.dim])
                    for i, v in enumerate(self.variables)]

    # -- host side: checkpoints and swapping ---------------------------------------------

    def build_io(self) -> None:
        """Builds the host-side read / write / reset ops for the current slot layout (a
        no-op when they exist). Call it before the graph is finalized: ``start_asc_pipeline``
        does; :meth:`read` and :meth:`write` call it otherwise."""
        if self._io_layout == self.slot_names:
            return
        with self._clean_context(), self.graph.name_scope(self._scope):
            self._read_rows = tf.compat.v1.placeholder(tf.int32, [None], "read_rows")
            self._read = [tf.gather(v, self._read_rows) for v in self.variables]
            self._write_rows = tf.compat.v1.placeholder(tf.int32, [None], "write_rows")
            self._write_values = [tf.compat.v1.placeholder(tf.float32, [None, self.dim])
                                  for _ in self.variables]
            self._write = tf.group(*[tf.compat.v1.scatter_update(v, self._write_rows, x)
                                     for v, x in zip(self.variables, self._write_values)])
            self._reset = tf.group(*[v.initializer for v in self.variables])
        self._io_layout = self.slot_names
        for build, gate in self._deferred:
            with self._clean_context(), self.graph.name_scope(self._scope):
                built = build()
                if built is not None:
                    add_control_input(gate, getattr(built, "op", built))
        self._deferred.clear()

    def read(self, sess, rows: np.ndarray, weights_only: bool = False) -> np.ndarray:
        """float32 ``[len(rows), dim * (1 + n_slots)]``: ``[weights | slots]`` of ``rows``,
        the host rows' layout (what checkpoints and the host tier store); with
        ``weights_only``, ``[len(rows), dim]``."""
        self.build_io()
        rows = np.ascontiguousarray(rows, np.int32)
        fetches = self._read[:1] if weights_only else self._read
        if rows.shape[0] == 0:
            return np.zeros((0, self.dim * len(fetches)), np.float32)
        parts = sess.run(fetches, {self._read_rows: rows})
        return np.ascontiguousarray(np.concatenate(parts, axis=1))

    def write(self, sess, rows: np.ndarray, values: np.ndarray) -> None:
        """Writes ``values`` (host layout ``[n, dim * (1 + n_slots)]``) into ``rows``."""
        self.build_io()
        rows = np.ascontiguousarray(rows, np.int32)
        values = np.asarray(values, np.float32)
        if values.shape != (rows.shape[0], self.width):
            raise ValueError(f"Table `{self.name}`: values of shape {values.shape} do not fit "
                             f"{rows.shape[0]} rows of width {self.width}.")
        if rows.shape[0] == 0:
            return
        feed = {self._write_rows: rows}
        for i, placeholder in enumerate(self._write_values):
            feed[placeholder] = values[:, i * self.dim:(i + 1) * self.dim]
        sess.run(self._write, feed)

    def reset(self, sess) -> None:
        """Sets every row and slot back to zeros."""
        self.build_io()
        sess.run(self._reset)


class DeviceTableRows:
    """The rows of a table created with ``rows_on="device"``, seen from the table.

    Host-side state only: the slot layout and bound optimizer (as ``HostRows``), the pending
    initial values of rows the key processor assigned, and the :class:`DeviceRows` of the
    graph that trains the table (created with the table's first lookup, or by
    ``start_asc_pipeline``).

    Args:
      name: the table's name.
      capacity: rows.
      dim: embedding width.
      init_spec: how weights of new rows are drawn (as for host rows).
      device: where the variables live; default :func:`default_device`.
    """

    def __init__(self, name: str, capacity: int, dim: int, init_spec: InitSpec,
                 device: str | None = None):
        self.name = name
        self.capacity = int(capacity)
        self.dim = int(dim)
        self.init_spec = init_spec
        self.device = device
        self.slot_names: tuple[str, ...] = ()
        self.slot_values: tuple[float, ...] = ()
        self.optimizer = None
        self.pending = PendingRows(dim)
        self.device_rows: DeviceRows | None = None
        self.last_session = None   # the session a Saver last used, for reads without one
        self.closed = False
        self._fill_args: tuple | None = None

    @property
    def width(self) -> int:
        """Floats per row in the host layout: weights plus slots."""
        return self.dim * (1 + len(self.slot_names))

    def bind_optimizer(self, optimizer, holds_no_row: bool = False) -> None:
        """Fixes the slot layout from ``optimizer`` and adds its slots to the variables.

        Args:
          optimizer: the sparse optimizer.
          holds_no_row: the caller (the table, under its key processor's lock) knows that no
            key was ever given a row: host-side ops built without the slots
            (``start_asc_pipeline``) are then built again with them.

        Raises:
          ValueError: another optimizer is already bound, or the host-side ops were built
            without slots and the table may hold rows.
        """
        if self.optimizer is optimizer:
            return
        if self.optimizer is not None:
            raise ValueError(
                f"Table `{self.name}` is already updated by optimizer `{self.optimizer.name}`; "
                f"a table takes one sparse optimizer. Received: `{optimizer.name}`")
        rebuild_io = self.device_rows is not None and self.device_rows.io_built
        if rebuild_io and not holds_no_row:
            raise ValueError(
                f"Table `{self.name}` already holds rows without optimizer slots: build the "
                f"sparse optimizer's apply_gradients (or pass it to create_table's "
                f"optimizer_list) before the first batch is drawn.")
        self.optimizer = optimizer
        self.slot_names = tuple(optimizer.slot_names)
        self.slot_values = tuple(float(v) for v in optimizer.slot_initial_values)
        if self.device_rows is not None:
            self.device_rows.bind_slots(self.slot_names, self.slot_values)
            if rebuild_io:
                self.device_rows.build_io()

    def rows_in(self, graph) -> DeviceRows:
        """The table's :class:`DeviceRows`, created in ``graph`` on first use.

        Raises:
          RuntimeError: the table was released by ``terminate_config_initializer()``.
          ValueError: the variables live in another graph.
        """
        if self.closed:
            raise RuntimeError(f"Table `{self.name}` was released by "
                               f"terminate_config_initializer(); its rows are gone.")
        if self.device_rows is None:
            with graph.as_default():
                self.device_rows = DeviceRows(self.name, self.capacity, self.dim,
                                              device=self.device)
            if self.optimizer is not None:
                self.device_rows.bind_slots(self.slot_names, self.slot_values)
        elif self.device_rows.graph is not graph:
            raise ValueError(
                f"Table `{self.name}` keeps its rows in TF variables (rows_on=\"device\") of "
                f"another graph: build every lookup and optimizer of a device table in one "
                f"graph, or create it with rows_on=\"host\".")
        return self.device_rows

    def prepare(self) -> None:
        """``start_asc_pipeline``: makes the variables exist (in the default graph when no
        lookup built them) and builds the host-side ops, before the graph is finalized."""
        self.rows_in(self.device_rows.graph if self.device_rows is not None
                     else tf.compat.v1.get_default_graph()).build_io()

    def allocate(self):
        """For symmetry with ``HostRows``; a device table has no host storage."""
        raise TypeError(f"Table `{self.name}` keeps its rows in TF variables "
                        f"(rows_on=\"device\"): it has no host storage.")

    def initialize(self, rows: np.ndarray, keys: np.ndarray) -> None:
        """The key processor's callback for newly assigned rows: draws their weights
        (deterministic per key, exactly as host rows do) and queues them for the next
        training step, which writes them (and resets the slots) before its gather."""
        n = rows.shape[0]
        if n == 0:
            return
        values = np.empty((n, self.dim), np.float32)
        order = np.arange(n, dtype=np.int32)
        if self._fill_args is None:
            init_rows(values, order, keys, self.init_spec, self.dim)  # validated once
            spec = self.init_spec
            upper = np.float32(0.0)
            if spec.kind == "uniform":
                upper = np.nextafter(np.float32(spec.b), np.float32(-np.inf))
            self._fill_args = (init_kernels.KIND_CODES[spec.kind], float(spec.a), float(spec.b),
                               upper, np.uint64(spec.seed), self.dim, np.zeros(0, np.float32))
        else:
            init_kernels.fill_rows(values, order, np.ascontiguousarray(keys).view(np.uint64),
                                   *self._fill_args)
        self.pending.push(rows, values)

    # -- host-side reads and writes (checkpoints, export) --------------------------------

    def session(self, sess=None):
        """The session to read the variables through: ``sess``; else the default session
        (inside ``with tf.compat.v1.Session() as sess:``) of the variables' graph; else the
        session a ``sparseflow.Saver`` last saved or restored with, if still open.

        Raises:
          RuntimeError: none of them is available.
        """
        if sess is not None:
            return sess
        graph = self.device_rows.graph if self.device_rows is not None else None
        for candidate in (tf.compat.v1.get_default_session(), self.last_session):
            if (candidate is not None and not getattr(candidate, "_closed", False)
                    and getattr(candidate, "graph", None) is graph):
                return candidate
        raise RuntimeError(
            f"Table `{self.name}` keeps its rows in TF variables (rows_on=\"device\"): reading "
            f"them needs the session that trains it. Pass sess=..., call inside "
            f"`with tf.compat.v1.Session() as sess:`, or after a sparseflow.Saver save or "
            f"restore with a session that is still open.")

    def prepared(self) -> DeviceRows:
        if self.device_rows is None:
            raise RuntimeError(f"Table `{self.name}` has no variables yet: call "
                               f"start_asc_pipeline() first.")
        return self.device_rows

    def flush(self, sess) -> None:
        """Writes the pending rows now (weights and initial slots), e.g. before a
        checkpoint reads them. The caller holds the key processor's lock."""
        rows, weights = self.pending.pop()
        if rows.shape[0]:
            values = np.empty((rows.shape[0], self.width), np.float32)
            values[:, :self.dim] = weights
            for i, value in enumerate(self.slot_values):
                values[:, self.dim * (i + 1):self.dim * (i + 2)] = value
            self.prepared().write(sess, rows, values)

    def read(self, sess, rows: np.ndarray, weights_only: bool = False) -> np.ndarray:
        """``[weights | slots]`` (or the weights) of ``rows`` in the host layout, pending rows
        written first. The caller holds the key processor's lock."""
        self.flush(sess)
        return self.prepared().read(sess, rows, weights_only)

    def gather(self, rows: np.ndarray, sess=None) -> np.ndarray:
        """Weights of ``rows`` as float32 ``[len(rows), dim]`` (as ``HostRows.gather``)."""
        return self.read(self.session(sess), rows, weights_only=True)

    def slots(self, rows: np.ndarray, sess=None) -> dict[str, np.ndarray]:
        """Each optimizer slot of ``rows``, by slot name (as ``HostRows.slots``)."""
        values = self.read(self.session(sess), rows)
        return {name: values[:, self.dim * (i + 1):self.dim * (i + 2)]
                for i, name in enumerate(self.slot_names)}

    def load(self, sess, values: np.ndarray) -> None:
        """Replaces every row by ``values`` (rows 0..n-1, host layout; the rest reset): a
        checkpoint restore. Pending rows are dropped (they were assigned before the
        restore). The caller holds the key processor's lock."""
        self.pending.pop()
        rows = self.prepared()
        rows.reset(sess)
        rows.write(sess, np.arange(values.shape[0], dtype=np.int32), values[:, :rows.width])

    def close(self) -> None:
        """Drops the pending rows and the variables' handle; any later use raises."""
        self.closed = True
        self.pending.pop()
        self.device_rows = None
        self.last_session = None


def bias_corrected_rate(learning_rate: float, beta1: float, beta2: float, step: int) -> float:
    """Adam's step size at ``step`` as the host kernel computes it (for tests and callers
    that precompute it)."""
    b1, b2 = float(np.float32(beta1)), float(np.float32(beta2))
    return learning_rate * math.sqrt(1.0 - b2 ** step) / (1.0 - b1 ** step)
