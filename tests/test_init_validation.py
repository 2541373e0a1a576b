"""``init`` / ``terminate_config_initializer`` argument rules (Rec SDK's ``init`` ranges)."""

import re

import numpy as np
import pytest

from sparseflow import runtime
from sparseflow.runtime import AlreadyInitializedError, NotInitializedError
from sparseflow.featurespec.spec import FeatureSpec
from sparseflow.validation import INT32_MAX

STEP_ARGS = ("max_steps", "train_steps", "eval_steps", "save_steps")
BOOL_ARGS = ("use_dynamic", "use_dynamic_expansion", "if_load")


def names(argument, received):
    """Regex: the message names ``argument`` and shows ``received`` as the template does."""
    return rf"`{re.escape(argument)}`.*Received: {re.escape(repr(received))}$"


@pytest.fixture(autouse=True)
def clean_state():
    runtime.terminate_config_initializer()
    yield
    runtime.terminate_config_initializer()


# --- valid input -----------------------------------------------------------------------------

def test_defaults_follow_rec_sdk():
    cfg = runtime.init()
    assert (cfg.max_steps, cfg.train_steps, cfg.eval_steps, cfg.save_steps) == (-1, -1, -1, -1)
    assert cfg.use_dynamic is True
    assert cfg.use_dynamic_expansion is False
    assert cfg.if_load is False
    assert runtime.is_initialized()
    assert runtime.current().config is cfg


@pytest.mark.parametrize("argument", STEP_ARGS)
@pytest.mark.parametrize("value", [-1, 0, 1, INT32_MAX, np.int64(7)])
def test_step_bounds_accepted(argument, value):
    cfg = runtime.init(**{argument: value})
    assert getattr(cfg, argument) == value


@pytest.mark.parametrize("argument", BOOL_ARGS)
@pytest.mark.parametrize("value", [True, False])
def test_bools_accepted(argument, value):
    assert getattr(runtime.init(**{argument: value}), argument) is value


def test_hardware_options_ignored():
    cfg = runtime.init(bind_cpu=False, use_lccl=True, recent_key_count_threshold=3)
    assert cfg == runtime.InitConfig()


def test_some_steps_zero_is_allowed():
    cfg = runtime.init(max_steps=0, train_steps=0, eval_steps=5)
    assert cfg.eval_steps == 5


def test_terminate_twice_is_safe_and_allows_init_again():
    runtime.init()
    runtime.terminate_config_initializer()
    runtime.terminate_config_initializer()
    assert not runtime.is_initialized()
    runtime.init(train_steps=3)
    assert runtime.current().config.train_steps == 3


def test_terminate_forgets_feature_specs():
    runtime.init()
    FeatureSpec("user")
    assert len(runtime.current().feature_specs) == 1
    runtime.terminate_config_initializer()
    runtime.init()
    assert runtime.current().feature_specs == []


def test_get_use_dynamic_expansion():
    runtime.init(use_dynamic_expansion=True)
    assert runtime.get_use_dynamic_expansion() is True


# --- invalid input ---------------------------------------------------------------------------

@pytest.mark.parametrize("argument", STEP_ARGS)
@pytest.mark.parametrize("value", [-2, INT32_MAX + 1, -(2**40)])
def test_step_out_of_range(argument, value):
    with pytest.raises(ValueError, match=names(argument, value)):
        runtime.init(**{argument: value})
    assert not runtime.is_initialized()


@pytest.mark.parametrize("argument", STEP_ARGS)
@pytest.mark.parametrize("value", [1.0, "10", True, None])
def test_step_wrong_type(argument, value):
    with pytest.raises(TypeError, match=names(argument, value)):
        runtime.init(**{argument: value})


def test_step_message_states_range():
    with pytest.raises(ValueError, match=re.escape(f"an int in [-1, {INT32_MAX}]")):
        runtime.init(save_steps=-5)


@pytest.mark.parametrize("argument", BOOL_ARGS)
@pytest.mark.parametrize("value", [1, 0, "True", None])
def test_bool_wrong_type(argument, value):
    with pytest.raises(TypeError, match=names(argument, value)):
        runtime.init(**{argument: value})


def test_max_train_eval_all_zero():
    with pytest.raises(ValueError, match=r"`max_steps`, `train_steps` and `eval_steps`.*"
                                         r"must not all be 0.*Received: 0, 0, 0"):
        runtime.init(max_steps=0, train_steps=0, eval_steps=0)
    assert not runtime.is_initialized()


def test_second_init_raises():
    runtime.init()
    with pytest.raises(AlreadyInitializedError, match="terminate_config_initializer"):
        runtime.init()
    # The first session survives the failed call.
    assert runtime.is_initialized()


def test_runtime_before_init_raises():
    with pytest.raises(NotInitializedError, match=r"sparseflow\.init.*before using create_table"):
        runtime.current("create_table")


def test_feature_spec_before_init_raises():
    with pytest.raises(NotInitializedError, match="FeatureSpec"):
        FeatureSpec("user")


def test_feature_spec_after_terminate_raises():
    runtime.init()
    runtime.terminate_config_initializer()
    with pytest.raises(NotInitializedError, match="FeatureSpec"):
        FeatureSpec("user")


def test_get_use_dynamic_expansion_before_init_raises():
    with pytest.raises(NotInitializedError, match="get_use_dynamic_expansion"):
        runtime.get_use_dynamic_expansion()
