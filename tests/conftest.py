"""Shared fixtures: a fresh sparseflow init and a fresh TF graph per test."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import sparseflow as sf  # noqa: E402
import sparseflow.table  # noqa: E402


@pytest.fixture(autouse=True)
def _host_rows_unless_asked(monkeypatch):
    """Tables created without ``rows_on`` get host rows, also on a machine with a GPU (where
    the placement rule picks device rows), so that the suite runs the same everywhere.
    tests/test_device_tables.py asks for device rows explicitly and tests the rule itself."""
    monkeypatch.setattr(sparseflow.table, "default_rows_on", lambda: "host")


@pytest.fixture(autouse=True)
def _no_runtime_left_behind():
    """A test that fails between its ``init`` and its ``terminate_config_initializer`` would
    leave the runtime active, and every later test of its worker would fail at its own
    ``init`` (AlreadyInitializedError): ending it here keeps one failure one failure."""
    yield
    sf.terminate_config_initializer()


@pytest.fixture
def graph():
    """A fresh default graph for tf.compat.v1 code; sparseflow init/terminate around it."""
    sf.terminate_config_initializer()
    g = tf.Graph()
    with g.as_default():
        yield g
    sf.terminate_config_initializer()


@pytest.fixture
def sf_init(graph):
    """``sparseflow.init()`` with defaults inside a fresh graph."""
    sf.init()
    return graph


@pytest.fixture(scope="session")
def movielens_cache(tmp_path_factory):
    """A cache directory for the recbole wheel that ships MovieLens-100K, shared by the
    session: the wheel is downloaded from PyPI once (copied from ``~/.cache/sparseflow`` when
    it is already there)."""
    import shutil

    from sparseflow.datasets import movielens

    path = tmp_path_factory.mktemp("ml-cache")
    home = os.path.expanduser(os.path.join("~/.cache/sparseflow", movielens.WHEEL))
    if os.path.isfile(home):
        shutil.copy(home, path / movielens.WHEEL)
    return str(path)
