"""Changing a table's admission threshold while training (Rec SDK's ``set_threshold``)."""

from __future__ import annotations

from sparseflow import runtime as _runtime
from sparseflow.validation import INT32_MAX, check_int, fail


def set_threshold(table, value) -> None:
    """Sets a table's ``access_threshold`` for the batches processed from now on.

    A prefetching pipeline may already hold batches processed under the old threshold
    (tf.data injects a prefetch by default), so the change shows a few batches later in the
    training loop.

    Args:
      table: a table object or a table name.
      value: int in [-1, 2^31-1]. -1 turns admission off for this table (every key admitted at
        first sight); 0 admits every key and stops counting; N > 0 admits a key once its
        count reaches N (counts gathered so far are kept).

    Raises:
      NotInitializedError: ``init`` was not called.
      TypeError, ValueError: ``value`` out of range, or ``table`` names no table.
    """
    rt = _runtime.current("set_threshold")
    value = check_int("value", value, -1, INT32_MAX)
    name = table if isinstance(table, str) else getattr(table, "table_name", None)
    if name not in rt.tables:
        fail("table", f"a table or table name, one of {sorted(rt.tables)}", table)
    target = rt.tables[name]
    with target.processor.lock:
        target.processor.threshold = value
        target.access_threshold = value
