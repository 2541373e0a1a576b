"""What a run saw, for results.json (not in Rec SDK's demo: its only output is its log).

RecordHook, added to each EstimatorSpec's hooks, keeps which data channels graph modification
rewrote (it runs after GraphModifierHook), the loss of every step of the run and, when the run
ends, the global step and each table's size in the graph of that run."""

import tensorflow as tf

from mx_rec.util.initialize import ConfigInitializer

RESULTS = {"model_fn": [], "train": [], "eval": [], "predict": []}


class RecordHook(tf.compat.v1.train.SessionRunHook):
    def __init__(self, kind, loss, table_list):
        self._kind = kind
        self._loss = loss
        self._table_list = table_list
        self._global_step = None
        self._losses = []
        self._rewritten = []

    def begin(self):
        self._global_step = tf.compat.v1.train.get_global_step()
        self._losses = []
        self._rewritten = []
        for is_training, channel in ((True, "train"), (False, "eval")):
            try:
                ConfigInitializer.get_instance().train_params_config.get_initializer(is_training)
            except RuntimeError:   # no rewritten iterator for that channel
                continue
            self._rewritten.append(channel)

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self._loss)

    def after_run(self, run_context, run_values):
        self._losses.append(float(run_values.results))

    def end(self, session):
        RESULTS[self._kind].append({
            "global_step": int(session.run(self._global_step)),
            "rewritten_channels": self._rewritten,
            "loss": self._losses,
            "table_size": {t.table_name: int(t.size()) for t in self._table_list},
            "table_capacity": {t.table_name: int(t.capacity()) for t in self._table_list},
        })


def record_model_fn(mode, table_list):
    RESULTS["model_fn"].append({"mode": mode, "tables": [t.table_name for t in table_list]})
