"""One worker of tests/test_exchange.py: buckets its batches' unique keys by owner, sends them
to their owners with sparseflow.distributed.Exchange, and reads back what the owners answer
(each key's "embedding" is derived from the key, so every worker can check every value).

    python -m tests.workers.key_exchange INDEX PORTS_JSON
"""

import json
import math
import os
import sys

W = 2


def main(index: int, ports: list[int]) -> None:
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": [f"localhost:{p}" for p in ports]},
        "task": {"type": "worker", "index": index}})
    import numpy as np
    import tensorflow as tf

    from sparseflow.distributed.exchange import Exchange
    from sparseflow.distributed.sharding import PAD_KEY, bucket_keys, owner_of

    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.distribute.MultiWorkerMirroredStrategy()   # the gRPC server and collectives
    exchange = Exchange(W, timeout_seconds=60.0)

    @tf.function(input_signature=[tf.TensorSpec([W, None], tf.int64),
                                  tf.TensorSpec([W], tf.int32), tf.TensorSpec([], tf.int64)])
    def send_keys(ids, counts, stamp):
        return exchange.all_to_all_dynamic(ids, counts, pad_value=PAD_KEY, also_max=stamp)

    @tf.function(input_signature=[tf.TensorSpec([W, None, 3], tf.float32)])
    def send_back(embeddings):
        return exchange.all_to_all(embeddings)

    def embedding_of(keys):   # what an owner answers for its keys
        return np.stack([keys % 1000, keys // 7 % 100, np.full(keys.shape, 1.0)], 1).astype(
            np.float32)

    def keys_of(step, worker):   # a worker's batch of unique keys
        rng = np.random.default_rng(100 * step + worker)
        return np.unique(rng.integers(-500, 5000, rng.integers(1, 60)))

    for step in range(12):
        keys = keys_of(step, index)
        buckets = bucket_keys(keys, W)
        # Each worker's stamp; the largest comes back to every worker (values past int32,
        # negative ones too).
        stamps = [(-1) ** (step + r) * (2 ** 40 + 1000 * step + r) for r in range(W)]
        received, counts, most = send_keys(tf.constant(buckets.send),
                                           tf.constant(buckets.counts),
                                           tf.constant(stamps[index], tf.int64))
        received, counts = received.numpy(), counts.numpy()
        assert int(most) == max(stamps), (step, int(most), stamps)
        widths = [bucket_keys(keys_of(step, r), W).width for r in range(W)]
        # The widest batch's width, rounded up to the smallest ceil(2^(k/8)) >= it.
        widest = max(widths)
        rung = next(r for r in (0, *(math.ceil(2 ** (k / 8)) for k in range(300)))
                    if r >= widest)
        assert received.shape[1] == rung, (step, received.shape, widths)
        for r in range(W):   # every key I received is mine, after the sender's real count
            mine = received[r, :counts[r]]
            assert (owner_of(mine, W) == index).all(), (step, r, mine)
            assert (received[r, counts[r]:] == PAD_KEY).all()
        answer = np.zeros(received.shape + (3,), np.float32)
        for r in range(W):
            answer[r, :counts[r]] = embedding_of(received[r, :counts[r]])
        width = received.shape[1]
        back = send_back(tf.constant(answer)).numpy().reshape(W * width, 3)
        # Read each of my keys' answer where bucket_keys put it (the owner's row, its rank),
        # in the agreed width.
        owners = owner_of(keys, W)
        rank = buckets.positions - owners.astype(np.int64) * buckets.width
        got = back[owners.astype(np.int64) * width + rank]
        np.testing.assert_array_equal(got, embedding_of(keys))
    print(f"worker {index}: 12 steps exchanged and checked", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), json.loads(sys.argv[2]))
