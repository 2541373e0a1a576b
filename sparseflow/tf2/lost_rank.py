"""A TF2 program whose rank loses a peer: its error names the last checkpoint every rank wrote.

The TF2 faces' collectives run inside the user's ``tf.function``, whose error (the
collective's ``DeadlineExceededError`` after ``SPARSEFLOW_COLLECTIVE_TIMEOUT``, or the
channel's ``UnavailableError``) reaches the user's script as TensorFlow raised it. Over
several ranks, :func:`watch` therefore

- follows ``tf.train.Checkpoint.write`` / ``save``: once a rank has written its file, every
  rank waits for the others' (one scalar all-reduce), and the file is recorded as complete;
- adds to the error of an uncaught collective failure the line the Session API's
  ``RankLostError`` says: which rank, how long collectives wait, and the last checkpoint
  every rank completed (this rank's file of it; every rank restores its own on a rerun).
"""

from __future__ import annotations

import functools
import sys
import threading

import tensorflow as tf

_LOCK = threading.Lock()
_STATE: dict = {}   # rank, size, timeout, exchange, checkpoints (once watched)


def watch(rank: int, size: int, timeout_seconds: float, group_key: int) -> None:
    """Starts following this rank's TF2 checkpoints and its uncaught collective errors
    (once per process; later calls do nothing).

    Args:
      rank, size: this rank and the number of ranks.
      timeout_seconds: how long a collective waits (for the message).
      group_key: the collective group of the checkpoint barrier (its own).
    """
    from sparseflow.distributed.exchange import CountedExchange

    with _LOCK:
        if _STATE:
            return
        _STATE.update(rank=rank, size=size, timeout=timeout_seconds, checkpoints=[],
                      exchange=CountedExchange(size, timeout_seconds, group_key))
    checkpoint = tf.train.Checkpoint
    for name in ("write", "save"):
        setattr(checkpoint, name, _recorded(getattr(checkpoint, name)))
    previous = sys.excepthook

    def hook(kind, error, traceback):
        previous(kind, error, traceback)
        if isinstance(error, tf.errors.OpError) and _from_collective(error):
            sys.stderr.write(lost_rank_message() + "\n")
            sys.stderr.flush()

    sys.excepthook = hook


def _recorded(method):
    @functools.wraps(method)
    def recorded(self, *args, **kwargs):
        path = method(self, *args, **kwargs)
        if _STATE and tf.executing_eagerly():
            # Every rank wrote its file of this checkpoint once each has come here.
            _STATE["exchange"].reduce(tf.constant([1], tf.int32), "Add")
            _STATE["checkpoints"].append(path)
        return path

    recorded._sparseflow_recorded = True
    return recorded


def lost_rank_message() -> str:
    """What a rank says when a collective among the ranks failed."""
    last = _STATE["checkpoints"][-1] if _STATE.get("checkpoints") else None
    where = (f"{last} (this rank's file of it: restore every rank's on a rerun to resume)."
             if last else "none.")
    return (f"sparseflow: rank {_STATE['rank']} of {_STATE['size']}: a collective among the "
            f"ranks did not complete, so another rank died, hung or left (collectives wait "
            f"{_STATE['timeout']:g} s, SPARSEFLOW_COLLECTIVE_TIMEOUT). The last checkpoint "
            f"every rank completed: {where}")


def _from_collective(error: tf.errors.OpError) -> bool:
    return isinstance(error, (tf.errors.DeadlineExceededError, tf.errors.UnavailableError,
                              tf.errors.CancelledError, tf.errors.AbortedError,
                              tf.errors.InternalError)) and "ollective" in error.message
