"""Built-in models (sparseflow.models): numerical correctness against numpy, graph and eager
agreement, gradients, training through the public API, argument errors."""

import numpy as np
import pytest
import tensorflow as tf

import sparseflow as sf
from sparseflow.models import MLP, DCNv2, DLRM, DotInteraction, WideDeep, build_model, pool
from sparseflow.optimizers import lazy_adam
from sparseflow.synthetic import ctr_dataset

B, N_DENSE, DIM, N_EMB = 5, 3, 4, 3


# ---------------------------------------------------------------- numpy references

def _relu(x):
    return np.maximum(x, 0.0)


def _np_mlp(x, layers, val, activate_last):
    for i, layer in enumerate(layers):
        x = x @ val(layer.kernel) + val(layer.bias)
        if i < len(layers) - 1 or activate_last:
            x = _relu(x)
    return x


def _np_dlrm(model, val, dense, embs, wide):
    vectors = list(embs)
    bottom = None
    if dense is not None:
        bottom = _np_mlp(dense, model.bottom.layers, val, activate_last=True)
        vectors = [bottom] + vectors
    if model.interaction == "cat":
        features = np.concatenate(vectors, 1)
    else:
        z = np.stack(vectors, 1)
        gram = np.einsum("bid,bjd->bij", z, z)
        i, j = np.triu_indices(len(vectors), k=1)
        features = gram[:, i, j]
        if bottom is not None:
            features = np.concatenate([bottom, features], 1)
    return _np_mlp(features, model.top.layers, val, activate_last=False)


def _np_wide_deep(model, val, dense, embs, wide):
    x = np.concatenate(list(embs) + ([dense] if dense is not None else []), 1)
    deep = _np_mlp(x, model.deep.layers, val, activate_last=False)
    return deep + sum(wide, np.zeros((x.shape[0], 1), np.float32)) + val(model.wide_bias)


def _np_dcn(model, val, dense, embs, wide):
    x0 = np.concatenate(([dense] if dense is not None else []) + list(embs), 1)
    x = x0
    for weights, bias in zip(model.cross.cross_weights, model.cross.biases):
        w = val(weights[0]) if len(weights) == 1 else val(weights[0]) @ val(weights[1])
        x = x0 * (x @ w + val(bias)) + x
    if model.structure == "stacked":
        h = _np_mlp(x, model.deep.layers, val, activate_last=True)
    else:
        h = np.concatenate([x, _np_mlp(x0, model.deep.layers, val, activate_last=True)], 1)
    return h @ val(model.out.kernel) + val(model.out.bias)


_REFERENCE = {DLRM: _np_dlrm, WideDeep: _np_wide_deep, DCNv2: _np_dcn}

CASES = {  # id -> (class, kwargs, with dense, with wide)
    "dlrm_dot": (DLRM, dict(bottom_mlp=(6, DIM), top_mlp=(8, 5), n_outputs=2), True, False),
    "dlrm_dot_no_dense": (DLRM, dict(top_mlp=(8,)), False, False),
    "dlrm_cat": (DLRM, dict(bottom_mlp=(6,), top_mlp=(8,), interaction="cat"), True, False),
    "wide_deep": (WideDeep, dict(deep_mlp=(8, 6), n_outputs=2), True, True),
    "wide_deep_no_wide_no_dense": (WideDeep, dict(deep_mlp=(8,)), False, False),
    "dcn_stacked": (DCNv2, dict(cross_layers=2, deep_mlp=(8, 6)), True, False),
    "dcn_parallel_low_rank": (DCNv2, dict(cross_layers=3, deep_mlp=(8,), low_rank=2,
                                          structure="parallel", n_outputs=3), True, False),
    "dcn_no_cross_no_dense": (DCNv2, dict(cross_layers=0, deep_mlp=(5,)), False, False),
}


def _inputs(seed, with_dense, with_wide):
    rng = np.random.default_rng(seed)
    dense = rng.normal(size=(B, N_DENSE)).astype(np.float32) if with_dense else None
    embs = [rng.normal(size=(B, DIM)).astype(np.float32) for _ in range(N_EMB)]
    wide = [rng.normal(size=(B, 1)).astype(np.float32) for _ in range(2)] if with_wide else []
    return dense, embs, wide


def _call(model, dense, embs, wide):
    return model(None if dense is None else tf.convert_to_tensor(dense),
                 [tf.convert_to_tensor(e) for e in embs], [tf.convert_to_tensor(w) for w in wide])


# ---------------------------------------------------------------- numerical correctness

@pytest.mark.parametrize("case", list(CASES))
def test_forward_matches_numpy_eagerly_and_in_a_graph(case):
    cls, kwargs, with_dense, with_wide = CASES[case]
    dense, embs, wide = _inputs(1, with_dense, with_wide)
    reference = _REFERENCE[cls]

    eager_model = cls(**kwargs, seed=7)
    eager = _call(eager_model, dense, embs, wide).numpy()
    expected = reference(eager_model, lambda v: v.numpy(), dense, embs, wide)
    n_outputs = kwargs.get("n_outputs", 1)
    assert eager.shape == (B, n_outputs) and eager.dtype == np.float32
    np.testing.assert_allclose(eager, expected, rtol=1e-5, atol=1e-5)

    function_model = cls(**kwargs, seed=7)
    traced = tf.function(lambda *a: _call(function_model, *a))(dense, embs, wide).numpy()
    np.testing.assert_allclose(traced, eager, rtol=1e-6, atol=1e-6)

    with tf.Graph().as_default():
        graph_model = cls(**kwargs, seed=7)
        logits = _call(graph_model, dense, embs, wide)
        variables = graph_model.trainable_variables
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            graph_out, values = sess.run([logits, {v.ref(): v for v in variables}])
        expected = reference(graph_model, lambda v: values[v.ref()], dense, embs, wide)
    np.testing.assert_allclose(graph_out, expected, rtol=1e-5, atol=1e-5)
    # Same seed, same initial weights: the graph's initial logits are the eager ones.
    np.testing.assert_allclose(graph_out, eager, rtol=1e-6, atol=1e-6)

    other_seed = _call(cls(**kwargs, seed=8), dense, embs, wide).numpy()
    assert not np.allclose(other_seed, eager)


@pytest.mark.parametrize("cls", [DLRM, WideDeep, DCNv2])
def test_zero_dense_features_are_no_dense_features(cls):
    _, embs, _ = _inputs(5, False, False)
    model = cls(seed=1)
    without = _call(model, None, embs, [])
    np.testing.assert_array_equal(_call(model, np.zeros((B, 0), np.float32), embs, []), without)


def test_initial_weights_are_glorot_uniform_and_zero_biases():
    model = DCNv2(cross_layers=1, deep_mlp=(300,), low_rank=0, seed=3)
    _call(model, *_inputs(0, True, False))
    d = N_DENSE + N_EMB * DIM
    kernel = model.deep.layers[0].kernel.numpy()
    limit = np.sqrt(6.0 / (d + 300))
    assert kernel.shape == (d, 300)
    assert np.abs(kernel).max() <= limit and np.abs(kernel).max() > 0.95 * limit
    assert abs(kernel.mean()) < 0.05 * limit
    np.testing.assert_array_equal(model.deep.layers[0].bias.numpy(), 0.0)
    np.testing.assert_array_equal(model.cross.biases[0].numpy(), 0.0)
    # Every weight matrix draws from its own stream.
    mlp = MLP((8, 8, 8), seed=3)
    mlp(tf.zeros([1, 8]))
    first, second, third = (layer.kernel.numpy() for layer in mlp.layers)
    assert not np.allclose(first, second) and not np.allclose(second, third)


def test_dot_interaction_order_is_the_row_major_upper_triangle():
    vectors = [tf.constant([[float(i + 1), 0.0]]) for i in range(4)]  # v_i = (i + 1, 0)
    out = DotInteraction()(vectors).numpy()
    pairs = [(i + 1) * (j + 1) for i in range(4) for j in range(i + 1, 4)]
    np.testing.assert_array_equal(out, [pairs])


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_pool_masks_padding(combiner):
    rng = np.random.default_rng(2)
    emb = rng.normal(size=(6, 4, 3)).astype(np.float32)
    keys = rng.integers(-(2**62), 2**62, (6, 4))
    keys[keys == -1] = 5
    keys[0, 2:] = -1          # two padding ids
    keys[1, :] = -1           # all padding -> zeros
    keys[2, 0] = -7           # a negative key is a real key
    keys[3, :] = [-1, 11, -1, 12]
    out = pool(tf.constant(emb), tf.constant(keys), combiner).numpy()
    mask = (keys != -1).astype(np.float32)
    summed = (emb * mask[:, :, None]).sum(1)
    count = mask.sum(1, keepdims=True)
    expected = {"sum": summed, "mean": summed / np.maximum(count, 1),
                "sqrtn": summed / np.sqrt(np.maximum(count, 1))}[combiner]
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(out[1], 0.0)
    # int32 keys and keys=None (no padding: every id counts).
    out32 = pool(tf.constant(emb), tf.constant(keys.clip(-1, 100).astype(np.int32)), combiner)
    assert out32.shape == (6, 3)
    n = {"sum": 1.0, "mean": 4.0, "sqrtn": 2.0}[combiner]
    np.testing.assert_allclose(pool(tf.constant(emb), None, combiner).numpy(),
                               emb.sum(1) / n, rtol=1e-6)


def test_pool_returns_single_hot_unchanged():
    emb = tf.constant(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert pool(emb, tf.constant([[3], [-1]], tf.int64), "mean") is emb


# ---------------------------------------------------------------- variables and gradients

@pytest.mark.parametrize("case", list(CASES))
def test_gradients_reach_every_variable(case):
    cls, kwargs, with_dense, with_wide = CASES[case]
    dense, embs, wide = _inputs(3, with_dense, with_wide)
    model = cls(**kwargs)
    _call(model, dense, embs, wide)  # builds the variables
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(_call(model, dense, embs, wide)))
    grads = tape.gradient(loss, model.trainable_variables)
    assert model.trainable_variables and all(g is not None for g in grads)
    with tf.Graph().as_default():
        model = cls(**kwargs)
        loss = tf.reduce_sum(tf.square(_call(model, dense, embs, wide)))
        variables = tf.compat.v1.trainable_variables()
        assert len(variables) == len(model.trainable_variables)
        assert all(g is not None for g in tf.gradients(loss, variables))


def test_two_towers_in_one_graph_share_the_variables(sf_init):
    model = DLRM(bottom_mlp=(6, DIM), top_mlp=(8,))
    dense, embs, _ = _inputs(4, True, False)
    train_logits = _call(model, dense, embs, [])
    n_vars = len(tf.compat.v1.trainable_variables())
    p = tf.compat.v1.placeholder(tf.bool, [])
    # Called again, even inside a cond branch, it makes no new variables.
    eval_logits = tf.cond(p, lambda: _call(model, dense, embs, []), lambda: tf.zeros([B, 1]))
    dense_vars, _ = sf.get_dense_and_sparse_variable()
    assert len(dense_vars) == n_vars == len(model.trainable_variables) == 8
    assert {v.ref() for v in dense_vars} == {v.ref() for v in model.trainable_variables}
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        a, b = sess.run([train_logits, eval_logits], {p: True})
    np.testing.assert_array_equal(a, b)
    with tf.Graph().as_default(), pytest.raises(ValueError, match="another tf.Graph"):
        _call(model, dense, embs, [])


# ---------------------------------------------------------------- training from Python

BATCH, STEPS = 256, 30
FEATURES = {"user": (3, 3000, 1.05), "item": (2, 800, 1.1)}  # ids per sample, cardinality, exp.


def _train(model, wide_table: bool):
    """Trains ``model`` for STEPS steps through sparseflow's public API; returns the losses."""
    rng = np.random.default_rng(11)
    data = ctr_dataset(rng, BATCH * STEPS, FEATURES, n_labels=1)
    data["user"][rng.random(BATCH * STEPS) < 0.3, 2] = -1  # padded multi-hot rows
    data["dense"] = rng.normal(size=(BATCH * STEPS, N_DENSE)).astype(np.float32)
    sf.init(max_steps=STEPS)
    specs = [sf.FeatureSpec(name, table_name=name) for name in FEATURES]
    tables = {name: sf.create_table(tf.int64, DIM, name,
                                    tf.compat.v1.truncated_normal_initializer(stddev=0.05),
                                    device_vocabulary_size=2 * card)
              for name, (_, card, _) in FEATURES.items()}
    wide_specs = []
    if wide_table:
        wide_specs = [sf.FeatureSpec(f"{name}_wide", table_name="wide", index_key=name)
                      for name in FEATURES]
        tables["wide"] = sf.create_table(tf.int64, 1, "wide", tf.compat.v1.zeros_initializer(),
                                         device_vocabulary_size=8000)
    ds = tf.data.Dataset.from_tensor_slices(data).batch(BATCH, drop_remainder=True)
    ds = ds.map(sf.get_asc_insert_func(tgt_key_specs=specs + wide_specs, is_training=True))
    iterator = tf.compat.v1.data.make_initializable_iterator(ds)
    batch = iterator.get_next()

    def pooled(spec, combiner):
        emb = sf.sparse_lookup(tables[spec.table_name], spec, batch=batch)
        return pool(emb, batch[spec.index_key], combiner)

    logits = model(batch["dense"], [pooled(s, "mean") for s in specs],
                   [pooled(s, "sum") for s in wide_specs])
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
        labels=batch["label_0"][:, None], logits=logits))
    dense_vars, sparse_vars = sf.get_dense_and_sparse_variable()
    assert {v.ref() for v in dense_vars} == {v.ref() for v in model.trainable_variables}
    grads = tf.gradients(loss, dense_vars + sparse_vars)
    train_op = tf.group(
        tf.compat.v1.train.AdamOptimizer(0.01).apply_gradients(
            zip(grads[:len(dense_vars)], dense_vars)),
        lazy_adam.create_hash_optimizer(learning_rate=0.05).apply_gradients(
            zip(grads[len(dense_vars):], sparse_vars)))
    sf.start_asc_pipeline()
    with tf.compat.v1.Session() as sess:
        sess.run([tf.compat.v1.global_variables_initializer(), iterator.initializer])
        losses = [sess.run([train_op, loss])[1] for _ in range(STEPS)]
    if wide_table:
        assert tables["wide"].size() > 0
    return np.array(losses)


@pytest.mark.parametrize("name,params", [
    ("dlrm", {"bottom_mlp": [16, DIM], "top_mlp": [32, 16]}),
    ("wide_deep", {"deep_mlp": [32, 16], "wide_features": ["user_wide", "item_wide"]}),
    ("dcn_v2", {"cross_layers": 2, "deep_mlp": [32, 16], "low_rank": 4}),
])
def test_trains_from_python(graph, name, params):
    model = build_model(name, params, n_outputs=1, seed=0)
    losses = _train(model, wide_table=name == "wide_deep")
    assert np.all(np.isfinite(losses))
    assert losses[-5:].mean() < losses[:5].mean() - 0.05, losses
    # Below the best constant prediction (the labels' entropy, 0.556): the keys were learnt.
    assert losses[-5:].mean() < 0.545, losses


# ---------------------------------------------------------------- build_model and errors

def test_build_model_takes_yaml_keys_without_touching_them():
    params = {"cross_layers": 2, "deep_mlp": [16, 8], "structure": "parallel"}
    copy = {k: list(v) if isinstance(v, list) else v for k, v in params.items()}
    model = build_model("dcn_v2", params, n_outputs=2, seed=5)
    assert isinstance(model, DCNv2) and params == copy
    assert (model.deep_mlp, model.structure, model.n_outputs, model.seed) == ((16, 8),
                                                                              "parallel", 2, 5)
    assert repr(model).startswith("DCNv2(cross_layers=2, deep_mlp=(16, 8), low_rank=0")
    assert isinstance(build_model("dlrm", {}, n_outputs=1), DLRM)
    assert isinstance(build_model("wide_deep", {"wide_features": []}, n_outputs=1), WideDeep)


@pytest.mark.parametrize("call,error,pattern", [
    (lambda: build_model("dlrm2", {}, n_outputs=1), ValueError, r"`name`.*'dlrm2'"),
    (lambda: build_model("dlrm", {"top_mpl": [8]}, n_outputs=1), ValueError,
     r"`params`.*top_mlp.*'top_mpl'"),
    (lambda: build_model("dlrm", {"wide_features": []}, n_outputs=1), ValueError,
     r"`params`.*'wide_features'"),
    (lambda: build_model("dlrm", [("top_mlp", [8])], n_outputs=1), TypeError, r"`params`"),
    (lambda: build_model("dlrm", {}, n_outputs=0), ValueError, r"`n_outputs`.*>= 1.*0"),
    (lambda: DLRM(bottom_mlp=(64, 0)), ValueError, r"`bottom_mlp\[1\]`.*>= 1.*Received: 0"),
    (lambda: DLRM(top_mlp=256), TypeError, r"`top_mlp`.*list.*256"),
    (lambda: DLRM(top_mlp=(256, 1.5)), TypeError, r"`top_mlp\[1\]`.*1\.5"),
    (lambda: DLRM(interaction="max"), ValueError, r"`interaction`.*'dot', 'cat'.*'max'"),
    (lambda: DLRM(seed=-1), ValueError, r"`seed`.*-1"),
    (lambda: DLRM(name="my model"), ValueError, r"`name`.*identifier.*'my model'"),
    (lambda: WideDeep(deep_mlp="256"), TypeError, r"`deep_mlp`"),
    (lambda: WideDeep(n_outputs=True), TypeError, r"`n_outputs`.*True"),
    (lambda: DCNv2(cross_layers=-1), ValueError, r"`cross_layers`.*>= 0.*-1"),
    (lambda: DCNv2(low_rank=-2), ValueError, r"`low_rank`.*-2"),
    (lambda: DCNv2(structure="serial"), ValueError, r"`structure`.*'stacked', 'parallel'"),
    (lambda: pool(tf.zeros([2, 3, 4]), tf.zeros([2, 3], tf.int64), "max"), ValueError,
     r"`combiner`.*'sum', 'mean', 'sqrtn'.*'max'"),
    (lambda: pool(tf.zeros([2, 3, 4]), tf.zeros([2, 4], tf.int64), "sum"), ValueError,
     r"`keys`.*\[2, 3\]"),
    (lambda: pool(tf.zeros([2, 3, 4]), tf.zeros([2, 3]), "sum"), TypeError, r"`keys`.*float32"),
    (lambda: pool(tf.zeros([2, 3, 4, 5]), None, "sum"), ValueError, r"`embeddings`.*rank"),
])
def test_argument_errors_name_the_argument(call, error, pattern):
    with pytest.raises(error, match=pattern):
        call()


def _emb(n=2, dim=DIM):
    return [tf.zeros([B, dim]) for _ in range(n)]


@pytest.mark.parametrize("call,error,pattern", [
    (lambda: DLRM()(None, _emb(), [tf.zeros([B, 1])]), ValueError, r"`wide`.*WideDeep"),
    (lambda: DCNv2()(None, _emb(), [tf.zeros([B, 1])]), ValueError, r"`wide`.*WideDeep"),
    (lambda: DLRM(bottom_mlp=(8, 6))(tf.zeros([B, 3]), _emb()), ValueError,
     r"`bottom_mlp`.*dim 4.*\(8, 6\)"),
    (lambda: DLRM()(None, [tf.zeros([B, 4]), tf.zeros([B, 5])]), ValueError,
     r"`embeddings`.*one dim.*\[4, 5\]"),
    (lambda: DLRM()(None, _emb(1)), ValueError, r"`embeddings`.*at least two"),
    (lambda: DLRM(interaction="cat")(None, []), ValueError, r"`embeddings`.*non-empty"),
    (lambda: WideDeep()(None, []), ValueError, r"`embeddings`.*non-empty"),
    (lambda: WideDeep()(None, _emb(), [tf.zeros([B, 2])]), ValueError, r"`wide\[0\]`.*\[batch, 1\]"),
    (lambda: WideDeep()(None, _emb(), tf.zeros([B, 1])), TypeError, r"`wide`.*list"),
    (lambda: DCNv2()(tf.zeros([B, 3], tf.float64), _emb()), TypeError, r"`dense`.*float32"),
    (lambda: DCNv2()(None, tf.zeros([B, 4])), TypeError, r"`embeddings`.*list"),
    (lambda: DCNv2()(None, [tf.zeros([B, 4, 2])]), ValueError, r"`embeddings\[0\]`.*rank-2"),
])
def test_call_errors_name_the_argument(call, error, pattern):
    with pytest.raises(error, match=pattern):
        call()


def test_a_changed_input_width_is_an_error():
    model = DCNv2(cross_layers=1, deep_mlp=(4,))
    model(None, _emb(2))
    with pytest.raises(ValueError, match=r"`x0`.*\[batch, 8\].*built with"):
        model(None, _emb(3))
    model = WideDeep(deep_mlp=(4,))
    model(None, _emb(2))
    with pytest.raises(ValueError, match=r"`inputs`.*\[batch, 8\].*built with"):
        model(None, _emb(3))
