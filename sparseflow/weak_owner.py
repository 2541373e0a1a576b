"""``alive``: what a weak reference names, or a clear error once its owner released it.

A Python callback that TensorFlow keeps for the life of the process (a numpy function built
in TF2 stays on the thread's global graph; a custom gradient's registry entry) must not
keep sparseflow's tables with it: it reaches them, or the object owning them, through a
``weakref.ref``, and the tables go when their owner (an ``Embedding``, a Keras layer, the
runtime) does (``sparseflow/custom_gradient.py``).
"""

from __future__ import annotations


def alive(ref, what: str):
    """The object ``ref`` (a ``weakref.ref``) names.

    Args:
      ref: the weak reference.
      what: what it names, for the error (e.g. "table `t1`").

    Returns:
      The object.

    Raises:
      RuntimeError: it was released while a dataset or a graph that uses it still runs.
    """
    obj = ref()
    if obj is None:
        raise RuntimeError(f"The {what} was released (its owner was dropped or terminated) "
                           f"while a dataset or graph that uses it still runs: keep its owner "
                           f"(the sparseflow.tf2.Embedding, the Keras layer, or the "
                           f"sparseflow.init() runtime) alive until they finish.")
    return obj
