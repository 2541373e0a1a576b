"""Building blocks of the built-in models: Dense, MLP, CrossNetwork, DotInteraction.

Every layer is a ``tf.Module`` holding plain ``tf.Variable``s, created on the first call (when
the input width is known). The same code runs in three settings:

* tf.compat.v1 graph mode: variables are created under ``tf.init_scope()`` (outside any
  control-flow context) and land in the graph's GLOBAL_VARIABLES and TRAINABLE_VARIABLES
  collections, so ``sparseflow.get_dense_and_sparse_variable()`` finds them. Calling a layer
  again in the same graph (an eval tower next to the training tower) reuses them.
* eagerly, and inside ``tf.function`` (variables are made on the first trace).

Initial values come from stateless random ops seeded with ``(seed, stream)``, so a graph and
an eager run with the same seed start from the same weights: glorot uniform kernels, zero
biases.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence

import tensorflow as tf

from sparseflow.validation import check_int, check_one_of, fail

_ACTIVATIONS = {None: None, "relu": tf.nn.relu}


def glorot_uniform(shape: Sequence[int], seed: tuple[int, int]) -> tf.Tensor:
    """Glorot (Xavier) uniform values for a ``[fan_in, fan_out]`` matrix.

    Args:
      shape: ``[fan_in, fan_out]``.
      seed: the stateless seed pair ``(seed, stream)``.

    Returns:
      float32 tensor of ``shape``, uniform in ``±sqrt(6 / (fan_in + fan_out))``.
    """
    limit = math.sqrt(6.0 / (shape[0] + shape[1]))
    return tf.random.stateless_uniform(shape, seed=tf.constant(seed, tf.int64),
                                       minval=-limit, maxval=limit, dtype=tf.float32)


@contextlib.contextmanager
def creation_scope(scope: str):
    """Where variables are made: lifted out of control flow in v1 graphs, under ``scope/``.

    Inside ``tf.function`` (and eagerly) nothing is lifted: tf.function creates variables on
    its first trace itself.
    """
    lift = (tf.init_scope() if not tf.compat.v1.executing_eagerly_outside_functions()
            else contextlib.nullcontext())
    with lift, tf.name_scope(scope + "/"):  # trailing "/": the absolute scope, not uniquified
        yield


def check_graph(variable: tf.Variable, scope: str) -> None:
    """In tf.compat.v1 graph mode, raises if ``variable`` belongs to another graph.

    A module's variables live in the graph of its first call; a module built in one graph
    cannot be called in another (build a new module there).

    Raises:
      ValueError: the current (outermost) default graph is not the variable's.
    """
    if tf.compat.v1.executing_eagerly_outside_functions():
        return
    with tf.init_scope():
        graph = tf.compat.v1.get_default_graph()
    if variable.graph is not graph:
        raise ValueError(f"Module variables `{scope}` were created in another tf.Graph; a "
                         "module is tied to the graph of its first call. Build a new module "
                         "for this graph.")


def new_variable(initial_value, name: str) -> tf.Variable:
    """A trainable float32 ``tf.Variable`` (call inside :func:`creation_scope`)."""
    return tf.Variable(initial_value, trainable=True, name=name, dtype=tf.float32)


def glorot_variable(shape: Sequence[int], seed: tuple[int, int], name: str) -> tf.Variable:
    """A :func:`new_variable` initialised by :func:`glorot_uniform`."""
    return new_variable(lambda: glorot_uniform(shape, seed), name)


def zeros_variable(width: int, name: str) -> tf.Variable:
    """A :func:`new_variable` of ``width`` zeros (a bias)."""
    return new_variable(lambda: tf.zeros([width]), name)


def last_dim(x: tf.Tensor, argument: str) -> int:
    """The static width of a ``[batch, width]`` float32 input.

    Raises:
      TypeError: ``x`` is not float32.
      ValueError: ``x`` is not rank 2 or its width is not known statically.
    """
    if x.dtype != tf.float32:
        fail(argument, "a float32 tensor", f"dtype {x.dtype.name}", TypeError)
    if x.shape.rank != 2 or x.shape[1] is None:
        fail(argument, "a rank-2 tensor [batch, width] with a static width", f"shape {x.shape}")
    return int(x.shape[1])


class Dense(tf.Module):
    """``activation(inputs @ kernel + bias)``; kernel ``[in, units]`` made on the first call.

    Args:
      units: output width, an int >= 1.
      activation: None (linear) or ``"relu"``.
      seed: the stateless seed pair ``(seed, stream)`` of the kernel's initial values.
      scope: the variables' name prefix (``<scope>/kernel``); default ``name``.
      name: the module's name, a Python identifier.

    Raises:
      TypeError, ValueError: an argument is invalid.
    """

    def __init__(self, units: int, *, activation: str | None = None,
                 seed: tuple[int, int] = (0, 0), scope: str | None = None, name: str = "dense"):
        super().__init__(name=name)
        self.units = check_int("units", units, 1)
        self.activation = check_one_of("activation", activation, list(_ACTIVATIONS))
        self._seed = tuple(seed)
        self._scope = scope or name
        self.kernel: tf.Variable | None = None
        self.bias: tf.Variable | None = None

    def __call__(self, inputs: tf.Tensor) -> tf.Tensor:
        """Args: inputs float32 ``[batch, in]``. Returns: float32 ``[batch, units]``.

        Raises:
          ValueError: ``in`` differs from the width the layer was built with.
        """
        width = last_dim(inputs, "inputs")
        if self.kernel is None:
            with creation_scope(self._scope):
                self.kernel = glorot_variable([width, self.units], self._seed, "kernel")
                self.bias = zeros_variable(self.units, "bias")
        else:
            check_graph(self.kernel, self._scope)
            if width != self.kernel.shape[0]:
                fail("inputs", f"[batch, {self.kernel.shape[0]}] (the width {self._scope} was "
                     f"built with)", f"shape {inputs.shape}")
        y = tf.nn.bias_add(tf.matmul(inputs, self.kernel), self.bias)
        act = _ACTIVATIONS[self.activation]
        return act(y) if act is not None else y


class MLP(tf.Module):
    """A stack of :class:`Dense` layers, ReLU between them.

    Args:
      widths: output widths of the layers, ints >= 1 (may be empty: the identity).
      activate_last: whether the last layer has a ReLU too (DLRM's bottom MLP) or is linear.
      seed: the model's seed; layer ``i`` draws from stream ``stream + i``.
      stream: first stream number of this MLP's layers.
      scope: the variables' name prefix (``<scope>/layer_<i>/kernel``); default ``name``.
      name: the module's name, a Python identifier.
    """

    def __init__(self, widths: Sequence[int], *, activate_last: bool = True, seed: int = 0,
                 stream: int = 0, scope: str | None = None, name: str = "mlp"):
        super().__init__(name=name)
        scope = scope or name
        n = len(widths)
        self.layers = [
            Dense(w, activation="relu" if (i < n - 1 or activate_last) else None,
                  seed=(seed, stream + i), scope=f"{scope}/layer_{i}", name=f"layer_{i}")
            for i, w in enumerate(widths)]

    def __call__(self, inputs: tf.Tensor) -> tf.Tensor:
        """Args: inputs float32 ``[batch, in]``. Returns: float32 ``[batch, widths[-1]]``."""
        x = inputs
        for layer in self.layers:
            x = layer(x)
        return x


class CrossNetwork(tf.Module):
    """DCN-v2 cross layers: ``x_{l+1} = x0 * (x_l @ W_l + b_l) + x_l``.

    Full rank: ``W_l`` is ``[d, d]``. Low rank ``r``: ``W_l = V_l @ U_l`` with ``V_l``
    ``[d, r]`` and ``U_l`` ``[r, d]`` (the paper's ``U V^T`` in row-vector form), which costs
    ``2 d r`` instead of ``d^2`` per row.

    Args:
      n_layers: cross layers, an int >= 0 (0: the identity).
      low_rank: 0 for full rank, else the rank ``r`` >= 1.
      seed: the model's seed; layer ``l`` draws from streams ``stream + 2l`` and ``+ 1``.
      stream: first stream number.
      scope: the variables' name prefix (``<scope>/cross_<l>/w``, ``u``, ``v``, ``bias``).
      name: the module's name, a Python identifier.
    """

    def __init__(self, n_layers: int, *, low_rank: int = 0, seed: int = 0, stream: int = 0,
                 scope: str | None = None, name: str = "cross"):
        super().__init__(name=name)
        self.n_layers = check_int("n_layers", n_layers, 0)
        self.low_rank = check_int("low_rank", low_rank, 0)
        self._seed, self._stream = seed, stream
        self._scope = scope or name
        self.cross_weights: list[list[tf.Variable]] = []  # per layer: [w] or [v, u]
        self.biases: list[tf.Variable] = []
        self._width: int | None = None

    def _build(self, d: int) -> None:
        for layer in range(self.n_layers):
            s0 = (self._seed, self._stream + 2 * layer)
            s1 = (self._seed, self._stream + 2 * layer + 1)
            r = self.low_rank
            with creation_scope(f"{self._scope}/cross_{layer}"):
                if r:
                    self.cross_weights.append([glorot_variable([d, r], s0, "v"),
                                               glorot_variable([r, d], s1, "u")])
                else:
                    self.cross_weights.append([glorot_variable([d, d], s0, "w")])
                self.biases.append(zeros_variable(d, "bias"))
        self._width = d

    def __call__(self, x0: tf.Tensor) -> tf.Tensor:
        """Args: x0 float32 ``[batch, d]``. Returns: float32 ``[batch, d]``.

        Raises:
          ValueError: ``d`` differs from the width the layers were built with.
        """
        d = last_dim(x0, "x0")
        if self._width is None:
            self._build(d)
        else:
            if self.biases:
                check_graph(self.biases[0], self._scope)
            if d != self._width:
                fail("x0", f"[batch, {self._width}] (the width {self._scope} was built with)",
                     f"shape {x0.shape}")
        x = x0
        for weights, bias in zip(self.cross_weights, self.biases):
            h = x
            for w in weights:
                h = tf.matmul(h, w)
            x = x0 * tf.nn.bias_add(h, bias) + x
        return x


class DotInteraction(tf.Module):
    """Pairwise dot products of ``T`` vectors, the strict upper triangle (DLRM).

    One batched matmul ``Z Z^T`` (``Z``: ``[batch, T, d]``) and one gather of the
    ``T (T - 1) / 2`` upper-triangle entries, row-major: ``(0,1), (0,2), .., (1,2), ..``.

    Args:
      name: the module's name, a Python identifier.
    """

    def __init__(self, name: str = "dot_interaction"):
        super().__init__(name=name)

    def __call__(self, vectors: Sequence[tf.Tensor]) -> tf.Tensor:
        """Args: vectors, ``T >= 2`` float32 ``[batch, d]`` tensors of one ``d``.

        Returns:
          float32 ``[batch, T (T - 1) / 2]``: ``<v_i, v_j>`` for ``i < j``.

        Raises:
          ValueError: fewer than two vectors, or their widths differ.
        """
        t = len(vectors)
        if t < 2:
            fail("vectors", "at least two tensors to interact", f"{t} tensor(s)")
        widths = {v.shape[-1] for v in vectors}
        if len(widths) != 1:
            fail("vectors", "tensors of one width", f"widths {[v.shape[-1] for v in vectors]}")
        z = tf.stack(vectors, axis=1)                        # [batch, T, d]
        gram = tf.matmul(z, z, transpose_b=True)             # [batch, T, T]
        flat = tf.reshape(gram, [-1, t * t])
        upper = [i * t + j for i in range(t) for j in range(i + 1, t)]
        return tf.gather(flat, upper, axis=1)


# Argument checks shared by the models' constructors and calls.

def check_widths(argument: str, value) -> tuple[int, ...]:
    """Checks a list/tuple of layer widths (ints >= 1; may be empty).

    Returns:
      The widths as a tuple of ints (the caller's list is not kept).

    Raises:
      TypeError: ``value`` is not a list or tuple, or a width is not an int.
      ValueError: a width is < 1.
    """
    if not isinstance(value, (list, tuple)):
        fail(argument, "a list or tuple of ints >= 1", value, TypeError)
    return tuple(check_int(f"{argument}[{i}]", w, 1) for i, w in enumerate(value))


def check_module_name(name) -> str:
    """Checks a module name: a Python identifier (tf.Module's rule).

    Raises:
      TypeError: ``name`` is not a str.
      ValueError: it is not an identifier.
    """
    if not isinstance(name, str):
        fail("name", "a str that is a Python identifier", name, TypeError)
    if not name.isidentifier():
        fail("name", "a str that is a Python identifier", name)
    return name


def check_model_inputs(dense, embeddings) -> tuple[tf.Tensor | None, list[tf.Tensor]]:
    """Checks a model's ``dense`` and ``embeddings`` (static shapes and dtypes only).

    Returns:
      ``(dense or None, embeddings as a list)``; a ``[batch, 0]`` dense becomes None.

    Raises:
      TypeError: ``embeddings`` is not a list/tuple, or a tensor is not float32.
      ValueError: a tensor is not rank 2 with a static width.
    """
    if dense is not None:
        dense = tf.convert_to_tensor(dense)
        if last_dim(dense, "dense") == 0:
            dense = None
    if not isinstance(embeddings, (list, tuple)):
        fail("embeddings", "a list of float32 [batch, dim] tensors", type(embeddings).__name__,
             TypeError)
    embeddings = [tf.convert_to_tensor(e) for e in embeddings]
    for i, e in enumerate(embeddings):
        last_dim(e, f"embeddings[{i}]")
    return dense, embeddings


def check_no_wide(wide) -> None:
    """Models without a linear part take no ``wide`` tensors.

    Raises:
      ValueError: ``wide`` is not empty.
    """
    if wide is not None and len(wide) > 0:
        fail("wide", "empty (only WideDeep has a linear part)", f"{len(wide)} tensor(s)")


def stream(role: int, index: int = 0) -> int:
    """The stateless-seed stream of layer ``index`` of a model part ``role``."""
    return (role << 32) | index


def format_repr(obj, **kwargs) -> str:
    """``TypeName(key=value, ...)``."""
    return f"{type(obj).__name__}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"
