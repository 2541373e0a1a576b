"""``sparseflow.ops.text_kernels`` against plain Python references.

References: hex keys from ``int(s, 16)`` (two's complement for 16 digits); string keys from
TensorFlow's ``tf.strings.to_hash_bucket_fast(s, 2**63 - 1)`` and ``tf.fingerprint`` (the C++
farmhash the kernel re-implements); padded lists from Python loops over
``to_pylist()``. Inputs include empty arrays, nulls, sliced arrays (non-zero offsets), chunked
arrays, large_string / large_list, dictionary arrays and string views.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import tensorflow as tf

from sparseflow.ops import text_kernels as tk

MOD = 2**63 - 1


def ref_hex(values):
    out = []
    for v in values:
        if v is None or v == "":
            out.append(-1)
        else:
            x = int(v, 16)
            out.append(x - 2**64 if x >= 2**63 else x)
    return out


def ref_hash(values):
    """Fingerprint64 mod (2**63 - 1) computed by TensorFlow; -1 for null/empty."""
    data = [b"" if v is None else (v.encode() if isinstance(v, str) else v) for v in values]
    if not data:
        return []
    hashed = tf.strings.to_hash_bucket_fast(tf.constant(data, tf.string), MOD).numpy()
    return [-1 if not d or v is None else int(h) for d, v, h in zip(data, values, hashed)]


def ref_pad(lists, length, encode=lambda v: -1 if v is None else v):
    out = []
    for row in lists:
        keys = [] if row is None else [encode(v) for v in row][:length]
        out.append(keys + [-1] * (length - len(keys)))
    return out


HEX = ["68fd1e64", None, "", "0", "FFFFFFFF", "aBcD", "7fffffffffffffff", "8000000000000000",
       "ffffffffffffffff", "00000000deadbeef"]
WORDS = ["", None, "a", "abc", "hello world", "Comédie", "x" * 17, "y" * 33, "z" * 64, "w" * 65,
         "v" * 200, "zip 02139", "-1"]


# --- parse_hex_keys ------------------------------------------------------------------------

@pytest.mark.parametrize("type_", [pa.string(), pa.large_string(), pa.binary(),
                                   pa.large_binary(), pa.string_view()])
def test_hex_matches_int_parse(type_):
    arr = pa.array(HEX, type_)
    out = tk.parse_hex_keys(arr)
    assert out.dtype == np.int64 and out.shape == (len(HEX),)
    assert out.tolist() == ref_hex(HEX)


def test_hex_empty_sliced_chunked_dictionary():
    assert tk.parse_hex_keys(pa.array([], pa.string())).shape == (0,)
    assert tk.parse_hex_keys(pa.chunked_array([], pa.string())).shape == (0,)
    arr = pa.array(HEX, pa.string())
    for start, stop in [(1, 4), (3, 10), (9, 10), (5, 5)]:
        assert tk.parse_hex_keys(arr[start:stop]).tolist() == ref_hex(HEX[start:stop])
    chunked = pa.chunked_array([arr[2:5], arr[0:0], arr[5:]])
    assert tk.parse_hex_keys(chunked).tolist() == ref_hex(HEX[2:5] + HEX[5:])
    dictionary = pa.array(HEX * 2, pa.string()).dictionary_encode()
    assert tk.parse_hex_keys(dictionary).tolist() == ref_hex(HEX * 2)
    assert tk.parse_hex_keys(pa.nulls(3)).tolist() == [-1, -1, -1]


@pytest.mark.parametrize("bad,row", [("12g4", 2), ("0x12", 2), (" 12", 2), ("1" * 17, 2),
                                     ("é", 2)])
def test_hex_invalid_names_the_row(bad, row):
    arr = pa.array(["1", None, bad, "2"])
    with pytest.raises(ValueError, match=rf"row {row}: {bad!r}"):
        tk.parse_hex_keys(arr)


def test_hex_invalid_row_counts_across_chunks_and_slices():
    chunked = pa.chunked_array([pa.array(["1", "2"]), pa.array(["0", "3", "zz"])[1:]])
    with pytest.raises(ValueError, match=r"row 3: 'zz'"):
        tk.parse_hex_keys(chunked)
    dictionary = pa.array(["a", "q", "a"]).dictionary_encode()
    with pytest.raises(ValueError, match=r"row 1: 'q'"):
        tk.parse_hex_keys(dictionary)


def test_wrappers_reject_non_strings():
    with pytest.raises(TypeError, match="`array`"):
        tk.parse_hex_keys(pa.array([1, 2]))
    with pytest.raises(TypeError, match="`array`"):
        tk.hash_string_keys(np.array(["a"]))


# --- hash_string_keys ----------------------------------------------------------------------

@pytest.mark.parametrize("type_", [pa.string(), pa.large_string(), pa.string_view()])
def test_hash_matches_tensorflow(type_):
    out = tk.hash_string_keys(pa.array(WORDS, type_))
    assert out.dtype == np.int64
    assert out.tolist() == ref_hash(WORDS)


def test_hash_every_length_and_random_bytes():
    rng = np.random.default_rng(7)
    values = [bytes(rng.integers(0, 256, n, dtype=np.uint8)) for n in range(1, 260)]
    values += [bytes(rng.integers(0, 256, n, dtype=np.uint8)) for n in (1000, 4097)]
    out = tk.hash_string_keys(pa.array(values, pa.binary()))
    assert out.tolist() == ref_hash(values)
    assert (out >= 0).all() and len(set(out.tolist())) == len(values)


def test_fingerprint64_matches_tf_fingerprint():
    # The raw 64-bit hash (before the modulus) against tf.fingerprint(method="farmhash64").
    rng = np.random.default_rng(3)
    values = [b""] + [bytes(rng.integers(0, 256, n, dtype=np.uint8)) for n in
                      (1, 3, 4, 8, 9, 16, 17, 32, 33, 64, 65, 128, 129, 300)]
    expect = tf.fingerprint(tf.constant(values), method="farmhash64").numpy().view("<u8").ravel()
    got = [tk.fingerprint64(np.frombuffer(v + b"\0" * 8, np.uint8), 0, len(v)) for v in values]
    assert [int(g) for g in got] == [int(e) for e in expect]


def test_hash_null_empty_sliced_chunked_dictionary():
    arr = pa.array(WORDS, pa.large_string())
    assert tk.hash_string_keys(arr[0:0]).shape == (0,)
    for start, stop in [(1, 5), (4, 13), (12, 13)]:
        assert tk.hash_string_keys(arr[start:stop]).tolist() == ref_hash(WORDS[start:stop])
    chunked = pa.chunked_array([arr[3:6], arr[0:3]])
    assert tk.hash_string_keys(chunked).tolist() == ref_hash(WORDS[3:6] + WORDS[0:3])
    dictionary = pa.array(WORDS + WORDS[::-1]).dictionary_encode()
    assert tk.hash_string_keys(dictionary).tolist() == ref_hash(WORDS + WORDS[::-1])


def test_hash_is_never_minus_one():
    # The kernel reduces mod 2**63 - 1, so only missing values read -1.
    values = [f"token-{i}" for i in range(20000)]
    out = tk.hash_string_keys(pa.array(values))
    assert out.min() >= 0 and out.max() <= MOD - 1
    assert len(np.unique(out)) == len(values)


# --- encode_keys / pad_lists ---------------------------------------------------------------

def test_encode_int_casts_and_fills_nulls():
    assert tk.encode_keys(pa.array([3, None, -7], pa.int32()), "int").tolist() == [3, -1, -7]
    assert tk.encode_keys(pa.array(["12", None]), "int").tolist() == [12, -1]
    assert tk.encode_keys(pa.array([1.0, 2.0]), "int").tolist() == [1, 2]
    chunked = pa.chunked_array([pa.array([1, None]), pa.array([5])])
    assert tk.encode_keys(chunked, "int").tolist() == [1, -1, 5]
    assert tk.encode_keys(pa.chunked_array([], pa.int64()), "int").shape == (0,)


def test_encode_errors_name_the_argument():
    with pytest.raises(ValueError, match="`encoding`: 'base64'"):
        tk.encode_keys(pa.array(["a"]), "base64")
    with pytest.raises(ValueError, match="`int`"):
        tk.encode_keys(pa.array(["x1"]), "int")
    with pytest.raises(ValueError, match="`int`"):
        tk.encode_keys(pa.array([1.5]), "int")


LISTS = [[1, 2, 3], None, [], [4], [5, None, 6, 7, 8], [9, 10]]


@pytest.mark.parametrize("type_", [pa.list_(pa.int64()), pa.large_list(pa.int32())])
@pytest.mark.parametrize("length", [1, 2, 3, 6])
def test_pad_lists_matches_loops(type_, length):
    arr = pa.array(LISTS, type_)
    out = tk.pad_lists(arr, length)
    assert out.dtype == np.int64 and out.shape == (len(LISTS), length)
    assert out.tolist() == ref_pad(LISTS, length)


def test_pad_lists_sliced_chunked_empty():
    arr = pa.array(LISTS, pa.list_(pa.int64()))
    for start, stop in [(1, 3), (2, 6), (4, 5), (3, 3)]:
        assert tk.pad_lists(arr[start:stop], 3).tolist() == ref_pad(LISTS[start:stop], 3)
    chunked = pa.chunked_array([arr[4:], arr[:2]])
    assert tk.pad_lists(chunked, 4).tolist() == ref_pad(LISTS[4:] + LISTS[:2], 4)
    assert tk.pad_lists(pa.array([], pa.list_(pa.int64())), 2).shape == (0, 2)
    assert tk.pad_lists(pa.chunked_array([], pa.list_(pa.int64())), 2).shape == (0, 2)


def test_pad_lists_of_strings_and_hex():
    words = [["Drama", "Comedy"], None, ["War", None, "Drama"], []]
    out = tk.pad_lists(pa.array(words)[1:], 2, encoding="string")
    flat = {w: h for w, h in zip(["Drama", "Comedy", "War"],
                                 ref_hash(["Drama", "Comedy", "War"]))}
    assert out.tolist() == ref_pad(words[1:], 2, lambda v: -1 if v is None else flat[v])
    hexes = pa.array([["ff", "10"], ["a"]], pa.list_(pa.large_string()))
    assert tk.pad_lists(hexes, 3, encoding="hex").tolist() == [[255, 16, -1], [10, -1, -1]]
    fixed = pa.array([[1, 2], [3, 4]], pa.list_(pa.int64(), 2))
    assert tk.pad_lists(fixed, 1).tolist() == [[1], [3]]


def test_pad_lists_reads_flat_arrays_as_single_lists():
    assert tk.pad_lists(pa.array([7, None]), 3).tolist() == [[7, -1, -1], [-1, -1, -1]]


def test_pad_lists_rejects_bad_length():
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="`length`"):
            tk.pad_lists(pa.array([[1]]), bad)


def test_kernels_directly_on_buffers():
    # The raw kernels, fed hand-built Arrow buffers: offsets int32, a validity bitmap with an
    # offset of 3 bits (rows 1 and 3 null).
    data = np.frombuffer(b"ffzzab", np.uint8)
    offsets = np.array([0, 2, 4, 4, 6], np.int32)
    bitmap = np.array([(1 << 3) | (1 << 5) | (1 << 6)], np.uint8)   # rows 0, 2, 3 valid
    out = np.empty(4, np.int64)
    bad = tk.parse_hex_kernel(offsets, data, bitmap, 3, out)
    assert bad == -1 and out.tolist() == [255, -1, -1, 0xAB]
    lists = np.empty((3, 2), np.int64)
    tk.pad_lists_kernel(np.array([0, 3, 3, 4], np.int64), np.array([1, 2, 3, 4], np.int64),
                        np.zeros(0, np.uint8), 0, lists)
    assert lists.tolist() == [[1, 2], [-1, -1], [4, -1]]
