"""What importing ``mx_rec`` adds to ``tf.data``, as Rec SDK's import does, and the batch of a
rewritten iterator (``train_params_config.get_target_batch``).

- ``Dataset.eos_map(librec, channel_id, max_train_steps, max_eval_steps)``. Rec SDK maps an
  end-of-sequence op over the dataset so that, when one rank's data runs out, every rank stops
  at the same step instead of waiting forever in a collective. One process has no other rank
  to tell: the dataset's own end (``OutOfRangeError``) ends the loop, so ``eos_map`` returns
  the dataset unchanged. Its step counts do not cap the dataset here; the script's loop does.
- ``Dataset.make_initializable_iterator()`` / ``make_one_shot_iterator()`` on TF2 datasets
  (``tf.data.TFRecordDataset`` in Rec SDK's model examples): TF 1.15 datasets had them, TF 2
  keeps them on ``tf.compat.v1.data.Dataset`` only. Added only where TF has none.
- ``tf.compat.v1.data.Iterator.get_next`` notes the structure of each batch it returns (dict
  keys...), which the flat outputs of a graph op do not carry, so that the rewritten iterator's
  batch can be handed back in the same structure. The batch itself is TF's, unchanged.
"""

from __future__ import annotations

import functools
import weakref

import tensorflow as tf
from tensorflow.python.data.ops import iterator_ops
from tensorflow.python.data.util import structure

from mx_rec.constants.constants import EVAL_CHANNEL_ID, TRAIN_CHANNEL_ID
from sparseflow import runtime as _runtime
from sparseflow.validation import INT32_MAX, check_int, fail, is_int

# graph -> {IteratorGetNext op name: the element_spec of its batch}
_BATCH_SPECS: "weakref.WeakKeyDictionary[tf.Graph, dict]" = weakref.WeakKeyDictionary()


def eos_map(self, librec, channel_id, max_train_steps, max_eval_steps):
    """Rec SDK's end-of-sequence synchronisation between ranks; over one process, the dataset
    itself (see the module docstring).

    Args:
      librec: what ``import_host_pipeline_ops(...)`` returned.
      channel_id: 0 (training) or 1 (evaluation).
      max_train_steps, max_eval_steps: int in [-1, 2^31-1]; -1 means "until the data ends".

    Returns:
      This dataset.

    Raises:
      TypeError, ValueError: an argument is not one of the allowed values.
    """
    from mx_rec.util.ops import HostPipelineOps
    if not isinstance(librec, HostPipelineOps):
        fail("librec", "the object import_host_pipeline_ops(...) returns", librec, TypeError)
    allowed = f"{TRAIN_CHANNEL_ID} (training) or {EVAL_CHANNEL_ID} (evaluation)"
    if not is_int(channel_id):
        fail("channel_id", allowed, channel_id, TypeError)
    if channel_id not in (TRAIN_CHANNEL_ID, EVAL_CHANNEL_ID):
        fail("channel_id", allowed, channel_id)
    check_int("max_train_steps", max_train_steps, -1, INT32_MAX)
    check_int("max_eval_steps", max_eval_steps, -1, INT32_MAX)
    return self


def _make_initializable_iterator(self, shared_name=None):
    """``tf.compat.v1.data.make_initializable_iterator(self, shared_name)``."""
    return tf.compat.v1.data.make_initializable_iterator(self, shared_name)


def _make_one_shot_iterator(self):
    """``tf.compat.v1.data.make_one_shot_iterator(self)``."""
    return tf.compat.v1.data.make_one_shot_iterator(self)


def _recording(get_next):
    @functools.wraps(get_next)
    def wrapper(self, name=None):
        batch = get_next(self, name=name)
        flat = tf.nest.flatten(batch, expand_composites=True)
        if flat and isinstance(flat[0], tf.Tensor) and flat[0].op.type == "IteratorGetNext":
            _BATCH_SPECS.setdefault(flat[0].graph, {})[flat[0].op.name] = self.element_spec
        return batch
    wrapper.records_batch_structure = True
    return wrapper


def install() -> None:
    """Adds the names above to ``tf.data`` (idempotent)."""
    dataset = tf.data.Dataset
    if not hasattr(dataset, "eos_map"):
        dataset.eos_map = eos_map
    if not hasattr(dataset, "make_initializable_iterator"):
        dataset.make_initializable_iterator = _make_initializable_iterator
    if not hasattr(dataset, "make_one_shot_iterator"):
        dataset.make_one_shot_iterator = _make_one_shot_iterator
    if not getattr(iterator_ops.Iterator.get_next, "records_batch_structure", False):
        iterator_ops.Iterator.get_next = _recording(iterator_ops.Iterator.get_next)


def rewritten_batch(is_training: bool):
    """The batch of the iterator that graph modification built for one channel, in the
    structure of the original ``get_next()`` (Rec SDK's ``get_target_batch``).

    Args:
      is_training: True for the training channel, False for evaluation.

    Returns:
      The new iterator's batch: a dict (or the original structure) of tensors.

    Raises:
      NotInitializedError: ``init`` was not called.
      RuntimeError: ``modify_graph_and_start_emb_cache()`` has not rewritten an iterator for
        that channel, or the channel's lookups read several iterators, or the original
        iterator was not built with ``tf.compat.v1.data`` after ``mx_rec`` was imported.
    """
    from sparseflow.pipeline.graph_modifier import get_initializer
    state = _runtime.current("get_target_batch").modify
    initializer = get_initializer(is_training)  # raises when nothing was rewritten
    sources = {lk.ids.op for lk in (state.lookups if state else []) if lk.is_train == is_training}
    channel = "training" if is_training else "evaluation"
    if len(sources) != 1:
        raise RuntimeError(f"The {channel} lookups read {len(sources)} iterators "
                           f"({sorted(op.name for op in sources)}): get_target_batch returns the "
                           f"batch of one rewritten iterator per channel, as in Rec SDK.")
    old = sources.pop()
    spec = _BATCH_SPECS.get(old.graph, {}).get(old.name)
    news = []
    if getattr(initializer, "type", None) == "MakeIterator":
        news = [c for c in initializer.inputs[1].consumers() if c.type == "IteratorGetNext"]
    if spec is None or len(news) != 1:
        raise RuntimeError(f"get_target_batch({is_training}) cannot rebuild the rewritten "
                           f"{channel} batch of {old.name}: it needs an iterator from "
                           f"tf.compat.v1.data (make_initializable_iterator) whose get_next() "
                           f"ran after `import mx_rec`.")
    return structure.from_compatible_tensor_list(spec, news[0].outputs[:len(old.outputs)])
