"""One rank of tests/test_session_ranks.py's collectives test: the mx_rec ``hccl_ops`` and
sparseflow's graph collectives on N ranks, each rank's input derived from its rank so that
every rank can check every result.

    sparseflow launch -n N -m tests.workers.hccl_ranks OUT_DIR
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import mx_rec  # noqa: E402,F401
from mx_rec.util.initialize import get_rank_id, get_rank_size, init  # noqa: E402
from mx_rec.util.tf_version_adapter import hccl_ops  # noqa: E402
from sparseflow.distributed import collectives  # noqa: E402


def value(rank: int) -> np.ndarray:
    return np.arange(6, dtype=np.float32).reshape(2, 3) * (rank + 1) - rank


def main(out_dir: str) -> None:
    tf.compat.v1.disable_eager_execution()
    init(use_mpi=True, train_steps=1)
    rank, size = get_rank_id(), get_rank_size()
    x = tf.constant(value(rank))
    results = {op: hccl_ops.allreduce(x, op) for op in ("sum", "max", "min", "prod")}
    results["gather"] = hccl_ops.allgather(x, size)
    results["broadcast"] = hccl_ops.broadcast([x], 1)[0]
    v = tf.compat.v1.get_variable("v", initializer=tf.constant(value(rank)))
    sync = collectives.broadcast_global_variables(0)
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        out = {}
        for step in range(3):   # each op runs several times: a run must meet its own peers
            out = sess.run(results)
        sess.run(sync)
        out["variable"] = sess.run(v)
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"), size=size, **out)


if __name__ == "__main__":
    main(sys.argv[1])
