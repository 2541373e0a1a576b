"""TensorFlow ops whose kernels are numba ``cfunc``s, registered through TensorFlow's C API.

A ``tf.numpy_function`` node enters Python: it takes the GIL, wraps its inputs as numpy
arrays, calls the function and wraps the outputs back, and it waits for the GIL while the
input pipeline's own numpy function holds it (the batch's gradient sum: 819 us a call as a
numpy function against 498 us as an op here, 17.9 ms against 0.83 ms with Python running
beside it; ``benchmarks/bench_op_boundary.py``). An op registered through TensorFlow's C API
(``tensorflow/c/ops.h``, ``tensorflow/c/kernels.h``: the ABI-stable interface TensorFlow
keeps for pluggable kernels, exported by ``libtensorflow_framework``) runs its kernel in
TensorFlow's executor like any built-in op. Its kernel here is a numba ``cfunc``: compiled at
run time by the numba the project already depends on, so nothing needs a C compiler and the
README's two commands still set everything up.

Inside a kernel, C API handles are plain integers (``uint64``), the C API functions are numba
external functions bound by symbol, and :func:`float32_pointer` and its siblings turn a
tensor's data address into a pointer ``numba.carray`` can view.
"""

from __future__ import annotations

import ctypes
import glob
import os
import threading

import llvmlite.binding as llvm
import numba
import numpy as np
import tensorflow as tf
from numba import types
from numba.core.extending import intrinsic

TF_FLOAT = 1              # TF_DataType (tensorflow/c/tf_datatype.h)
TF_INT64 = 9
TF_INT32 = 3
TF_OK = 0                 # TF_Code (tensorflow/c/tf_status.h)
TF_INVALID_ARGUMENT = 3
TF_FAILED_PRECONDITION = 9


def _framework_library() -> ctypes.CDLL:
    """The loaded ``libtensorflow_framework`` (TensorFlow's import already mapped it)."""
    candidates = sorted(glob.glob(os.path.join(tf.sysconfig.get_lib(),
                                               "libtensorflow_framework*")))
    if not candidates:
        raise RuntimeError(
            f"sparseflow's compiled ops need TensorFlow's C API in libtensorflow_framework, "
            f"which this TensorFlow ({tf.__version__}) does not ship under "
            f"{tf.sysconfig.get_lib()}.")
    return ctypes.CDLL(candidates[0], mode=ctypes.RTLD_GLOBAL)


_LIB = _framework_library()


def _c_function(symbol: str, restype, *argtypes):
    """A ctypes prototype of the C API function ``symbol``, for Python.

    Each call builds its own prototype at the symbol's address: ctypes hands out one shared
    function object per symbol, whose types a second declaration would overwrite.

    Raises:
      RuntimeError: the library does not export ``symbol``.
    """
    try:
        address = ctypes.cast(getattr(_LIB, symbol), ctypes.c_void_p).value
    except AttributeError:
        raise RuntimeError(f"TensorFlow {tf.__version__}'s C API lacks `{symbol}`, which "
                           f"sparseflow's compiled ops need.") from None
    return ctypes.CFUNCTYPE(restype, *argtypes)(address)


def _pointer_intrinsic(dtype):
    @intrinsic
    def as_pointer(typingctx, address):
        signature = types.CPointer(dtype)(address)

        def codegen(context, builder, sig, args):
            return builder.inttoptr(args[0], context.get_value_type(sig.return_type))
        return signature, codegen
    return as_pointer


float32_pointer = _pointer_intrinsic(types.float32)
float64_pointer = _pointer_intrinsic(types.float64)
int32_pointer = _pointer_intrinsic(types.int32)
int64_pointer = _pointer_intrinsic(types.int64)
uint8_pointer = _pointer_intrinsic(types.uint8)

# Called from kernels (handles as integers). Declared by symbol, not as ctypes pointers, so
# numba caches the kernels that call them (a ctypes pointer is a run-time constant, which
# numba will not cache, and compiling the kernels anew cost ~2 s per process).
llvm.load_library_permanently(_LIB._name)
_u64 = types.uint64
_i32 = types.int32
new_status = types.ExternalFunction("TF_NewStatus", _u64())
delete_status = types.ExternalFunction("TF_DeleteStatus", types.void(_u64))
status_code = types.ExternalFunction("TF_GetCode", _i32(_u64))
set_status = types.ExternalFunction("TF_SetStatus", types.void(_u64, _i32, _u64))
kernel_failure = types.ExternalFunction("TF_OpKernelContext_Failure", types.void(_u64, _u64))
get_input = types.ExternalFunction("TF_GetInput", types.void(_u64, _i32, _u64, _u64))
allocate_output = types.ExternalFunction(
    "TF_AllocateOutput", _u64(_u64, _i32, _i32, _u64, _i32, _u64, _u64))
num_inputs = types.ExternalFunction("TF_NumInputs", _i32(_u64))
tensor_data = types.ExternalFunction("TF_TensorData", _u64(_u64))
tensor_dim = types.ExternalFunction("TF_Dim", types.int64(_u64, _i32))
tensor_rank = types.ExternalFunction("TF_NumDims", _i32(_u64))
delete_tensor = types.ExternalFunction("TF_DeleteTensor", types.void(_u64))
_set_unknown_shape = types.ExternalFunction("TF_ShapeInferenceContextSetUnknownShape",
                                            types.void(_u64, _u64))
for _kernel_function in (new_status, delete_status, status_code, set_status, kernel_failure,
                         get_input, allocate_output, num_inputs, tensor_data, tensor_dim,
                         tensor_rank, delete_tensor, _set_unknown_shape):
    _c_function(_kernel_function.symbol, None)   # a clear error now, not at link time

# Called once per op, from Python.
_new_op_builder = _c_function("TF_NewOpDefinitionBuilder", ctypes.c_void_p, ctypes.c_char_p)
_add_input = _c_function("TF_OpDefinitionBuilderAddInput", None, ctypes.c_void_p,
                        ctypes.c_char_p)
_add_output = _c_function("TF_OpDefinitionBuilderAddOutput", None, ctypes.c_void_p,
                         ctypes.c_char_p)
_add_attr = _c_function("TF_OpDefinitionBuilderAddAttr", None, ctypes.c_void_p,
                       ctypes.c_char_p)
_set_shape_fn = _c_function("TF_OpDefinitionBuilderSetShapeInferenceFunction", None,
                           ctypes.c_void_p, ctypes.c_void_p)
_set_stateful = _c_function("TF_OpDefinitionBuilderSetIsStateful", None, ctypes.c_void_p,
                            ctypes.c_bool)
_register_op = _c_function("TF_RegisterOpDefinition", None, ctypes.c_void_p, ctypes.c_void_p)
_new_kernel_builder = _c_function("TF_NewKernelBuilder", ctypes.c_void_p, ctypes.c_char_p,
                                 ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p,
                                 ctypes.c_void_p)
_register_kernel = _c_function("TF_RegisterKernelBuilder", None, ctypes.c_char_p,
                              ctypes.c_void_p, ctypes.c_void_p)
_py_new_status = _c_function("TF_NewStatus", ctypes.c_void_p)
_py_delete_status = _c_function("TF_DeleteStatus", None, ctypes.c_void_p)
_py_status_code = _c_function("TF_GetCode", ctypes.c_int, ctypes.c_void_p)
_py_status_message = _c_function("TF_Message", ctypes.c_char_p, ctypes.c_void_p)


@numba.cfunc(types.void(types.uint64, types.uint64), nopython=True, cache=True)
def _unknown_shape(context, status):
    # Outputs' static shapes are set by the Python that builds the op (Tensor.set_shape).
    _set_unknown_shape(context, status)


@numba.cfunc(types.uint64(types.uint64), nopython=True, cache=True)
def _create_kernel(construction):
    # The kernels keep no state; TensorFlow wants a non-null handle back.
    return 1


@numba.cfunc(types.void(types.uint64), nopython=True, cache=True)
def _delete_kernel(kernel):
    pass


def message_bytes(text: str) -> np.ndarray:
    """``text`` as a NUL-terminated uint8 array: a kernel passes its address
    (``array.ctypes.data``) to :data:`set_status` as the error message."""
    return np.frombuffer(text.encode() + b"\0", np.uint8)


# -- helpers for kernels --------------------------------------------------------------------

@numba.njit(nogil=True, cache=True)
def input_handle(context, index, scratch, status):
    """The handle of input ``index`` (to be deleted with ``delete_tensor``), 0 if TF
    refused."""
    scratch[0] = 0
    get_input(context, index, scratch.ctypes.data, status)
    if status_code(status) != TF_OK:
        return np.uint64(0)
    return scratch[0]


@numba.njit(nogil=True, cache=True)
def input_handles(context, n, scratch, status):
    """Handles of inputs ``[0, n)`` (0 where TF refused one) and whether all were taken;
    free them with :func:`delete_handles`. ``scratch``: a uint64 ``[1]`` array."""
    handles = np.zeros(n, np.uint64)
    got = True
    for k in range(n):
        handles[k] = input_handle(context, k, scratch, status)
        got = got and handles[k] != 0
    return handles, got


@numba.njit(nogil=True, cache=True)
def open_inputs(context, ranks, bad_inputs, scratch, status):
    """A kernel's first step: the handles of inputs ``[0, len(ranks))`` and whether its body
    may run; it may not (the op then failed) when TF refused an input or input ``k``'s rank
    is not ``ranks[k]`` (``bad_inputs``, a :func:`message_bytes` message). Close with
    :func:`close_inputs`."""
    handles, got = input_handles(context, ranks.shape[0], scratch, status)
    if not got:
        kernel_failure(context, status)
        return handles, False
    if not ranks_are(handles, ranks):
        fail(context, status, bad_inputs)
        return handles, False
    return handles, True


@numba.njit(nogil=True, cache=True)
def close_inputs(handles, status):
    """A kernel's last step: frees the handles :func:`open_inputs` took and the status."""
    delete_handles(handles)
    delete_status(status)


@numba.njit(nogil=True, cache=True)
def ranks_are(handles, ranks):
    """Whether input ``k``'s rank is ``ranks[k]`` for every k of ``ranks``."""
    for k in range(ranks.shape[0]):
        if tensor_rank(handles[k]) != ranks[k]:
            return False
    return True


@numba.njit(nogil=True, cache=True)
def delete_handles(handles):
    """Deletes every taken handle (non-zero) of ``handles``."""
    for k in range(handles.shape[0]):
        if handles[k] != 0:
            delete_tensor(handles[k])


@numba.njit(nogil=True, cache=True)
def int32_vector(handle):
    """A 1-D int32 tensor's data, as an array view (valid while the handle lives)."""
    return numba.carray(int32_pointer(tensor_data(handle)), tensor_dim(handle, 0))


@numba.njit(nogil=True, cache=True)
def int64_vector(handle):
    """A 1-D int64 tensor's data, as an array view (valid while the handle lives)."""
    return numba.carray(int64_pointer(tensor_data(handle)), tensor_dim(handle, 0))


@numba.njit(nogil=True, cache=True)
def int64_scalar(handle):
    """An int64 scalar tensor's value."""
    return numba.carray(int64_pointer(tensor_data(handle)), 1)[0]


@numba.njit(nogil=True, cache=True)
def fail(context, status, message):
    """Fails the op with ``InvalidArgumentError`` and ``message`` (:func:`message_bytes`)."""
    set_status(status, TF_INVALID_ARGUMENT, message.ctypes.data)
    kernel_failure(context, status)


@numba.njit(nogil=True, cache=True)
def fail_with(context, status, code, message):
    """Fails the op with TF error ``code`` and ``message`` (:func:`message_bytes`)."""
    set_status(status, code, message.ctypes.data)
    kernel_failure(context, status)



_registered: set[str] = set()   # ops whose definition and kernel TF took
_defined: set[str] = set()      # ops whose definition TF took
_registering = threading.Lock()


def register_op(name: str, *, inputs: list[str], outputs: list[str], attrs: list[str] = (),
                compute, stateful: bool = False) -> None:
    """Registers op ``name`` with TensorFlow, its CPU kernel the cfunc ``compute``
    (``void(uint64 kernel, uint64 context)``); once per process, later calls return at once.

    Args:
      name: the op's type name (CamelCase, unique in the process).
      inputs, outputs, attrs: OpDef specs, as ``REGISTER_OP`` takes them ("x: float",
        "grads: N * float", "N: int >= 1").
      compute: a ``numba.cfunc`` of signature ``void(uint64, uint64)``.
      stateful: whether the kernel reads or changes state beyond its inputs (a table's rows);
        TensorFlow folds, prunes or merges only stateless ops.

    Raises:
      RuntimeError: TensorFlow refused the op or its kernel (its message included).
    """
    with _registering:
        if name in _registered:
            return
        status = _py_new_status()
        try:
            if name not in _defined:
                builder = _new_op_builder(name.encode())
                for spec in inputs:
                    _add_input(builder, spec.encode())
                for spec in outputs:
                    _add_output(builder, spec.encode())
                for spec in attrs:
                    _add_attr(builder, spec.encode())
                _set_shape_fn(builder, _unknown_shape.address)
                _set_stateful(builder, stateful)
                _register_op(builder, status)   # consumes the builder
                _check(status, f"registering op {name}")
                # A retry after a refused kernel must not define the op twice.
                _defined.add(name)
                tf.no_gradient(name)
            kernel_builder = _new_kernel_builder(name.encode(), b"CPU", _create_kernel.address,
                                                 compute.address, _delete_kernel.address)
            _register_kernel(f"{name}Kernel".encode(), kernel_builder, status)
            _check(status, f"registering the CPU kernel of op {name}")
        finally:
            _py_delete_status(status)
        _registered.add(name)


def _check(status, what: str) -> None:
    if _py_status_code(status) != TF_OK:
        raise RuntimeError(f"TensorFlow refused {what}: "
                           f"{_py_status_message(status).decode(errors='replace')}")


def apply_op(name: str, inputs: list, n_outputs: int, *, attrs: dict | None = None,
             op_name: str | None = None) -> list[tf.Tensor]:
    """Runs (eagerly) or adds (in a graph or ``tf.function``) one op ``name`` registered by
    :func:`register_op`.

    Args:
      name: the op's type name.
      inputs: its inputs, in OpDef order, a list input flattened in place.
      n_outputs: how many output tensors the op has.
      attrs: the op's attributes, ``{attr: int}`` (list lengths such as ``N`` included).
      op_name: the node's name in a graph.

    Returns:
      The op's output tensors.
    """
    from tensorflow.python.eager import context, execute

    attrs = attrs or {}
    inputs = [tf.convert_to_tensor(t) for t in inputs]
    if tf.executing_eagerly():
        flat_attrs = tuple(item for key, value in attrs.items() for item in (key, value))
        return list(execute.execute(name, n_outputs, inputs, flat_attrs,
                                    context.context(), name=op_name))
    return list(graph_op(name, inputs, attrs=attrs, op_name=op_name).outputs)


def graph_op(name: str, inputs: list, *, attrs: dict | None = None,
             op_name: str | None = None):
    """Adds one op ``name`` (registered by :func:`register_op`) to the default graph, as
    :func:`apply_op` does, and returns the ``tf.Operation`` (an op without outputs has
    nothing else to return)."""
    from tensorflow.python.framework import ops

    graph = ops.get_default_graph()
    attr_values = {key: tf.compat.v1.AttrValue(i=int(value))
                   for key, value in (attrs or {}).items()}
    inputs = [tf.convert_to_tensor(t) for t in inputs]
    # The public Graph.create_op is deprecated; TF's generated op wrappers reach this one.
    return graph._create_op_internal(name, inputs, None, name=op_name,  # noqa: SLF001
                                     attrs=attr_values)
