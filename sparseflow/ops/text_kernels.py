"""Key kernels over Arrow buffers: hex keys, hashed string keys and padded multi-hot lists.

The kernels read Arrow's buffers in place (no per-row Python): a string array is ``offsets``
(int32, or int64 for ``large_string``) into ``data`` (uint8) plus a validity bitmap; a list
array is ``offsets`` into a child array of keys. A missing key is -1 everywhere: a null or an
empty string, and the padding of a multi-hot row.

String keys are ``Fingerprint64(bytes) mod (2**63 - 1)`` (farmhash, the function TensorFlow's
``tf.strings.to_hash_bucket_fast(s, 2**63 - 1)`` computes), so the same token gives the same key
whether it is read from Parquet/CSV here or hashed in a TensorFlow graph (TFRecord input,
serving). The result lies in [0, 2**63 - 2]: never -1.

The ``@numba.njit`` kernels take arrays already checked by the wrappers below, which accept
pyarrow arrays (``string``/``large_string``/``binary``/``large_binary``, their views,
dictionary-encoded strings, chunked arrays, slices with offsets).
"""

from __future__ import annotations

import numba
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_JIT = dict(nogil=True, cache=True, error_model="numpy", boundscheck=False)

ENCODINGS = ("int", "hex", "string")
HASH_MODULUS = 2**63 - 1

_K0 = np.uint64(0xC3A5C85C97CB3127)
_K1 = np.uint64(0xB492B66FBE98F273)
_K2 = np.uint64(0x9AE16A3B2F90404F)
_MOD = np.uint64(HASH_MODULUS)
# Byte -> hex digit value, -1 for bytes that are not hex digits.
_HEX_DIGIT = np.full(256, -1, np.int64)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX_DIGIT[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX_DIGIT[_c] = 10 + _i


# --- kernels -------------------------------------------------------------------------------

@numba.njit(**_JIT)
def _is_valid(bitmap, bit):
    if bitmap.shape[0] == 0:
        return True
    return (bitmap[bit >> 3] >> (bit & 7)) & 1 == 1


@numba.njit(**_JIT)
def parse_hex_kernel(offsets, data, bitmap, bit_offset, out):
    """out[i] = the hex string i as a 64-bit pattern; -1 where null or empty.

    Args:
      offsets: int32 or int64 [n + 1], string i is ``data[offsets[i]:offsets[i + 1]]``.
      data: uint8 bytes.
      bitmap: uint8 validity bitmap (empty: all valid); row i is bit ``bit_offset + i``.
      bit_offset: the array's offset into ``bitmap``.
      out: int64 [n] out.

    Returns:
      The first row that is not 1 to 16 hex digits, or -1 when all rows parsed.
    """
    for i in range(out.shape[0]):
        start = offsets[i]
        end = offsets[i + 1]
        if not _is_valid(bitmap, bit_offset + i) or end == start:
            out[i] = -1
            continue
        if end - start > 16:
            return i
        v = np.int64(0)
        for p in range(start, end):
            d = _HEX_DIGIT[data[p]]
            if d < 0:
                return i
            v = (v << 4) | d
        out[i] = v
    return -1


@numba.njit(**_JIT)
def _fetch_le(data, p, n):
    """The ``n`` bytes at ``data[p]`` as a little-endian unsigned integer (n <= 8)."""
    v = np.uint64(0)
    for j in range(n):
        v |= np.uint64(data[p + j]) << np.uint64(8 * j)
    return v


@numba.njit(**_JIT)
def _fetch64(data, p):
    return _fetch_le(data, p, 8)


@numba.njit(**_JIT)
def _fetch32(data, p):
    return _fetch_le(data, p, 4)


@numba.njit(**_JIT)
def _rotate(v, shift):
    return (v >> np.uint64(shift)) | (v << np.uint64(64 - shift))


@numba.njit(**_JIT)
def _shift_mix(v):
    return v ^ (v >> np.uint64(47))


@numba.njit(**_JIT)
def _hash_len16(u, v, mul):
    a = (u ^ v) * mul
    a ^= a >> np.uint64(47)
    b = (v ^ a) * mul
    b ^= b >> np.uint64(47)
    return b * mul


@numba.njit(**_JIT)
def _weak_hash32(data, p, a, b):
    w = _fetch64(data, p)
    x = _fetch64(data, p + 8)
    y = _fetch64(data, p + 16)
    z = _fetch64(data, p + 24)
    a += w
    b = _rotate(b + a + z, 21)
    c = a
    a += x
    a += y
    b += _rotate(a, 44)
    return a + z, b + c


@numba.njit(**_JIT)
def fingerprint64(data, s, n):
    """farmhash Fingerprint64 (farmhashna::Hash64) of ``data[s:s + n]`` as uint64."""
    ln = np.uint64(n)
    if n <= 16:
        if n >= 8:
            mul = _K2 + ln * np.uint64(2)
            a = _fetch64(data, s) + _K2
            b = _fetch64(data, s + n - 8)
            c = _rotate(b, 37) * mul + a
            d = (_rotate(a, 25) + b) * mul
            return _hash_len16(c, d, mul)
        if n >= 4:
            mul = _K2 + ln * np.uint64(2)
            a = _fetch32(data, s)
            return _hash_len16(ln + (a << np.uint64(3)), _fetch32(data, s + n - 4), mul)
        if n > 0:
            y = np.uint64(data[s]) + (np.uint64(data[s + (n >> 1)]) << np.uint64(8))
            z = ln + (np.uint64(data[s + n - 1]) << np.uint64(2))
            return _shift_mix(y * _K2 ^ z * _K0) * _K2
        return _K2
    if n <= 32:
        mul = _K2 + ln * np.uint64(2)
        a = _fetch64(data, s) * _K1
        b = _fetch64(data, s + 8)
        c = _fetch64(data, s + n - 8) * mul
        d = _fetch64(data, s + n - 16) * _K2
        return _hash_len16(_rotate(a + b, 43) + _rotate(c, 30) + d,
                           a + _rotate(b + _K2, 18) + c, mul)
    if n <= 64:
        mul = _K2 + ln * np.uint64(2)
        a = _fetch64(data, s) * _K2
        b = _fetch64(data, s + 8)
        c = _fetch64(data, s + n - 8) * mul
        d = _fetch64(data, s + n - 16) * _K2
        y = _rotate(a + b, 43) + _rotate(c, 30) + d
        z = _hash_len16(y, a + _rotate(b + _K2, 18) + c, mul)
        e = _fetch64(data, s + 16) * mul
        f = _fetch64(data, s + 24)
        g = (y + _fetch64(data, s + n - 32)) * mul
        h = (z + _fetch64(data, s + n - 24)) * mul
        return _hash_len16(_rotate(e + f, 43) + _rotate(g, 30) + h,
                           e + _rotate(f + a, 18) + g, mul)
    seed = np.uint64(81)
    x = seed
    y = seed * _K1 + np.uint64(113)
    z = _shift_mix(y * _K2 + np.uint64(113)) * _K2
    v0 = np.uint64(0)
    v1 = np.uint64(0)
    w0 = np.uint64(0)
    w1 = np.uint64(0)
    x = x * _K2 + _fetch64(data, s)
    end = s + ((n - 1) // 64) * 64
    last64 = s + n - 64
    p = s
    while True:
        x = _rotate(x + y + v0 + _fetch64(data, p + 8), 37) * _K1
        y = _rotate(y + v1 + _fetch64(data, p + 48), 42) * _K1
        x ^= w1
        y += v0 + _fetch64(data, p + 40)
        z = _rotate(z + w0, 33) * _K1
        v0, v1 = _weak_hash32(data, p, v1 * _K1, x + w0)
        w0, w1 = _weak_hash32(data, p + 32, z + w1, y + _fetch64(data, p + 16))
        x, z = z, x
        p += 64
        if p == end:
            break
    mul = _K1 + ((z & np.uint64(0xFF)) << np.uint64(1))
    p = last64
    w0 += np.uint64((n - 1) & 63)
    v0 += w0
    w0 += v0
    x = _rotate(x + y + v0 + _fetch64(data, p + 8), 37) * mul
    y = _rotate(y + v1 + _fetch64(data, p + 48), 42) * mul
    x ^= w1 * np.uint64(9)
    y += v0 * np.uint64(9) + _fetch64(data, p + 40)
    z = _rotate(z + w0, 33) * mul
    v0, v1 = _weak_hash32(data, p, v1 * mul, x + w0)
    w0, w1 = _weak_hash32(data, p + 32, z + w1, y + _fetch64(data, p + 16))
    x, z = z, x
    return _hash_len16(_hash_len16(v0, w0, mul) + _shift_mix(y) * _K0 + z,
                       _hash_len16(v1, w1, mul) + x, mul)


@numba.njit(**_JIT)
def hash_strings_kernel(offsets, data, bitmap, bit_offset, out):
    """out[i] = Fingerprint64(string i) mod (2**63 - 1); -1 where null or empty.

    Args: as :func:`parse_hex_kernel`.
    """
    for i in range(out.shape[0]):
        start = offsets[i]
        n = offsets[i + 1] - start
        if n == 0 or not _is_valid(bitmap, bit_offset + i):
            out[i] = -1
        else:
            out[i] = np.int64(fingerprint64(data, start, n) % _MOD)


@numba.njit(**_JIT)
def pad_lists_kernel(offsets, values, bitmap, bit_offset, out):
    """out[i, :] = list i's first L values, padded with -1; a null list is all -1.

    Args:
      offsets: int32 or int64 [n + 1], list i is ``values[offsets[i]:offsets[i + 1]]``.
      values: int64 keys.
      bitmap, bit_offset: the list array's validity, as in :func:`parse_hex_kernel`.
      out: int64 [n, L] out.
    """
    length = out.shape[1]
    for i in range(out.shape[0]):
        start = offsets[i]
        count = 0
        if _is_valid(bitmap, bit_offset + i):
            count = min(offsets[i + 1] - start, length)
        for j in range(count):
            out[i, j] = values[start + j]
        for j in range(count, length):
            out[i, j] = -1


# --- wrappers ------------------------------------------------------------------------------

_EMPTY_BITMAP = np.zeros(0, np.uint8)
_EMPTY_DATA = np.zeros(8, np.uint8)


def _bitmap(array: pa.Array) -> np.ndarray:
    buf = array.buffers()[0]
    if buf is None or array.null_count == 0:
        return _EMPTY_BITMAP
    return np.frombuffer(buf, np.uint8)


def _offsets(array: pa.Array, dtype) -> np.ndarray:
    buf = array.buffers()[1]
    return np.frombuffer(buf, dtype)[array.offset:array.offset + len(array) + 1]


def _string_kernel(array, kernel, what: str) -> np.ndarray:
    """Runs a string kernel over every chunk; returns int64 [n]."""
    if not isinstance(array, (pa.Array, pa.ChunkedArray)):
        raise TypeError(f"Argument `array` must be a pyarrow array of strings. "
                        f"Received: {type(array).__name__}")
    chunks = array.chunks if isinstance(array, pa.ChunkedArray) else [array]
    out = np.empty(sum(len(c) for c in chunks), np.int64)
    row = 0
    for chunk in chunks:
        n = len(chunk)
        out[row:row + n] = _string_chunk(chunk, kernel, what, row)
        row += n
    return out


def _string_chunk(chunk: pa.Array, kernel, what: str, first_row: int) -> np.ndarray:
    t = chunk.type
    out = np.empty(len(chunk), np.int64)
    if len(chunk) == 0:
        return out
    if pa.types.is_null(t):
        out.fill(-1)
        return out
    if pa.types.is_dictionary(t):
        if not _is_stringish(t.value_type):
            raise TypeError(f"Argument `array` must hold strings. Received: {t}")
        # Encode each distinct value once, then gather (a bad hex value reports its row below).
        try:
            keys = _string_chunk(chunk.dictionary, kernel, what, 0)
        except ValueError:
            return _string_chunk(chunk.cast(t.value_type), kernel, what, first_row)
        idx = pc.fill_null(chunk.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
        return np.where(idx >= 0, keys[np.maximum(idx, 0)] if keys.size else -1, -1)
    if pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        chunk = chunk.cast(pa.large_binary())
        t = chunk.type
    if pa.types.is_string(t) or pa.types.is_binary(t):
        offsets = _offsets(chunk, np.int32)
    elif pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        offsets = _offsets(chunk, np.int64)
    else:
        raise TypeError(f"Argument `array` must hold strings (string, large_string, binary). "
                        f"Received: {t}")
    data_buf = chunk.buffers()[2]
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None and data_buf.size else \
        _EMPTY_DATA
    if offsets[-1] > data.shape[0] or offsets[0] < 0:
        raise ValueError(f"Argument `array` has offsets past its data buffer: "
                         f"{offsets[-1]} > {data.shape[0]}")
    bad = kernel(offsets, data, _bitmap(chunk), chunk.offset, out)
    if bad is not None and bad >= 0:
        value = chunk[int(bad)].as_py()
        raise ValueError(f"Invalid {what} at row {first_row + int(bad)}: {value!r}; "
                         f"expected 1 to 16 hex digits (0-9, a-f, A-F), or empty for missing.")
    return out


def _is_stringish(t: pa.DataType) -> bool:
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t) or pa.types.is_string_view(t)
            or pa.types.is_binary_view(t))


def parse_hex_keys(array) -> np.ndarray:
    """Parses hex key strings (Criteo's 8-digit hashes) into int64 keys.

    Args:
      array: pyarrow string/binary array or chunked array, n rows. Each value is 1 to 16 hex
        digits (either case, no prefix); its 64-bit pattern is the key (so the one 16-digit
        value ``ffffffffffffffff`` reads as -1, missing; Criteo's 8-digit values never do).

    Returns:
      int64 [n]; -1 where the value is null or empty.

    Raises:
      TypeError: ``array`` does not hold strings.
      ValueError: a value is not 1 to 16 hex digits (the message names the row).
    """
    return _string_kernel(array, parse_hex_kernel, "hex key")


def hash_string_keys(array) -> np.ndarray:
    """Hashes string keys to int64: ``Fingerprint64(bytes) mod (2**63 - 1)``.

    Equal to ``tf.strings.to_hash_bucket_fast(s, 2**63 - 1)``, so keys agree with those hashed
    in TensorFlow graphs.

    Args:
      array: pyarrow string/binary array or chunked array, n rows.

    Returns:
      int64 [n] in [0, 2**63 - 2]; -1 where the value is null or empty.

    Raises:
      TypeError: ``array`` does not hold strings.
    """
    return _string_kernel(array, hash_strings_kernel, "string")


def encode_keys(array, encoding: str) -> np.ndarray:
    """One int64 key per row of a flat pyarrow column.

    Args:
      array: pyarrow array or chunked array, n rows. ``int``: integer (or integral float, or
        decimal-digit string) values; ``hex`` / ``string``: string values.
      encoding: ``int`` | ``hex`` | ``string``.

    Returns:
      int64 [n]; nulls (and empty strings) are -1.

    Raises:
      ValueError: unknown ``encoding``; values that the encoding cannot read.
      TypeError: a string encoding on a column that does not hold strings.
    """
    if encoding == "hex":
        return parse_hex_keys(array)
    if encoding == "string":
        return hash_string_keys(array)
    if encoding != "int":
        raise ValueError(f"Invalid `encoding`: {encoding!r}, use one of {', '.join(ENCODINGS)}.")
    t = array.type
    if pa.types.is_null(t):
        return np.full(len(array), -1, np.int64)
    if pa.types.is_dictionary(t):
        array = array.cast(t.value_type)
        t = array.type
    if t != pa.int64():
        if not (pa.types.is_integer(t) or pa.types.is_floating(t) or _is_stringish(t)
                or pa.types.is_decimal(t)):
            raise TypeError(f"Encoding `int` needs integer values. Received: {t}")
        try:
            array = pc.cast(array, pa.int64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
            raise ValueError(f"Encoding `int` cannot read the values as int64: {err}") from None
    if array.null_count:
        array = pc.fill_null(array, -1)
    if isinstance(array, pa.ChunkedArray):
        if array.num_chunks == 1:
            array = array.chunk(0)
        else:
            return np.concatenate([c.to_numpy() for c in array.chunks]) if array.num_chunks \
                else np.zeros(0, np.int64)
    return array.to_numpy()


def pad_lists(array, length: int, *, encoding: str = "int") -> np.ndarray:
    """Multi-hot rows: each list's first ``length`` keys, padded with -1.

    Args:
      array: pyarrow list/large_list/fixed_size_list array or chunked array, n rows; its
        values are read with ``encoding`` (see :func:`encode_keys`). A flat (non-list) array is
        read as lists of one value.
      length: L >= 1.
      encoding: ``int`` | ``hex`` | ``string``.

    Returns:
      int64 [n, L]; a null list is all -1, a null value inside a list is -1.

    Raises:
      ValueError: ``length`` < 1; values that ``encoding`` cannot read.
      TypeError: as :func:`encode_keys`.
    """
    if not isinstance(length, (int, np.integer)) or isinstance(length, bool) or length < 1:
        raise ValueError(f"Argument `length` must be an int >= 1. Received: {length!r}")
    chunks = array.chunks if isinstance(array, pa.ChunkedArray) else [array]
    parts = [_pad_chunk(chunk, int(length), encoding) for chunk in chunks]
    if not parts:
        return np.full((0, length), -1, np.int64)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _pad_chunk(chunk: pa.Array, length: int, encoding: str) -> np.ndarray:
    t = chunk.type
    out = np.empty((len(chunk), length), np.int64)
    if pa.types.is_fixed_size_list(t):
        chunk = chunk.cast(pa.list_(t.value_type))
        t = chunk.type
    if pa.types.is_list(t):
        offsets = _offsets(chunk, np.int32)
    elif pa.types.is_large_list(t):
        offsets = _offsets(chunk, np.int64)
    else:
        out.fill(-1)
        out[:, 0] = encode_keys(chunk, encoding)
        return out
    if len(chunk) == 0:
        return out
    first, last = int(offsets[0]), int(offsets[-1])
    values = encode_keys(chunk.values.slice(first, last - first), encoding)
    pad_lists_kernel(offsets - first if first else offsets, values, _bitmap(chunk), chunk.offset,
                     out)
    return out
