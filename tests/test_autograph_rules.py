"""sparseflow.autograph_rules: a user's ``tf.function`` that trains through the TF2 API, a
Keras layer and a built-in model has its own code rewritten by autograph, and none of ours;
it trains the same either way."""

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.autograph.core import config
from tensorflow.python.autograph.impl import api

from sparseflow import tf2
from sparseflow.autograph_rules import keep_out_of_autograph
from sparseflow.keras import SparseEmbedding
from sparseflow.models import DLRM


def _train(steps: int = 3):
    """Trains one ``tf2.Embedding`` feature, one ``SparseEmbedding`` layer and a DLRM in a
    ``tf.function`` whose user helper needs autograph (a Python ``if`` on a tensor).
    Returns the losses."""
    init = tf.compat.v1.truncated_normal_initializer(stddev=0.1, seed=3)
    embedding = tf2.Embedding({"a": tf2.FeatureConfig(tf2.TableConfig(40, 4, init, name="a"))},
                              tf2.Adam(0.05))
    layer = SparseEmbedding(30, 4, initializer=init, optimizer=tf2.SGD(0.5), combiner="sum",
                            name="b")
    model = DLRM(bottom_mlp=(4,), top_mlp=(8,), seed=1)
    rng = np.random.default_rng(0)
    batch = (rng.integers(0, 40, 16), rng.integers(0, 30, (16, 1)),
             rng.normal(size=(16, 3)).astype(np.float32), (rng.random(16) < 0.5).astype(np.float32))

    def clipped(loss):   # user code: converted by autograph (a tensor condition)
        if loss > 100.0:
            loss = loss * 0.0
        return loss

    @tf.function
    def step(a, b, dense, labels):
        embedding.enqueue({"a": a}, training=True)
        with tf.GradientTape() as tape:
            act = embedding.dequeue()
            tape.watch(act)
            logits = model(dense, [act["a"], layer(b, training=True)])
            loss = clipped(tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
                labels=labels, logits=tf.squeeze(logits, 1))))
        grads = tape.gradient(loss, [act] + [layer.anchor] + list(model.trainable_variables))
        embedding.apply_gradients(grads[0])
        for var, grad in zip(model.trainable_variables, grads[2:]):
            var.assign_sub(0.1 * grad)
        return loss

    return [float(step(*batch)) for _ in range(steps)]   # one batch: its loss falls


@pytest.fixture
def converted(monkeypatch):
    """The modules of the functions autograph rewrites while the test runs."""
    modules = []
    actual = api._convert_actual

    def spy(entity, program_ctx):
        modules.append(getattr(entity, "__module__", None) or "?")
        return actual(entity, program_ctx)

    monkeypatch.setattr(api, "_convert_actual", spy)
    return modules


def test_only_the_users_functions_are_rewritten_and_training_is_unchanged(converted,
                                                                          monkeypatch):
    losses = _train()
    ours = sorted({m for m in converted if m.split(".")[0] == "sparseflow"})
    assert ours == []
    assert __name__ in converted   # the step and its helper still are
    assert losses[-1] < losses[0]

    # Without the rule autograph rewrites our functions; the losses are the same.
    monkeypatch.setattr(config, "CONVERSION_RULES", tuple(
        r for r in config.CONVERSION_RULES if not r.matches("sparseflow")))
    converted.clear()
    rewritten = _train()
    assert any(m.startswith("sparseflow.") for m in converted)
    np.testing.assert_allclose(rewritten, losses, rtol=0, atol=1e-6)


def test_the_rule_is_added_once(monkeypatch):
    monkeypatch.setattr(config, "CONVERSION_RULES", tuple(config.CONVERSION_RULES))
    assert keep_out_of_autograph() and keep_out_of_autograph()
    assert sum(r.matches("sparseflow") for r in config.CONVERSION_RULES
               if isinstance(r, config.DoNotConvert)) == 1
    assert config.CONVERSION_RULES[0].matches("sparseflow.tf2.embedding")
