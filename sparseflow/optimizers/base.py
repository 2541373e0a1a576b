"""The sparse optimizer: lazy updates of the rows a batch touched.

``apply_gradients(zip(grads, tables))`` takes, per table, the ``IndexedSlices`` that
``tf.gradients(loss, table)`` returns. For host tables it builds one update for all of them:
a fused numba update over the interleaved ``[weights | slots]`` rows, run by a compiled op
where the optimizer has one and every table is fixed-capacity with a batch's unique rows
(``_compiled_update``: lazy Adam, ``ops/optimizer_ops.py``), else by one
``tf.numpy_function``. Device tables (``rows_on="device"``) are updated by TF ops over
their variables (``DeviceRows.apply_*``, the same arithmetic), followed by one numpy function
that does the host-side bookkeeping (rows changed for incremental checkpoints, evicted rows
freed). Duplicate rows are summed first; rows of -1 (unadmitted keys) are skipped; untouched
rows never change.
"""

from __future__ import annotations

import threading

import numpy as np
import tensorflow as tf

from sparseflow import runtime as _runtime
from sparseflow.embed.host_rows import pinned_storages
from sparseflow.row_sums import sum_rows_by_index
from sparseflow.validation import check_one_of, fail
from sparseflow.weak_owner import weak

# tf.compat.v1.train.Optimizer's gate_gradients values.
GATE_NONE, GATE_OP, GATE_GRAPH = 0, 1, 2


class SparseOptimizer:
    """Base of the lazy sparse optimizers; subclasses set the slots and the update kernel.

    Attributes:
      name: the optimizer's name.
      hparams: validated hyper-parameters.
      slot_names: names of the per-row slots, in storage order.
      slot_initial_values: the value each slot holds for a new row.
    """

    slot_names: tuple[str, ...] = ()
    by_address = False   # the by-address optimizers (dynamic expansion only) set True

    def __init__(self, hparams: dict, *, runtime: bool = True):
        """Args:
          hparams: validated hyper-parameters, with ``name``.
          runtime: register with the ``sparseflow.init`` runtime (the Rec SDK API); False
            for a standalone optimizer (the TF2 API, ``sparseflow.tf2``), which needs none.
        """
        self.hparams = dict(hparams)
        self.name = self.hparams.pop("name")
        self._steps: dict[str, int] = {}
        # Tables whose counter moved into their registry entry (a compiled update counts
        # there, ops/optimizer_ops.py): table name -> TableEntry.
        self._step_entries: dict = {}
        self._lock = threading.Lock()
        if not runtime:
            return
        rt = _runtime.current(type(self).__name__)
        if rt.config.use_dynamic_expansion and not self.by_address:
            raise ValueError(
                "The dynamic expansion mode is not compatible with the optimizer "
                f"{type(self).__name__}: with init(use_dynamic_expansion=True) use the "
                "by-address optimizers (create_hash_optimizer_by_address).")
        if self.by_address and not rt.config.use_dynamic_expansion:
            raise ValueError(
                "The dynamic expansion mode is not compatible with the optimizer "
                f"{type(self).__name__}: by-address optimizers need "
                "init(use_dynamic_expansion=True); without it use create_hash_optimizer.")
        rt.optimizers.append(self)

    @property
    def slot_initial_values(self) -> tuple[float, ...]:
        """Initial value of each slot for a freshly allocated row."""
        return tuple(0.0 for _ in self.slot_names)

    # The step counter: one per table, for host and device tables alike (a device table's
    # TF update reads it through a numpy function), so that checkpoints read and write it in
    # one way: here, or in the table's registry entry once a compiled update counts it.

    def steps(self, table_name: str) -> int:
        """Updates applied so far to ``table_name`` (Adam's bias-correction step)."""
        entry = self._step_entries.get(table_name)
        return entry.steps if entry is not None else self._steps.get(table_name, 0)

    def set_steps(self, table_name: str, steps: int) -> None:
        """Sets the update count of ``table_name`` (a checkpoint restore)."""
        with self._lock:
            self._steps[table_name] = int(steps)
            entry = self._step_entries.get(table_name)
            if entry is not None:
                entry.steps = int(steps)

    def next_step(self, table_name: str) -> int:
        """Counts one more update of ``table_name``; returns its step (1-based)."""
        with self._lock:
            entry = self._step_entries.get(table_name)
            step = (entry.count_step() if entry is not None
                    else self._steps.get(table_name, 0) + 1)
            self._steps[table_name] = step
        return step

    def _registry_token(self, table) -> int:
        """``table``'s registry token for a compiled update, its step counter moved into its
        entry first (where the op counts)."""
        token = table.registry_token()
        entry = table.rows.registry_entry()
        with self._lock:
            # A table created again under the same name (a new Estimator graph's scope)
            # has a new entry: the count carries over, as the dict's did.
            old = self._step_entries.get(table.table_name)
            if old is not entry:
                entry.steps = (old.steps if old is not None
                               else self._steps.get(table.table_name, 0))
                self._step_entries[table.table_name] = entry
        return token

    def _step_tensor(self, table_name: str) -> tf.Tensor:
        """An int64 scalar op that counts one update of ``table_name`` (:meth:`next_step`)
        each time it runs, for a device table's update."""
        @tf.autograph.experimental.do_not_convert
        def count():
            return np.int64(self.next_step(table_name))

        step = tf.numpy_function(count, [], tf.int64, stateful=True, name="sparseflow_step")
        step.set_shape([])
        return step

    def compute_gradients(self, loss, var_list=None, gate_gradients=GATE_OP,
                          aggregation_method=None, colocate_gradients_with_ops=False,
                          grad_loss=None) -> list:
        """The gradients of ``loss`` as (gradient, table) pairs for :meth:`apply_gradients`,
        as ``tf.compat.v1.train.Optimizer.compute_gradients`` pairs them with variables.

        Args:
          loss: a scalar float tensor.
          var_list: the tables (``get_dense_and_sparse_variable()[1]``); default every table
            of the current ``init()``.
          gate_gradients, aggregation_method, colocate_gradients_with_ops, grad_loss: as for
            TF's optimizers (``gate_gradients`` 0, 1 or 2; ``grad_loss``, the gradient of
            ``loss`` itself, scales every gradient).

        Returns:
          list of ``(gradient, table)``: the gradient an ``IndexedSlices`` over the table's
          rows, or None where ``loss`` does not depend on the table.

        Raises:
          TypeError: an element of ``var_list`` is not a sparseflow table.
          ValueError: ``gate_gradients`` is not 0, 1 or 2.
        """
        from sparseflow.table import SparseTable

        if var_list is None:
            var_list = list(_runtime.current("compute_gradients").tables.values())
        var_list = list(var_list)
        for var in var_list:
            if not isinstance(var, SparseTable):
                fail("var_list", "sparseflow tables (get_dense_and_sparse_variable()[1]); "
                     "dense variables go to a dense TF optimizer", var, TypeError)
        grads = gradients_of(loss, var_list, gate_gradients, aggregation_method,
                             colocate_gradients_with_ops, grad_loss)
        return list(zip(grads, var_list))

    def apply_gradients(self, grads_and_vars, global_step=None, name=None) -> tf.Operation:
        """Builds the op that applies each table's gradient to the rows it touches.

        Args:
          grads_and_vars: iterable of (gradient, table) with gradients from
            ``tf.gradients(loss, tables)`` (``IndexedSlices``) or None (skipped).
          global_step: optional variable incremented after the updates.
          name: op name.

        Returns:
          A ``tf.Operation``.

        Raises:
          TypeError: a variable is not a sparseflow table or a gradient not IndexedSlices.
          ValueError: no gradient to apply (``grads_and_vars`` is empty or every gradient is
            None), as TF's optimizers raise; a table is already bound to another
            optimizer, or the optimizer has no
            update for device rows (a subclass without ``_device_update``) and a table has
            ``rows_on="device"``.
        """
        from sparseflow.table import SparseTable  # the table module imports TF wiring
        from sparseflow.lookup import is_batch_unique_rows

        pairs, device_pairs, without_gradient = [], [], []
        for grad, table in grads_and_vars:
            if not isinstance(table, SparseTable):
                fail("grads_and_vars", "pairs (gradient, sparseflow table); dense variables "
                     "go to a dense TF optimizer", table, TypeError)
            if grad is None:
                without_gradient.append(table.table_name)
                continue
            if not isinstance(grad, tf.IndexedSlices):
                fail("grads_and_vars", "gradients from tf.gradients(loss, table) "
                     "(IndexedSlices)", type(grad).__name__, TypeError)
            if table.rows_on == "device" and not self.supports_device_rows:
                raise ValueError(
                    f"Optimizer `{self.name}` ({type(self).__name__}) has no update for device "
                    f"rows, and table `{table.table_name}` was created with rows_on=\"device\": "
                    f"create it with rows_on=\"host\".")
            table.bind_optimizer(self)
            (device_pairs if table.rows_on == "device" else pairs).append((grad, table))
        if not pairs and not device_pairs:
            raise_no_gradients(without_gradient, "table")
        # What the tiers read (tiered_lookup.py): which tables an update trains together.
        from sparseflow.tiered_lookup import record_update
        record_update((pairs + device_pairs)[0][0].indices.graph,
                      [table for _, table in pairs + device_pairs])
        with tf.name_scope(name or self.name):
            updates = []
            if pairs:
                # Rows a batch's own gather handed out are its unique keys' rows: distinct.
                unique = all(is_batch_unique_rows(grad.indices) for grad, _ in pairs)
                updates.append(self.host_update(pairs, unique))
            if device_pairs:
                updates.append(self._apply_device(device_pairs))
            if global_step is not None:
                with tf.control_dependencies(updates):
                    return tf.compat.v1.assign_add(global_step, 1).op
            return tf.group(*updates)

    def host_update(self, pairs, unique: bool, name: str = "sparseflow_update") -> tf.Tensor:
        """The update of ``pairs`` ((IndexedSlices, table) of host tables without a fast
        tier) as one node per op: the optimizer's compiled op where it has one and every
        table is fixed-capacity with ``unique`` rows, else one numpy function (named
        ``name``) running its kernel. Returns its int64 output, for control dependencies."""
        if unique and all(table.gathers_in_kernel for _, table in pairs):
            compiled = self._compiled_update(pairs)
            if compiled is not None:
                return compiled
        # One numpy function for every table: per-call overhead and the Python around 26
        # calls cost more than the update kernels (BENCHMARKS.md, end-to-end).
        inputs = [t for grad, _ in pairs for t in (grad.indices, grad.values)]
        return tf.numpy_function(self._make_apply([table for _, table in pairs], unique),
                                 inputs, tf.int64, stateful=True, name=name)

    def _compiled_update(self, pairs) -> tf.Tensor | None:
        """The update of ``pairs`` ((IndexedSlices over a batch's unique rows, table) of
        fixed-capacity host tables) as one compiled op (``ops/optimizer_ops.py``), or None
        where the optimizer has none (the numpy function then runs its kernel)."""
        return None

    # -- device tables ------------------------------------------------------------------

    @property
    def supports_device_rows(self) -> bool:
        """Whether the optimizer can update device tables (implements ``_device_update``)."""
        return type(self)._device_update is not SparseOptimizer._device_update

    def _apply_device(self, pairs) -> tf.Operation:
        """TF updates of device tables, then one numpy function for their bookkeeping."""
        from sparseflow.lookup import is_batch_unique_rows

        updates, touched = [], []
        for grad, table in pairs:
            rows, values = grad.indices, grad.values
            if not is_batch_unique_rows(rows):
                # Gradients of several batches, concatenated: sum each row's once (the TF
                # scatters need distinct rows; -1 stays one entry, skipped by the update).
                rows, position = tf.unique(rows)
                values = sum_rows_by_index(values, position, tf.shape(rows)[0])
            rows = tf.cast(rows, tf.int32)
            device_rows = table.rows.rows_in(rows.graph)
            # Every op of the update after the gradient, hence after the batch's gather and
            # the scatter of its new rows before it (the gradient depends on them): the
            # update's own reads of the rows must not see them from before.
            with tf.name_scope(table.table_name), tf.control_dependencies([values]):
                updates.append(self._device_update(device_rows, rows, values))
            touched.append(rows)
        tables = [table for _, table in pairs]

        @tf.autograph.experimental.do_not_convert
        def bookkeeping(*rows_of_tables):
            for table, rows in zip(tables, rows_of_tables):
                # Changed rows marked; evicted rows the gathered batches held may now be
                # reused; a tiered table's updated slots unpinned.
                table.after_update(rows)
            return np.int64(len(tables))

        # After the updates: a row is freed for reuse only once no update can land on it.
        with tf.control_dependencies(updates):
            return tf.numpy_function(bookkeeping, touched, tf.int64, stateful=True,
                                     name="sparseflow_device_bookkeeping")

    def _device_update(self, rows, indices: tf.Tensor, grads: tf.Tensor) -> tf.Operation:
        """The update of a device table's ``indices`` (int32, distinct, -1 skipped) by
        ``grads`` (float32 ``[U, dim]``) as TF ops on ``rows`` (a ``DeviceRows``)."""
        raise NotImplementedError

    def _make_apply(self, tables, unique: bool):
        # Weakly: TensorFlow keeps a numpy function built in TF2 for the life of the process
        # (sparseflow/weak_owner.py); the tables go with their owner.
        refs = [weak(table, f"table `{table.table_name}`") for table in tables]

        @tf.autograph.experimental.do_not_convert
        def apply(*arrays):
            live = [ref() for ref in refs]
            self.apply_at_tables(live, arrays[0::2], arrays[1::2], unique)
            return np.int64(len(live))
        return apply

    def apply_at_tables(self, tables: list, rows: list, grads: list, unique: bool) -> None:
        """:meth:`apply_at_rows` on each of ``tables`` (host rows, no fast tier); an
        optimizer with a kernel over several tables (:meth:`_update_tables`) runs it in one
        call when ``unique``.

        Args:
          tables: the tables.
          rows: per table, int32 ``[U]`` rows (-1 skipped).
          grads: per table, float32 ``[U, dim]``, summed per row.
          unique: every table's rows are distinct (a batch's own unique keys' rows).
        """
        if not unique or not self._has_table_kernel or any(t.tiers is not None for t in tables):
            for table, r, g in zip(tables, rows, grads):
                self.apply_at_rows(table, r, g)
            return
        steps = [self.next_step(table.table_name) for table in tables]
        with pinned_storages([table.rows for table in tables]) as storages:
            self._update_tables(storages, tuple(rows),
                                tuple(np.ascontiguousarray(g, np.float32) for g in grads),
                                steps)
        for table, r in zip(tables, rows):   # takes the key processors' locks: unpinned
            table.after_update(r)

    @property
    def _has_table_kernel(self) -> bool:
        return type(self)._update_tables is not SparseOptimizer._update_tables

    def _update_tables(self, storages: tuple, rows: tuple, grads: tuple, steps: list) -> None:
        """One update of several tables' storages, rows distinct (optional: without it,
        :meth:`apply_at_tables` calls :meth:`_update` per table)."""
        raise NotImplementedError

    def apply_at_rows(self, table, rows: np.ndarray, grads: np.ndarray) -> None:
        """One update of a host table: counts the table's step, applies ``grads`` (float32
        ``[U, dim]``, already summed per row) at ``rows`` (int32 ``[U]``, distinct; -1
        skipped) with the numba kernel, then the table's bookkeeping (changed rows marked;
        evicted rows its batches held may be reused; a tiered table's slots unpinned)."""
        storage = table.rows.allocate()
        step = self.next_step(table.table_name)
        self._update(storage, rows, np.ascontiguousarray(grads, np.float32), step)
        table.after_update(rows)

    def _update(self, storage: np.ndarray, rows: np.ndarray, grads: np.ndarray,
                step: int) -> None:
        raise NotImplementedError


def apply_by_optimizer(tables: list, rows: list, grads: list, unique: bool) -> None:
    """Applies each table's own optimizer (``table.rows.optimizer``): one
    :meth:`SparseOptimizer.apply_at_tables` per optimizer over its tables.

    Args:
      tables: host tables, each with an optimizer bound.
      rows: per table, int32 ``[U]`` rows (-1 skipped).
      grads: per table, float32 ``[U, dim]``, summed per row.
      unique: every table's rows are distinct.
    """
    groups = {}
    for table, r, g in zip(tables, rows, grads):
        optimizer = table.rows.optimizer
        group = groups.setdefault(id(optimizer), (optimizer, [], [], []))
        group[1].append(table)
        group[2].append(r)
        group[3].append(g)
    for optimizer, group_tables, group_rows, group_grads in groups.values():
        optimizer.apply_at_tables(group_tables, group_rows, group_grads, unique)


def host_update_by_optimizer(pairs: list, name: str) -> tf.Tensor:
    """The update of ``pairs`` ((IndexedSlices over distinct rows, host table)) in graph:
    one :meth:`SparseOptimizer.host_update` per optimizer over its tables (each table's own,
    ``table.rows.optimizer``), its nodes named ``name``.

    Returns:
      An int64 tensor computed from every update's output (each its tables' count), not a
      constant under control dependencies, which graph optimization may drop with the
      updates.
    """
    groups = {}
    for grad, table in pairs:
        optimizer = table.rows.optimizer
        groups.setdefault(id(optimizer), (optimizer, []))[1].append((grad, table))
    updates = [optimizer.host_update(group, True, name=name)
               for optimizer, group in groups.values()]
    return tf.add_n(updates) if len(updates) > 1 else updates[0]


def gradients_of(loss, xs: list, gate_gradients, aggregation_method,
                 colocate_gradients_with_ops, grad_loss) -> list:
    """``tf.compat.v1.gradients(loss, xs)`` with TF optimizers' ``compute_gradients`` options
    (``GATE_GRAPH``: no gradient is usable before every one is computed).

    Raises:
      ValueError: ``gate_gradients`` is not 0, 1 or 2.
    """
    check_one_of("gate_gradients", gate_gradients, (GATE_NONE, GATE_OP, GATE_GRAPH))
    grads = tf.compat.v1.gradients(
        loss, xs, grad_ys=grad_loss, gate_gradients=gate_gradients == GATE_OP,
        aggregation_method=aggregation_method,
        colocate_gradients_with_ops=colocate_gradients_with_ops)
    if gate_gradients == GATE_GRAPH:
        present = [i for i, g in enumerate(grads) if g is not None]
        for i, g in zip(present, tf.tuple([grads[i] for i in present])):
            grads[i] = g
    return grads


def raise_no_gradients(without_gradient: list, kind: str) -> None:
    """Raises the error of an ``apply_gradients`` call with nothing to apply, as TF's own
    optimizers do ("No gradients provided for any variable"): training would otherwise run
    silently without its sparse tables (a list built from a collection nobody filled).

    Args:
      without_gradient: the names of the tables whose gradient was None (empty when
        ``grads_and_vars`` itself was empty).
      kind: what the pairs' second element is ("table" or "address"), for the message.

    Raises:
      ValueError: always.
    """
    if not without_gradient:
        raise ValueError(
            f"No gradients provided: `grads_and_vars` is empty. Pass (gradient, {kind}) pairs, "
            f"e.g. zip(tf.gradients(loss, {kind}s), {kind}s); an empty list often means the "
            f"list was built from a collection that no sparse_lookup filled.")
    raise ValueError(
        f"No gradients provided for any table: every gradient in `grads_and_vars` is None, "
        f"for tables {sorted(set(without_gradient))}. Check that the loss depends on these "
        f"tables' sparse_lookup outputs (and that is_grad=True).")
