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


# make_router's config: [world, mixed, T=2, F=3, order 1 2 0, coefs 1 3 1, table ends 2 3,
# segment tables 0 0 1] (features 1 and 2 read table 0, feature 0 table 1).
CHANGES = {
    "length": lambda c: c[:-1],
    "order": lambda c: _set(c, slice(4, 7), [0, 0, 2]),     # feature 0 twice, 1 never
    "world": lambda c: _set(c, 0, 0),
    "mixed": lambda c: _set(c, 1, 2),
    "table": lambda c: _set(c, -1, 7),                       # outside [0, T)
    "inconsistent": lambda c: _set(c, slice(12, 15), [0, 1, 1]),   # segment 1 is table 0's
    "short ends": lambda c: _set(c, slice(10, 12), [1, 1]),  # the last end before F
    "decreasing ends": lambda c: _set(c, slice(10, 12), [3, 2]),
}


def _set(config, where, value):
    config[where] = value
    return config


def test_make_routers_config_is_the_one_the_changes_below_assume():
    assert make_router(2).route_config().tolist() == [2, 0, 2, 3, 1, 2, 0, 1, 3, 1, 2, 3,
                                                      0, 0, 1]


@pytest.mark.parametrize("change", [*CHANGES, "features"])
def test_a_config_that_does_not_describe_the_inputs_is_refused_by_the_op(change):
    config = make_router(2).route_config()
    keys = [tf.constant([1, 2], tf.int64)] * 3
    if change == "features":
        keys = keys[:2]
    else:
        config = CHANGES[change](config)
    with pytest.raises(tf.errors.InvalidArgumentError, match="SparseflowRouteKeys: config"):
        route_ops.route_keys_op(config, keys)


def test_a_router_with_a_send_count_has_no_compiled_routing():
    with pytest.raises(ValueError, match="send_count.*12"):
        make_router(2, send_count=12).route_config()


def test_the_tf2_faces_route_with_the_op_and_commit_ahead_in_process():
    from sparseflow.tf2.sharding import Tf2Sharding

    router = make_router(2)
    bound = Tf2Sharding(0, 2).bind(router.tables, [1, 0, 0])
    assert bound.router.commit_in_process and not router.commit_in_process

    @tf.function
    def route(a, b, c):
        return bound.route(tf.constant(7, tf.int64), [a, b, c], stamped=False)

    spec = tf.TensorSpec([None], tf.int64)
    types = [op.type for op in route.get_concrete_function(spec, spec, spec)
             .graph.get_operations()]
    assert route_ops.ROUTE_KEYS in types
    assert not {"PyFunc", "PyFuncStateless", "EagerPyFunc"} & set(types)
    batch = [np.array([1, 5, 1]), np.array([6, 7]), np.array([2, 9])]
    out = route(*(tf.constant(k) for k in batch))
    # The TF2 faces count each occurrence once (no faae coefficients).
    reference = KeyRouter(router.tables, [1, 0, 0], [1, 1, 1], world_size=2)
    assert_same([out[k].numpy() for k in ("route/send", "route/counts", "route/place",
                                          "route/gather", "route/sizes")],
                reference.route(batch))


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
