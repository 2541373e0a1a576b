"""``FeatureSpec`` and ``group_specs_by_table``: valid input, then one test per rule."""

import re

import numpy as np
import pytest

from sparseflow import runtime
from sparseflow.featurespec.grouping import SpecGroups, group_specs_by_table
from sparseflow.featurespec.spec import FeatureSpec
from sparseflow.validation import INT32_MAX


def names(argument, received):
    """Regex: the message names ``argument`` and shows ``received`` as the template does."""
    return rf"`{re.escape(argument)}`.*Received: {re.escape(repr(received))}$"


@pytest.fixture(autouse=True)
def session():
    runtime.terminate_config_initializer()
    runtime.init()
    yield
    runtime.terminate_config_initializer()


# --- FeatureSpec: valid input ----------------------------------------------------------------

def test_defaults():
    spec = FeatureSpec("user_ids")
    assert spec.name == "user_ids"
    assert spec.table_name == "user_ids"
    assert spec.index_key == "user_ids"
    assert spec.access_threshold is None
    assert spec.eviction_threshold is None
    assert spec.is_timestamp is False
    assert spec.batch_size is None
    assert spec.faae_coefficient == 1
    assert not spec.admission_enabled
    assert not spec.eviction_enabled


def test_all_arguments():
    spec = FeatureSpec("user_ids", table_name="user_table", index_key=3, access_threshold=2,
                       eviction_threshold=86400, is_timestamp=False, batch_size=4096,
                       faae_coefficient=4)
    assert (spec.table_name, spec.index_key, spec.access_threshold, spec.eviction_threshold,
            spec.batch_size, spec.faae_coefficient) == ("user_table", 3, 2, 86400, 4096, 4)
    assert spec.admission_enabled and spec.eviction_enabled


def test_unique_name_has_counter_suffix_and_differs():
    train = FeatureSpec("user_ids")
    eval_ = FeatureSpec("user_ids")
    assert re.fullmatch(r"user_ids_\d+", train.unique_name)
    assert re.fullmatch(r"user_ids_\d+", eval_.unique_name)
    assert train.unique_name != eval_.unique_name
    assert train.name == eval_.name == "user_ids"


def test_unique_name_not_reused_after_reinit():
    first = FeatureSpec("user_ids")
    runtime.terminate_config_initializer()
    runtime.init()
    assert FeatureSpec("user_ids").unique_name != first.unique_name


def test_registered_in_runtime_in_creation_order():
    a, b = FeatureSpec("a"), FeatureSpec("b")
    assert runtime.current().feature_specs == [a, b]


@pytest.mark.parametrize("key", [0, 255, np.int32(7), "k", "k" * 255])
def test_index_key_bounds_accepted(key):
    spec = FeatureSpec("f", index_key=key)
    assert spec.index_key == key
    assert type(spec.index_key) in (int, str)


@pytest.mark.parametrize("value", [-1, 0, INT32_MAX])
def test_threshold_bounds_accepted(value):
    spec = FeatureSpec("f", access_threshold=value, eviction_threshold=value)
    assert spec.access_threshold == spec.eviction_threshold == value


def test_threshold_semantics():
    # None and -1 are off; 0 is on (sparseflow follows Rec SDK's docs, not its truthiness test).
    assert not FeatureSpec("a", access_threshold=-1, eviction_threshold=-1).admission_enabled
    assert not FeatureSpec("b", access_threshold=-1, eviction_threshold=-1).eviction_enabled
    zero = FeatureSpec("c", access_threshold=0, eviction_threshold=0)
    assert zero.admission_enabled and zero.eviction_enabled
    only_access = FeatureSpec("d", access_threshold=5)
    assert only_access.admission_enabled and not only_access.eviction_enabled


def test_timestamp_spec_has_no_table():
    ts = FeatureSpec("timestamp", index_key=0, is_timestamp=True)
    assert ts.is_timestamp is True
    assert ts.table_name is None
    assert ts.index_key == 0


def test_is_timestamp_false_is_a_normal_spec():
    assert FeatureSpec("f", is_timestamp=False).table_name == "f"


def test_name_bounds_accepted():
    assert FeatureSpec("x").name == "x"
    assert FeatureSpec("x" * 255, table_name="t" * 255).table_name == "t" * 255


def test_immutable():
    spec = FeatureSpec("f")
    with pytest.raises(AttributeError, match="immutable"):
        spec.table_name = "other"
    with pytest.raises(AttributeError, match="immutable"):
        spec.new_attribute = 1
    with pytest.raises(AttributeError, match="immutable"):
        del spec.name
    assert spec.table_name == "f"


def test_copy_returns_the_same_spec():
    import copy
    spec = FeatureSpec("f")
    assert copy.copy(spec) is spec
    assert copy.deepcopy([spec])[0] is spec


def test_repr():
    spec = FeatureSpec("user_ids", table_name="user_table", access_threshold=2,
                       faae_coefficient=3)
    text = repr(spec)
    assert text.startswith("FeatureSpec(name='user_ids', ")
    assert f"unique_name='{spec.unique_name}'" in text
    assert "table_name='user_table'" in text
    assert "access_threshold=2" in text
    assert "faae_coefficient=3" in text
    assert "eviction_threshold" not in text
    assert "is_timestamp=True" in repr(FeatureSpec("ts", is_timestamp=True))


# --- FeatureSpec: invalid input --------------------------------------------------------------

@pytest.mark.parametrize("value", ["", "n" * 256])
def test_name_length(value):
    with pytest.raises(ValueError, match=names("name", value)):
        FeatureSpec(value)


@pytest.mark.parametrize("value", [None, 3, b"user"])
def test_name_type(value):
    with pytest.raises(TypeError, match=names("name", value)):
        FeatureSpec(value)


@pytest.mark.parametrize("value", ["", "t" * 256])
def test_table_name_length(value):
    with pytest.raises(ValueError, match=names("table_name", value)):
        FeatureSpec("f", table_name=value)


def test_table_name_type():
    with pytest.raises(TypeError, match=names("table_name", 5)):
        FeatureSpec("f", table_name=5)


@pytest.mark.parametrize("value", [-1, 256, "", "k" * 256])
def test_index_key_range(value):
    with pytest.raises(ValueError, match=names("index_key", value)):
        FeatureSpec("f", index_key=value)


@pytest.mark.parametrize("value", [1.0, True, ("a",)])
def test_index_key_type(value):
    with pytest.raises(TypeError, match=names("index_key", value)):
        FeatureSpec("f", index_key=value)


@pytest.mark.parametrize("argument", ["access_threshold", "eviction_threshold"])
@pytest.mark.parametrize("value", [-2, INT32_MAX + 1])
def test_threshold_range(argument, value):
    kwargs = {"access_threshold": 1, argument: value}
    with pytest.raises(ValueError, match=names(argument, value)):
        FeatureSpec("f", **kwargs)


@pytest.mark.parametrize("argument", ["access_threshold", "eviction_threshold"])
@pytest.mark.parametrize("value", [1.5, "2", False])
def test_threshold_type(argument, value):
    kwargs = {"access_threshold": 1, argument: value}
    with pytest.raises(TypeError, match=names(argument, value)):
        FeatureSpec("f", **kwargs)


def test_eviction_without_access():
    with pytest.raises(ValueError) as info:
        FeatureSpec("f", eviction_threshold=10)
    message = str(info.value)
    assert message.startswith("Access_threshold should be configured before eviction_threshold.")
    assert "`access_threshold`" in message and "`eviction_threshold`" in message
    assert message.endswith("Received: access_threshold=None, eviction_threshold=10")


@pytest.mark.parametrize("value", [1, 0, "yes"])
def test_is_timestamp_type(value):
    with pytest.raises(TypeError, match=names("is_timestamp", value)):
        FeatureSpec("f", is_timestamp=value)


@pytest.mark.parametrize("argument, value", [("table_name", "t"), ("access_threshold", 1)])
def test_timestamp_spec_takes_no_table_arguments(argument, value):
    with pytest.raises(ValueError, match=names(argument, value)) as info:
        FeatureSpec("ts", is_timestamp=True, **{argument: value})
    assert "`is_timestamp`" in str(info.value)


def test_timestamp_spec_takes_no_eviction_threshold():
    with pytest.raises(ValueError, match=names("eviction_threshold", 5)):
        FeatureSpec("ts", is_timestamp=True, eviction_threshold=5)


@pytest.mark.parametrize("value", [0, -1])
def test_batch_size_range(value):
    with pytest.raises(ValueError, match=names("batch_size", value)):
        FeatureSpec("f", batch_size=value)


def test_batch_size_type():
    with pytest.raises(TypeError, match=names("batch_size", 32.0)):
        FeatureSpec("f", batch_size=32.0)


@pytest.mark.parametrize("value", [0, -3])
def test_faae_coefficient_range(value):
    with pytest.raises(ValueError, match=names("faae_coefficient", value)):
        FeatureSpec("f", faae_coefficient=value)


@pytest.mark.parametrize("value", [None, 1.0])
def test_faae_coefficient_type(value):
    with pytest.raises(TypeError, match=names("faae_coefficient", value)):
        FeatureSpec("f", faae_coefficient=value)


def test_failed_spec_is_not_registered():
    with pytest.raises(ValueError):
        FeatureSpec("f", batch_size=0)
    assert runtime.current().feature_specs == []


# --- group_specs_by_table: valid input -------------------------------------------------------

def test_grouping_order_and_shared_tables():
    user = FeatureSpec("user_ids", table_name="user_table", access_threshold=2)
    item = FeatureSpec("item_ids", table_name="item_table")
    user_hist = FeatureSpec("user_hist", table_name="user_table", access_threshold=2,
                            faae_coefficient=4)
    ts = FeatureSpec("timestamp", is_timestamp=True)
    specs = [item, ts, user, user_hist]
    groups = group_specs_by_table(specs)
    assert isinstance(groups, SpecGroups)
    assert list(groups.tables) == ["item_table", "user_table"]
    assert groups.tables["user_table"] == [user, user_hist]
    assert groups.tables["item_table"] == [item]
    assert groups.timestamp is ts
    assert specs == [item, ts, user, user_hist]  # input untouched


def test_grouping_tuple_without_timestamp():
    a = FeatureSpec("a")
    groups = group_specs_by_table((a,))
    assert groups.tables == {"a": [a]}
    assert groups.timestamp is None


def test_grouping_allows_duplicate_index_key_in_one_table():
    a = FeatureSpec("a", table_name="t", index_key="ids")
    b = FeatureSpec("b", table_name="t", index_key="ids")
    assert group_specs_by_table([a, b]).tables == {"t": [a, b]}


def test_grouping_same_name_train_and_eval_specs():
    train, eval_ = FeatureSpec("user"), FeatureSpec("user")
    assert group_specs_by_table([train, eval_]).tables == {"user": [train, eval_]}


# --- group_specs_by_table: invalid input -----------------------------------------------------

@pytest.mark.parametrize("value", [None, "spec", {"a": 1}])
def test_grouping_not_a_list(value):
    with pytest.raises(TypeError, match=names("tgt_key_specs", value)):
        group_specs_by_table(value)


@pytest.mark.parametrize("value", [[], ()])
def test_grouping_empty(value):
    with pytest.raises(ValueError, match=names("tgt_key_specs", value)):
        group_specs_by_table(value)


def test_grouping_element_not_a_spec():
    spec = FeatureSpec("a")
    with pytest.raises(TypeError, match=names("tgt_key_specs[1]", "b")):
        group_specs_by_table([spec, "b"])


def test_grouping_argument_name_is_configurable():
    with pytest.raises(ValueError, match=names("feature_specs", [])):
        group_specs_by_table([], argument="feature_specs")


def test_grouping_two_timestamps():
    ts1 = FeatureSpec("ts", is_timestamp=True)
    ts2 = FeatureSpec("ts", is_timestamp=True)
    with pytest.raises(ValueError, match=r"`tgt_key_specs`.*at most one.*is_timestamp=True.*"
                                         rf"Received: '{ts1.unique_name}' and "
                                         rf"'{ts2.unique_name}'$"):
        group_specs_by_table([FeatureSpec("a"), ts1, ts2])


def test_grouping_only_timestamp():
    ts = FeatureSpec("ts", is_timestamp=True)
    with pytest.raises(ValueError, match=r"`tgt_key_specs`.*at least one FeatureSpec with a "
                                         rf"table.*Received: \[\"'{ts.unique_name}'\"\]$"):
        group_specs_by_table([ts])


def test_grouping_same_spec_twice():
    spec = FeatureSpec("a")
    with pytest.raises(ValueError, match=names("tgt_key_specs", spec.unique_name)):
        group_specs_by_table([spec, spec])


@pytest.mark.parametrize("first, second", [
    ({"access_threshold": 2}, {"access_threshold": 3}),
    ({"access_threshold": 2}, {}),
    ({"access_threshold": 2, "eviction_threshold": 10}, {"access_threshold": 2}),
    ({"access_threshold": 0}, {}),  # 0 is "on", None is "off"
])
def test_grouping_thresholds_differ_in_one_table(first, second):
    a = FeatureSpec("a", table_name="shared", **first)
    b = FeatureSpec("b", table_name="shared", **second)
    with pytest.raises(ValueError) as info:
        group_specs_by_table([a, b])
    message = str(info.value)
    assert message.startswith("the access and evict threshold param must be same in one table "
                              "when multi lookup.")
    assert "`access_threshold`" in message and "`eviction_threshold`" in message
    assert "'shared'" in message
    assert (f"'{a.unique_name}' with access_threshold={a.access_threshold!r}, "
            f"eviction_threshold={a.eviction_threshold!r}") in message
    assert (f"'{b.unique_name}' with access_threshold={b.access_threshold!r}, "
            f"eviction_threshold={b.eviction_threshold!r}") in message


def test_grouping_thresholds_may_differ_across_tables():
    a = FeatureSpec("a", table_name="t1", access_threshold=2)
    b = FeatureSpec("b", table_name="t2", access_threshold=5, eviction_threshold=1)
    assert list(group_specs_by_table([a, b]).tables) == ["t1", "t2"]


def test_grouping_treats_none_and_minus_one_as_the_same_off():
    a = FeatureSpec("a", table_name="t", access_threshold=-1)
    b = FeatureSpec("b", table_name="t")
    assert group_specs_by_table([a, b]).tables["t"] == [a, b]
