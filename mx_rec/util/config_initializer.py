"""Rec SDK's ``ConfigInitializer.get_instance()``: the attributes Rec SDK scripts read from it,
answered from the active ``sparseflow.init`` runtime."""

from __future__ import annotations

import dataclasses

from mx_rec.constants.constants import EVAL_CHANNEL_ID, TRAIN_CHANNEL_ID
from sparseflow import runtime as _runtime
from sparseflow.validation import check_bool, fail

__all__ = ["ConfigInitializer", "OptimizerConfig", "TrainParamsConfig"]


class TrainParamsConfig:
    """``ConfigInitializer.get_instance().train_params_config``: per-channel graph state."""

    @staticmethod
    def get_initializer(is_training):
        """The initializer of the iterator graph modification rebuilt for the training (True)
        or evaluation (False) channel (``sparseflow.get_initializer``).

        Raises:
          TypeError: ``is_training`` is not a bool.
          RuntimeError: no iterator of that channel was rewritten.
        """
        from sparseflow.pipeline.graph_modifier import get_initializer
        return get_initializer(check_bool("is_training", is_training))

    @staticmethod
    def get_target_batch(is_training):
        """The batch of the rewritten iterator of a channel, in the structure of the original
        ``get_next()`` (a dict of tensors): what a session runs instead of the original batch,
        whose iterator is no longer initialized after the rewrite.

        Raises:
          TypeError: ``is_training`` is not a bool.
          RuntimeError: no iterator of that channel was rewritten (or see
            ``mx_rec._dataset.rewritten_batch``).
        """
        from mx_rec._dataset import rewritten_batch
        return rewritten_batch(check_bool("is_training", is_training))

    @staticmethod
    def get_training_mode_channel_id(is_training):
        """The data channel of a mode: 0 for training, 1 for evaluation.

        Raises:
          TypeError: ``is_training`` is not a bool.
        """
        return TRAIN_CHANNEL_ID if check_bool("is_training", is_training) else EVAL_CHANNEL_ID


class OptimizerConfig:
    """``ConfigInitializer.get_instance().optimizer_config``."""

    def __init__(self, rt: _runtime.Runtime):
        self._rt = rt
        self._instance = None

    @property
    def optimizer_instance(self):
        """The sparse optimizer set here, else the last one created (None before any): Rec SDK's
        optimizer factories record theirs here, sparseflow's are recorded by ``init``."""
        if self._instance is not None:
            return self._instance
        return self._rt.optimizers[-1] if self._rt.optimizers else None

    @optimizer_instance.setter
    def optimizer_instance(self, optimizer):
        from sparseflow.optimizers.base import SparseOptimizer
        if not isinstance(optimizer, SparseOptimizer):
            fail("optimizer_instance", "a sparse optimizer from mx_rec.optimizers "
                 "(create_hash_optimizer...); custom Rec SDK optimizer classes are not "
                 "supported", optimizer, TypeError)
        self._instance = optimizer


class ConfigInitializer:
    """Rec SDK's configuration singleton, as a view of the active ``init(...)``.

    Attributes read by Rec SDK scripts: ``use_dynamic``, ``use_static`` (its negation),
    ``use_dynamic_expansion``, ``if_load`` (settable), ``max_steps``, ``train_steps``,
    ``eval_steps``, ``save_steps``, ``host_pipeline_ops``, ``train_params_config``,
    ``optimizer_config``.
    """

    _instance: "ConfigInitializer | None" = None

    def __init__(self, rt: _runtime.Runtime):
        self._rt = rt
        self.train_params_config = TrainParamsConfig()
        self.optimizer_config = OptimizerConfig(rt)

    @classmethod
    def get_instance(cls) -> "ConfigInitializer":
        """The instance of the active ``init(...)``: the same object until
        ``terminate_config_initializer()``.

        Raises:
          NotInitializedError: ``init`` was not called (as Rec SDK, which asks to init first).
        """
        rt = _runtime.current("ConfigInitializer.get_instance()")
        if cls._instance is None or cls._instance._rt is not rt:
            cls._instance = cls(rt)
        return cls._instance

    def _config(self) -> _runtime.InitConfig:
        rt = _runtime.current("ConfigInitializer")
        if rt is not self._rt:
            raise _runtime.NotInitializedError(
                "This ConfigInitializer belongs to an init() that was terminated: call "
                "ConfigInitializer.get_instance() again after init().")
        return rt.config

    @property
    def use_dynamic(self) -> bool:
        """``init(use_dynamic=...)``: dynamic shapes."""
        return self._config().use_dynamic

    @property
    def use_static(self) -> bool:
        """``not use_dynamic``: static shapes, unique keys padded to ``send_count``."""
        return not self._config().use_dynamic

    @property
    def use_dynamic_expansion(self) -> bool:
        """``init(use_dynamic_expansion=...)``."""
        return self._config().use_dynamic_expansion

    @property
    def max_steps(self) -> int:
        """``init(max_steps=...)``."""
        return self._config().max_steps

    @property
    def train_steps(self) -> int:
        """``init(train_steps=...)``."""
        return self._config().train_steps

    @property
    def eval_steps(self) -> int:
        """``init(eval_steps=...)``."""
        return self._config().eval_steps

    @property
    def save_steps(self) -> int:
        """``init(save_steps=...)``."""
        return self._config().save_steps

    @property
    def if_load(self) -> bool:
        """Whether the script restores a checkpoint (``init(if_load=...)``, ``set_if_load``)."""
        return self._config().if_load

    @if_load.setter
    def if_load(self, value) -> None:
        check_bool("if_load", value)
        self._config()
        self._rt.config = dataclasses.replace(self._rt.config, if_load=value)

    @property
    def host_pipeline_ops(self):
        """The host-pipeline ops (``import_host_pipeline_ops()``'s object)."""
        from mx_rec.util.ops import import_host_pipeline_ops
        self._config()
        return import_host_pipeline_ops()
