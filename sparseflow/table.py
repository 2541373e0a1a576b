"""``create_table`` and the table object users hold.

A :class:`SparseTable` joins the two halves of a table: the key processor (pipeline side,
key → row) and the host rows (embed side, row → values). It is also what
``get_dense_and_sparse_variable()`` returns as a "sparse variable": ``tf.gradients(loss, table)``
yields an ``IndexedSlices`` over the table's rows, which the sparse optimizers consume.

Where the rows live is chosen per table (``create_table(..., rows_on=...)``): ``"host"``
rows are one numpy array read and updated by numba kernels (``embed/host_rows.py``);
``"device"`` rows are ``tf.Variable``s — on the GPU when TensorFlow sees one — gathered and
updated by TF ops (``embed/device_rows.py``). The default (:func:`default_rows_on`) is
``"device"`` when TensorFlow sees a GPU, else ``"host"``.

Under ``init(use_dynamic_expansion=True)`` a table has no row limit: its host rows start at one
block and grow as keys arrive (``capacity()`` reports the rows allocated so far), and it is
trained through the by-address optimizers (see ``sparseflow/optimizers/by_address.py``).
"""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np
import tensorflow as tf

from sparseflow import runtime as _runtime
from sparseflow.embed.device_rows import DeviceTableRows
from sparseflow.embed.disk_rows import DiskRows
from sparseflow.embed.host_rows import HostRows
from sparseflow.embed.initializers import init_spec_from_tf
from sparseflow.embed.row_tiers import RowTiers
from sparseflow.embed.table_config import TableConfig, make_table_config
from sparseflow.ops import key_kernels as kk
from sparseflow.ops.count_min import CountMinSketch
from sparseflow.pipeline.key_processor import KeyProcessor
from sparseflow.validation import INT32_MAX, check_int, fail


HASHTABLE_COLLECTION = "ASCEND_GLOBAL_HASHTABLE_COLLECTION"


def _keep_tables_out_of_meta_graphs() -> None:
    """A meta graph (written with every checkpoint) serializes each collection; the tables
    are Python objects, saved in the checkpoint's sparse part, so this collection exports as
    empty instead of a warning "Issue encountered when serializing" at every save (TF's
    private registry of collection serializers, wrapped here alone)."""
    from tensorflow.python.framework import ops
    from tensorflow.core.framework import attr_value_pb2

    ops.register_proto_function(HASHTABLE_COLLECTION, proto_type=attr_value_pb2.AttrValue,
                                to_proto=lambda table, export_scope=None: None,
                                from_proto=None)


_keep_tables_out_of_meta_graphs()
DEFAULT_EXPANSION_BLOCK_ROWS = 1024
ROWS_ON = ("host", "device")


def default_rows_on() -> str:
    """Where a table created without ``rows_on`` keeps its rows (the placement rule).

    ``"device"`` when TensorFlow sees a GPU (the rows then live in GPU memory and never cross
    to the host), else ``"host"``: without an accelerator the host rows' fused numba kernels
    beat TF ops on CPU variables (docs/design-notes.md, "Device rows").
    """
    return "device" if tf.config.list_physical_devices("GPU") else "host"


class SparseTable:
    """One embedding table.

    Use :func:`create_table` to make one. Attributes: ``table_name``, ``dim``, ``key_dtype``
    (a ``tf.DType``), ``config`` (the validated :class:`TableConfig`), ``expands`` (dynamic
    expansion: rows grow by blocks of ``expansion_block_rows``, never full), ``rows_on``
    ("host": a numpy array updated by numba kernels; "device": TF variables, on the GPU when
    one is visible), ``rows`` (the ``HostRows`` or ``DeviceTableRows``).
    """

    def __init__(self, table_config: TableConfig, seed: int,
                 expansion_block_rows: int | None = None, rows_on: str = "host"):
        self.config = table_config
        self.table_name = table_config.name
        self.dim = table_config.dim
        self.key_dtype = tf.as_dtype(table_config.key_dtype)
        spec = init_spec_from_tf(table_config.emb_initializer,
                                 (table_config.capacity, table_config.dim), seed,
                                 table_config.init_param)
        self.expands = expansion_block_rows is not None
        self.rows_on = rows_on
        self.tiers: RowTiers | None = None
        sketch = None
        if table_config.admission_counter == "sketch":
            sketch = CountMinSketch(table_config.sketch_width, table_config.sketch_depth,
                                    seed=seed % (2**63))
        if self.expands:
            # Rec SDK: the table starts at one row and grows with no overflow. The rows start
            # at one block; the key processor's limit is the int32 row space.
            self.rows = HostRows(self.table_name, 1, self.dim, spec,
                                 expansion_block_rows=expansion_block_rows)
            self.processor = KeyProcessor(self.table_name, INT32_MAX, None, self.rows.initialize,
                                          capacity_hint=min(self.rows.capacity, 1 << 20),
                                          sketch=sketch, tracked_rows=self.rows.capacity)
        else:
            self.rows, self.tiers = self._make_rows(table_config, spec, rows_on)
            tiers = self.tiers
            self.processor = KeyProcessor(self.table_name, table_config.capacity, None,
                                          tiers.initialize if tiers else self.rows.initialize,
                                          capacity_hint=min(table_config.capacity, 1 << 20),
                                          sketch=sketch,
                                          prefetch_rows=tiers.prefetch if tiers else None)
        self.access_threshold = -1   # -1: off (set from the training feature specs)
        self.eviction_threshold = -1
        self._thresholds: tuple[int, int] | None = None
        self.send_counts: dict[str, int] = {}   # FeatureSpec unique name -> send_count
        self._anchors: dict = {}

    def _make_rows(self, config: TableConfig, spec, rows_on: str):
        """The rows (``HostRows`` or ``DeviceTableRows``) and, for a tiered table, the
        :class:`RowTiers` over them: device rows with a host tier cache
        ``device_vocabulary_size`` rows over host homes (LRU); host rows with a disk tier
        hold ``device_vocabulary_size + host_vocabulary_size`` rows in memory over disk
        homes (LFU)."""
        if rows_on == "device":
            tiered = config.host_vocabulary_size > 0
            slots = config.device_vocabulary_size if tiered else config.capacity
            rows = DeviceTableRows(self.table_name, slots, self.dim, spec)
            hint = (f"device_vocabulary_size={config.device_vocabulary_size}, "
                    f"host_vocabulary_size={config.host_vocabulary_size}")
        else:
            tiered = config.ssd_vocabulary_size > 0
            slots = (config.device_vocabulary_size + config.host_vocabulary_size if tiered
                     else config.capacity)
            rows = HostRows(self.table_name, slots, self.dim, spec)
            hint = (f"device_vocabulary_size + host_vocabulary_size = {slots}, "
                    f"ssd_vocabulary_size={config.ssd_vocabulary_size}")
        if not tiered:
            return rows, None
        tiers = RowTiers(self.table_name, slots, config.capacity, self.dim, spec,
                         policy="lru" if rows_on == "device" else "lfu", size_hint=hint,
                         make_homes=self._make_homes)
        return rows, tiers

    def _make_homes(self):
        """A tiered table's homes, once the row layout is fixed: host rows for device slots,
        a memory-mapped file for host slots. Returns (homes, slot initial values)."""
        config = self.config
        if self.rows_on == "device":
            homes = HostRows(self.table_name, config.capacity, self.dim, self.rows.init_spec)
            if self.rows.optimizer is not None:
                homes.bind_optimizer(self.rows.optimizer)
            homes.allocate()
        else:
            homes = DiskRows(self.table_name, config.capacity, self.rows.width,
                             config.ssd_data_path)
        return homes, self.rows.slot_values

    # -- Rec SDK table API -----------------------------------------------------------------

    def size(self) -> int:
        """Keys that currently own a row."""
        # Under the key processor's lock: a batch counts its new keys, then (under dynamic
        # expansion) grows the rows for them, both while holding it.
        with self.processor.lock:
            return self.processor.size

    def capacity(self) -> int:
        """Rows the table can hold (device + host vocabulary size); under dynamic expansion,
        the rows allocated so far (Rec SDK's "allocated rows"), which grow as keys arrive:
        never fewer than :meth:`size` read before."""
        if not self.expands:
            return self.processor.row_limit
        with self.processor.lock:
            return self.rows.capacity

    def stats(self) -> dict:
        """Table statistics, at any time.

        Returns:
          dict with ``keys_held`` (keys that own a row), ``rows_free`` (rows a new key can
          take), ``rows_waiting`` (evicted rows held for batches in flight),
          ``keys_counted_not_admitted`` (None when a sketch counts them), ``evictions``
          (eviction runs), ``keys_evicted``
          (in total), ``capacity`` and ``clock`` (largest training timestamp, None before any).
          Under dynamic expansion ``capacity`` is the rows allocated so far and ``rows_free``
          counts the rows a new key can take without growing them. A tiered table (device
          rows with a host tier, or host rows with a disk tier) adds ``resident_rows`` (rows
          in the fast tier), ``hit_rate`` (share of looked-up rows found there),
          ``rows_swapped_in`` and ``rows_swapped_out``.
        """
        p = self.processor
        with p.lock:
            rows_free = p.rows_free
            if self.expands:  # allocated rows not handed out yet, plus the free list
                rows_free = self.rows.capacity - p.rows_ever_used + int(
                    p.state[kk.STATE_FREE_TOP])
            stats = {"keys_held": p.size, "rows_free": rows_free,
                     "rows_waiting": p.rows_waiting,
                     "keys_counted_not_admitted": p.keys_counted, "evictions": p.evictions,
                     "keys_evicted": p.keys_evicted,
                     "capacity": self.rows.capacity if self.expands else p.row_limit,
                     "clock": None if p.clock == np.int64(-(2**63)) else int(p.clock)}
        if self.tiers is not None:
            stats.update(self.tiers.stats())
        return stats

    def reserve_memory(self) -> None:
        """Commits the table's row memory now rather than page by page as rows are first used.

        By default host rows cost memory only once used, and the first row written into each
        memory page pays a page fault while the batch waits. Call this after
        ``start_asc_pipeline()`` to pay that once, up front: it makes resident
        ``capacity x dim x (1 + optimizer slots) x 4`` bytes (under dynamic expansion, the
        rows allocated so far; those added by later growth are committed as they are used).

        A device table (``rows_on="device"``) has no host rows: its variables are allocated
        whole when they are initialised, and this does nothing, unless it has a host tier:
        then the host homes of its rows are committed. A host table with a disk tier commits
        its host slots.

        Raises:
          RuntimeError: called before ``start_asc_pipeline()`` (the optimizer slots, hence the
            row width, are not fixed yet).
        """
        if not _runtime.current("reserve_memory").pipeline_started:
            raise RuntimeError(f"Table `{self.table_name}`: call reserve_memory() after "
                               f"start_asc_pipeline(), once the row layout is fixed.")
        if self.rows_on == "device" and self.tiers is None:
            return
        with self.processor.lock:  # no row may be handed out while we write the unused ones
            if self.rows_on == "device":  # the host homes, as host rows
                with self.tiers.cache.lock:
                    self.tiers.homes.commit_memory(self.processor.rows_ever_used)
            elif self.tiers is not None:  # host slots: the free ones (the rest hold rows)
                with self.tiers.cache.lock:
                    storage = self.rows.allocate()
                    storage[self.tiers.cache.row_in < 0] = 0.0
            else:
                self.rows.commit_memory(self.processor.rows_ever_used)

    def export(self, sess=None) -> tuple[np.ndarray, np.ndarray]:
        """Every admitted key and its embedding.

        Args:
          sess: device tables (``rows_on="device"``) only: the session whose variables to
            read. Default: the default session (inside ``with tf.compat.v1.Session() as
            sess:``), else the one a ``sparseflow.Saver`` last saved or restored with.

        Returns:
          (keys, embeddings): keys in the table's key dtype ``[n]``, float32 ``[n, dim]``,
          sorted by key.

        Raises:
          RuntimeError: a device table and no open session to read it through.
        """
        with self.processor.lock:  # no row is assigned or moved meanwhile
            keys, rows, _ = self.processor.index.entries(admitted_only=True)
            order = np.argsort(keys, kind="stable")
            keys, rows = keys[order], rows[order]
            values = self.read_rows(rows, sess, weights_only=True)
        return keys.astype(self.key_dtype.as_numpy_dtype), values

    # -- wiring ----------------------------------------------------------------------------

    def set_admission(self, spec, source: str) -> None:
        """Takes the table's thresholds from a training feature spec that uses it.

        The first training spec seen sets them; every later one must agree (None and -1 both
        mean "off").

        Raises:
          ValueError: training specs of this table disagree on a threshold.
        """
        if self._thresholds is None:
            self._thresholds = spec.thresholds
            self.access_threshold, self.eviction_threshold = spec.thresholds
            self.processor.threshold = self.access_threshold
            # A training table tracks its batches in flight: evicted rows wait for them, a
            # tiered table's slots stay pinned, and checkpoints leave out what they counted.
            self.processor.track_in_flight = True
        elif self._thresholds != spec.thresholds:
            raise ValueError(
                f"Table `{self.table_name}`: {source} sets access_threshold="
                f"{spec.thresholds[0]}, eviction_threshold={spec.thresholds[1]}, but the table "
                f"already has access_threshold={self._thresholds[0]}, eviction_threshold="
                f"{self._thresholds[1]}: the access and evict threshold param must be same "
                f"in one table when multi lookup.")

    def bind_optimizer(self, optimizer) -> None:
        """Makes ``optimizer`` the sparse optimizer that updates this table: every row gets
        its slots (``create_table(optimizer_list=...)``, or its ``apply_gradients``).

        ``start_asc_pipeline()`` lays the rows out; until a key is given a row (the first
        training batch drawn, or a restore), binding lays them out again with the slots, so
        that the optimizer may be built after the pipeline starts (Rec SDK's order). A
        device table over a host tier must bind before ``start_asc_pipeline()`` (its swaps
        are built for one layout).

        Raises:
          ValueError: another optimizer is bound, or the table already holds rows without
            this optimizer's slots.
        """
        rows = self.rows
        if rows.optimizer is optimizer:
            return
        tiered_device = self.rows_on == "device" and self.tiers is not None
        if (tiered_device and rows.optimizer is None and rows.device_rows is not None
                and rows.device_rows.io_built):
            raise ValueError(
                f"Table `{self.table_name}` keeps device rows over a host tier, whose swaps "
                f"start_asc_pipeline() built without optimizer slots: pass the optimizer to "
                f"create_table(optimizer_list=[...]) or build its apply_gradients before "
                f"start_asc_pipeline().")
        with self.processor.lock:   # no key is given a row while the layout changes
            holds_no_row = (rows.optimizer is None and self.processor.rows_ever_used == 0
                            and not tiered_device)
            rows.bind_optimizer(optimizer, holds_no_row=holds_no_row)
            if holds_no_row and self.tiers is not None:
                self.tiers.close()   # the homes are made again, as wide as the new rows

    @property
    def gathers_in_kernel(self) -> bool:
        """Whether a batch's compiled gather reads this table (host rows of a fixed
        capacity, no tiers); others are read by numpy functions under :meth:`HostRows.pinned`
        (growth moves the rows) or by TF ops (device rows)."""
        return self.rows_on == "host" and self.tiers is None and not self.expands

    def registry_token(self) -> int:
        """The token compiled ops name this table by (``ops/table_registry.py``); what they
        queue (batches released, updates run) is applied by this table's key processor.

        Raises:
          ValueError: the table is not read by compiled gathers (:attr:`gathers_in_kernel`).
        """
        if not self.gathers_in_kernel:
            raise ValueError(f"Table `{self.table_name}` is not read by compiled gathers "
                             f"(device rows, tiers or dynamic expansion).")
        # Allocated now (untouched pages cost nothing): an op must find rows to read even
        # before any key was admitted, as a numpy function's allocate() gave it.
        self.rows.allocate()
        entry = self.rows.registry_entry()
        self.processor.take_kernel_events(entry, lambda: self.rows.optimizer is None)
        return entry.token

    def gradient_anchor(self) -> tf.Tensor:
        """The tensor that stands for this table in the current graph for ``tf.gradients``."""
        graph = tf.compat.v1.get_default_graph()
        anchor = self._anchors.get(graph)
        if anchor is None:
            with tf.control_dependencies(None):
                anchor = tf.zeros([0], tf.float32, name=f"{self.table_name}_anchor")
            self._anchors[graph] = anchor
        return anchor

    def close(self) -> None:
        """Releases rows (a disk tier's file included) and forgets graph state."""
        self.rows.close()
        if self.tiers is not None:
            self.tiers.close()
        self._anchors.clear()

    # -- the training step's bookkeeping -----------------------------------------------------

    def prepare(self) -> None:
        """``start_asc_pipeline``: fixes the row layout. Host rows are allocated; device rows
        get their variables and the ops checkpoints read and write them with (before the
        graph is finalized); a tiered table's homes are made."""
        if self.rows_on == "device":
            self.rows.prepare()
        else:
            self.rows.allocate()
        if self.tiers is not None:
            self.tiers.homes  # noqa: B018 -- made now, with the layout just fixed

    def release_batch(self, seq: int, drain: bool) -> None:
        """A lookup gathered batch ``seq``'s rows.

        Args:
          seq: the batch's sequence number.
          drain: free evicted rows now (no optimizer will update this batch's rows);
            otherwise :meth:`after_update` does.
        """
        self.processor.release(int(seq), drain=drain)
        if self.tiers is not None:
            self.tiers.release(int(seq))

    def after_update(self, rows: np.ndarray) -> None:
        """The sparse optimizer updated ``rows`` (a batch's rows as the batch carries them:
        fast-tier slots for a tiered table): marks them changed for incremental checkpoints,
        frees evicted rows no batch in flight still needs, and unpins the updated batches'
        fast slots."""
        if self.tiers is None:
            self.processor.updated(rows)
            return
        rows = self.tiers.logical(rows[rows >= 0])  # still pinned until settle() below
        self.processor.updated(rows)
        self.tiers.settle()

    def read_rows(self, rows: np.ndarray, sess=None, weights_only: bool = False) -> np.ndarray:
        """``[weights | slots]`` (or the weights) of logical ``rows``, float32, in the host
        layout, wherever they are (device variables, host memory, a fast tier or its homes).
        The caller holds the key processor's lock.

        Args:
          rows: int32 rows the key processor assigned.
          sess: device tables: the session (see ``DeviceTableRows.session``).
          weights_only: only the ``dim`` weights.
        """
        if self.rows_on == "device":
            session = self.rows.session(sess)
            if self.tiers is None:
                return self.rows.read(session, rows, weights_only)
            device_rows = self.rows.prepared()
            return self.tiers.read(rows, lambda s: device_rows.read(session, s),
                                   lambda s, v: device_rows.write(session, s, v), weights_only)
        if self.tiers is not None:
            storage = self.rows.allocate()
            return self.tiers.read(rows, *self.tiers.host_slots(storage), weights_only)
        if weights_only:   # the weights alone (numba), not every slot copied then sliced
            return self.rows.gather(rows)
        return self.rows.read(rows)

    def __repr__(self) -> str:
        return (f"SparseTable(name={self.table_name!r}, dim={self.dim}, "
                f"capacity={self.capacity()}, size={self.size()}, rows_on={self.rows_on!r})")


def host_table(name: str, dim: int, initializer, vocabulary_size: int, *,
               access_threshold: int, eviction_threshold: int | None, optimizer,
               size_hint: str, admission_counter: str = "exact") -> SparseTable:
    """A table with host rows outside ``init()``'s registry (the TF2 API, a shard of
    multi-worker training), admission and eviction set as its feature specs would set them.

    Args:
      name, dim, initializer, vocabulary_size, admission_counter: as for
        :func:`create_table` (``vocabulary_size`` rows).
      access_threshold: admission threshold (-1: off).
      eviction_threshold: None or < 0 for no eviction.
      optimizer: the kernel ``SparseOptimizer`` that updates the rows, or None.
      size_hint: the setting a full-table error tells users to raise.

    Returns:
      The :class:`SparseTable`.

    Raises:
      TypeError, ValueError: an invalid argument (see :func:`create_table`).
    """
    config = make_table_config(tf.int64, dim, name, initializer,
                               device_vocabulary_size=vocabulary_size,
                               admission_counter=admission_counter)
    table = SparseTable(config, _default_seed(name), rows_on="host")
    table.processor.size_hint = size_hint
    table.access_threshold = table.processor.threshold = access_threshold
    table.processor.track_in_flight = True   # see SparseTable.set_admission
    if eviction_threshold is not None and eviction_threshold >= 0:
        table.eviction_threshold = eviction_threshold
    if optimizer is not None:
        table.rows.bind_optimizer(optimizer)
    return table


def _table_as_tensor(value, dtype=None, name=None, as_ref=False):
    return value.gradient_anchor()


tf.register_tensor_conversion_function(SparseTable, _table_as_tensor)


def _default_seed(name: str) -> int:
    """A seed fixed by the table name and the graph-level seed, so runs repeat exactly."""
    graph_seed = tf.compat.v1.get_default_graph().seed
    if graph_seed is None:
        graph_seed = 0
    return (zlib.crc32(name.encode()) * 1_000_003 + int(graph_seed)) % (2**63)


def _optimizer_list(optimizer_list) -> list:
    """``create_table``'s ``optimizer_list`` (None, a sparse optimizer or a list of them, as
    Rec SDK takes it) as a list of distinct optimizers, at most one."""
    from sparseflow.optimizers.base import SparseOptimizer

    if optimizer_list is None:
        return []
    items = list(optimizer_list) if isinstance(optimizer_list, (list, tuple)) else \
        [optimizer_list]
    for item in items:
        if not isinstance(item, SparseOptimizer):
            fail("optimizer_list", "None, a sparse optimizer (create_hash_optimizer...) or a "
                 "list of sparse optimizers", [type(i).__name__ for i in items], TypeError)
    distinct = list({id(item): item for item in items}.values())
    if len(distinct) > 1:
        fail("optimizer_list", "a list of at most one sparse optimizer: sparseflow keeps one "
             "sparse optimizer per table (its slots live in the table's rows)",
             [item.name for item in distinct])
    return distinct


def create_table(key_dtype, dim, name, emb_initializer, device_vocabulary_size=1,
                 host_vocabulary_size=0, ssd_vocabulary_size=0, ssd_data_path=None,
                 is_save=True, init_param=1.0, value_dtype=None, optimizer_list=None,
                 **kwargs) -> SparseTable:
    """Creates a sparse table (Rec SDK ``create_table``).

    Args:
      key_dtype: ``tf.int64`` or ``tf.int32``.
      dim: embedding width, an int or 1-D ``tf.TensorShape`` in [1, 8192].
      name: 1–100 characters of ``[A-Za-z0-9_.]``, unique.
      emb_initializer: a TF initializer (v1, v2 or Keras): constant, zeros, ones,
        random_normal, truncated_normal, random_uniform, glorot/variance scaling. New rows draw
        from the same distribution with the same parameters, deterministically per key.
      device_vocabulary_size, host_vocabulary_size: rows; the capacity is their sum (plus
        ``ssd_vocabulary_size``). Device rows with ``host_vocabulary_size > 0`` keep
        ``device_vocabulary_size`` rows in TF variables as a cache (least recently used rows
        leave first) over a home for every row in host memory; host rows keep all of them in
        host memory.
      ssd_vocabulary_size, ssd_data_path: the disk tier, behind host rows only:
        ``device_vocabulary_size + host_vocabulary_size`` rows stay in host memory as a cache
        (least frequently used rows leave first) over a home for every row in a
        memory-mapped file in the first directory of ``ssd_data_path`` (default: the
        working directory) with room for it; the file is scratch space, deleted by
        ``terminate_config_initializer()`` (checkpoints persist the rows). See
        docs/design-notes.md, "Tiers".
      is_save: whether checkpoints include the table.
      init_param: multiplies the initializer's values, in [-10, 10].
      value_dtype: float32 only.
      optimizer_list: None, a sparse optimizer, or a list holding one (Rec SDK's argument):
        the optimizer that updates the table, bound now (its slots are part of every row),
        as ``apply_gradients`` would bind it.
      **kwargs: Rec SDK's distribution options, accepted for compatibility; and sparseflow's
        ``admission_counter``: "exact" (default: not-yet-admitted keys are counted exactly in
        the key index, whose memory grows with them) or "sketch" (they are counted in a
        fixed-memory count-min sketch of ``sketch_width`` x ``sketch_depth`` uint32 counters,
        default 2^20 x 4 = 16 MiB, cleared at every eviction; estimates may over-count, never
        under-count, so a key may be admitted a little early — see
        ``sparseflow/ops/count_min.py`` for the bound); and, under
        ``init(use_dynamic_expansion=True)`` only, ``expansion_block_rows``: an int in
        [1, 2^31-1] (default 1024), the rows the table starts with and grows by (in whole
        blocks, at least doubling); and ``rows_on``: where the rows live, "host" (a numpy
        array in host memory, read and updated by numba kernels), "device" (TF variables on
        the GPU when TensorFlow sees one, else on the CPU, gathered and updated by TF ops) or
        None (default) for the placement rule: "device" when TensorFlow sees a GPU, else
        "host" (faster without an accelerator; see :func:`default_rows_on`). Device rows do
        not support dynamic expansion yet (the default is then host rows).

    Under ``init(use_dynamic_expansion=True)`` (Rec SDK's dynamic expansion) the table has no
    row limit: ``host_vocabulary_size`` and ``ssd_vocabulary_size`` are validated, then reset
    to 0 as in Rec SDK; ``device_vocabulary_size`` only sets the shape ``[size, dim]`` that
    fan-based initializers (glorot, variance scaling) compute their scale from. Train it with
    a by-address optimizer (``sparseflow.optimizers.lazy_adam_by_addr`` ...).

    Returns:
      The :class:`SparseTable`.

    Raises:
      NotInitializedError: ``init`` was not called.
      RuntimeError: the pipeline has already started.
      TypeError, ValueError: an argument is invalid, or the name is taken; ``rows_on="device"``
        under ``init(use_dynamic_expansion=True)`` or with ``ssd_vocabulary_size > 0``;
        ``optimizer_list`` holds something else than sparse optimizers, or several.
    """
    rt = _runtime.current("create_table")
    optimizers = _optimizer_list(optimizer_list)
    block_rows = kwargs.pop("expansion_block_rows", None)
    rows_on = kwargs.pop("rows_on", None)
    if rows_on is not None and (not isinstance(rows_on, str) or rows_on not in ROWS_ON):
        fail("rows_on", "one of 'host', 'device' or None (the placement rule: 'device' when "
             "TensorFlow sees a GPU, else 'host')", rows_on)
    if rt.config.use_dynamic_expansion:
        block_rows = check_int("expansion_block_rows",
                               DEFAULT_EXPANSION_BLOCK_ROWS if block_rows is None else block_rows,
                               1, INT32_MAX)
    elif block_rows is not None:
        raise ValueError("Argument `expansion_block_rows` must be None without "
                         "init(use_dynamic_expansion=True): a fixed table allocates "
                         f"device_vocabulary_size + host_vocabulary_size rows. Received: "
                         f"{block_rows!r}")
    table_config = make_table_config(key_dtype, dim, name, emb_initializer,
                                     device_vocabulary_size=device_vocabulary_size,
                                     host_vocabulary_size=host_vocabulary_size,
                                     ssd_vocabulary_size=ssd_vocabulary_size,
                                     ssd_data_path=ssd_data_path, is_save=is_save,
                                     init_param=init_param, value_dtype=value_dtype, **kwargs)
    if rt.config.use_dynamic_expansion:  # Rec SDK resets the host and SSD tiers
        table_config = dataclasses.replace(table_config, host_vocabulary_size=0,
                                           ssd_vocabulary_size=0)
        if rows_on == "device":
            raise ValueError(
                f"Argument `rows_on` must be 'host' or None under "
                f"init(use_dynamic_expansion=True): device rows do not grow yet (table "
                f"`{table_config.name}`). Received: 'device'")
        rows_on = "host"   # expanding tables grow their host rows
    if table_config.ssd_vocabulary_size > 0:  # the disk tier sits behind host rows
        if rows_on == "device":
            raise ValueError(
                f"Argument `rows_on` must be 'host' or None with ssd_vocabulary_size > 0: the "
                f"disk tier sits behind host rows (table `{table_config.name}`, "
                f"ssd_vocabulary_size={table_config.ssd_vocabulary_size}). Received: 'device'")
        rows_on = "host"
    if rt.world is not None and rows_on is None:
        # Over ranks a table that does not ask for device rows keeps its shard in host memory
        # (the owner's numba kernels; a "device cache over a host tier" then holds all its
        # rows there); device rows, read by TF ops at the owner, are asked for by name.
        rows_on = "host"
    if rows_on is None:
        rows_on = default_rows_on()
    with rt.lock:
        if rt.pipeline_started:
            raise RuntimeError(
                f"Cannot create table `{table_config.name}`: the pipeline has already started. "
                f"Create every table before start_asc_pipeline().")
        if table_config.name in rt.tables:
            raise ValueError(f"Argument `name` must be unique: a table named "
                             f"{table_config.name!r} exists already (Duplicated hashtable name). "
                             f"Received: {table_config.name!r}")
        table = SparseTable(table_config, _default_seed(table_config.name), block_rows,
                            rows_on)
        for optimizer in optimizers:
            table.bind_optimizer(optimizer)
        rt.tables[table_config.name] = table
    # Rec SDK's collection of sparse tables (what get_dense_and_sparse_variable returns).
    tf.compat.v1.add_to_collection(HASHTABLE_COLLECTION, table)
    return table
