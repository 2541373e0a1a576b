"""Memory made resident ahead of its first write (``embed/page_commit.py``), by host rows
(``HostRows.commit_ahead``) and by a router's input pipeline for its shards' next rows.

Residency is read back from the kernel (``mincore``), independently of the code under test.
"""

import ctypes
import gc
import mmap
import sys
import weakref

import numpy as np
import pytest

from sparseflow.embed import page_commit
from sparseflow.embed.host_rows import HostRows
from sparseflow.embed.initializers import InitSpec
from sparseflow.distributed.routing import KeyRouter

from tests.test_routing import make_table

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="MADV_POPULATE_WRITE and mincore are Linux's")
PAGE = mmap.PAGESIZE


def resident_pages(array: np.ndarray, start: int, stop: int) -> tuple[int, int]:
    """(resident, total) whole pages of ``array``'s bytes ``[start, stop)``, from mincore."""
    libc = ctypes.CDLL(None, use_errno=True)
    base = array.ctypes.data
    first = -(-(base + start) // PAGE) * PAGE
    last = (base + stop) // PAGE * PAGE
    n = max(0, (last - first) // PAGE)
    vec = (ctypes.c_ubyte * max(n, 1))()
    assert libc.mincore(ctypes.c_void_p(first), ctypes.c_size_t(last - first), vec) == 0
    return sum(v & 1 for v in vec[:n]), n


def fresh(nbytes: int) -> np.ndarray:
    """A never-touched anonymous mapping as a float32 array (no page resident)."""
    buffer = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return np.frombuffer(buffer, np.float32)


@linux_only
def test_populate_write_makes_the_range_resident_and_leaves_its_bytes_unchanged():
    array = fresh(64 * PAGE)
    array[3 * PAGE // 4 + 5] = 7.0    # page 3 written: its value must survive
    assert resident_pages(array, 8 * PAGE, 40 * PAGE)[0] == 0
    assert page_commit.populate_write(array, 2 * PAGE, 40 * PAGE)
    assert resident_pages(array, 2 * PAGE, 40 * PAGE) == (38, 38)
    assert array[3 * PAGE // 4 + 5] == 7.0
    assert np.count_nonzero(array) == 1


@linux_only
def test_populate_write_takes_every_page_the_range_touches_inside_the_buffer():
    array = fresh(8 * PAGE)
    assert page_commit.populate_write(array, 100, PAGE + 50)       # touches pages 0 and 1
    assert resident_pages(array, 0, 2 * PAGE) == (2, 2)
    assert resident_pages(array, 2 * PAGE, 8 * PAGE) == (0, 6)
    # A view that starts inside page 0: that page is not wholly its buffer's.
    view = fresh(8 * PAGE)[25:]                                      # 100 bytes in
    assert not page_commit.populate_write(view, 0, 10)
    assert page_commit.populate_write(view, 0, PAGE)                 # page 1 of the mapping
    assert resident_pages(view, PAGE - 100, 2 * PAGE - 100) == (1, 1)
    assert not page_commit.populate_write(view, 5, 5)                # empty range


def test_populate_write_names_a_bad_range_or_array():
    array = np.zeros(1024, np.float32)
    with pytest.raises(ValueError, match=r"byte range \[0, 4097\) is outside the array's "
                                         r"4096 bytes"):
        page_commit.populate_write(array, 0, 4097)
    with pytest.raises(ValueError, match=r"byte range \[-1, 8\)"):
        page_commit.populate_write(array, -1, 8)
    read_only = array.copy()
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="C-contiguous, writeable array.*writeable=False"):
        page_commit.populate_write(read_only, 0, 8)


@linux_only
def test_a_kernel_without_the_advice_is_asked_once_then_never_again(monkeypatch):
    calls = []

    def einval(address, length, advice):
        calls.append(advice)
        ctypes.set_errno(22)
        return -1

    monkeypatch.setitem(page_commit._state, "madvise", einval)   # noqa: SLF001
    array = np.zeros(16 * PAGE // 4, np.float32)
    assert not page_commit.populate_write(array, 0, array.nbytes)
    assert not page_commit.populate_write(array, 0, array.nbytes)
    assert calls == [page_commit.MADV_POPULATE_WRITE]


def host_rows(capacity: int, dim: int = 16) -> HostRows:
    rows = HostRows("t", capacity, dim, InitSpec("truncated_normal", 0.0, 0.05, 1))
    rows.allocate()
    return rows


@linux_only
def test_host_rows_keep_the_rows_after_the_next_one_resident_without_changing_any():
    rows = host_rows(200_000)                      # 64 B per row: 64 rows per page
    storage, row_bytes = rows.storage, rows.storage.strides[0]
    keys = np.arange(1000, dtype=np.int64)
    rows.initialize(np.arange(1000, dtype=np.int32), keys)
    before = storage[:1000].copy()
    rows.commit_ahead(1000, 20_000)                # rows [1000, 41000) resident
    resident, pages = resident_pages(storage, 1000 * row_bytes, 41_000 * row_bytes)
    assert resident == pages >= 40_000 * row_bytes // PAGE - 1
    np.testing.assert_array_equal(storage[:1000], before)
    assert not storage[1000:].any()


def test_host_rows_commit_ahead_only_when_the_next_rows_come_near_the_resident_end(
        monkeypatch):
    calls = []

    def record(array, start, stop):
        calls.append((start, stop))
        return True

    monkeypatch.setattr(page_commit, "populate_write", record)
    rows = host_rows(10_000)
    row = rows.storage.strides[0]
    rows.commit_ahead(0, 1000)               # [0, 2000)
    rows.commit_ahead(900, 1000)             # 1900 <= 2000: enough ahead, nothing
    rows.commit_ahead(1500, 1000)            # [2000, 3500)
    rows.commit_ahead(9000, 1000)            # the end of the storage: [9000, 10000)
    rows.commit_ahead(9500, 1000)            # everything is resident
    assert calls == [(0, 2000 * row), (2000 * row, 3500 * row), (9000 * row, 10_000 * row)]
    unallocated = HostRows("u", 100, 4, InitSpec("constant", 0.0, 0.0, 1))
    unallocated.commit_ahead(0, 10)          # no storage yet: nothing to commit
    assert len(calls) == 3 and unallocated.storage is None


def test_a_closed_or_grown_tables_old_storage_is_freed_after_committing_ahead():
    rows = host_rows(10_000)
    rows.commit_ahead(0, 100)
    gone = weakref.ref(rows.storage)
    rows.close()
    gc.collect()
    assert gone() is None
    expanding = HostRows("e", 1000, 4, InitSpec("constant", 0.0, 0.0, 1),
                         expansion_block_rows=1000)
    expanding.allocate()
    expanding.commit_ahead(0, 100)
    old = weakref.ref(expanding.storage)
    expanding.ensure_rows(5000)                   # grows into a new array
    gc.collect()
    assert old() is None and expanding.storage.shape[0] >= 5000


def test_a_routers_input_pipeline_commits_each_shards_rows_ahead_of_its_next_row(monkeypatch):
    """route() (the input pipeline) asks each host shard to keep twice the largest recent
    growth of its next row resident past it; before any growth nothing, and the peak decays
    by 1/8 per batch once the shard stops growing."""
    calls = []
    monkeypatch.setattr(HostRows, "commit_ahead",
                        lambda self, next_row, ahead: calls.append((self.name, next_row, ahead)))
    table = make_table("t", 2, -1)
    router = KeyRouter([table], [0], [1], world_size=1)
    router.route([np.array([1, 2, 3], np.int64)])
    assert calls == []                             # no step has taken rows yet
    received = np.array([[[4, 1], [5, 1], [6, 1]]], np.int64)
    router.process(received, np.array([[3]], np.int32), None, True)
    router.route([np.array([1, 2, 3], np.int64)])
    assert calls == [("t", 3, 6)]                  # grew by 3 rows: 6 ahead
    for _ in range(4):                             # no growth: 3 -> 2 -> 1 -> 0
        router.route([np.array([1, 2, 3], np.int64)])
    assert calls == [("t", 3, 6), ("t", 3, 4), ("t", 3, 2)]
