"""``TableConfig``: the validated arguments of Rec SDK's ``create_table``.

``make_table_config`` takes ``create_table``'s arguments in Rec SDK's order and spelling; the
caller (``create_table``) checks that the name is unique and builds the table from the config.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np
import tensorflow as tf

from sparseflow.embed.limits import (MAX_DIM, MAX_VOCABULARY_SIZE, TABLE_NAME_MAX_LEN,
                                     TABLE_NAME_PATTERN)
from sparseflow.validation import (INT32_MAX, check_bool, check_float, check_int, check_one_of,
                                   check_str, fail, is_int)

_MAX_SHARD_NUM = 8192   # Rec SDK's documented range for the (ignored) `shard_num`
_KEY_DTYPES = ("int32", "int64")
_VALUE_DTYPES = ("float32",)
_ALL2ALL_GRADIENTS_OPS = ("sum_gradients", "sum_gradients_and_div_by_ranksize")
# create_table arguments that Rec SDK uses for multi-device training or NPU kernels only: their
# documented ranges are checked, then they are ignored.
_IGNORED_BOOLS = ("is_dp", "enable_merge", "padding_keys_mask", "fusion_optimizer_var")
_IGNORED_OTHERS = ("shard_num", "hashtable_threshold", "padding_keys", "padding_keys_len")


@dataclasses.dataclass(frozen=True, kw_only=True, repr=False)
class TableConfig:
    """One embedding table's configuration, validated at construction.

    Rows hold ``dim`` ``value_dtype`` values; keys are ``key_dtype`` ints of any value (they
    are hashed, not used as row indices).

    Args / Attributes:
      name: str of 1 to 100 characters from ``[A-Za-z0-9_.]``.
      key_dtype: tf.int32 or tf.int64 (also numpy's int32/int64 or "int32"/"int64"); stored
        as a ``numpy.dtype``.
      dim: the embedding width, an int in [1, 8192] or a 1-D ``tf.TensorShape`` (or a list or
        tuple of one int) holding it; stored as an int.
      emb_initializer: the row initializer (a TF initializer), stored as given; not None.
      device_vocabulary_size: int in [1, 1e9], rows in the fast tier.
      host_vocabulary_size: int in [0, 1e9], rows in the host (DDR) tier; 0 for none.
      ssd_vocabulary_size: int in [0, 1e9], rows in the SSD tier; > 0 needs a host tier.
      ssd_data_path: directories for the SSD tier, tried in order: a str or a non-empty list or
        tuple of non-empty str; None means the current directory. Stored as a tuple of str.
      is_save: bool, whether checkpoints include the table.
      init_param: number in [-10, 10] scaling the initializer's values; stored as a float.
      value_dtype: None or float32 (tf.float32, np.float32 or "float32"); stored as
        ``numpy.dtype('float32')``.
      all2all_gradients_op: over several ranks, "sum_gradients" (a key's gradients from the
        ranks are summed at its owner) or "sum_gradients_and_div_by_ranksize" (and divided
        by the number of ranks).

    Raises:
      TypeError: an argument has the wrong type, or ``emb_initializer`` is None.
      ValueError: an argument is out of range, or ``ssd_vocabulary_size`` > 0 with
        ``host_vocabulary_size`` == 0.
    """

    name: str
    key_dtype: np.dtype
    dim: int
    emb_initializer: Any
    device_vocabulary_size: int = 1
    host_vocabulary_size: int = 0
    ssd_vocabulary_size: int = 0
    ssd_data_path: tuple[str, ...] | None = None
    is_save: bool = True
    init_param: float = 1.0
    value_dtype: np.dtype | None = None
    admission_counter: str = "exact"
    sketch_width: int = 1 << 20
    sketch_depth: int = 4
    # Over several ranks, how an owner combines a key's gradients from the ranks: summed, or
    # summed and divided by the number of ranks (Rec SDK's create_table argument).
    all2all_gradients_op: str = "sum_gradients"

    def __post_init__(self) -> None:
        # Normalized values replace the given ones; the caller's objects are not touched.
        def set_(attr: str, value: Any) -> None:
            object.__setattr__(self, attr, value)

        set_("name", check_table_name(self.name))
        set_("key_dtype", _check_dtype("key_dtype", self.key_dtype, _KEY_DTYPES))
        set_("dim", _check_dim(self.dim))
        if self.emb_initializer is None:
            fail("emb_initializer", "an initializer, not None", None, TypeError)
        set_("device_vocabulary_size",
             check_int("device_vocabulary_size", self.device_vocabulary_size, 1,
                       MAX_VOCABULARY_SIZE))
        set_("host_vocabulary_size",
             check_int("host_vocabulary_size", self.host_vocabulary_size, 0, MAX_VOCABULARY_SIZE))
        set_("ssd_vocabulary_size",
             check_int("ssd_vocabulary_size", self.ssd_vocabulary_size, 0, MAX_VOCABULARY_SIZE))
        if self.ssd_vocabulary_size > 0 and self.host_vocabulary_size == 0:
            raise ValueError(
                "Argument `host_vocabulary_size` must be > 0 when `ssd_vocabulary_size` is > 0 "
                "(the SSD tier sits behind the host tier). Received: host_vocabulary_size=0, "
                f"ssd_vocabulary_size={self.ssd_vocabulary_size}")
        set_("ssd_data_path", _check_ssd_data_path(self.ssd_data_path))
        set_("is_save", check_bool("is_save", self.is_save))
        set_("init_param", check_float("init_param", self.init_param, -10.0, 10.0))
        value_dtype = "float32" if self.value_dtype is None else self.value_dtype
        set_("value_dtype", _check_dtype("value_dtype", value_dtype, _VALUE_DTYPES))
        check_one_of("admission_counter", self.admission_counter, ("exact", "sketch"))
        set_("sketch_width", check_int("sketch_width", self.sketch_width, 16, 2**31))
        set_("sketch_depth", check_int("sketch_depth", self.sketch_depth, 1, 16))

    @property
    def capacity(self) -> int:
        """Rows the table can hold over all tiers: device + host + SSD."""
        return self.device_vocabulary_size + self.host_vocabulary_size + self.ssd_vocabulary_size

    def __repr__(self) -> str:
        fields = [f"name={self.name!r}", f"key_dtype={self.key_dtype.name}", f"dim={self.dim}",
                  f"emb_initializer={_initializer_text(self.emb_initializer)}",
                  f"device_vocabulary_size={self.device_vocabulary_size}"]
        if self.host_vocabulary_size:
            fields.append(f"host_vocabulary_size={self.host_vocabulary_size}")
        if self.ssd_vocabulary_size:
            fields.append(f"ssd_vocabulary_size={self.ssd_vocabulary_size}")
            fields.append(f"ssd_data_path={self.ssd_data_path!r}")
        fields += [f"is_save={self.is_save}", f"init_param={self.init_param!r}",
                   f"value_dtype={self.value_dtype.name}"]
        if self.admission_counter == "sketch":
            fields.append(f"admission_counter='sketch', sketch_width={self.sketch_width}, "
                          f"sketch_depth={self.sketch_depth}")
        return f"TableConfig({', '.join(fields)})"


def gradients_divided_by_ranks(config: Any) -> bool:
    """Whether a table's key gradients, summed over the ranks at its owner, are then divided
    by their number (``all2all_gradients_op="sum_gradients_and_div_by_ranksize"``). Takes any
    table's config: one without the option (the TF2 faces') sums only."""
    return (getattr(config, "all2all_gradients_op", "sum_gradients")
            == "sum_gradients_and_div_by_ranksize")


def make_table_config(key_dtype: Any, dim: Any, name: str, emb_initializer: Any,
                      device_vocabulary_size: int = 1, host_vocabulary_size: int = 0,
                      ssd_vocabulary_size: int = 0, ssd_data_path: Any = None,
                      is_save: bool = True, init_param: float = 1.0, value_dtype: Any = None,
                      **ignored: Any) -> TableConfig:
    """Validates Rec SDK ``create_table`` arguments into a :class:`TableConfig`.

    Args:
      key_dtype, dim, name, emb_initializer, device_vocabulary_size, host_vocabulary_size,
      ssd_vocabulary_size, ssd_data_path, is_save, init_param, value_dtype: see
        :class:`TableConfig`.
      **ignored: Rec SDK's multi-device and NPU options, checked against their documented
        ranges and otherwise ignored: ``is_dp``, ``enable_merge``, ``padding_keys_mask``,
        ``fusion_optimizer_var`` (bools), ``shard_num`` (int in [1, 8192]),
        ``hashtable_threshold`` (int in [0, 2^31-1]), ``padding_keys``, ``padding_keys_len``.

    Returns:
      The validated :class:`TableConfig`.

    Raises:
      TypeError: an argument has the wrong type, or is not one of ``create_table``'s.
      ValueError: an argument is out of range (see :class:`TableConfig`).
    """
    counter = {k: ignored.pop(k) for k in ("admission_counter", "sketch_width", "sketch_depth")
               if k in ignored}
    if "all2all_gradients_op" in ignored:
        counter["all2all_gradients_op"] = check_one_of(
            "all2all_gradients_op", ignored.pop("all2all_gradients_op"), _ALL2ALL_GRADIENTS_OPS)
    _check_ignored(ignored)
    return TableConfig(name=name, key_dtype=key_dtype, dim=dim, emb_initializer=emb_initializer,
                       device_vocabulary_size=device_vocabulary_size,
                       host_vocabulary_size=host_vocabulary_size,
                       ssd_vocabulary_size=ssd_vocabulary_size, ssd_data_path=ssd_data_path,
                       is_save=is_save, init_param=init_param, value_dtype=value_dtype,
                       **counter)


def check_table_name(name: Any, argument: str = "name") -> str:
    """``name`` if it is 1 to 100 characters of ``[A-Za-z0-9_.]`` (a table's name: it names
    files and checkpoint keys).

    Raises:
      TypeError, ValueError: naming ``argument``.
    """
    check_str(argument, name, 1, TABLE_NAME_MAX_LEN)
    if not TABLE_NAME_PATTERN.fullmatch(name):
        fail(argument, f"a str of 1 to {TABLE_NAME_MAX_LEN} characters from A-Z, a-z, 0-9, '_' "
             f"and '.'", name)
    return name



def _check_dtype(argument: str, value: Any, allowed_names: tuple[str, ...]) -> np.dtype:
    allowed = ", ".join(f"tf.{n}" for n in allowed_names)
    allowed = allowed if len(allowed_names) == 1 else "one of " + allowed
    if isinstance(value, tf.DType):
        dtype_name = value.name
    elif isinstance(value, np.dtype):
        dtype_name = value.name
    elif isinstance(value, type) and issubclass(value, np.generic):
        dtype_name = np.dtype(value).name
    elif isinstance(value, str):
        dtype_name = value
    else:
        fail(argument, allowed, value, TypeError)
    if dtype_name not in allowed_names:
        fail(argument, allowed, value)
    return np.dtype(dtype_name)


def _check_dim(dim: Any) -> int:
    allowed = f"an int in [1, {MAX_DIM}] or a 1-D tf.TensorShape holding one"
    if is_int(dim):
        value = dim
    elif isinstance(dim, tf.TensorShape):
        if dim.rank != 1 or dim[0] is None:
            fail("dim", allowed, dim)
        value = dim[0]
    elif isinstance(dim, (list, tuple)):
        if len(dim) != 1 or not is_int(dim[0]):
            fail("dim", allowed, dim)
        value = dim[0]
    else:
        fail("dim", allowed, dim, TypeError)
    if not 1 <= value <= MAX_DIM:
        fail("dim", allowed, dim)
    return int(value)


def _check_ssd_data_path(path: Any) -> tuple[str, ...]:
    allowed = "a str or a non-empty list or tuple of non-empty str"
    if path is None:
        return (os.getcwd(),)
    paths = (path,) if isinstance(path, str) else path
    if not isinstance(paths, (list, tuple)):
        fail("ssd_data_path", allowed, path, TypeError)
    if not paths or not all(isinstance(p, str) and p for p in paths):
        fail("ssd_data_path", allowed, path)
    return tuple(paths)


def _check_ignored(ignored: dict[str, Any]) -> None:
    for argument, value in ignored.items():
        if argument in _IGNORED_BOOLS:
            check_bool(argument, value)
        elif argument == "shard_num":
            check_int(argument, value, 1, _MAX_SHARD_NUM)
        elif argument == "hashtable_threshold":
            check_int(argument, value, 0, INT32_MAX)
        elif argument not in _IGNORED_OTHERS:
            # Rec SDK's create_table has a fixed signature: a misspelt option must not silently
            # fall back to its default.
            raise TypeError(f"create_table() got an unexpected keyword argument `{argument}`. "
                            "Received: " + repr(value))


def _initializer_text(initializer: Any) -> str:
    # Keras / TF initializers print as "<...object at 0x...>"; their class name and config say more.
    get_config = getattr(initializer, "get_config", None)
    if not callable(get_config):
        return repr(initializer)
    params = ", ".join(f"{k}={v!r}" for k, v in get_config().items() if v is not None)
    return f"{type(initializer).__name__}({params})"
