"""Helpers for tests of what one thread does while another holds a lock."""

import threading


def returns_while_locked(call, *args, timeout: float = 5.0) -> None:
    """Runs ``call(*args)`` on another thread and fails the test if it has not returned
    within ``timeout`` seconds (it waited for a lock the calling thread holds)."""
    thread = started_thread(call, *args)
    thread.join(timeout)
    assert not thread.is_alive(), f"{call.__name__} waited for the lock"


def started_thread(call, *args) -> threading.Thread:
    """``call(*args)`` started on another thread (the caller joins it)."""
    thread = threading.Thread(target=call, args=args)
    thread.start()
    return thread
