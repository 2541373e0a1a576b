"""The Arrow memory pools sparseflow's file readers decode into (``jobs.readers.read_pool``).

The YAML jobs' Parquet reader must decode into the pool ``read_pool`` names (jemalloc where
pyarrow has it): beside TensorFlow, Arrow's default pool faulted its freed huge pages in again
batch after batch (BENCHMARKS.md, "YAML job's input"). The CSV readers and the feature-stats
readers keep Arrow's default pool, where they measured as fast or faster. Checked
by where a streamed batch's decoded columns live while the reader holds it: in the read pool.
(Arrow still reads the file's raw pages into its default pool; only the decoded columns, the
bulk of what a batch allocates, follow the pool a reader is given.)
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparseflow.jobs import readers
from sparseflow.jobs.schema import ColumnsConfig, SparseColumn
from sparseflow.stats.readers import CsvSource, ParquetSource

ROWS = 50_000
COLUMN_BYTES = ROWS * 8   # one int64 column
# Every proxy pool a test made: a reader's background threads may free buffers into one
# after its test ended, and a freed pool would crash them.
_PROXIES = []


@pytest.fixture(autouse=True)
def fresh_pool_choice():
    read_pool = readers.read_pool   # a test may replace it
    read_pool.cache_clear()
    yield
    read_pool.cache_clear()


def _table():
    rng = np.random.default_rng(0)
    return pa.table({"label": rng.integers(0, 2, ROWS).astype(np.float64),
                     "C1": rng.integers(0, 10**12, ROWS),
                     "C2": rng.integers(0, 10**12, ROWS),
                     "timestamp": np.arange(ROWS, dtype=np.int64)})


def _parquet(tmp_path):
    path = str(tmp_path / "part.parquet")
    pq.write_table(_table(), path)
    return path


def _csv(tmp_path):
    import pyarrow.csv as pcsv

    path = str(tmp_path / "part.csv")
    pcsv.write_csv(_table(), path)
    return path


def _plan():
    return readers.ColumnPlan.from_columns(ColumnsConfig(
        labels=("label",), dense=(), sparse=(SparseColumn("C1"), SparseColumn("C2")),
        timestamp="timestamp"))


def _job_parquet(tmp_path):
    return readers.parquet_blocks([_parquet(tmp_path)], _plan())()


def _job_csv(tmp_path):
    from sparseflow.jobs.schema import CsvOptions

    return readers.csv_blocks("csv", [_csv(tmp_path)], CsvOptions(), _plan())()


def _stats_parquet(tmp_path):
    return ParquetSource(_parquet(tmp_path), ["C1", "C2"], timestamp="timestamp").batches()


def _stats_csv(tmp_path):
    return CsvSource(_csv(tmp_path), ["C1", "C2"], timestamp="timestamp").batches()


def test_read_pool_is_jemalloc_where_pyarrow_has_it(monkeypatch):
    monkeypatch.delenv("ARROW_DEFAULT_MEMORY_POOL", raising=False)
    pool = readers.read_pool()
    expected = "jemalloc" if "jemalloc" in pa.supported_memory_backends() \
        else pa.default_memory_pool().backend_name
    assert pool.backend_name == expected
    assert readers.read_pool() is pool


def test_a_default_pool_the_user_chose_is_kept(monkeypatch):
    monkeypatch.setenv("ARROW_DEFAULT_MEMORY_POOL", "system")
    monkeypatch.setattr(pa, "jemalloc_memory_pool",
                        lambda: pytest.fail("jemalloc chosen over the user's default pool"))
    assert readers.read_pool().backend_name == pa.default_memory_pool().backend_name


@pytest.mark.parametrize("stream, into_read_pool", [
    (_job_parquet, True), (_job_csv, False), (_stats_parquet, False), (_stats_csv, False)],
    ids=["job-parquet", "job-csv", "stats-parquet", "stats-csv"])
def test_readers_decode_into_their_pool(tmp_path, monkeypatch, stream, into_read_pool):
    # A proxy of the read pool counts only what goes through it: Arrow's pools are shared by
    # the whole process, whose other readers' background threads may free into them meanwhile.
    proxy = pa.proxy_memory_pool(readers.read_pool())
    _PROXIES.append(proxy)
    monkeypatch.setattr(readers, "read_pool", lambda: proxy)
    batches = stream(tmp_path)
    try:
        # The suspended reader holds this batch's Arrow buffers; the block is not kept, so a
        # failing assertion's traceback cannot hold them past the proxies.
        assert next(batches) is not None
        if into_read_pool:
            # Four decoded columns of ROWS values (label, C1, C2, timestamp).
            assert proxy.bytes_allocated() >= 3 * COLUMN_BYTES
        else:
            assert proxy.max_memory() == 0
    finally:
        batches.close()
