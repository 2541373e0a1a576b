"""Process-wide int64 arrays that compiled kernels reach by symbol, and atomic operations on
their elements (no TensorFlow here: the key processor imports this without it).

A kernel that captured an array's address as a Python int would carry a constant of the
process that compiled it, and numba would not cache it; an array bound to a symbol with
``llvm.add_symbol`` is reached through :func:`global_address` instead, so the kernels that
use it are cached like any other.

numba's cache is keyed on the file of the kernel that inlines these intrinsics
(``table_registry.py``, ``progress_ops.py``), not on this one: after changing an intrinsic
here, clear those kernels' caches (their ``__pycache__`` ``*.nbi`` / ``*.nbc`` files).
"""

from __future__ import annotations

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic


def bind(symbol: str, array: np.ndarray) -> None:
    """Binds ``symbol`` to ``array``'s data for the kernels: the array must live, and never
    move, for the life of the process (a module-level array)."""
    llvm.add_symbol(symbol, array.ctypes.data)


def global_address(symbol: str):
    """An intrinsic giving, in a kernel, the address (int64) of the array bound to ``symbol``
    (:func:`bind`)."""
    @intrinsic
    def address(typingctx):
        def codegen(context, builder, signature, args):
            variable = cgutils.add_global_variable(builder.module, ir.IntType(64), symbol)
            return builder.ptrtoint(variable, ir.IntType(64))
        return types.int64(), codegen
    return address


@intrinsic
def atomic(typingctx, operation, address, value):
    """``operation`` ("add", "max", "xchg") on the int64 at ``address``, sequentially
    consistent; returns the value before."""
    if not isinstance(operation, types.StringLiteral):
        return None
    op = operation.literal_value

    def codegen(context, builder, signature, args):
        pointer = builder.inttoptr(args[1], ir.IntType(64).as_pointer())
        return builder.atomic_rmw(op, pointer, args[2], "seq_cst")
    return types.int64(operation, address, value), codegen
