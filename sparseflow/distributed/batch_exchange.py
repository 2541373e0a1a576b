"""One routed batch among the ranks, for every face: its keys to their owners and rows back,
then the rows' gradients to the owners.

A batch's keys were laid out by owner by ``KeyRouter.route`` (in the ``tf.data`` map);
:meth:`BatchExchange.forward` exchanges them (counts, the agreed width, keys), runs the
owners' key processing (``KeyRouter.process``: admission, timestamps, allocation) and reads
the rows back; :meth:`BatchExchange.to_owners` sends a gradient of those rows back to their
owners, where ``KeyRouter.sum_gradients`` (Session faces: the user's sparse optimizer applies
it) or ``KeyRouter.update`` (TF2 faces: applied there) takes it.
"""

from __future__ import annotations

import weakref

import tensorflow as tf

from sparseflow.distributed.sharding import PAD_KEY
from sparseflow.embed.table_config import gradients_divided_by_ranks
from sparseflow.optimizers.base import host_update_by_optimizer
from sparseflow.row_sums import sum_rows_by_index
from sparseflow.weak_owner import weak


class BatchExchange:
    """The collectives and owner-side numpy functions of one routed batch.

    Args:
      router: the ``KeyRouter`` of this rank's shards, held weakly: its owner (the
        runtime's ``routers``, a TF2 ``BoundSharding``) keeps it alive while the graph runs.
      exchange: the ``Exchange`` the collectives run on.
      send, counts, place, timestamp: the batch's routed keys (``KeyRouter.route``'s send
        buffer ``[N, width, 2]``, counts ``[N, T]``, places ``[U, 2]``) and its int64
        timestamp.
      train: count, admit and allocate (training) or only read.
      stamped: the timestamp is a time (eviction); else it is ignored.
      keep: a training batch's keys stay pending for a gradient from the start (the TF2
        faces); otherwise only once :meth:`to_owners` has been built (graph programs: a
        training lookup without a gradient releases its keys at once).
    """

    def __init__(self, router, exchange, send, counts, place, timestamp, train: bool,
                 stamped: bool, keep: bool = False):
        # Held weakly, here and by the numpy functions: TensorFlow keeps a TF2 numpy
        # function for the life of the process, and a training batch (which holds this
        # object) stays with the gradient closures of its step's graph, which TensorFlow's
        # own custom gradients keep too; the tables go with their owner (the Embedding, the
        # Keras layer, the runtime).
        self._router = weak(router, "key router of the sharded tables")
        self.exchange = exchange
        self.send, self.counts, self.place, self.timestamp = send, counts, place, timestamp
        self.train, self.stamped = train, stamped
        self._keep = [keep]   # whether a gradient will come: a cell the numpy functions share
        # Whether the gradient goes to the user's sparse optimizer (owner_gradients), which
        # records the tables it trains, rather than to the owners' optimizers (update).
        self._users_update = [False]
        # A TF2 training step's update as TF ops (the gradients' sum and the optimizers'
        # compiled update) rather than a numpy function: the lookup hands the token over.
        self.in_graph = keep and train and router.updates_in_graph
        # token: the owner's step token (None on the in_graph path, where the update is
        # handed over with slots, owner_rows and owner_sizes instead).
        self.token = self.m = self.rung = self.where = None
        self.slots = self.owner_rows = self.owner_sizes = None

    @property
    def router(self):
        """The ``KeyRouter`` (raises ``RuntimeError`` once its owner was dropped)."""
        return self._router()

    @property
    def gradient(self) -> bool:
        """Whether a training batch's keys stay pending for a gradient."""
        return self._keep[0]

    def forward(self, flags: bool, keys: tf.Tensor | None = None):
        """Every table's unique keys' rows, one table after another (``place`` order):
        float32 ``[U, max_dim]``, and with ``flags`` whether each key owns a row (bool
        ``[U]``; else None).

        With ``keys`` (int32 ``[K]``, each an index into that order: the routed batch's
        ``gather``, every feature's keys one feature after another) the rows of those keys
        instead, ``[K, max_dim]`` (and ``[K]`` flags), gathered straight from the reply: one
        gather for every feature, not one per feature from the unique rows; a gradient of
        them (:meth:`to_owners`) is summed per entry in one op.
        """
        router, max_dim = self.router, self.router.max_dim
        width = max_dim + int(flags)
        router_ref, keep, stamped, train = self._router, self._keep, self.stamped, self.train

        @tf.autograph.experimental.do_not_convert
        def process(received, received_counts, step_time):
            return router_ref().process(received, received_counts,
                                        int(step_time) if stamped else None, train)

        untrained = _untrained_test(router_ref, keep, self._users_update,
                                    getattr(self.send, "graph", None))   # None: eager

        @tf.autograph.experimental.do_not_convert
        def read(token):
            return router_ref().gather(token, keep=keep[0], flags=flags, untrained=untrained)

        @tf.autograph.experimental.do_not_convert
        def process_and_read(received, received_counts, step_time):
            token = process(received, received_counts, step_time)
            return token, read(token)

        @tf.autograph.experimental.do_not_convert
        def process_read_and_hand_over(received, received_counts, step_time):
            token = process(received, received_counts, step_time)
            try:
                # Two outputs, not five: each costs TensorFlow ~13 us to hand back, and the
                # Keras face runs one of these per layer and step. The token stays here:
                # nothing in the graph needs it once the update is handed over.
                return read(token), router_ref().hand_over(token)
            except BaseException:
                # No update will come for it: nothing else would drop the token.
                router_ref().discard(token)
                raise

        # The counts', keys' and rows' collectives report to the watchdog as one.
        with self.exchange.watched_as_one() as span:
            received, received_counts, step_time, self.rung = (
                self.exchange.all_to_all_dynamic(self.send, self.counts, PAD_KEY,
                                                 self.timestamp, with_rung=True))
            self.m = tf.shape(received)[1]
            arguments = [received, received_counts, step_time]
            if self.in_graph:
                reply, handed = tf.numpy_function(
                    span.guard(process_read_and_hand_over), arguments,
                    [tf.float32, tf.int32], stateful=True, name="sparseflow_owner_lookup")
                handed.set_shape([None])
                # KeyRouter.hand_over's layout: sizes [T], slots [N * m], rows [U].
                n_tables = len(router.tables)
                n_entries = self.exchange.world_size * self.m
                self.owner_sizes = tf.ensure_shape(handed[:n_tables], [n_tables])
                self.slots = handed[n_tables:n_tables + n_entries]
                self.owner_rows = handed[n_tables + n_entries:]
                device = []
            elif not any(table.rows_on == "device" for table in router.tables):
                # One numpy function, not two: each call on the step's critical path takes the
                # GIL from the input pipeline's thread once more.
                self.token, reply = tf.numpy_function(
                    span.guard(process_and_read), arguments, [tf.int64, tf.float32],
                    stateful=True, name="sparseflow_owner_lookup")
                device = []
            else:
                self.token = tf.numpy_function(span.guard(process), arguments, tf.int64,
                                               stateful=True, name="sparseflow_owner_keys")
                device = self._device_reads(width, span, untrained)
                # After the device tables' reads: the host read releases an evaluation's keys.
                with tf.control_dependencies([values for _, values in device]):
                    reply = tf.numpy_function(span.guard(read), [self.token], tf.float32,
                                              stateful=True, name="sparseflow_owner_gather")
            reply = tf.ensure_shape(reply, [self.exchange.world_size, None, width])
            if device:   # the tables' entries are disjoint: one scatter for all of them
                entries = tf.concat([e for e, _ in device], 0)
                values = tf.concat([v for _, v in device], 0)
                flat = tf.tensor_scatter_nd_add(tf.reshape(reply, [-1, width]), entries[:, None],
                                                values)
                reply = tf.reshape(flat, tf.shape(reply))
            # m is the received buffer's rung: the reply goes as it is.
            back = tf.reshape(self.exchange.all_to_all(reply, rung=self.rung), [-1, width])
        self.where = self.place[:, 0] * self.m + self.place[:, 1]
        if keys is None:
            rows = tf.gather(back, self.where)
            return rows[:, :max_dim], (rows[:, max_dim] > 0.5 if flags else None)
        # Cut before the gather: the reply has N x m rows, the batch's keys several times as
        # many.
        self.where = tf.gather(self.where, keys)
        values = tf.gather(back[:, :max_dim] if flags else back, self.where)
        return values, (tf.gather(back[:, max_dim] > 0.5, self.where) if flags else None)

    def _device_reads(self, width: int, span, untrained) -> list:
        """Per table with rows on the device, the owner's read as TF ops, as one process's
        lookup reads it (``lookup.py``): the rows the key processor assigned since the last
        read written with their initial values, or a tiered table's swaps run, then the
        received entries' rows gathered. Returns ``[(entries int64 [E], values float32
        [E, width])]``, each entry's flat place in the reply and its row (zeros where the
        key owns none). ``span``: the forward's ``WatchSpan``, whose end a failing numpy
        function reports; ``untrained``: ``KeyRouter.gather``'s."""
        from sparseflow.lookup import pending_rows_written, read_after
        from sparseflow.tiered_lookup import tier_swaps

        reads = []
        router, router_ref = self.router, self._router
        for t, table in enumerate(router.tables):
            if table.rows_on != "device":
                continue
            device_rows = table.rows.rows_in(self.token.graph)

            @tf.autograph.experimental.do_not_convert
            def entries_of(token, t=t):
                return router_ref().device_entries(token, t, untrained)

            rows, restore, entries = tf.numpy_function(
                span.guard(entries_of), [self.token], [tf.int32, tf.int32, tf.int64],
                stateful=True, name=f"sparseflow_owner_entries_{table.table_name}")
            rows.set_shape([None])
            gate = (tier_swaps([table], [rows]) if table.tiers is not None
                    else pending_rows_written(table, device_rows, rows, release=False))
            unique = device_rows.gather(tf.maximum(read_after(gate, rows), 0))
            owned = tf.cast(tf.gather(rows, restore) >= 0, tf.float32)[:, None]
            values = tf.gather(unique, restore) * owned
            reads.append((entries, tf.pad(values, [[0, 0], [0, width - table.dim]])))
        return reads

    def to_owners(self, dy: tf.Tensor) -> tf.Tensor:
        """``dy`` (float32 ``[U, max_dim]``, or ``[K, max_dim]`` after a forward with
        ``keys``: a gradient of :meth:`forward`'s rows) summed per entry and sent to
        the keys' owners: float32 ``[N, m, max_dim]`` in the layout the owner received the
        keys in (``KeyRouter.sum_gradients`` / ``update`` take it with :attr:`token`; a
        handed-over step, :attr:`in_graph`, has no token: its update sums it by
        :attr:`slots`)."""
        self._keep[0] = True
        n, max_dim = self.exchange.world_size, self.router.max_dim
        # Keyed rows: several keys share an entry, so their gradients add up there.
        scattered = sum_rows_by_index(dy, self.where, n * self.m)
        return self.exchange.all_to_all(tf.reshape(scattered, [n, -1, max_dim]),
                                        rung=self.rung)

    def owner_gradients(self, dy: tf.Tensor) -> list:
        """Per table, the ``IndexedSlices`` its sparse optimizer applies at the owner: each
        key's gradients from every rank summed, at the key's row (-1: none)."""
        from sparseflow.lookup import mark_batch_unique_rows

        tables, router_ref = self.router.tables, self._router
        received = self.to_owners(dy)
        self._users_update[0] = True

        @tf.autograph.experimental.do_not_convert
        def summed(token, grads):
            return router_ref().sum_gradients_packed(token, grads)

        # Two outputs for all the tables, not two per table (each output costs TensorFlow
        # ~13 us to hand back: 0.7 ms a step for 26 tables); cut as
        # KeyRouter.sum_gradients_packed lays them out.
        packed, flat_values = tf.numpy_function(summed, [self.token, received],
                                                [tf.int32, tf.float32], stateful=True,
                                                name="sparseflow_owner_gradients")
        n_tables = len(tables)
        sizes = tf.ensure_shape(packed[:n_tables], [n_tables])
        dims = tf.constant([table.dim for table in tables], tf.int32)
        if n_tables > 1:
            all_rows = tf.split(packed[n_tables:], sizes, num=n_tables)
            all_values = tf.split(flat_values, sizes * dims, num=n_tables)
        else:
            all_rows, all_values = [packed[n_tables:]], [flat_values]
        slices = []
        for table, rows, values in zip(tables, all_rows, all_values):
            rows.set_shape([None])
            mark_batch_unique_rows(rows)   # one row per key at its owner: distinct
            values = tf.reshape(values, [-1, table.dim])
            slices.append(tf.IndexedSlices(
                values, rows, tf.constant([table.capacity(), table.dim], tf.int64)))
        return slices

    def apply_at_owners(self, dy: tf.Tensor) -> tf.Tensor:
        """``dy`` sent to the owners, which sum each key's gradients over the ranks and apply
        the table's optimizer once (``KeyRouter.update``). Returns the update's output
        (int64), for control dependencies."""
        if self.in_graph:
            with self.exchange.watched_as_one():   # its end reported by a compiled op
                received = self.to_owners(dy)
            return self._update_ops(received)
        # The update reports the gradients' collective's end to the watchdog: one numpy
        # function fewer per exchange.
        with self.exchange.watched_as_one() as span:
            received = self.to_owners(dy)
            finished = span.take_end()
        router_ref = self._router

        @tf.autograph.experimental.do_not_convert
        def report_and_update(token, grads):
            finished()
            return router_ref().update(token, grads)

        return tf.numpy_function(report_and_update, [self.token, received], tf.int64,
                                 stateful=True, name="sparseflow_owner_update")

    def _update_ops(self, received: tf.Tensor) -> tf.Tensor:
        """The owners' update of a handed-over training step (:attr:`in_graph`) as TF ops:
        ``received`` (``[N, m, max_dim]``, every rank's gradients of the entries this rank
        received) summed per unique key (``KeyRouter.hand_over``'s slots), then per
        optimizer its update of the keys' rows (``SparseOptimizer.host_update``: lazy Adam's
        compiled op). Returns its int64 output, for control dependencies."""
        router = self.router
        tables, max_dim = router.tables, router.max_dim
        total = tf.shape(self.owner_rows)[0]
        # Padding entries (and rows of no key) add up in one row past the keys, dropped.
        summed = sum_rows_by_index(tf.reshape(received, [-1, max_dim]), self.slots,
                                   total + 1)[:-1]
        if len(tables) > 1:
            values = tf.split(summed, self.owner_sizes, num=len(tables))
            rows = tf.split(self.owner_rows, self.owner_sizes, num=len(tables))
        else:
            values, rows = [summed], [self.owner_rows]
        pairs = []
        for table, table_values, table_rows in zip(tables, values, rows):
            if table.dim != max_dim:
                table_values = table_values[:, :table.dim]
            if gradients_divided_by_ranks(table.config):
                table_values = table_values / self.exchange.world_size
            pairs.append((tf.IndexedSlices(table_values, table_rows, tf.constant(
                [table.capacity(), table.dim], tf.int64)), table))
        # One key per row at its owner: the rows are distinct.
        return host_update_by_optimizer(pairs, "sparseflow_owner_update")


def split_per_feature(rows: tf.Tensor, sizes: tf.Tensor, dims: list) -> list:
    """``rows`` (``[K, max_dim]``, every feature's keys one feature after another, as
    :meth:`BatchExchange.forward` with keys reads them) split per feature by ``sizes`` (its
    keys per feature), each cut to its feature's width in ``dims``: ``[[n_f, dim_f]]``.
    Cut after the gather: cutting first copied every row once per narrower feature."""
    width = rows.shape[1]
    pieces = tf.split(rows, sizes, num=len(dims))
    return [tf.ensure_shape(piece if dim == width else piece[:, :dim], [None, dim])
            for piece, dim in zip(pieces, dims)]


def step_bytes(widths: list, world_size: int, n_tables: int, max_dim: int, *,
               flags: bool = False, dense_parameters: int = 0) -> float:
    """Mean bytes one rank sends per training step through one routed batch's exchange
    (``widths``: the agreed width m of each step's buffers) and a ring all-reduce of
    ``dense_parameters`` float32s: to each of the N-1 others, the counts (4 bytes per
    table) with this rank's width and timestamp (12 bytes), keys with their weights (16 bytes
    per slot of m), rows back (``max_dim`` floats, plus a has-row flag with ``flags``) and
    their gradients (``max_dim`` floats); and 2 (N-1)/N of the dense gradients. 0.0 on one
    rank."""
    if world_size <= 1:
        return 0.0
    others = world_size - 1
    exchange = 0.0
    if widths:
        m = sum(widths) / len(widths)
        reply = max_dim + int(flags)
        exchange = others * (n_tables * 4 + 12 + m * 16 + m * reply * 4 + m * max_dim * 4)
    return exchange + 2.0 * others / world_size * dense_parameters * 4


def _untrained_test(router_ref, keep: list, users_update: list, graph):
    """A test, at run time, of whether no update trains table ``t``'s rows of a batch
    (``KeyRouter.gather``'s ``untrained``): the table has no optimizer; or no gradient of the
    batch goes to the owners (``keep[0]``: nothing built :meth:`BatchExchange.to_owners`);
    or it goes to the user's sparse optimizer (``users_update[0]``) and no update built in
    ``graph`` trains the table (``tiered_lookup.is_trained``). The graph is held weakly: TF2
    keeps a numpy function for the life of the process."""
    from sparseflow.tiered_lookup import is_trained

    graph_ref = weakref.ref(graph) if graph is not None else lambda: None

    def untrained(t: int) -> bool:
        table = router_ref().tables[t]
        if table.rows.optimizer is None or not keep[0]:
            return True
        graph = graph_ref()
        return users_update[0] and graph is not None and not is_trained(graph, table)

    return untrained
