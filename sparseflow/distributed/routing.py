"""One training step's keys between workers: a worker's batch routed to the owners of its
keys, and an owner's lookups and updates of the keys it received.

Per step and worker (``docs/design-notes.md``, "Multi-worker training"):

1. :meth:`KeyRouter.route` (in the ``tf.data`` pipeline): each table's keys deduplicated over
   the table's features (each unique key with its weighted occurrences: what admission counts
   on one worker), owners found, and every table's keys for owner r laid out one table after
   another in row r of one ``[N, width, 2]`` int64 send buffer of ``(key, weight)`` pairs;
   ``counts[r, t]`` says how many of row r belong to table t.
2. Counts and buffers are exchanged (``Exchange``); each owner calls
   :meth:`KeyRouter.process` on what it received: per table the keys of every sender go
   through the table's key processor together (a key sent by two workers is one key whose
   weights add up: admission, timestamps and row allocation as on one worker). This may run
   a batch ahead of the training step. In the step, :meth:`KeyRouter.gather` reads the rows
   (after the previous update) into a reply holding each received entry's embedding at the
   entry's place.
3. The reply goes back; gradients come the same way; :meth:`KeyRouter.update` sums each
   key's gradients from every worker and applies the table's sparse optimizer once.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import threading
import time

import numpy as np

from sparseflow import tensor_buffers
from sparseflow.distributed.sharding import HASHES, PAD_KEY
from sparseflow.embed.table_config import gradients_divided_by_ranks
from sparseflow.ops import key_kernels as kk
from sparseflow.ops import shard_kernels
from sparseflow.optimizers.base import apply_by_optimizer
from sparseflow.pipeline.key_processor import (SendCountOverflowError, borrow_scratch,
                                               process_tables)
from sparseflow.validation import INT32_MAX, check_int, check_one_of


def _timed(stage: str):
    """Adds the call's wall time to ``self.seconds[stage]``."""
    def wrap(method):
        @functools.wraps(method)
        def timed(self, *args, **kwargs):
            begin = time.perf_counter()
            try:
                return method(self, *args, **kwargs)
            finally:
                self.seconds[stage] += time.perf_counter() - begin
        return timed
    return wrap


@dataclasses.dataclass
class _Pending:
    """A processed step's entries and key-processor results per table, by token."""

    n: int
    m: int
    train: bool
    tables: list
    # Per table, the rows the update applies at: the fast-tier slots a tiered table's
    # gather placed them in; None: the processor's rows.
    slots: list = dataclasses.field(default_factory=list)


class KeyRouter:
    """Routes a worker's keys to their owners and serves the keys this worker owns.

    Args:
      tables: this worker's shard of each table (``SparseTable`` with host rows and a bound
        sparse optimizer), in table order.
      feature_tables: for each feature (in batch order), the index of its table.
      feature_coefs: for each feature, what one occurrence counts (``faae_coefficient``).
      world_size: workers.
      hash: the owner rule (``sharding.owner_of``).
      send_count: the most unique keys of one table a worker sends one owner per step, or
        None (``use_dynamic``: the buffer is as wide as the step needs).
      commit_in_process: make the shards' next rows resident in :meth:`process` rather
        than in :meth:`route` (for routing by the compiled op of :meth:`route_config`,
        which cannot).
    """

    def __init__(self, tables: list, feature_tables: list[int], feature_coefs: list[int],
                 world_size: int, hash: str = "mod", send_count: int | None = None,
                 commit_in_process: bool = False):
        self.tables = tables
        self.commit_in_process = commit_in_process
        self.world_size = world_size
        self.hash = hash
        self.send_count = send_count
        self.by_table = [[k for k, t in enumerate(feature_tables) if t == i]
                         for i in range(len(tables))]
        # Features in table order, and where each table's end among them: one dedup call
        # per batch for every table.
        self._order = np.asarray([k for members in self.by_table for k in members], np.int64)
        self._coefs = np.asarray([feature_coefs[k] for k in self._order], np.int32)
        self._table_segs = np.cumsum([len(m) for m in self.by_table], dtype=np.int64)
        self._segment_tables = np.repeat(np.arange(len(tables), dtype=np.int64),
                                         [len(m) for m in self.by_table])
        check_one_of("hash", hash, HASHES)
        check_int("world_size", world_size, 1, INT32_MAX)
        self.max_dim = max(t.dim for t in tables)
        self._pending: dict[int, list] = {}
        # Seconds spent in each stage (for the run's summary: where a step's time goes).
        self.seconds = {"route": 0.0, "process": 0.0, "gather": 0.0, "update": 0.0}
        # The agreed buffer width m of the latest processed batches (bytes on the wire).
        self.widths = collections.deque(maxlen=10_000)
        # Per table, the shard's next row at the last route() and a decaying peak of how far
        # it moved between two: how far ahead of it route() keeps the shard's memory resident.
        self._next_rows = [0] * len(tables)
        self._growth = [0] * len(tables)
        self._tokens = itertools.count(1)
        self._lock = threading.Lock()
        # Per table, handed-over batches (hand_over) whose update may not have run, oldest
        # first: (seq, the table's update count once it has), released by the next process().
        # The counts rise along each queue, so a release stops at the first still waiting.
        self._awaiting_update = [collections.deque() for _ in tables]

    def route_config(self) -> np.ndarray:
        """The config of ``route_ops.route_keys_op``, which routes as :meth:`route` does in
        a compiled op (TF2 faces): int64.

        Raises:
          ValueError: the router has a ``send_count`` (the op's buffer is as wide as the
            step needs; an overflow's error names the table, which only Python can).
        """
        from sparseflow.ops.route_ops import route_config

        if self.send_count is not None:
            raise ValueError(f"route_config: the compiled routing has no send_count; this "
                             f"router's is {self.send_count}. Route with route().")
        return route_config(self.world_size, self.hash == "mix", len(self.tables),
                            self._order, self._coefs, self._table_segs, self._segment_tables)

    @property
    def n_features(self) -> int:
        """Features routed per batch."""
        return sum(len(m) for m in self.by_table)

    # -- 1. the sender: a batch's keys to their owners -----------------------------------

    @_timed("route")
    def route(self, feature_keys: list[np.ndarray]):
        """Routes one batch's keys (what the ``tf.data`` map runs).

        Args:
          feature_keys: per feature, its int64 keys flattened (every one a key).

        Returns:
          ``(send, counts, place, gather, sizes)``: int64 ``send [N, width, 2]`` (key,
          weight; padding ``(-1, 0)``); int32 ``counts [N, T]``; int32 ``place [U, 2]``
          (owner, slot in its row) of every table's unique keys one table after another;
          int32 ``gather`` of every feature's keys one feature after another, each the key's
          index in ``place``; int64 ``sizes [T + F]``: unique keys per table, keys per
          feature.

        Raises:
          SendCountOverflowError: a table sends one owner more than ``send_count`` keys
            (names the table and the value to set).
        """
        n, n_tables = self.world_size, len(self.tables)
        keys = [np.asarray(feature_keys[k], np.int64).reshape(-1) for k in self._order]
        key_ends = np.cumsum(np.fromiter((x.shape[0] for x in keys), np.int64, len(keys)))
        # One kernel for every table (the Keras face routes each of 26 tables on its own:
        # per call, each numpy step here cost more than the work).
        with borrow_scratch() as scratch:
            scratch.fit(kk.table_bounds(key_ends, self._table_segs)[2])
            send, counts, place, gather, sizes, overflow = shard_kernels.route_keys(
                scratch.joined_keys(keys), key_ends, self._coefs, self._table_segs,
                self._order, self._segment_tables, n, self.hash == "mix",
                -1 if self.send_count is None else self.send_count, PAD_KEY, scratch.keys,
                scratch.tags, scratch.next_generation(n_tables))
        if overflow >= 0:
            r, t = divmod(int(overflow), n_tables)
            raise SendCountOverflowError(
                f"Table `{self.tables[t].table_name}`: a batch sends {counts[r, t]} unique "
                f"keys to worker {r} of {n}, more than distributed.send_count="
                f"{self.send_count}. Set `distributed.send_count` to at least "
                f"{counts[r, t]}, or to null (exchange the counts first).")
        if not self.commit_in_process:
            self._commit_ahead()
        return send.reshape(n, -1, 2), counts, place, gather, sizes

    def _commit_ahead(self) -> None:
        """Makes resident the memory of the rows this worker's shards hand out next: the
        owner's key processing in the step then writes new rows without page faults. Runs
        in the input pipeline, once per batch, ahead of the steps (``HostRows.commit_ahead``;
        with ``commit_in_process``, in :meth:`process`, for the batches after it):
        twice the largest recent growth of the shard's next row past it. The peak decays by
        1/8 per batch, so a shard that stops growing (reusing evicted rows, or full) stops
        committing; rows taken from the free list were resident already."""
        for t, table in enumerate(self.tables):
            if table.rows_on != "host" or table.tiers is not None:
                continue
            next_row = table.processor.rows_ever_used
            grown = max(next_row - self._next_rows[t], 0)
            self._next_rows[t] = next_row
            self._growth[t] = peak = max(grown, self._growth[t] * 7 // 8)
            if peak:
                table.rows.commit_ahead(next_row, 2 * peak)

    # -- 2. the owner: the keys it received ----------------------------------------------

    @_timed("process")
    def process(self, received: np.ndarray, counts: np.ndarray, timestamp: int | None,
                train: bool) -> np.int64:
        """Maps the keys every worker sent this owner to rows: per table, every sender's
        entries through the shard's key processor as one batch.

        Args:
          received: int64 ``[N, m, 2]``: row s is what worker s sent (key, weight).
          counts: int32 ``[N, T]``: how many of row s belong to each table.
          timestamp: the step's timestamp (the largest over all workers' batches), or None.
          train: count, admit and allocate (training) or only read (evaluation: unknown
            keys get no row).

        Returns:
          An int64 token (> 0) for :meth:`gather` (and, training, :meth:`update`).

        Raises:
          TableFullError: a table's shard has no free row for an admitted key.
        """
        if any(self._awaiting_update):
            self._release_updated()
        n, m = received.shape[0], received.shape[1]
        self.widths.append(m)
        # Each received entry is its own segment, its weight the occurrences it stands for:
        # the key processor adds them up per key exactly as one worker would. Every table's
        # entries are taken in one kernel call and go through one dedup kernel call.
        counts = np.ascontiguousarray(counts, np.int32)
        positions, keys, weights, ends, ok = shard_kernels.take_received(
            np.ascontiguousarray(received.reshape(n * m, 2), np.int64), counts, m)
        if not ok:
            raise ValueError(
                f"The counts received with a step's keys do not describe its buffer of "
                f"{n} x {m} entries (each count >= 0, each sender's at most {m}): "
                f"{counts.tolist()[:8]}. The ranks run different code or a message was "
                f"corrupted.")
        batch, results = process_tables([table.processor for table in self.tables], keys,
                                        np.arange(1, keys.shape[0] + 1, dtype=np.int64),
                                        weights, ends, train, timestamp)
        # Each entry is one key: the dedup's table bounds cut the entries too (slices, not
        # np.split: ~7 us a call in numpy's Python).
        entries = [positions[a:b] for a, b in zip(batch.starts.tolist(), batch.ends.tolist())]
        tables = list(zip(entries, results))
        with self._lock:
            token = next(self._tokens)
            self._pending[token] = _Pending(n, m, train, tables, [None] * len(tables))
        if self.commit_in_process:   # after this batch's rows: for the batches after it
            self._commit_ahead()
        return np.int64(token)

    @_timed("gather")
    def gather(self, token: int, keep: bool = True, flags: bool = False,
               untrained=None) -> np.ndarray:
        """The embeddings of :meth:`process` ``token``'s entries: float32 ``[N, m,
        max_dim]``, each at the entry's place (zeros for padding and keys without a row).
        Read at call time: after the previous step's update.

        Args:
          token: from :meth:`process`.
          keep: keep a training token for its gradients (:meth:`sum_gradients`); False
            releases it now (no gradient will come).
          flags: one more column (``[N, m, max_dim + 1]``) saying whether the entry's key
            owns a row (1.0) or not (0.0).
          untrained: called with a tiered table's index: True when no update will train
            its rows of this batch (see :meth:`_claim`); None: every table is trained.

        Raises:
          RuntimeError: ``token`` is not pending.
        """
        with self._lock:
            pending = self._take(token, pop=False)
            if not (pending.train and keep):
                del self._pending[int(token)]
        width = self.max_dim + int(flags)
        reply = tensor_buffers.zeros((pending.n * pending.m, width), np.float32)
        for t, (table, (entries, result)) in enumerate(zip(self.tables, pending.tables)):
            if flags:
                shard_kernels.mark_owned(result.rows, result.restore, entries, self.max_dim,
                                         reply)
            if table.rows_on == "device":   # read by TF ops (BatchExchange)
                if not (pending.train and keep):
                    table.release_batch(result.seq, drain=True)
                continue
            slots = self._claim(pending, t, untrained)
            if table.tiers is not None:   # a disk tier: the queued moves, before the read
                table.tiers.swap_host(table.rows.allocate())
            with table.rows.pinned() as storage:
                shard_kernels.scatter_rows(storage, slots, result.restore, entries,
                                           table.dim, reply)
            if not (pending.train and keep):
                table.release_batch(result.seq, drain=True)
        return reply.reshape(pending.n, pending.m, width)

    @property
    def updates_in_graph(self) -> bool:
        """Whether a training step's update can run as TF ops (:meth:`hand_over`): every
        table's rows on the host, of a fixed capacity, without tiers (what compiled ops
        read and update, ``SparseTable.gathers_in_kernel``)."""
        return all(table.gathers_in_kernel for table in self.tables)

    @_timed("update")
    def hand_over(self, token: int) -> np.ndarray:
        """Hands training token ``token``'s update to TF ops (the TF2 faces' compiled
        update, ``BatchExchange``): after its :meth:`gather` (``keep=True``), the token is
        done here and its batch released; its rows stay out of reuse until the update's
        drain (as after a compiled gather in one process).

        Returns:
          int32 ``[T + N * m + U]``, one array (each output of a numpy function costs
          TensorFlow ~13 us to hand back): ``sizes [T]``, each table's unique keys; then
          ``slots [N * m]``, each received entry's index among every table's unique keys
          one table after another (``U``, one past them, for padding); then ``rows [U]``,
          those keys' rows (-1: none). :func:`split_hand_over` cuts it. A gradient
          ``[N, m, max_dim]`` summed by ``slots`` is each key's gradient over every rank.

        The batch is consumed for checkpoints now (what it changed is saved) and stays in
        flight for eviction until its update has run (rows evicted meanwhile wait in the
        quarantine): the next :meth:`process` releases it once its table's optimizer counts
        the update.

        Raises:
          RuntimeError: ``token`` is not pending, or is not a training step's.
        """
        with self._lock:
            pending = self._take(token, pop=False)
            if not pending.train:
                raise RuntimeError(f"Step token {int(token)} is an evaluation's: it has no "
                                   f"update to hand over.")
            del self._pending[int(token)]
        n_tables, n_entries = len(pending.tables), pending.n * pending.m
        total = sum(result.rows.shape[0] for _, result in pending.tables)
        packed = tensor_buffers.empty(n_tables + n_entries + total, np.int32)
        slots, rows, sizes = split_hand_over(packed, n_tables, n_entries)
        slots.fill(total)
        start = 0
        awaiting = []
        for t, (table, (entries, result)) in enumerate(zip(self.tables, pending.tables)):
            end = start + result.rows.shape[0]
            sizes[t] = end - start
            rows[start:end] = result.rows
            slots[entries] = result.restore + start
            start = end
            table.processor.consume(result.seq)
            awaiting.append((t, int(result.seq), _update_count(table)))
        with self._lock:
            for t, seq, count in awaiting:
                # After the updates of the batches handed over before it, then its own.
                waiting = self._awaiting_update[t]
                waiting.append((seq, count + len(waiting) + 1))
        return packed

    def _release_updated(self) -> None:
        """Releases the handed-over batches whose update has run (their table's optimizer
        counted it), and per table any beyond the newest ``_UPDATES_AWAITED`` (updates that
        never came: training lookups without a gradient). Each table's queue is read from
        its oldest batch up to the first still waiting."""
        done = []
        with self._lock:
            for t, waiting in enumerate(self._awaiting_update):
                if not waiting:
                    continue
                count = _update_count(self.tables[t])
                while waiting and (waiting[0][1] <= count or len(waiting) > _UPDATES_AWAITED):
                    done.append((t, waiting.popleft()[0]))
        # Outside the router's lock: a release takes the key processor's.
        for t, seq in done:
            self.tables[t].release_batch(seq, drain=True)

    def discard(self, token: int) -> None:
        """Drops :meth:`process` ``token`` of a step that failed before its rows were read or
        its update handed over: its batch is released (rows it holds from reuse freed) and
        the token is no longer pending. A token not pending is ignored."""
        with self._lock:
            pending = self._pending.pop(int(token), None)
        for table, (_, result) in zip(self.tables, pending.tables if pending else ()):
            table.release_batch(result.seq, drain=True)

    def device_entries(self, token: int, t: int, untrained=None) -> tuple:
        """For table ``t`` of :meth:`process` ``token`` (its rows on the device, read by TF
        ops): the unique rows (int32 ``[U]``, -1 for keys without a row; a tiered table's
        fast slots, claimed now), each received
        entry's index among them (int32 ``[E]``) and the entry's flat place in the
        ``[N * m]`` reply (int64 ``[E]``). Call before :meth:`gather`, which releases an
        evaluation's token. ``untrained``: as :meth:`gather`'s.

        Raises:
          RuntimeError: ``token`` is not pending.
        """
        with self._lock:
            pending = self._take(token, pop=False)
        entries, result = pending.tables[t]
        # A host tier's swaps: the caller's, before its gather.
        rows = self._claim(pending, t, untrained)
        return (np.ascontiguousarray(rows, np.int32),
                np.ascontiguousarray(result.restore, np.int32),
                np.ascontiguousarray(entries, np.int64))

    def _claim(self, pending: _Pending, t: int, untrained=None) -> np.ndarray:
        """Where table ``t``'s rows of ``pending`` are read and updated: a tiered table's
        rows claim fast slots now (unless the processor placed them early), kept for the
        update; other tables' rows are their own. A tiered table that ``untrained(t)``
        says no update trains (a frozen one) claims its slots as an evaluation's, unpinned
        at the release: no update would settle them, and its fast tier would fill."""
        _, result = pending.tables[t]
        table = self.tables[t]
        if table.tiers is None:
            return result.rows
        frozen = untrained is not None and untrained(t)
        pending.slots[t] = table.tiers.place(result.rows, int(result.seq),
                                             False if frozen else None)
        return pending.slots[t]

    def _take(self, token: int, pop: bool) -> _Pending:
        """The pending step of ``token`` (under the lock).

        Raises:
          RuntimeError: no such step: already updated, released as stale, or never
            processed (a gradient applied twice, or of a step that was not looked up).
        """
        found = self._pending.pop(int(token), None) if pop else self._pending.get(int(token))
        if found is None:
            raise RuntimeError(
                f"Keys of step token {int(token)} are not pending: their gradients were "
                f"applied already, or a later step's were (an update of a step runs once, "
                f"in order), or the step was never looked up. Pending: "
                f"{sorted(self._pending)[:10]}")
        return found

    def lookup(self, received: np.ndarray, counts: np.ndarray, timestamp: int | None,
               train: bool):
        """:meth:`process` then :meth:`gather`: ``(reply, token)``, token 0 for evaluation
        (nothing to update)."""
        token = self.process(received, counts, timestamp, train)
        reply = self.gather(token)
        return reply, token if train else np.int64(0)

    @_timed("update")
    def update(self, token: int, grads: np.ndarray) -> np.int64:
        """Applies the gradients every worker sent back for the keys of :meth:`lookup`
        ``token``: per table, each key's gradients summed over entries (so over workers),
        then one optimizer update of its row.

        Args:
          token: from :meth:`lookup`.
          grads: float32 ``[N, m, max_dim]`` in the layout :meth:`lookup` received.

        Returns:
          The number of tables updated.
        """
        summed = self.sum_gradients(token, grads)
        # One row per key of a table at its owner: the rows are distinct.
        apply_by_optimizer(self.tables, [rows for rows, _ in summed],
                           [grad for _, grad in summed], unique=True)
        return np.int64(len(summed))

    def sum_gradients(self, token: int, grads: np.ndarray) -> list:
        """Per table, the rows of :meth:`process` ``token``'s keys and each key's gradients
        summed over its entries (so over workers; divided by the number of workers for a
        table created with ``all2all_gradients_op="sum_gradients_and_div_by_ranksize"``):
        ``[(int32 rows [U], float32 [U, dim])]`` (views into the two arrays of
        :meth:`sum_gradients_packed`), -1 for keys without a row. The token's batch is
        released: its evicted rows are freed
        by the optimizer's update (``after_update``), or now for a table without one. Tokens
        older than ``token`` whose gradients never came (a training step that only looked
        up) are released too.

        Args:
          token: from :meth:`process` (training).
          grads: float32 ``[N, m, max_dim]`` in the layout :meth:`process` received.
        """
        packed, values = self.sum_gradients_packed(token, grads)
        return split_summed(packed, values, [table.dim for table in self.tables])

    def sum_gradients_packed(self, token: int, grads: np.ndarray) -> tuple:
        """:meth:`sum_gradients` as two arrays, for a numpy function (each output costs
        TensorFlow ~13 us to hand back; 26 tables made 52): int32 ``[T + U]``, each table's
        unique keys ``sizes [T]`` then every table's rows one table after another, and
        float32 ``[sum of U_t * dim_t]``, every table's ``[U_t, dim_t]`` summed gradients
        one table after another. :func:`split_summed` cuts them.
        """
        with self._lock:
            taken = self._take(token, pop=True)
            pending, placed = taken.tables, taken.slots
            stale = [self._pending.pop(t).tables for t in list(self._pending) if t < token]
        for tables in stale:
            for table, (_, result) in zip(self.tables, tables):
                table.release_batch(result.seq, drain=True)
        flat = np.ascontiguousarray(grads.reshape(-1, grads.shape[-1]), np.float32)
        n_tables = len(self.tables)
        n_rows = [result.rows.shape[0] for _, result in pending]
        packed = tensor_buffers.empty(n_tables + sum(n_rows), np.int32)
        packed[:n_tables] = n_rows
        dims = [table.dim for table in self.tables]
        values = tensor_buffers.zeros(sum(u * dim for u, dim in zip(n_rows, dims)), np.float32)
        for table, (entries, result), slots, (rows, summed) in zip(
                self.tables, pending, placed, split_summed(packed, values, dims)):
            shard_kernels.sum_entries(flat, entries, result.restore, table.dim, summed)
            if gradients_divided_by_ranks(table.config):
                summed /= self.world_size
            table.release_batch(result.seq, drain=table.rows.optimizer is None)
            rows[:] = result.rows if slots is None else slots
        return packed, values


def split_hand_over(packed: np.ndarray, n_tables: int, n_entries: int) -> tuple:
    """:meth:`KeyRouter.hand_over`'s array cut into ``(slots [N * m], rows [U], sizes [T])``
    (views)."""
    return (packed[n_tables:n_tables + n_entries], packed[n_tables + n_entries:],
            packed[:n_tables])


def split_summed(packed: np.ndarray, values: np.ndarray, dims: list) -> list:
    """:meth:`KeyRouter.sum_gradients_packed`'s arrays cut per table (views):
    ``[(int32 rows [U_t], float32 [U_t, dim_t])]``, ``dims`` each table's width."""
    n_tables = len(dims)
    out = []
    start = value_start = 0
    for t, dim in enumerate(dims):
        n_rows = int(packed[t])
        out.append((packed[n_tables + start:n_tables + start + n_rows],
                    values[value_start:value_start + n_rows * dim].reshape(n_rows, dim)))
        start += n_rows
        value_start += n_rows * dim
    return out


# Handed-over batches kept waiting for their updates, at most, per table: a step's update
# follows its lookup, so more than a few means updates that never came.
_UPDATES_AWAITED = 4096


def _update_count(table) -> int:
    """Updates ``table``'s optimizer has applied to it (0 without one)."""
    optimizer = table.rows.optimizer
    return 0 if optimizer is None else optimizer.steps(table.table_name)
