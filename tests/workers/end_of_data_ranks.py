"""Ranks that reach the end of their data inside a step holding collectives, then go on with
collective steps, many times over (as Rec SDK's one-shot evaluation does after every
training interval), run by tests/test_session_ranks.py under ``sparseflow launch``.

    python -m tests.workers.end_of_data_ranks ROUNDS

Each round: a one-batch dataset, its batch all-reduced; a second run of that step ends the
data (OutOfRangeError); then a step all-gathers a constant (like the Saver's list of
shards). Prints "ROUNDS rounds" when every gather returned every rank's value.
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import sparseflow as sf  # noqa: E402
from sparseflow.distributed import collectives  # noqa: E402


def main(rounds: int) -> None:
    tf.compat.v1.disable_eager_execution()
    sf.init()
    rank, size = collectives.rank_and_size()
    data = tf.data.Dataset.from_tensors(tf.fill([4], float(rank + 1)))
    iterator = tf.compat.v1.data.make_initializable_iterator(data)
    reduced = collectives.all_reduce(iterator.get_next(), "sum")
    gathered = collectives.all_gather(tf.constant([rank]))
    # Work of the step that does not wait for the batch, longer on rank 1: its step ends
    # (and TensorFlow cleans it up) after rank 0's.
    busy = tf.numpy_function(lambda: np.float32(time.sleep(0.2 * rank) or 0), [], tf.float32,
                             stateful=True)
    with tf.compat.v1.Session() as sess:
        for i in range(rounds):
            sess.run(iterator.initializer)
            np.testing.assert_allclose(sess.run(reduced), [size * (size + 1) / 2] * 4)
            try:
                sess.run([reduced, busy])
                raise AssertionError("the one-batch dataset gave a second batch")
            except tf.errors.OutOfRangeError:
                pass
            assert sess.run(gathered).tolist() == list(range(size)), i
    print(f"rank {rank}: {rounds} rounds", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
