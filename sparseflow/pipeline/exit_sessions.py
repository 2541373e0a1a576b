"""At interpreter exit, the TensorFlow sessions still alive are deleted before Python finalizes.

A script that leaves its session to the garbage collector (Rec SDK's little_demo keeps it in
its ``RunMode`` to the end; a run that failed keeps it in the error's traceback) has it deleted
during interpreter finalization. By then a TensorFlow thread that calls into Python — the key
pipeline's insert function, read ahead by ``prefetch``, or a gather — can no longer take the
GIL, and deleting the session waits for that thread forever: the process hangs instead of
exiting. Deleted at exit, before finalization, the session's threads finish their calls (the
pipeline's fail at once once ``terminate_config_initializer`` has closed the tables) and the
process ends.
"""

from __future__ import annotations

import atexit
import gc
import threading

import tensorflow as tf

_installed = False
_lock = threading.Lock()


def _session_base() -> type:
    """TF's BaseSession, the base of ``tf.compat.v1.Session`` (which ``import mx_rec``
    replaces by a subclass) and of ``InteractiveSession``."""
    return next(c for c in tf.compat.v1.Session.__mro__ if c.__name__ == "BaseSession")


def live_objects(cls: type) -> list:
    """Every object the garbage collector tracks whose type is ``cls`` or a subclass of it,
    after a collection.

    By type, not ``isinstance``: gc lists weak proxies too, and asking a dead one its class
    raises ReferenceError (a proxy is never an instance itself).
    """
    gc.collect()
    return [obj for obj in gc.get_objects() if issubclass(type(obj), cls)]


def delete_live_sessions() -> int:
    """Deletes every TF session (``tf.compat.v1.Session``, ``InteractiveSession``) not
    deleted yet: ``close()`` keeps the C session; ``__del__`` deletes it (TF's
    ``TF_DeleteSession``, which releases the GIL while it waits), and a second call does
    nothing.

    Returns:
      The number of sessions deleted.
    """
    live = [obj for obj in live_objects(_session_base())
            if obj._session is not None]  # noqa: SLF001
    for session in live:
        session.__del__()
    return len(live)


def install() -> None:
    """Registers :func:`delete_live_sessions` to run at exit (once; from
    ``start_asc_pipeline``, so after the runtime's own exit hook, hence before it: atexit runs
    hooks last registered first)."""
    global _installed
    with _lock:
        if not _installed:
            atexit.register(delete_live_sessions)
            _installed = True
