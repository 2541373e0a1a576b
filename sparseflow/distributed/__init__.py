"""Several ranks training one model: tables sharded by key under every face.

``ranks`` (which rank of how many), ``graph_world`` (a graph program's ranks and their
server), ``sharded_lookup`` / ``batch_exchange`` / ``routing`` (a batch's keys to their
owners and rows back), ``exchange`` / ``step_keys`` / ``collectives`` (TensorFlow's
collectives), ``sharding`` (owners, re-bucketing a checkpoint), ``launch`` / ``launch_script``
(local ranks); see ``docs/multi-worker.md``.
"""
