"""What importing ``mx_rec`` changes in TensorFlow, as Rec SDK's import does."""

from __future__ import annotations

import types

import tensorflow as tf

from mx_rec import _dataset, _tf_optimizer
from mx_rec.util.log import logger

_installed = False
_warned_npu = False
# Graph optimizers that only exist in Huawei's TF adapter for Ascend NPUs.
_ASCEND_OPTIMIZERS = ("NpuOptimizer",)


def _strip_ascend_options(config):
    """A copy of a ConfigProto without Ascend-only custom optimizers; warns once per process."""
    global _warned_npu
    if config is None:
        return None
    custom = config.graph_options.rewrite_options.custom_optimizers
    ascend = [c.name for c in custom if c.name in _ASCEND_OPTIMIZERS]
    if not ascend:
        return config
    cleaned = type(config)()
    cleaned.CopyFrom(config)
    kept = [c for c in cleaned.graph_options.rewrite_options.custom_optimizers
            if c.name not in _ASCEND_OPTIMIZERS]
    del cleaned.graph_options.rewrite_options.custom_optimizers[:]
    cleaned.graph_options.rewrite_options.custom_optimizers.extend(kept)
    if not _warned_npu:
        _warned_npu = True
        logger.warning("mx_rec facade: Ascend-only session options (%s) are ignored: "
                       "sparseflow runs on CPU/GPU.", ", ".join(ascend))
    return cleaned


class _Session(tf.compat.v1.Session):
    """tf.compat.v1.Session that drops Ascend-only session options (with one warning)."""

    def __init__(self, target="", graph=None, config=None):
        super().__init__(target, graph, _strip_ascend_options(config))


class _SaverMeta(type):
    """isinstance(x, tf.compat.v1.train.Saver) holds for TF's Savers and sparseflow's."""

    def __instancecheck__(cls, instance):
        from sparseflow.checkpoint.saver import _TF_SAVER, Saver
        return isinstance(instance, (_TF_SAVER, Saver))


class _Saver(metaclass=_SaverMeta):
    """``tf.compat.v1.train.Saver`` with mx_rec imported: while sparseflow is initialized,
    sparseflow's Saver (dense and sparse together); otherwise TF's own."""

    def __new__(cls, *args, **kwargs):
        from sparseflow import runtime
        from sparseflow.checkpoint.saver import _TF_SAVER, Saver
        if not runtime.is_initialized():
            return _TF_SAVER(*args, **kwargs)
        if args:
            kwargs["var_list"] = args[0]
            if len(args) > 1:
                raise TypeError("tf.compat.v1.train.Saver with mx_rec imported takes keyword "
                                "arguments after var_list.")
        kwargs.setdefault("max_to_keep", 5)  # TF's default
        return Saver(**kwargs)


# tf.compat.v1.layers' public names (functions and classes) that tf-keras still provides.
_LAYER_NAMES = (
    "dense", "Dense", "dropout", "Dropout", "flatten", "Flatten",
    "batch_normalization", "BatchNormalization",
    "conv1d", "conv2d", "conv3d", "Conv1D", "Conv2D", "Conv3D",
    "conv2d_transpose", "conv3d_transpose", "Conv2DTranspose", "Conv3DTranspose",
    "separable_conv1d", "separable_conv2d", "SeparableConv1D", "SeparableConv2D",
    "average_pooling1d", "average_pooling2d", "average_pooling3d",
    "AveragePooling1D", "AveragePooling2D", "AveragePooling3D",
    "max_pooling1d", "max_pooling2d", "max_pooling3d",
    "MaxPooling1D", "MaxPooling2D", "MaxPooling3D",
)


def _legacy_layers() -> dict:
    """tf.compat.v1.layers names served by tf-keras's legacy layers (Keras 3 removed them)."""
    from tf_keras.src.legacy_tf_layers import convolutional, core, normalization, pooling
    found = {}
    for module in (core, convolutional, normalization, pooling):
        for name in _LAYER_NAMES:
            if name in vars(module):
                found[name] = vars(module)[name]
    return found


def install() -> None:
    """Applies the patches once."""
    global _installed
    if _installed:
        return
    import sparseflow.checkpoint.saver  # noqa: F401  (captures TF's Saver before the patch)
    tf.compat.v1.train.Saver = _Saver
    # tf.compat.v1.layers is a lazy loader that refuses Keras-3-removed names (and writes):
    # put a module of tf-keras's legacy layers in its place.
    layers = types.ModuleType("tensorflow.compat.v1.layers",
                              "tf.compat.v1.layers served by tf-keras's legacy layers (mx_rec).")
    for name, value in _legacy_layers().items():
        setattr(layers, name, value)
    tf.compat.v1.layers = layers
    # After the tf-keras import above, which repopulates tf.compat.v1's names.
    tf.compat.v1.Session = _Session
    _dataset.install()
    _tf_optimizer.install()
    _install_estimator()
    _installed = True


def _has_estimator(module) -> bool:
    try:
        return getattr(module, "estimator", None) is not None
    except (AttributeError, ImportError):   # TF's lazy loader for a removed module
        return False


def _install_estimator(modules=None) -> None:
    """``tf.estimator`` (and ``tf.compat.v1.estimator``) resolve to ``sparseflow.estimator``
    where TensorFlow has none (2.16 and later); a real ``tf.estimator`` is never replaced.

    Args:
      modules: the modules to complete; default ``tf`` and ``tf.compat.v1``.
    """
    import sparseflow.estimator as estimator
    for module in modules or (tf, tf.compat.v1):
        if not _has_estimator(module):
            setattr(module, "estimator", estimator)
