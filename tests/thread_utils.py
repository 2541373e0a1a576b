"""Helpers for tests of what one thread does while another holds a lock."""

import threading


def returns_while_locked(call, *args, timeout: float = 5.0) -> None:
    """Runs ``call(*args)`` on another thread and fails the test if it has not returned
    within ``timeout`` seconds (it waited for a lock the calling thread holds)."""
    thread = threading.Thread(target=call, args=args)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"{call.__name__} waited for the lock"
