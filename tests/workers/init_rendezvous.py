"""Ranks that clear a directory they share before ``sparseflow.init()`` and write into it
after, as Rec SDK's little demos do (their ``_clear_saved_model`` deletes ``_rank*`` on every
rank, then ``init()``); run by tests/test_session_ranks.py under ``sparseflow launch``.

    python -m tests.workers.init_rendezvous SHARED_DIR

Rank 1 reaches its clearing late (a slower start). Rec SDK's ``init()`` meets every rank
(HCCL's set-up), so no rank writes before every rank has cleared. Each rank then writes
``SHARED_DIR/rank<r>`` and prints the files it finds once every rank has written.
"""

import os
import shutil
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

import sparseflow as sf  # noqa: E402
from sparseflow.distributed import collectives  # noqa: E402
from sparseflow.distributed.ranks import detect  # noqa: E402


def main(shared: str) -> None:
    tf.compat.v1.disable_eager_execution()
    rank = detect().rank
    if rank == 1:
        time.sleep(3)
    shutil.rmtree(shared, ignore_errors=True)
    sf.init()
    os.makedirs(shared, exist_ok=True)
    with open(os.path.join(shared, f"rank{rank}"), "w") as f:
        f.write(str(rank))
    done = collectives.all_reduce(tf.constant(1), "sum")
    with tf.compat.v1.Session() as sess:
        sess.run(done)   # every rank has written
    print("found", " ".join(sorted(os.listdir(shared))), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
