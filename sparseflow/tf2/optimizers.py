"""Optimizers of the TF2 API, named and parameterised as ``tf.tpu.experimental.embedding``'s.

Each is a small description (hyper-parameters, validated at construction); the Embedding
turns it into the lazy sparse optimizer that updates a table's host rows with the same numba
kernels as the Rec SDK API (``sparseflow/optimizers/``), so both APIs train identically.
"""

from __future__ import annotations

from sparseflow.optimizers.adagrad import Adagrad as _AdagradKernel
from sparseflow.optimizers.base import SparseOptimizer
from sparseflow.optimizers.ftrl import Ftrl as _FtrlKernel
from sparseflow.optimizers.gradient_descent import GradientDescent as _SgdKernel
from sparseflow.optimizers.hparams import (adagrad_hparams, ftrl_hparams, lazy_adam_hparams,
                                           sgd_hparams)
from sparseflow.optimizers.lazy_adam import LazyAdam as _LazyAdamKernel
from sparseflow.validation import check_bool, fail


class _Optimizer:
    """Base: ``hparams`` (validated) and the kernel optimizer class that applies them."""

    _kernel: type[SparseOptimizer]

    def __init__(self, hparams: dict, args: dict):
        self.hparams = hparams
        self._args = args   # the constructor's arguments, for get_config()

    def get_config(self) -> dict:
        """``{"class_name", "config"}``: what :func:`optimizer_from_config` rebuilds it from
        (a Keras layer's saved config)."""
        return {"class_name": type(self).__name__, "config": dict(self._args)}

    def build(self) -> SparseOptimizer:
        """A lazy sparse optimizer with these hyper-parameters (one per Embedding, which
        counts each table's updates)."""
        return self._kernel(self.hparams, runtime=False)

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self.hparams.items() if k != "name")
        return f"{type(self).__name__}({shown})"


class SGD(_Optimizer):
    """Plain SGD at the rows a batch touched: ``w -= lr * (g + weight_decay * w)``.

    Args:
      learning_rate: in [0, 10].
      weight_decay: None or in [1e-5, 1e-2].

    Raises:
      TypeError, ValueError: an argument is out of range.
    """

    _kernel = _SgdKernel

    def __init__(self, learning_rate: float = 0.01, weight_decay: float | None = None):
        super().__init__(sgd_hparams(learning_rate, weight_decay, name="SGD"),
                         dict(learning_rate=learning_rate, weight_decay=weight_decay))


class Adagrad(_Optimizer):
    """Adagrad at the rows a batch touched.

    Args:
      learning_rate: in [0, 10].
      initial_accumulator_value: in (0, 1].

    Raises:
      TypeError, ValueError: an argument is out of range.
    """

    _kernel = _AdagradKernel

    def __init__(self, learning_rate: float = 0.001, initial_accumulator_value: float = 0.1):
        super().__init__(adagrad_hparams(learning_rate, initial_accumulator_value,
                                         name="Adagrad"),
                         dict(learning_rate=learning_rate,
                              initial_accumulator_value=initial_accumulator_value))


class Adam(_Optimizer):
    """Lazy Adam: moments and weights change only at the rows a batch touched, the bias
    correction counts the table's updates.

    Args:
      learning_rate: in [0, 10].
      beta_1: in (0, 1). beta_2: in [0, 1]. epsilon: in (0, 1].
      lazy_adam: must be True (the only Adam a sparse table has; accepted for
        ``tf.tpu.experimental.embedding.Adam`` compatibility).

    Raises:
      TypeError, ValueError: an argument is out of range, or ``lazy_adam`` is False.
    """

    _kernel = _LazyAdamKernel

    def __init__(self, learning_rate: float = 0.001, beta_1: float = 0.9,
                 beta_2: float = 0.999, epsilon: float = 1e-07, lazy_adam: bool = True):
        check_bool("lazy_adam", lazy_adam)
        if not lazy_adam:
            fail("lazy_adam", "True (sparse tables update only the rows a batch touched)",
                 lazy_adam)
        super().__init__(lazy_adam_hparams(learning_rate, beta_1, beta_2, epsilon, name="Adam"),
                         dict(learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2,
                              epsilon=epsilon))


class FTRL(_Optimizer):
    """FTRL-Proximal at the rows a batch touched (TF's ``SparseApplyFtrl``).

    Args:
      learning_rate: in [0, 10].
      learning_rate_power: <= 0.
      l1_regularization_strength, l2_regularization_strength: in [0, 10000].
      initial_accumulator_value: in (0, 1].

    Raises:
      TypeError, ValueError: an argument is out of range.
    """

    _kernel = _FtrlKernel

    def __init__(self, learning_rate: float = 0.001, learning_rate_power: float = -0.5,
                 l1_regularization_strength: float = 0.0,
                 l2_regularization_strength: float = 0.0,
                 initial_accumulator_value: float = 0.1):
        super().__init__(ftrl_hparams(
            learning_rate, learning_rate_power=learning_rate_power,
            initial_accumulator_value=initial_accumulator_value,
            l1_regularization_strength=l1_regularization_strength,
            l2_regularization_strength=l2_regularization_strength, name="FTRL"),
            dict(learning_rate=learning_rate, learning_rate_power=learning_rate_power,
                 l1_regularization_strength=l1_regularization_strength,
                 l2_regularization_strength=l2_regularization_strength,
                 initial_accumulator_value=initial_accumulator_value))


OPTIMIZERS = (SGD, Adagrad, Adam, FTRL)


def optimizer_from_config(config: dict):
    """The optimizer :meth:`_Optimizer.get_config` described.

    Raises:
      ValueError: an unknown ``class_name``.
    """
    by_name = {cls.__name__: cls for cls in OPTIMIZERS}
    name = config.get("class_name") if isinstance(config, dict) else None
    if name not in by_name:
        fail("config", f"an optimizer config with class_name one of {sorted(by_name)}", config)
    return by_name[name](**config.get("config", {}))
