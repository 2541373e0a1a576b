"""Output buffers for ``tf.numpy_function``: numpy arrays TensorFlow can adopt without a copy.

A numpy_function's outputs become tensors through ``TF_NewTensor``, which copies any buffer
not aligned to ``EIGEN_MAX_ALIGN_BYTES`` (64 on the x86 builds). numpy aligns its data to 16
bytes only, so every large output of a numpy function (the batch's embeddings, 6.8 MB per
Criteo-shaped step) was copied once more after the kernel had written it. Arrays from
:func:`empty` start on a 64-byte boundary, and TF keeps a reference instead of copying.
"""

from __future__ import annotations

import math

import numba
import numpy as np

ALIGNMENT = 64


@numba.njit(cache=True, nogil=True)
def _address(array):
    # ~0.15 us, where ``array.ctypes.data`` builds a ctypes object (~1 us): the owners'
    # numpy functions make several of these buffers per exchange.
    return array.ctypes.data


def empty(shape, dtype) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on a 64-byte boundary (when it
    has any: an empty array holds no bytes to copy).

    Args:
      shape: int or tuple of ints.
      dtype: a numpy dtype.

    Returns:
      The array (a view into a slightly larger byte buffer, which it keeps alive).
    """
    dtype = np.dtype(dtype)
    flat = not isinstance(shape, (tuple, list))
    # math.prod, not np.prod: ~2 us a call, and the owners' numpy functions make several per
    # exchange.
    count = int(shape) if flat else int(math.prod(shape))
    raw = np.empty(count * dtype.itemsize + ALIGNMENT, np.uint8)
    offset = -_address(raw) % ALIGNMENT
    out = raw[offset:offset + count * dtype.itemsize].view(dtype)
    return out if flat else out.reshape(shape)


def zeros(shape, dtype) -> np.ndarray:
    """:func:`empty`, filled with zeros."""
    out = empty(shape, dtype)
    out.fill(0)
    return out


def concatenate(parts, dtype) -> np.ndarray:
    """1-D arrays ``parts`` joined, cast to ``dtype``, in a 64-byte aligned array."""
    out = empty(sum(p.shape[0] for p in parts), dtype)
    np.concatenate(parts, out=out, casting="same_kind")
    return out
