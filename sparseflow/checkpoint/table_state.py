"""A table's whole state by key, captured from and applied to a live table.

Checkpoints keep **keys**, not row offsets, as the unit: a restored table hands out rows
0..n-1 afresh, so a checkpoint restores into a table of another capacity (or, later, another
sharding). This is the one module that sees both halves of a table — the key processor
(key -> row, counts, last-seen, clock) and the rows (weights and optimizer slots): host rows
directly, device rows (``rows_on="device"``) through a session, in the same host layout, so a
checkpoint moves between host and device tables.

A state is that of the batches the model has consumed: what batches read ahead (prefetch,
parallel map) counted, admitted, stamped or added to the sketch is left out
(``KeyProcessor.consumed_state``), so a run restored from it and reading on from the next
batch counts each batch once, as the uninterrupted run did.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from sparseflow.ops import key_kernels as kk
from sparseflow.ops.count_min import CountMinSketch
from sparseflow.ops.hash_index import HashIndex

logger = logging.getLogger("sparseflow")

NO_CLOCK = -(2**63)


@dataclass
class TableState:
    """Everything needed to continue training a table exactly.

    Attributes:
      keys: int64 [n] admitted keys. counts: int32 [n]. last_seen: int64 [n].
      values: float32 [n, dim * (1 + len(slot_names))], each row ``[weights | slots]`` as in
        the table's storage (written and read as one block: no per-slot copies).
      slot_names: the optimizer's slots, in storage order.
      counted_keys, counted_counts: int64/int32 [m], keys counted but not admitted (exact
        counting only).
      clock: the table clock (``NO_CLOCK`` before any timestamp).
      optimizer_steps: updates its sparse optimizer has applied (Adam's bias correction).
      tombstones: int64 keys evicted since the base checkpoint (incremental states only).
      sketch: the admission sketch counting not-yet-admitted keys (a table created with
        ``admission_counter="sketch"``; a copy), or None.
    """

    keys: np.ndarray
    counts: np.ndarray
    last_seen: np.ndarray
    values: np.ndarray
    slot_names: tuple = ()
    counted_keys: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    counted_counts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    clock: int = NO_CLOCK
    optimizer_steps: int = 0
    tombstones: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    sketch: CountMinSketch | None = None

    @property
    def dim(self) -> int:
        """Embedding width."""
        return self.values.shape[1] // (1 + len(self.slot_names))

    @property
    def weights(self) -> np.ndarray:
        """float32 [n, dim] view of the embeddings."""
        return self.values[:, :self.dim]

    @property
    def slots(self) -> dict:
        """slot name -> float32 [n, dim] view."""
        d = self.dim
        return {name: self.values[:, d * (i + 1):d * (i + 2)]
                for i, name in enumerate(self.slot_names)}


def take_window(table):
    """Hands over the rows touched and keys evicted since the last call, and starts a new
    window. A change made between this and :func:`capture` lands in both: it is saved again
    next time, never missed."""
    processor = table.processor
    with processor.lock:
        window = (processor.take_marks(), processor.tombstones)
        # Rows of batches in flight are left out of this state (read_ahead.py): the next
        # one must save what those batches change.
        processor.dirty[processor.in_flight_rows()] = True
        processor.tombstones = []
    return window


def capture(table, window=None, sess=None) -> TableState:
    """Copies ``table``'s state under its key processor's lock (a consistent snapshot).

    Args:
      table: the live table.
      window: from :func:`take_window` for an incremental state (only keys whose rows the
        window marks, plus its tombstones); None for the full state.
      sess: device tables only: the session to read the variables through (default: see
        ``DeviceTableRows.session``).

    Returns:
      A :class:`TableState`.
    """
    processor, host = table.processor, table.rows
    session = None
    if table.rows_on == "device":
        session = host.session(sess)
        host.last_session = session
    with processor.lock:
        consumed = processor.consumed_state()   # without the batches read ahead
        keys, rows, counts = consumed.keys, consumed.rows, consumed.counts
        admitted = rows >= 0
        if window is not None:
            # Under dynamic expansion rows may have been added since the window was taken:
            # past its end, a row is new, hence changed.
            marks = window[0]
            inside = rows < marks.shape[0]
            admitted &= ~inside | marks[np.where(inside, np.maximum(rows, 0), 0)]
        counted = rows < 0
        order = np.argsort(rows[admitted], kind="stable")  # row order: a sequential read
        keys_a, counts_a, rows_a = keys[admitted][order], counts[admitted][order], \
            rows[admitted][order]
        if table.tiers is not None:  # wherever each row is now: fast tier or home
            values = table.read_rows(rows_a, session)
        elif session is not None:  # device rows: pending rows written first, then read
            values = host.read(session, rows_a)
        else:
            storage = host.allocate()
            n = rows_a.shape[0]
            if n and rows_a[0] == 0 and rows_a[-1] == n - 1:
                values = storage[:n].copy()  # rows 0..n-1 all held: one sequential copy
            else:
                values = storage[rows_a]
        steps = host.optimizer.steps(table.table_name) if host.optimizer is not None else 0
        tombstones = (np.concatenate(window[1]) if window is not None and window[1]
                      else np.zeros(0, np.int64))
        return TableState(keys=keys_a, counts=counts_a,
                          last_seen=consumed.last_seen[rows_a], values=values,
                          slot_names=tuple(host.slot_names), counted_keys=keys[counted],
                          counted_counts=counts[counted], clock=int(consumed.clock),
                          optimizer_steps=int(steps), tombstones=tombstones,
                          sketch=consumed.sketch)


def restore_window(table, window) -> None:
    """Gives back a window from :func:`take_window` whose state was not saved."""
    processor = table.processor
    with processor.lock:
        processor.dirty[:window[0].shape[0]] |= window[0]  # it may have grown since
        processor.tombstones = list(window[1]) + processor.tombstones


def merge(base: TableState, delta: TableState) -> TableState:
    """The state after ``delta`` (an incremental capture) on top of ``base``: evicted keys
    dropped, changed keys replaced, counted keys and scalars taken from ``delta``."""
    replaced = np.isin(base.keys, np.concatenate([delta.tombstones, delta.keys]))
    keep = ~replaced

    def cat(a, b):
        return np.concatenate([a[keep], b])

    return TableState(keys=cat(base.keys, delta.keys), counts=cat(base.counts, delta.counts),
                      last_seen=cat(base.last_seen, delta.last_seen),
                      values=cat(base.values, delta.values), slot_names=base.slot_names,
                      counted_keys=delta.counted_keys, counted_counts=delta.counted_counts,
                      clock=delta.clock, optimizer_steps=delta.optimizer_steps,
                      sketch=delta.sketch)


def check_fits(table, state: TableState, source: str) -> None:
    """Raises ValueError, naming the numbers, if ``state`` cannot be applied to ``table``.

    Refused: more keys than rows, another dim, or another optimizer slot layout than the
    table's (SGD's none included: an optimizer without slots still trains the rows, and
    restoring Adam's or Adagrad's rows into it would drop their slots), or, for a table that
    trains, an admission sketch of another width, depth or seed (its counts would land in
    other counters). Only a table with no sparse optimizer at all (evaluation, export,
    serving) takes any checkpoint's weights.

    Args:
      table: the live table.
      state: what would be applied.
      source: where the state came from, for messages.

    Raises:
      ValueError: the state does not fit; the message names the table, the checkpoint's
        dim and slots (or sketch) and the table's.
    """
    processor, host = table.processor, table.rows
    n = state.keys.shape[0]
    if n > processor.row_limit:
        raise ValueError(
            f"Cannot restore table `{table.table_name}` from {source}: it holds {n} keys but "
            f"the table has {processor.row_limit} rows. Create it with a capacity "
            f"(device_vocabulary_size + host_vocabulary_size) of at least {n}.")
    optimizer = host.optimizer
    if optimizer is None and state.dim == host.dim:
        return  # a serving table (no sparse optimizer): the weights alone are restored
    if (optimizer is None or tuple(state.slot_names) != tuple(host.slot_names)
            or state.dim != host.dim):
        has = ("no sparse optimizer (a serving table: weights only)" if optimizer is None
               else f"its sparse optimizer {type(optimizer).__name__} slots "
                    f"{list(host.slot_names)}")
        raise ValueError(
            f"Cannot restore table `{table.table_name}` from {source}: it holds dim {state.dim} "
            f"with optimizer slots {list(state.slot_names)} but the table has dim {host.dim} "
            f"and {has}. Build the sparse optimizer the checkpoint was trained with before "
            f"restoring, or none (a serving table takes the weights only).")
    sketch = processor.sketch   # (a serving table, which counts nothing, returned above)
    if sketch is not None and state.sketch is not None and \
            sketch.geometry != state.sketch.geometry:
        raise ValueError(
            f"Cannot restore table `{table.table_name}` from {source}: its admission sketch "
            f"has (width, depth, seed) {state.sketch.geometry} but the table's has "
            f"{sketch.geometry}. Create the table with sketch_width="
            f"{state.sketch.width}, sketch_depth={state.sketch.depth} (and the same table "
            f"name and graph seed, which fix the hashes).")


def apply(table, state: TableState, source: str, sess=None) -> None:
    """Replaces ``table``'s keys, rows, slots, counts, timestamps and clock with ``state``.

    Args:
      table: the live table (its pipeline started, so its slot layout is fixed).
      state: what to load.
      source: where the state came from, for messages.
      sess: device tables only: the session to write the variables through (default: see
        ``DeviceTableRows.session``).

    Raises:
      ValueError: see :func:`check_fits`.
    """
    check_fits(table, state, source)
    processor, host = table.processor, table.rows
    n = state.keys.shape[0]
    session = None
    if table.rows_on == "device":
        session = host.session(sess)
        host.last_session = session
    with processor.lock:
        keep_counted = processor.sketch is None
        m = state.counted_keys.shape[0] if keep_counted else 0
        index = HashIndex(max(n + m, 1))
        index.insert(state.keys, np.arange(n, dtype=np.int32), state.counts)
        if m:
            index.insert(state.counted_keys, np.full(m, -1, np.int32), state.counted_counts)
        if table.tiers is not None:
            # Every row home, the fast tier emptied; a device table's variables initialised
            # (a MonitoredSession restoring runs no initializer).
            table.tiers.load(state.values)
            if session is not None:
                host.prepared().reset(session)
        elif session is not None:
            # Every variable reset (rows beyond n included), then rows 0..n-1 written; a table
            # without optimizer slots (an inference graph) takes the weights only.
            host.load(session, state.values)
        else:
            host.ensure_rows(n)  # dynamic expansion: grow to the checkpoint's keys
            processor.cover_rows(n)
            storage = host.allocate()
            # A table without optimizer slots (an inference graph) takes the weights only.
            storage[:n] = state.values[:, :storage.shape[1]]
        processor.index = index
        processor.state[kk.STATE_INDEX_SIZE] = index.size
        processor.state[kk.STATE_NEXT_ROW] = n
        processor.state[kk.STATE_FREE_TOP] = 0
        processor.free_rows = np.zeros(0, np.int32)
        processor.last_seen[:n] = state.last_seen
        processor.clock = np.int64(state.clock)
        processor.reset_in_flight()
        processor.mark_saved()  # the table now equals the checkpoint
        _load_sketch(table, state, source)
        if host.optimizer is not None:  # host and device tables: the optimizer's counter
            host.optimizer.set_steps(table.table_name, state.optimizer_steps)


def _load_sketch(table, state: TableState, source: str) -> None:
    """The admission sketch from ``state``. A state without one (a checkpoint written before
    sketches were saved, or by a table that counts exactly) leaves the sketch empty but for
    the state's counted keys, with a warning for a training table: keys not yet admitted
    count anew. A serving table (no optimizer) never counts: its sketch is only cleared when
    the state's does not fit it."""
    sketch = table.processor.sketch
    trains = table.rows.optimizer is not None
    if sketch is None:
        if state.sketch is not None and trains:
            logger.warning(
                "Table `%s`: %s counted not-yet-admitted keys in an admission sketch, which "
                "a table that counts exactly cannot read; those keys are counted again from "
                "zero.", table.table_name, source)
        return
    if state.sketch is not None and state.sketch.geometry == sketch.geometry:
        sketch.load(state.sketch)
        return
    sketch.clear()
    if state.sketch is not None:   # another geometry: refused for a training table
        return
    m = state.counted_keys.shape[0]
    if m:
        sketch.add(state.counted_keys, state.counted_counts.astype(np.int64))
    if trains:
        logger.warning(
            "Table `%s`: %s holds no admission sketch (it was written before sketches were "
            "saved, or by a table that counts exactly); the sketch starts %s, so keys not "
            "yet admitted are counted again from there.", table.table_name, source,
            f"from its {m} counted keys" if m else "empty")
