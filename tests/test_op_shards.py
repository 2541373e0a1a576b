"""A batch's tables split over several compiled ops (``ops/op_shards.py``), which TensorFlow
runs side by side: the split covers every table once, and training through several ops is
bit-identical to training through one, on the Session and the TF2 face."""

import numpy as np
import pytest
import tensorflow as tf

import sparseflow as sf
from sparseflow import tf2
from sparseflow.ops import op_shards
from tests.pipeline_utils import int_keys, train_pooled_lazy_adam

B, STEPS, VOCAB, DIM = 32, 12, 60, 4
TABLES = ("t1", "t2", "t3", "t4")
INIT = dict(stddev=0.1, seed=3)


@pytest.mark.parametrize("weights, cpus, runs", [
    ([1] * 26, 2, [(0, 13), (13, 26)]),
    ([1] * 26, 1, [(0, 26)]),
    ([1] * 26, 16, [(0, 6), (6, 13), (13, 19), (19, 26)]),   # at most MAX_OP_SHARDS
    ([1] * 3, 4, [(0, 1), (1, 2), (2, 3)]),                  # at most one per member
    ([5, 1, 1, 1], 2, [(0, 1), (1, 4)]),                     # by weight
    ([1, 1, 1, 1, 9], 2, [(0, 4), (4, 5)]),
    ([1], 8, [(0, 1)]),
    ([], 2, [(0, 0)]),
])
def test_op_shards_cover_the_members_in_order_by_weight(weights, cpus, runs):
    got = op_shards.op_shards(weights, cpus)
    assert [(r.start, r.stop) for r in got] == runs
    assert [i for r in got for i in r] == list(range(len(weights)))


def test_width_shards_split_each_width_on_its_own(monkeypatch):
    dims, weights = [8, 4, 8, 8, 4], [1, 1, 1, 1, 3]
    monkeypatch.setattr(op_shards, "available_cpus", lambda: 2)
    assert op_shards.width_shards(dims, weights) == [(4, [1]), (4, [4]), (8, [0]),
                                                     (8, [2, 3])]
    monkeypatch.setattr(op_shards, "available_cpus", lambda: 1)
    assert op_shards.width_shards(dims, weights) == [(4, [1, 4]), (8, [0, 2, 3])]


def _data(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    data = {f"f{i}": int_keys(rng, VOCAB, (B * STEPS, 3)) for i in range(len(TABLES))}
    data["label"] = ((data["f0"][:, 0] % 3 == 0) | (data["f2"][:, 1] % 2 == 0)).astype(
        np.float32)
    return data


def _session_run(data, cpus: int, monkeypatch):
    """Four same-width tables (one feature each) trained by lazy Adam through the Session
    path with ``cpus`` CPUs: (losses, exported tables, op type counts)."""
    monkeypatch.setattr(op_shards, "available_cpus", lambda: cpus)
    with tf.Graph().as_default() as graph:
        sf.init()
        specs = [sf.FeatureSpec(f"f{i}", table_name=t, access_threshold=1)
                 for i, t in enumerate(TABLES)]
        tables = [sf.create_table(tf.int64, DIM, t,
                                  tf.compat.v1.truncated_normal_initializer(**INIT),
                                  device_vocabulary_size=VOCAB) for t in TABLES]
        losses, exported = train_pooled_lazy_adam(
            data, B, specs, tables, read_ahead=False,
            inspect=lambda: {t.table_name: t.export() for t in tables})
        types = [op.type for op in graph.get_operations()]
    return np.array(losses), exported, {k: types.count(k) for k in (
        "SparseflowGatherTables", "SparseflowSumTables", "SparseflowLazyAdamTables")}


def _tf2_run(data, cpus: int, monkeypatch):
    """The same model through ``tf2.Embedding`` (in feature order t1, t3, t2, t4: a split
    keeps each table's features in one op)."""
    monkeypatch.setattr(op_shards, "available_cpus", lambda: cpus)
    configs = {t: tf2.TableConfig(VOCAB, DIM, tf.compat.v1.truncated_normal_initializer(**INIT),
                                  name=t, access_threshold=1) for t in TABLES}
    order = ("f0", "f2", "f1", "f3")
    features = {f: tf2.FeatureConfig(configs[TABLES[int(f[1])]]) for f in order}
    embedding = tf2.Embedding(features, tf2.Adam(0.05, epsilon=1e-8))
    w = tf.Variable(np.random.default_rng(5).normal(0, 0.3, (len(order) * DIM, 1))
                    .astype(np.float32))

    @tf.function(reduce_retracing=True)
    def step(keys, label):
        embedding.enqueue(keys, training=True)
        with tf.GradientTape() as tape:
            acts = embedding.dequeue()
            tape.watch(acts)
            x = tf.concat([acts[f] for f in order], 1)
            logit = tf.squeeze(tf.matmul(x, w), 1)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label,
                                                                          logits=logit))
        g_act, g_w = tape.gradient(loss, [acts, w])
        embedding.apply_gradients(g_act)
        w.assign_sub(0.1 * g_w)
        return loss

    ds = tf.data.Dataset.from_tensor_slices(data).batch(B, drop_remainder=True)
    losses, graph = [], None
    for x in ds:
        keys = {f: x[f] for f in order}
        losses.append(float(step(keys, x["label"])))
        graph = graph or step.get_concrete_function(keys, x["label"]).graph
    types = [op.type for op in graph.get_operations()]
    exported = {name: embedding.tables[config].export() for name, config in configs.items()}
    return np.array(losses), exported, {k: types.count(k) for k in (
        "SparseflowGatherTables", "SparseflowSumTables", "SparseflowLazyAdamTables")}


def _assert_identical(split, one):
    """Bit for bit: the same losses, keys and embeddings (export sorts by key)."""
    np.testing.assert_array_equal(split[0], one[0])
    assert split[1].keys() == one[1].keys()
    for name, (keys, embeddings) in one[1].items():
        np.testing.assert_array_equal(split[1][name][0], keys)
        np.testing.assert_array_equal(split[1][name][1], embeddings)


@pytest.mark.parametrize("run", [_session_run, _tf2_run], ids=["session", "tf2"])
def test_tables_split_over_ops_train_as_one_op(run, monkeypatch):
    data = _data()
    one = run(data, 1, monkeypatch)
    split = run(data, 2, monkeypatch)
    assert one[2] == dict.fromkeys(one[2], 1)
    assert split[2] == dict.fromkeys(split[2], 2)
    _assert_identical(split, one)
    assert one[0][-3:].mean() < one[0][:3].mean()   # it trained
