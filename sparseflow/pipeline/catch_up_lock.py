"""A lock whose holder first catches up on work other threads left for it.

The training step's calls into a table's state (a gather's release, an update's bookkeeping)
must not wait while the input pipeline's thread holds the table's lock to process the next
batch: they leave their work queued instead, and whoever takes the lock next applies it
before anything else (``KeyProcessor``'s releases and updates, ``TierCache``'s releases).
"""

from __future__ import annotations

import threading
from typing import Callable


class CatchUpLock:
    """A reentrant lock. Its outermost entry first runs ``catch_up()`` when ``pending()``
    says there is work left (by threads that found the lock taken), so that whoever holds it
    sees everything done before; a section that re-enters (a property read under the lock)
    sees the state it started with.

    Args:
      pending: ``() -> bool``, cheap: every outermost entry asks it.
      catch_up: ``() -> None``, applies the work left; if it raises, the lock is left.
    """

    __slots__ = ("_lock", "_pending", "_catch_up", "_depth")

    def __init__(self, pending: Callable[[], bool], catch_up: Callable[[], None]):
        self._lock = threading.RLock()
        self._pending = pending
        self._catch_up = catch_up
        self._depth = 0   # entries of the holding thread (only it changes this)

    def __enter__(self):
        self._lock.acquire()
        self._entered()
        return self

    def __exit__(self, *exc_info):
        self.release()
        return False

    def acquire_now(self) -> bool:
        """Takes the lock if it is free, without waiting; True when taken (then entered:
        the work left applied). Pair with :meth:`release`."""
        if not self._lock.acquire(blocking=False):
            return False
        self._entered()
        return True

    def release(self) -> None:
        """Leaves one entry (of ``with`` or :meth:`acquire_now`)."""
        self._depth -= 1
        self._lock.release()

    def _entered(self) -> None:
        self._depth += 1
        if self._depth == 1 and self._pending():
            try:
                self._catch_up()
            except BaseException:
                self.release()
                raise
