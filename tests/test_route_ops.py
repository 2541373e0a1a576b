"""The compiled routing op of the TF2 faces (``ops/route_ops.py``) and the fused routing
kernel it shares with ``KeyRouter.route`` (``shard_kernels.route_keys``).

Checked against ``test_routing.check_layout``, a plain-Python reference of the layout
(weighted counts per key, owners ``key mod N`` or mixed, each table's segment of each
owner's row, every feature's keys through ``place`` back to themselves), and against
``KeyRouter.route`` array for array.
"""

import numpy as np
import pytest
import tensorflow as tf

from sparseflow.distributed.routing import KeyRouter
from sparseflow.ops import route_ops
from tests.test_routing import HUGE, check_layout, make_router, make_table, random_batch


def routed(router, batch) -> list:
    """``batch`` routed eagerly by the compiled op, as numpy arrays."""
    out = route_ops.route_keys_op(router.route_config(), [tf.constant(k) for k in batch])
    return [t.numpy() for t in out]


def assert_same(out, ref):
    for a, b in zip(out, ref, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("n, hash", [(1, "mod"), (2, "mod"), (3, "mix"), (4, "mod")])
def test_the_op_lays_out_a_batch_as_the_reference_and_as_route(n, hash):
    rng = np.random.default_rng(n)
    router = make_router(n, hash=hash)
    for _ in range(4):
        batch = random_batch(rng, sizes=(40, 65, 31))
        batch[0] = np.concatenate([batch[0], batch[1][:5], HUGE])   # keys in both tables
        out = routed(router, batch)
        check_layout(router, batch, out, hash=hash)
        assert_same(out, router.route(batch))


def test_the_op_routes_empty_features_and_an_empty_batch():
    router = make_router(3)
    for batch in ([np.zeros(0, np.int64), np.array([4, 4, 9]), np.zeros(0, np.int64)],
                  [np.zeros(0, np.int64)] * 3):
        out = routed(router, batch)
        check_layout(router, batch, out)
        assert_same(out, router.route(batch))
    assert out[0].shape == (3, 1, 2) and out[2].shape == (0, 2) and out[3].shape == (0,)


def test_the_op_flattens_multi_hot_keys_row_by_row():
    router = make_router(2)
    batch = [np.array([[1, 2], [2, 7]]), np.array([[5], [6]]), np.array([[9, 9, 1]])]
    out = routed(router, batch)
    flat = [k.reshape(-1) for k in batch]
    check_layout(router, flat, out)
    assert_same(out, router.route(flat))


def test_a_table_without_features_routes_nothing_of_its_own():
    tables = [make_table(name, dim, -1) for name, dim in (("a", 2), ("b", 3), ("c", 2))]
    router = KeyRouter(tables, [2, 0, 2], [1, 2, 1], world_size=2)
    batch = [np.array([3, 4, 3]), np.array([8, 3]), np.array([4, 5])]
    out = routed(router, batch)
    assert_same(out, router.route(batch))
    assert out[4][:3].tolist() == [2, 0, 3]       # unique keys of tables a, b, c
    assert out[1][:, 1].sum() == 0


def test_in_a_graph_the_routing_is_one_compiled_op_with_static_ranks():
    router = make_router(4)

    @tf.function
    def route(a, b, c):
        return route_ops.route_keys_op(router.route_config(), [a, b, c])

    spec = tf.TensorSpec([None], tf.int64)
    graph = route.get_concrete_function(spec, spec, spec).graph
    types = [op.type for op in graph.get_operations()]
    assert types.count(route_ops.ROUTE_KEYS) == 1
    assert not {"PyFunc", "PyFuncStateless", "EagerPyFunc"} & set(types)
    send, counts, place, gather, sizes = graph.outputs[:5]
    assert send.shape.as_list() == [4, None, 2] and counts.shape.as_list() == [4, 2]
    assert place.shape.as_list() == [None, 2] and gather.shape.as_list() == [None]
    assert sizes.shape.as_list() == [5]
    batch = [np.array([1, 5, 1]), np.array([6, 7]), np.array([2])]
    assert_same([t.numpy() for t in route(*(tf.constant(k) for k in batch))],
                router.route(batch))


@pytest.mark.parametrize("change", ["length", "order", "world", "table", "features"])
def test_a_config_that_does_not_describe_the_inputs_is_refused_by_the_op(change):
    router = make_router(2)
    config = router.route_config()
    keys = [tf.constant([1, 2], tf.int64)] * 3
    if change == "length":
        config = config[:-1]
    elif change == "order":        # feature 0 twice, feature 1 never
        config[4:7] = [0, 0, 2]
    elif change == "world":
        config[0] = 0
    elif change == "table":        # a segment's table outside [0, T)
        config[-1] = 7
    else:
        keys = keys[:2]
    with pytest.raises(tf.errors.InvalidArgumentError, match="SparseflowRouteKeys: config"):
        route_ops.route_keys_op(config, keys)


def test_a_router_with_a_send_count_has_no_compiled_routing():
    with pytest.raises(ValueError, match="send_count.*12"):
        make_router(2, send_count=12).route_config()


def test_a_router_routed_by_the_op_commits_its_rows_ahead_in_process(monkeypatch):
    committed = []
    router = make_router(2)
    router.commit_in_process = True
    for table in router.tables:
        monkeypatch.setattr(table.rows, "commit_ahead",
                            lambda first, n, name=table.table_name: committed.append(name))
    batch = [np.arange(40), np.arange(100, 150), np.arange(30)]
    send, counts, *_ = router.route(batch)
    assert committed == []
    router.process(send, counts, None, True)   # as if every rank sent what this one did
    assert sorted(committed) == ["narrow", "wide"]
