"""Multi-worker training: tables sharded across workers by key (issue 10, in progress).

``sharding``: which worker owns a key, the per-owner send buffers of a batch's unique keys
(Rec SDK's ``send_count``), and re-bucketing a checkpoint's table states to another world
size. The collective exchange and the training loop come next.
"""
