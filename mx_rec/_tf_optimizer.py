"""What importing ``mx_rec`` changes in TF's ``tf.compat.v1.train.Optimizer``: its
``compute_gradients`` takes sparse tables in ``var_list``.

Rec SDK's tables are ``tf.Variable``s, so its dlrm and mmoe examples hand the dense optimizer
every variable, ``dense_optimizer.compute_gradients(loss, var_list=dense + sparse)``, then
give the table's gradient to the sparse optimizer. A sparseflow table is not a variable; in
``var_list`` it stands for its gradient anchor (what ``tf.gradients(loss, table)`` reads), and
the pair returned holds the table again with its ``IndexedSlices`` gradient. Only
``compute_gradients`` changes: ``apply_gradients`` of a TF optimizer still refuses a table
(pass it to a sparse optimizer).
"""

from __future__ import annotations

import functools

import tensorflow as tf

_MARK = "takes_sparse_tables"


def _with_tables(compute_gradients):
    @functools.wraps(compute_gradients)
    def wrapper(self, loss, var_list=None, *args, **kwargs):
        from sparseflow.table import SparseTable
        flat = tf.nest.flatten(var_list) if var_list is not None else []
        if not any(isinstance(v, SparseTable) for v in flat):
            return compute_gradients(self, loss, var_list, *args, **kwargs)
        targets = [v.gradient_anchor() if isinstance(v, SparseTable) else v for v in flat]
        table_of = {id(t): v for t, v in zip(targets, flat) if isinstance(v, SparseTable)}
        pairs = compute_gradients(self, loss, targets, *args, **kwargs)
        return [(grad, table_of.get(id(var), var)) for grad, var in pairs]

    setattr(wrapper, _MARK, True)
    return wrapper


def install() -> None:
    """Wraps ``tf.compat.v1.train.Optimizer.compute_gradients`` once."""
    optimizer = tf.compat.v1.train.Optimizer
    if not getattr(optimizer.compute_gradients, _MARK, False):
        optimizer.compute_gradients = _with_tables(optimizer.compute_gradients)
