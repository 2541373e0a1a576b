"""``weak``: a weak reference to a table's owner that says so once the owner is gone.

A Python callback that TensorFlow keeps for the life of the process (a numpy function built
in TF2 stays on the thread's global graph; a custom gradient's registry entry) must not
keep sparseflow's tables with it: it reaches them, or the object owning them, through
:func:`weak`, and the tables go when their owner (an ``Embedding``, a Keras layer, the
runtime) does (``sparseflow/custom_gradient.py``).
"""

from __future__ import annotations

import weakref
from typing import Callable, TypeVar

T = TypeVar("T")


def weak(obj: T, what: str) -> Callable[[], T]:
    """A weak reference to ``obj``: calling it returns ``obj``.

    Args:
      obj: the object (an ``Embedding``, a table).
      what: what it is, for the error (e.g. "table `t1`").

    Returns:
      A function of no arguments returning ``obj``; it raises ``RuntimeError`` once ``obj``
      was released while a dataset or a graph that uses it still runs.
    """
    ref = weakref.ref(obj)

    def get() -> T:
        live = ref()
        if live is None:
            raise RuntimeError(f"The {what} was released (its owner was dropped or "
                               f"terminated) while a dataset or graph that uses it still "
                               f"runs: keep its owner (the sparseflow.tf2.Embedding, the Keras "
                               f"layer, or the sparseflow.init() runtime) alive until they "
                               f"finish.")
        return live

    return get
