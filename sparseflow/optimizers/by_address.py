"""The by-address sparse optimizers of dynamic expansion (Rec SDK's ``*_by_addr`` modules).

Under ``init(use_dynamic_expansion=True)`` each training ``sparse_lookup`` adds its table's
gathered unique rows (the "local embeddings", float32 ``[U, dim]``) to the collection
``ASCEND_SPARSE_LOOKUP_LOCAL_EMB`` and their addresses (int64 ``[U]``, the rows) to
``ASCEND_SPARSE_LOOKUP_ID_OFFSET``. The user differentiates the loss w.r.t. the former and
hands the gradients with the addresses to a by-address optimizer::

    local_embs = tf.compat.v1.get_collection("ASCEND_SPARSE_LOOKUP_LOCAL_EMB")
    addresses = tf.compat.v1.get_collection("ASCEND_SPARSE_LOOKUP_ID_OFFSET")
    grads = tf.gradients(loss, local_embs)
    train_op = sparse_optimizer.apply_gradients(list(zip(grads, addresses)))

Each address tensor maps back to its table through a per-graph registry the lookup fills
(``sparseflow.lookup.address_owner``). The update is the same lazy, fused numba kernel as the
table optimizers', on the same interleaved ``[weights | slots]`` rows (with the same slot
names, so checkpoints move between expansion and fixed-size tables); it runs pinned against
the storage's growth (``HostRows.pinned``), so no update is lost to a copy.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from sparseflow.optimizers.base import (GATE_OP, SparseOptimizer, gradients_of,
                                        raise_no_gradients)
from sparseflow.row_sums import sum_rows_by_index
from sparseflow.validation import fail

_PAIRS = ("pairs (gradient, address) with the addresses from the "
          "ASCEND_SPARSE_LOOKUP_ID_OFFSET collection, in the order of the gradients' "
          "ASCEND_SPARSE_LOOKUP_LOCAL_EMB tensors")


class ByAddressOptimizer(SparseOptimizer):
    """Base of the by-address optimizers; combine it with a table optimizer for the update
    (``class LazyAdamByAddress(ByAddressOptimizer, LazyAdam)``)."""

    by_address = True

    def compute_gradients(self, loss, var_list=None, gate_gradients=GATE_OP,
                          aggregation_method=None, colocate_gradients_with_ops=False,
                          grad_loss=None) -> list:
        """The gradients of ``loss`` w.r.t. local embeddings, paired with their addresses for
        :meth:`apply_gradients` (DCNv2-style scripts call it with the
        ``ASCEND_SPARSE_LOOKUP_LOCAL_EMB`` tensors).

        Args:
          loss: a scalar float tensor.
          var_list: local embeddings from ``ASCEND_SPARSE_LOOKUP_LOCAL_EMB``; default that
            collection of ``loss``'s graph.
          gate_gradients, aggregation_method, colocate_gradients_with_ops, grad_loss: as for
            TF's optimizers.

        Returns:
          list of ``(gradient, address)``: the gradient (float32 ``[U, dim]``, or None), the
          int64 address tensor of the same lookup (``ASCEND_SPARSE_LOOKUP_ID_OFFSET``).

        Raises:
          TypeError: an element of ``var_list`` is no local embedding of a training lookup.
          ValueError: ``gate_gradients`` is not 0, 1 or 2.
        """
        from sparseflow.lookup import LOCAL_EMB_COLLECTION, local_embedding_address

        if var_list is None:
            var_list = loss.graph.get_collection(LOCAL_EMB_COLLECTION)
        var_list = list(var_list)
        addresses = [local_embedding_address(v) for v in var_list]
        for var, address in zip(var_list, addresses):
            if address is None:
                fail("var_list", "local embeddings from the ASCEND_SPARSE_LOOKUP_LOCAL_EMB "
                     "collection (training lookups under dynamic expansion)",
                     getattr(var, "name", var), TypeError)
        grads = gradients_of(loss, var_list, gate_gradients, aggregation_method,
                             colocate_gradients_with_ops, grad_loss)
        return list(zip(grads, addresses))

    def apply_gradients(self, grads_and_vars, global_step=None, name=None) -> tf.Operation:
        """Builds the op that applies each gradient to the rows its address names.

        Args:
          grads_and_vars: iterable of (gradient, address): gradients from
            ``tf.gradients(loss, local_embs)`` — float32 ``[U, dim]`` tensors or
            ``IndexedSlices`` over their positions — or None (skipped); addresses from the
            ``ASCEND_SPARSE_LOOKUP_ID_OFFSET`` collection, in the same order.
          global_step: optional variable incremented after the updates.
          name: op name.

        Returns:
          A ``tf.Operation``: one numpy function updates every table (the pairs of one table
          are summed into one update). It runs after the lookups' gathers.

        Raises:
          TypeError: an element is not a pair, a table is given instead of an address, or a
            gradient is not a float32 tensor or IndexedSlices.
          ValueError: no gradient to apply (``grads_and_vars`` is empty or every gradient is
            None); an address tensor comes from no training ``sparse_lookup`` of this
            graph, a gradient's width is not its table's dim, or a table is already bound to
            another optimizer.
        """
        from sparseflow.lookup import address_owner
        from sparseflow.table import SparseTable

        from sparseflow.distributed.sharded_lookup import apply_by_address, sharded_address

        groups: dict = {}      # table name -> (table, [(rows, values)])
        gathers = []
        without_gradient = []
        sharded = []           # (values, address) of lookups over ranks
        for pair in grads_and_vars:
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                fail("grads_and_vars", _PAIRS, pair, TypeError)
            grad, address = pair
            if isinstance(address, SparseTable):
                fail("grads_and_vars", _PAIRS + " (a table's own gradient goes to "
                     "create_hash_optimizer, without dynamic expansion)", address, TypeError)
            owner = address_owner(address)
            if owner is None:
                fail("grads_and_vars", _PAIRS + ": an address of a training sparse_lookup in "
                     "this graph", getattr(address, "name", address))
            table, local_emb = owner
            if grad is None:
                without_gradient.append(table.table_name)
                continue
            values = self._dense_gradient(grad, address, table)
            table.bind_optimizer(self)
            if sharded_address(address) is not None:
                sharded.append((values, address))
                continue
            groups.setdefault(table.table_name, (table, []))[1].append((address, values))
            gathers.append(local_emb)
        if not groups and not sharded:
            raise_no_gradients(without_gradient, "address")
        with tf.name_scope(name or self.name):
            # Over ranks, the owners apply this optimizer (bound to the tables above).
            updates = apply_by_address(sharded) if sharded else []
            if groups:
                tables = [(table, len(members)) for table, members in groups.values()]
                inputs = [t for _, members in groups.values() for pair in members for t in pair]
                # After the gathers: a gradient that does not read the embeddings (a loss
                # linear in them) would otherwise let the update overwrite rows before the
                # batch has read them.
                with tf.control_dependencies(gathers):
                    updates.append(tf.numpy_function(
                        self._make_address_apply(tables), inputs, tf.int64, stateful=True,
                        name="sparseflow_update_by_address"))
            if global_step is not None:
                with tf.control_dependencies(updates):
                    return tf.compat.v1.assign_add(global_step, 1).op
            return tf.group(*updates)

    @staticmethod
    def _dense_gradient(grad, address, table) -> tf.Tensor:
        """The gradient as float32 ``[U, dim]``, one row per address (IndexedSlices summed)."""
        if isinstance(grad, tf.IndexedSlices):
            values = sum_rows_by_index(grad.values, grad.indices, tf.shape(address)[0])
        elif isinstance(grad, tf.Tensor):
            values = grad
        else:
            fail("grads_and_vars", "gradients from tf.gradients(loss, local_embs) (float32 "
                 "tensors or IndexedSlices)", type(grad).__name__, TypeError)
        if values.dtype != tf.float32:
            fail("grads_and_vars", "float32 gradients", values.dtype.name, TypeError)
        width = values.shape[-1] if values.shape.rank else None
        if values.shape.rank not in (None, 2) or width not in (None, table.dim):
            fail("grads_and_vars", f"gradients of shape [U, {table.dim}] for table "
                 f"`{table.table_name}` (its local embeddings)", values.shape)
        return values

    def _make_address_apply(self, tables):
        @tf.autograph.experimental.do_not_convert
        def apply(*arrays):
            at = 0
            for table, n_pairs in tables:
                pairs = arrays[at:at + 2 * n_pairs]
                at += 2 * n_pairs
                rows, values = pairs[0], pairs[1]
                if n_pairs > 1:  # several batches of one table: one update, duplicates summed
                    rows, values = np.concatenate(pairs[0::2]), np.concatenate(pairs[1::2])
                rows = np.ascontiguousarray(rows, np.int64)
                values = np.ascontiguousarray(values, np.float32).reshape(rows.shape[0],
                                                                          table.dim)
                step = self.next_step(table.table_name)
                # Pinned: growth cannot copy the rows away while the kernel writes them.
                with table.rows.pinned() as storage:
                    self._update(storage, rows, values, step)
                # The key processor's lock only after unpinning (lock order): changed rows
                # marked, evicted rows the gathered batches held may now be reused.
                table.after_update(rows)
            return np.int64(len(tables))
        return apply
