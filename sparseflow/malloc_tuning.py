"""glibc's malloc told to keep freed memory mapped: a training step reuses it the next step.

A training step allocates and frees the same buffers every step (TensorFlow's op outputs,
numpy functions' arrays, gRPC's messages). With glibc's defaults two of its policies hand
pages back to the kernel between steps, and the next step faults them in again (a page fault
and a zeroed page for every 4 KiB):

- blocks from 128 KiB up are mmapped each time unless an earlier free raised the threshold
  (a 26-table model on 2 ranks: the gradient split's 26 outputs of 128 KiB, every step);
- a thread's arena unmaps a whole sub-heap once it is free and trims its top: an arena whose
  use rises and falls across a sub-heap's end each step maps and faults it again.

On 2 ranks of ``benchmarks/ranks_worker.py`` that was 850-2,230 page faults a step and
rank (3.5-6.5 core-ms a rank a step), 24-62 with the settings below, and the step 11-19%
faster (BENCHMARKS.md, "Sharded faces"; docs/design-notes.md, "Page faults between steps").

The settings (``mallopt``): blocks up to 32 MiB come from the heap, whose top is trimmed
only past 256 MiB free, and every heap keeps 64 MiB of padding at its top. A process keeps
up to that much memory it has freed, mapped, for reuse; tables (larger blocks) are mmapped
and unmapped as before.

Applied once per process when sparseflow is imported, on glibc only. Left alone when the
user chose malloc settings of their own (``GLIBC_TUNABLES`` naming ``glibc.malloc``, or a
``MALLOC_*_`` variable) or set ``SPARSEFLOW_MALLOC_TUNING=0``.
"""

from __future__ import annotations

import ctypes
import os
import platform

OPT_OUT_VARIABLE = "SPARSEFLOW_MALLOC_TUNING"

# mallopt's parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3

SETTINGS = (
    (M_MMAP_THRESHOLD, 32 << 20),   # glibc's largest: blocks below come from the heap
    (M_TRIM_THRESHOLD, 256 << 20),
    (M_TOP_PAD, 64 << 20),
)

# The user's own malloc settings, which win.
_USER_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                   "MALLOC_ARENA_MAX", "MALLOC_ARENA_TEST", "MALLOC_MMAP_MAX_")

_applied: bool | None = None


def tune_malloc(environ=None, libc=None, *, force: bool = False) -> bool:
    """Applies :data:`SETTINGS` with glibc's ``mallopt``, once per process.

    Args:
      environ: the environment to read (default ``os.environ``).
      libc: an object with glibc's ``mallopt(param, value) -> int`` (default the process's
        C library); tests pass their own.
      force: apply again even if an earlier call decided (tests).

    Returns:
      Whether the settings are in effect: False on a C library other than glibc, when the
      user set malloc settings of their own, or with ``SPARSEFLOW_MALLOC_TUNING=0``.

    Raises:
      ValueError: ``SPARSEFLOW_MALLOC_TUNING`` is set to something other than 0 or 1.
      RuntimeError: glibc refused a setting.
    """
    global _applied
    if _applied is not None and not force:
        return _applied
    environ = os.environ if environ is None else environ
    choice = environ.get(OPT_OUT_VARIABLE, "1").strip()
    if choice not in ("0", "1"):
        raise ValueError(f"Environment variable {OPT_OUT_VARIABLE} must be 0 (leave glibc's "
                         f"malloc settings alone) or 1 (tune them, the default); received "
                         f"{choice!r}.")
    if choice == "0" or _user_settings(environ):
        _applied = False
        return False
    if libc is None:
        if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
            _applied = False
            return False
        libc = ctypes.CDLL(None)
    for param, value in SETTINGS:
        if libc.mallopt(param, value) != 1:
            raise RuntimeError(f"glibc's mallopt refused parameter {param} = {value}; set "
                               f"{OPT_OUT_VARIABLE}=0 to leave malloc's settings alone.")
    _applied = True
    return True


def _user_settings(environ) -> bool:
    if "glibc.malloc." in environ.get("GLIBC_TUNABLES", ""):
        return True
    return any(name in environ for name in _USER_VARIABLES)
