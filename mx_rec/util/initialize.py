"""Rec SDK ``mx_rec.util.initialize``.

Beyond ``init`` / ``terminate_config_initializer``: the rank functions (they work before
``init``; one process is rank 0 of 1), ``set_if_load``, ``clear_channel``,
``get_host_pipeline_ops``, ``get_use_dynamic_expansion``, ``get_initializer`` and
``ConfigInitializer``.
"""

from mx_rec.util.communication.hccl_ops import get_rank_id, get_rank_size
from mx_rec.util.config_initializer import ConfigInitializer
from sparseflow.pipeline.graph_modifier import get_initializer
from sparseflow.runtime import get_use_dynamic_expansion, init, terminate_config_initializer
from sparseflow.validation import check_bool

__all__ = ["ConfigInitializer", "clear_channel", "get_host_pipeline_ops", "get_initializer",
           "get_rank_id", "get_rank_size", "get_use_dynamic_expansion", "init", "set_if_load",
           "terminate_config_initializer"]


def set_if_load(if_load) -> None:
    """Records whether the script restores a checkpoint (``init(if_load=...)`` after the fact).

    Raises:
      NotInitializedError: ``init`` was not called.
      TypeError: ``if_load`` is not a bool.
    """
    check_bool("if_load", if_load)
    ConfigInitializer.get_instance().if_load = if_load


def get_host_pipeline_ops():
    """The host-pipeline ops (``set_threshold``, ``return_timestamp``, ``clear_channel``): the
    object ``mx_rec.util.ops.import_host_pipeline_ops()`` returns.

    Raises:
      NotInitializedError: ``init`` was not called.
    """
    return ConfigInitializer.get_instance().host_pipeline_ops


def clear_channel(is_train_channel=False):
    """The op that empties a channel's read-ahead batches (a no-op here; see
    ``HostPipelineOps.clear_channel``).

    Args:
      is_train_channel: True for the training channel, False for evaluation.

    Returns:
      A ``tf.no_op`` in graph mode (None in eager mode).

    Raises:
      NotInitializedError: ``init`` was not called.
      TypeError: ``is_train_channel`` is not a bool.
    """
    check_bool("is_train_channel", is_train_channel)
    config = ConfigInitializer.get_instance()
    channel_id = config.train_params_config.get_training_mode_channel_id(is_train_channel)
    return config.host_pipeline_ops.clear_channel(channel_id)
