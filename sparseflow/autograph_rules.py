"""Keeps TensorFlow's autograph out of sparseflow's own code.

Inside a ``tf.function``, autograph rewrites every function the traced code calls unless its
module is on autograph's list of libraries to leave alone, where TensorFlow lists itself,
Keras and numpy. Without an entry for sparseflow, each trace of a user's step that calls
``Embedding.dequeue`` or a Keras layer of ours parsed and rewrote hundreds of our graph-
building functions: 3.5 of a two-table TF2 program's 8.8 s (``benchmarks/bench_trace.py``).
Our functions build ops with Python control flow over Python values only (they also run in
``tf.compat.v1`` graphs, where nothing converts them), so the rewrite bought nothing.

Importing this module adds the entry (the TF2 API, the Keras layers and the built-in models
import it). A user's own functions are converted as before, including the methods a user
subclass of one of our classes defines.
"""

from __future__ import annotations

PACKAGE = "sparseflow"


def keep_out_of_autograph(package: str = PACKAGE) -> bool:
    """Puts ``package`` (and its submodules) on autograph's do-not-convert list, first, once.

    Args:
      package: a top-level module name.

    Returns:
      True when the rule is in place; False when this TensorFlow has no such list (the
      package is then converted as any user code: slower to trace, same graphs).
    """
    try:
        from tensorflow.python.autograph.core import config
        rules = tuple(config.CONVERSION_RULES)
        rule = config.DoNotConvert(package)
    except (ImportError, AttributeError, TypeError):
        return False
    if not any(isinstance(r, config.DoNotConvert) and r.matches(package) for r in rules):
        config.CONVERSION_RULES = (rule,) + rules
    return True


keep_out_of_autograph()
