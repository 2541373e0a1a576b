"""Rec SDK ``mx_rec.util.log``: the ``logger`` that Rec SDK scripts log through.

``logger`` is the ``logging.Logger`` named ``"mx_rec"``; the facade's own messages go to it
too. Rec SDK scripts read their progress from it at INFO (``logger.info("training at step
%d", i)``) without configuring logging, so, as Rec SDK's logger does, it has a handler of its
own and level INFO, or the level Rec SDK's ``MXREC_LOG_LEVEL`` environment variable names
(the interface Rec SDK's run scripts set). Records also propagate to the root logger, so
``logging`` configuration and test capture see them.
"""

from __future__ import annotations

import logging
import os
import threading

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

logger = logging.getLogger("mx_rec")

_logged: set = set()
_logged_lock = threading.Lock()


def _configure(log: logging.Logger) -> None:
    level = os.environ.get("MXREC_LOG_LEVEL", "INFO")
    if level not in LOG_LEVELS:
        raise ValueError(f"Environment variable `MXREC_LOG_LEVEL` must be one of "
                         f"{', '.join(LOG_LEVELS)}. Received: {level!r}")
    log.setLevel(level)
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[mx_rec] %(asctime)s %(levelname)s %(message)s"))
        log.addHandler(handler)


def log_once(key: str, message: str, *args, level: int = logging.INFO) -> bool:
    """Logs ``message % args`` on ``logger`` the first time ``key`` is seen in this process.

    The facade names each NPU-only option it accepts without a CPU meaning once, not on every
    call or step.

    Args:
      key: what makes the message distinct (e.g. the option's name).
      message, args: the ``logging`` message and its arguments.
      level: the ``logging`` level (INFO by default).

    Returns:
      True if this call logged, False if ``key`` was logged before.
    """
    with _logged_lock:
        if key in _logged:
            return False
        _logged.add(key)
    logger.log(level, message, *args)
    return True


_configure(logger)
