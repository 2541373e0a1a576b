"""Making memory resident ahead of its first write, without writing it.

A row of host storage costs a page fault the first time it is written: the OS zeroes a page
(and, on a virtual machine, the host may back it first). Where rows are handed out on the
training step's critical path (the owner of a shard, on several ranks), that cost lands in the
step. ``MADV_POPULATE_WRITE`` (Linux 5.14+) faults a range in for writing without changing its
contents, so another thread may do it ahead of time while rows are being written: it is safe
next to concurrent writers, which a zero-fill is not.

Where the kernel lacks it (other systems, older Linux) :func:`populate_write` does nothing and
returns False; the first write then pays the fault as before.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import sys

import numpy as np

MADV_POPULATE_WRITE = 23   # linux/mman.h, since 5.14

_PAGE = mmap.PAGESIZE


def _libc_madvise():
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    fn = libc.madvise
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn


# libc's madvise, or None where populating is not possible (not Linux, or a kernel that
# refused the advice once).
_state = {"madvise": _libc_madvise() if sys.platform.startswith("linux") else None}


def populate_write(array: np.ndarray, start: int, stop: int) -> bool:
    """Faults the pages that bytes ``[start, stop)`` of ``array``'s buffer touch in for
    writing, their contents unchanged: every page the range overlaps that lies wholly inside
    the buffer (so consecutive ranges leave no page out; a page the buffer shares with other
    memory, at either end of it, is left alone).

    Releases the GIL while the kernel works (a ctypes call).

    Args:
      array: a C-contiguous, writeable numpy array.
      start, stop: byte offsets into its buffer, ``0 <= start <= stop <= array.nbytes``.

    Returns:
      True when the pages are resident now; False when this system cannot populate (not
      Linux, or a kernel older than 5.14: then it never tries again) or the range touches
      no page wholly inside the buffer.

    Raises:
      ValueError: ``array`` is not C-contiguous and writeable, or the range is outside it.
    """
    if not (array.flags.c_contiguous and array.flags.writeable):
        raise ValueError("populate_write needs a C-contiguous, writeable array; received "
                         f"one with flags c_contiguous={array.flags.c_contiguous}, "
                         f"writeable={array.flags.writeable}")
    if not 0 <= start <= stop <= array.nbytes:
        raise ValueError(f"populate_write: byte range [{start}, {stop}) is outside the "
                         f"array's {array.nbytes} bytes")
    madvise = _state["madvise"]
    if madvise is None:
        return False
    if start == stop:
        return False
    base = array.ctypes.data
    buffer_first = -(-base // _PAGE) * _PAGE                  # the buffer's whole pages
    buffer_last = (base + array.nbytes) // _PAGE * _PAGE
    first = max((base + start) // _PAGE * _PAGE, buffer_first)
    last = min(-(-(base + stop) // _PAGE) * _PAGE, buffer_last)
    if last <= first:
        return False
    if madvise(first, last - first, MADV_POPULATE_WRITE) == 0:
        return True
    if ctypes.get_errno() == getattr(os, "EINVAL", 22):   # the kernel lacks the advice
        _state["madvise"] = None
    return False
