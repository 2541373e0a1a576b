"""Checks of ``sparse_lookup``'s Rec SDK arguments that say what a lookup reads rather than
how: ``dim``, ``access_and_evict_config`` and ``serving_default_value``."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from sparseflow.validation import fail, is_int

# Rec SDK's access_and_evict_config keys.
CONFIG_KEYS = ("access_threshold", "eviction_threshold", "faae_coefficient")


def check_dim(table, dim) -> None:
    """``dim`` may be None (the table's), the table's dim as an int, or a 1-D
    ``tf.TensorShape`` of it (what Rec SDK's ``create_table`` takes).

    Raises:
      ValueError: ``dim`` is anything else.
    """
    if dim is None:
        return
    value = dim
    if isinstance(dim, tf.TensorShape) and dim.rank == 1:
        value = dim[0]
    if not (is_int(value) and int(value) == table.dim):
        fail("dim", f"None or the dim of table `{table.table_name}` ({table.dim})", dim)


def check_access_and_evict_config(config) -> dict | None:
    """Rec SDK's per-lookup admission and eviction settings: None, or a dict with some of
    ``access_threshold``, ``eviction_threshold``, ``faae_coefficient``.

    Returns:
      ``config`` (absent keys keep Rec SDK's defaults: no admission, no eviction,
      ``faae_coefficient`` 1).

    Raises:
      TypeError: ``config`` is not None or a dict.
      ValueError: it has other keys.
    """
    if config is None:
        return None
    if not isinstance(config, dict):
        fail("access_and_evict_config", f"None or a dict with keys {', '.join(CONFIG_KEYS)}",
             config, TypeError)
    unknown = sorted(set(config) - set(CONFIG_KEYS), key=str)
    if unknown:
        fail("access_and_evict_config", f"a dict with keys {', '.join(CONFIG_KEYS)} only",
             unknown)
    return config


def check_config_matches_spec(config: dict, spec) -> None:
    """In FeatureSpec mode the FeatureSpec sets the thresholds (as in Rec SDK); an
    ``access_and_evict_config`` given as well must say the same (None and -1 both mean off).

    Raises:
      ValueError: a value differs from the spec's, naming both.
    """
    for key in CONFIG_KEYS:
        if key not in config:
            continue
        given, held = config[key], getattr(spec, key)
        off = 1 if key == "faae_coefficient" else -1   # what None stands for
        same = (off if given is None else given) == (off if held is None else held)
        if not same:
            raise ValueError(
                f"Argument `access_and_evict_config` sets {key}={given!r}, but FeatureSpec "
                f"`{spec.name}` has {key}={held!r}: in FeatureSpec mode the FeatureSpec sets "
                f"the table's admission and eviction. Pass the same value, or leave "
                f"access_and_evict_config=None.")


def check_serving_default_value(table, value):
    """``serving_default_value`` as a float32 tensor broadcastable to ``[dim]``, or None.

    Raises:
      ValueError: its static shape does not broadcast to ``[dim]``.
    """
    if value is None:
        return None
    value = tf.cast(value, tf.float32)
    shape = value.shape
    if shape.rank is not None and None not in shape.as_list():
        try:
            fits = np.broadcast_shapes(tuple(shape.as_list()), (table.dim,)) == (table.dim,)
        except ValueError:
            fits = False
        if not fits:
            raise ValueError(f"Argument `serving_default_value` must broadcast to the table's "
                             f"[dim] = [{table.dim}]. Received: shape {tuple(shape.as_list())}")
    return value
