"""``FeatureSpec``: which batch entry feeds which table, and that table's admission settings.

Rec SDK's FeatureSpec mode: the script builds one spec per id feature, then passes the specs to
``get_asc_insert_func(tgt_key_specs=...)`` (to key the ``tf.data`` batches) and to
``sparse_lookup(table, spec, ...)``.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

from sparseflow import runtime
from sparseflow.embed.limits import (ACCESS_THRESHOLD_MAX, ACCESS_THRESHOLD_MIN,
                                     EVICTION_THRESHOLD_MAX, FEATURE_NAME_MAX_LEN as _NAME_MAX_LEN)
from sparseflow.validation import (INT32_MAX, check_bool, check_int, check_optional_int, check_str,
                                   fail, is_int)

_INDEX_KEY_MAX = 255

# Process-wide, never reset: a spec created after a terminate/init cycle must not reuse a
# unique name that some object of the previous session may still hold.
_COUNTER = itertools.count(1)
_COUNTER_LOCK = threading.Lock()


class FeatureSpec:
    """One id feature of the input batch, looked up in one table. Immutable once built.

    Admission and eviction (sparseflow deliberately differs from Rec SDK's code here, which
    tests the thresholds by truthiness, and follows Rec SDK's documentation instead):

    * ``access_threshold`` None or -1: admission is off for the table; every key gets a row.
    * ``access_threshold`` >= 0: a key gets a row once its count (occurrences in training
      batches, times ``faae_coefficient``) reaches the threshold. 0 admits every key at its
      first occurrence.
    * ``eviction_threshold`` None or -1: no eviction. >= 0: on eviction, every key with
      ``clock - last_seen >= eviction_threshold`` is removed, ``clock`` being the largest
      timestamp seen in the pipeline's timestamp spec (so 0 evicts every key not seen at the
      current clock). Setting it needs ``access_threshold`` to be set too.

    Example:
      >>> sparseflow.init()
      >>> user = FeatureSpec("user_ids", table_name="user_table", access_threshold=2,
      ...                    eviction_threshold=86400)
      >>> item = FeatureSpec("item_ids", table_name="item_table")
      >>> ts = FeatureSpec("timestamp", is_timestamp=True)

    Args:
      name: str of length 1 to 255. The spec's name as the user knows it.
      table_name: the table the ids are looked up in, str of length 1 to 255; default ``name``.
        Specs sharing a table are looked up together and must have the same thresholds.
        Must be None for a timestamp spec, which has no table.
      index_key: the key of the ids in the batch dict: a str of length 1 to 255, or an int in
        [0, 255] for a dict keyed by ints (the insert function needs dict elements, not
        tuples); default ``name``.
      access_threshold: None or an int in [-1, 2^31-1], see above.
      eviction_threshold: None or an int in [-1, 2^31-1], see above. Needs ``access_threshold``.
      is_timestamp: None or a bool. True makes this spec name a per-sample int64 timestamp
        tensor (batch entry ``index_key``) instead of ids; at most one per pipeline. A
        timestamp spec takes no ``table_name`` and no thresholds.
      batch_size: None or an int >= 1.
      faae_coefficient: int >= 1, the weight of one occurrence in the admission count. Specs of
        one table may use different coefficients.

    Attributes:
      name: ``name`` as passed.
      unique_name: ``f"{name}_{n}"`` with ``n`` a process-wide counter, so that a train and an
        eval spec of the same name never collide.
      table_name: str, or None for a timestamp spec.
      index_key: int or str.
      access_threshold, eviction_threshold: int or None, as passed.
      is_timestamp: bool (False when None was passed).
      batch_size: int or None.
      faae_coefficient: int.

    Raises:
      sparseflow.runtime.NotInitializedError: ``sparseflow.init`` is not active.
      TypeError: an argument has the wrong type.
      ValueError: an argument is out of range, ``eviction_threshold`` is set without
        ``access_threshold``, or a timestamp spec has a table name or thresholds.
    """

    __slots__ = ("name", "unique_name", "table_name", "index_key", "access_threshold",
                 "eviction_threshold", "is_timestamp", "batch_size", "faae_coefficient")

    def __init__(self, name: str, table_name: str | None = None, index_key: int | str | None = None,
                 access_threshold: int | None = None, eviction_threshold: int | None = None,
                 is_timestamp: bool | None = None, batch_size: int | None = None,
                 faae_coefficient: int = 1) -> None:
        rt = runtime.current("FeatureSpec")
        check_str("name", name, 1, _NAME_MAX_LEN)
        if table_name is not None:
            check_str("table_name", table_name, 1, _NAME_MAX_LEN)
        index_key = name if index_key is None else _check_index_key(index_key)
        access_threshold = check_optional_int("access_threshold", access_threshold,
                                              ACCESS_THRESHOLD_MIN, ACCESS_THRESHOLD_MAX)
        eviction_threshold = check_optional_int("eviction_threshold", eviction_threshold, -1,
                                                EVICTION_THRESHOLD_MAX)
        is_timestamp = False if is_timestamp is None else check_bool("is_timestamp", is_timestamp)
        batch_size = check_optional_int("batch_size", batch_size, 1, INT32_MAX)
        faae_coefficient = check_int("faae_coefficient", faae_coefficient, 1, INT32_MAX)
        if is_timestamp:
            _check_timestamp_spec(table_name, access_threshold, eviction_threshold)
        elif table_name is None:
            table_name = name
        if access_threshold is None and eviction_threshold is not None:
            raise ValueError(
                "Access_threshold should be configured before eviction_threshold. Argument "
                "`access_threshold` must be set when `eviction_threshold` is. Received: "
                f"access_threshold=None, eviction_threshold={eviction_threshold!r}")

        with _COUNTER_LOCK:
            unique_name = f"{name}_{next(_COUNTER)}"
        for attr, value in (("name", name), ("unique_name", unique_name),
                            ("table_name", table_name), ("index_key", index_key),
                            ("access_threshold", access_threshold),
                            ("eviction_threshold", eviction_threshold),
                            ("is_timestamp", is_timestamp), ("batch_size", batch_size),
                            ("faae_coefficient", faae_coefficient)):
            object.__setattr__(self, attr, value)
        with rt.lock:
            rt.feature_specs.append(self)

    @property
    def thresholds(self) -> tuple[int, int]:
        """(access_threshold, eviction_threshold) with None spelled -1: both mean "off"."""
        return (-1 if self.access_threshold is None else self.access_threshold,
                -1 if self.eviction_threshold is None else self.eviction_threshold)

    @property
    def admission_enabled(self) -> bool:
        """Whether this spec turns admission on for its table (``access_threshold >= 0``)."""
        return self.access_threshold is not None and self.access_threshold >= 0

    @property
    def eviction_enabled(self) -> bool:
        """Whether this spec turns eviction on for its table (``eviction_threshold >= 0``)."""
        return self.eviction_threshold is not None and self.eviction_threshold >= 0

    def __copy__(self) -> FeatureSpec:
        return self  # immutable, and a copy must keep the unique_name: share the object

    def __deepcopy__(self, memo: dict) -> FeatureSpec:
        return self

    def __setattr__(self, attr: str, value: Any) -> None:
        raise AttributeError(f"FeatureSpec is immutable: cannot set `{attr}`; create a new spec.")

    def __delattr__(self, attr: str) -> None:
        raise AttributeError(f"FeatureSpec is immutable: cannot delete `{attr}`.")

    def __repr__(self) -> str:
        fields = [f"name={self.name!r}", f"unique_name={self.unique_name!r}"]
        if self.is_timestamp:
            fields.append("is_timestamp=True")
        else:
            fields.append(f"table_name={self.table_name!r}")
        fields.append(f"index_key={self.index_key!r}")
        for attr in ("access_threshold", "eviction_threshold", "batch_size"):
            value = getattr(self, attr)
            if value is not None:
                fields.append(f"{attr}={value!r}")
        if self.faae_coefficient != 1:
            fields.append(f"faae_coefficient={self.faae_coefficient!r}")
        return f"FeatureSpec({', '.join(fields)})"


def _check_index_key(index_key: Any) -> int | str:
    if is_int(index_key) and 0 <= index_key <= _INDEX_KEY_MAX:
        return int(index_key)
    if isinstance(index_key, str) and 1 <= len(index_key) <= _NAME_MAX_LEN:
        return index_key
    error = ValueError if is_int(index_key) or isinstance(index_key, str) else TypeError
    fail("index_key", f"an int in [0, {_INDEX_KEY_MAX}] or a str of length 1 to {_NAME_MAX_LEN}",
         index_key, error)


def _check_timestamp_spec(table_name: str | None, access_threshold: int | None,
                          eviction_threshold: int | None) -> None:
    # A timestamp spec feeds the eviction clock of every table; a table name or thresholds on
    # it would be silently ignored, so refuse them.
    for argument, value in (("table_name", table_name), ("access_threshold", access_threshold),
                            ("eviction_threshold", eviction_threshold)):
        if value is not None:
            fail(argument, "None when `is_timestamp` is True (a timestamp spec has no table)",
                 value)
