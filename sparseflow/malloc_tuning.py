"""glibc's malloc told to keep freed memory mapped: a training step reuses it the next step.

A training step allocates and frees the same buffers every step (TensorFlow's op outputs,
numpy functions' arrays, gRPC's messages). With glibc's defaults two of its policies hand
pages back to the kernel between steps, and the next step faults them in again (a page fault
and a zeroed page for every 4 KiB):

- blocks from 128 KiB up are mmapped, and unmapped when freed, until a free raises the
  threshold;
- a thread's arena unmaps a whole sub-heap once it is free and trims its top: an arena whose
  use rises and falls across a sub-heap's end each step maps and faults it again (on 2 ranks,
  the tables' gradient split, 26 outputs of 128 KiB, in the Estimator's process).

On 2 ranks of ``benchmarks/ranks_worker.py`` that was 850-2,230 page faults a step and
rank, 24-62 with the settings below, and the step 11-19% faster (BENCHMARKS.md, "Sharded
faces"; docs/design-notes.md, "Page faults between steps").

The settings (``mallopt``): blocks below 32 MiB come from the heaps; the main heap's top is
trimmed only past 256 MiB free; every heap keeps 64 MiB of padding at its top, so a thread's
arena never returns a sub-heap (at most 64 MiB each): it keeps the most it ever held, mapped
for reuse (``malloc_trim(0)`` returns it). Tables' storage (larger blocks) is mmapped and
unmapped as before.

Applied once per process when sparseflow is imported, on glibc only. Left alone when the
user chose malloc settings of their own (``GLIBC_TUNABLES`` naming ``glibc.malloc``, one of
:data:`USER_VARIABLES`), preloads another allocator (``LD_PRELOAD``), or set
``SPARSEFLOW_MALLOC_TUNING=0``.
"""

from __future__ import annotations

import ctypes
import os
import platform
import warnings

OPT_OUT_VARIABLE = "SPARSEFLOW_MALLOC_TUNING"

# mallopt's parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3

SETTINGS = (
    (M_MMAP_THRESHOLD, 32 << 20),   # the largest every 64-bit glibc accepts
    (M_TRIM_THRESHOLD, 256 << 20),
    (M_TOP_PAD, 64 << 20),
)
_NAMES = {value: name for name, value in globals().items() if name.startswith("M_")}

# glibc reads these at startup; mallopt afterwards would override the user's choice.
USER_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                  "MALLOC_ARENA_MAX", "MALLOC_ARENA_TEST", "MALLOC_MMAP_MAX_")
# A preloaded allocator serves malloc; glibc's settings would tune one nobody uses (or, for
# tcmalloc, reach a mallopt that does nothing).
_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc", "scudo", "hoard")

_applied: bool | None = None


def tune_malloc(environ=None, libc=None, *, force: bool = False) -> bool:
    """Applies :data:`SETTINGS` with glibc's ``mallopt``, once per process.

    Args:
      environ: the environment to read (default ``os.environ``).
      libc: an object with glibc's ``mallopt(param, value) -> int`` (default the process's
        C library); tests pass their own.
      force: apply again even if an earlier call decided (tests).

    Returns:
      Whether glibc took the settings: False on a C library other than glibc, under a
      preloaded allocator, when the user set malloc settings of their own, with
      ``SPARSEFLOW_MALLOC_TUNING=0``, or when glibc refused one (a warning says which; the
      ones before it stay set).

    Raises:
      ValueError: ``SPARSEFLOW_MALLOC_TUNING`` is set to something other than 0, 1 or empty.
    """
    global _applied
    if _applied is None or force:
        _applied = _apply(os.environ if environ is None else environ, libc)
    return _applied


def _apply(environ, libc) -> bool:
    """:func:`tune_malloc`'s decision and its mallopt calls."""
    choice = environ.get(OPT_OUT_VARIABLE, "").strip() or "1"
    if choice not in ("0", "1"):
        raise ValueError(f"Environment variable {OPT_OUT_VARIABLE} must be 0 (leave glibc's "
                         f"malloc settings alone) or 1 (tune them, the default); received "
                         f"{choice!r}.")
    if choice == "0" or _user_settings(environ):
        return False
    if libc is None:
        if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
            return False
        libc = ctypes.CDLL(None)
    for param, value in SETTINGS:
        if libc.mallopt(param, value) != 1:
            warnings.warn(f"glibc's mallopt refused {_NAMES[param]} ({param}) = {value} "
                          f"({value >> 20} MiB): malloc keeps its defaults from there on, and "
                          f"training steps may fault their buffers in afresh. Set "
                          f"{OPT_OUT_VARIABLE}=0 to skip the tuning.", RuntimeWarning,
                          stacklevel=3)
            return False
    return True

def _user_settings(environ) -> bool:
    if "glibc.malloc." in environ.get("GLIBC_TUNABLES", ""):
        return True
    preload = environ.get("LD_PRELOAD", "").lower()
    if any(name in preload for name in _ALLOCATORS):
        return True
    return any(name in environ for name in USER_VARIABLES)
