"""sparseflow: huge sparse embedding tables on current TensorFlow, tf.data first.

The Rec SDK flow::

    sparseflow.init(...)
    specs = [sparseflow.FeatureSpec("user_ids", table_name="user_table", ...)]
    dataset = dataset.map(sparseflow.get_asc_insert_func(tgt_key_specs=specs))
    table = sparseflow.create_table(tf.int64, 32, "user_table", tf.compat.v1.truncated_normal_initializer(), ...)
    emb = sparseflow.sparse_lookup(table, specs[0], batch=batch)
    ... loss ...
    dense_vars, sparse_vars = sparseflow.get_dense_and_sparse_variable()
    train_op = sparse_optimizer.apply_gradients(zip(tf.gradients(loss, sparse_vars), sparse_vars))
    sparseflow.start_asc_pipeline()
    ... tf.compat.v1.Session loop ...
    sparseflow.terminate_config_initializer()
"""

import importlib

from sparseflow.malloc_tuning import tune_malloc as _tune_malloc

# Before any step runs: freed buffers stay mapped for the next step (malloc_tuning.py).
_tune_malloc()

# Public name -> defining module. Imported on first use (PEP 562), so that the numba kernels in
# sparseflow.ops (and tools built on them) load without TensorFlow.
_EXPORTS = {
    "AlreadyInitializedError": "sparseflow.runtime",
    "NotInitializedError": "sparseflow.runtime",
    "get_use_dynamic_expansion": "sparseflow.runtime",
    "init": "sparseflow.runtime",
    "terminate_config_initializer": "sparseflow.runtime",
    "FeatureSpec": "sparseflow.featurespec.spec",
    "sparse_lookup": "sparseflow.lookup",
    "get_asc_insert_func": "sparseflow.pipeline.insert_func",
    "SendCountOverflowError": "sparseflow.pipeline.key_processor",
    "TableFullError": "sparseflow.pipeline.key_processor",
    "CacheFullError": "sparseflow.pipeline.tier_cache",
    "get_dense_and_sparse_variable": "sparseflow.pipeline.manager",
    "start_asc_pipeline": "sparseflow.pipeline.manager",
    "EvictHook": "sparseflow.pipeline.eviction",
    "evict": "sparseflow.pipeline.eviction",
    "set_threshold": "sparseflow.pipeline.admission",
    "get_initializer": "sparseflow.pipeline.graph_modifier",
    "modify_graph_and_start_emb_cache": "sparseflow.pipeline.graph_modifier",
    "export": "sparseflow.serving",
    "export_saved_model": "sparseflow.serving",
    "Saver": "sparseflow.checkpoint.saver",
    "latest_checkpoint": "sparseflow.checkpoint.saver",
    "CheckpointError": "sparseflow.checkpoint.sparse_format",
    "SparseTable": "sparseflow.table",
    "create_table": "sparseflow.table",
}

_SUBMODULES = frozenset({"checkpoint", "cli", "datasets", "embed", "featurespec", "jobs",
                         "lookup", "metrics", "models", "ops", "optimizers", "pipeline", "runtime", "serving",
                         "synthetic", "table", "validation"})

__all__ = sorted([*_EXPORTS, "optimizers"])


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"sparseflow.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sparseflow' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
