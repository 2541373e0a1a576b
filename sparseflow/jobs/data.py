"""The input of YAML jobs: ``data:`` + ``columns:`` -> a ``tf.data.Dataset`` of batch dicts.

Every element is a dict of exactly (B = batch_size, every batch full, the remainder dropped)::

    labels       float32 [B, n_labels]
    dense        float32 [B, n_dense]      only with dense columns; nulls 0, log1p if configured
    <sparse>     int64   [B]  (length 1)   one entry per sparse column; missing keys -1
                 int64   [B, L]            multi-hot: padded with -1 / truncated to L
    <timestamp>  int64   [B]               only with a timestamp column

Sources other than TFRecord are read by numpy/pyarrow/numba code in a Python generator (see
:mod:`sparseflow.jobs.readers`) that yields its arrays (each single-hot column's keys apart, as
the insert function reads them: no strided copies of a [B, n_single] matrix) per *run* of
consecutive batches: every whole batch a block holds, as one
[m, B, ...] view of it; TensorFlow's ``unbatch`` splits a run into its batches and a map
unpacks each into the dict. Per run the Python side only slices (or, when shuffling, gathers)
numpy arrays: a 65,536-row Parquet record batch crosses into TensorFlow once, not 16 times,
which keeps the generator's Python (and its hold on the GIL) off the training step.

Shuffling (train only, ``data.shuffle_buffer`` > 0) keeps a buffer of that many rows: each batch
is drawn uniformly without replacement from the buffer plus the next B rows, seeded by ``seed``.
With ``repeat`` the rows run through the epochs without a break (batches may span two epochs).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from sparseflow.jobs import readers
from sparseflow.jobs.readers import ColumnPlan


def batch_signature(columns, batch_size: int) -> dict[str, tf.TensorSpec]:
    """The element spec of :func:`make_dataset`.

    Args:
      columns: the ``ColumnsConfig``.
      batch_size: B >= 1.

    Returns:
      ``{"labels": float32 [B, n_labels], "dense": float32 [B, n_dense] (with dense columns),
      <sparse column>: int64 [B] or [B, L], <timestamp column>: int64 [B]}``.

    Raises:
      ValueError: ``batch_size`` < 1; sparse/timestamp names clashing with each other or with
        ``labels``/``dense``.
    """
    _check_batch_size(batch_size)
    plan = ColumnPlan.from_columns(columns)
    spec = {"labels": tf.TensorSpec([batch_size, len(plan.labels)], tf.float32)}
    if plan.dense:
        spec["dense"] = tf.TensorSpec([batch_size, len(plan.dense)], tf.float32)
    for c in columns.sparse:
        shape = [batch_size] if c.length == 1 else [batch_size, c.length]
        spec[c.name] = tf.TensorSpec(shape, tf.int64)
    if plan.timestamp:
        spec[plan.timestamp] = tf.TensorSpec([batch_size], tf.int64)
    return spec


def make_dataset(data, columns, split: str, *, batch_size: int, seed: int = 0,
                 repeat: bool = False) -> tf.data.Dataset:
    """The batches of one split of a job's data.

    The source is checked here (files opened, columns compared with ``columns``, generated or
    MovieLens data built), so configuration errors raise now rather than when iterating. The
    dataset works eagerly and in ``tf.compat.v1`` graph mode (``make_initializable_iterator``);
    each new iterator restarts the split in the same order.

    Args:
      data: the ``DataConfig``.
      columns: the ``ColumnsConfig``.
      split: ``train`` | ``eval``.
      batch_size: B >= 1 rows per batch; a last partial batch is dropped.
      seed: shuffling seed (``train`` with ``data.shuffle_buffer`` > 0 only).
      repeat: loop over the split forever (ends if the split is empty).

    Returns:
      A ``tf.data.Dataset`` whose elements match :func:`batch_signature`.

    Raises:
      ValueError: an unknown ``split`` or ``data.source``; a bad ``batch_size`` or ``seed``;
        ``split`` is ``eval`` and the data
        has no eval split; a missing path, unreadable file or column not in a file (the message
        names the file, the column and the columns it has).
      RuntimeError: MovieLens cannot be downloaded.
    """
    if split not in readers.SPLITS:
        raise ValueError(f"Invalid `split`: {split!r}, use one of {', '.join(readers.SPLITS)}.")
    if data.source not in readers.SOURCES:
        raise ValueError(f"Invalid `data.source`: {data.source!r}, use one of "
                         f"{', '.join(readers.SOURCES)}.")
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"Argument `seed` must be an int >= 0. Received: {seed!r}")
    signature = batch_signature(columns, batch_size)
    plan = ColumnPlan.from_columns(columns)
    _check_has_split(data, split)
    shuffle = int(data.shuffle_buffer) if split == "train" else 0
    if data.source == "tfrecord":
        files = readers.expand_paths(getattr(data, split), f"data.{split}")
        kinds = readers.tfrecord_kinds(files, plan)
        packed = readers.tfrecord_dataset(files, plan, kinds, batch_size=batch_size,
                                          shuffle_buffer=shuffle, seed=seed, repeat=repeat)
        return packed.map(_unpacker(columns, plan))
    blocks = _block_source(data, split, plan)

    def runs():
        rng = np.random.default_rng(seed)
        batcher = Shuffler(batch_size, shuffle, rng) if shuffle else Rebatcher(batch_size)
        keys = _packed_keys(plan)
        while True:
            rows = 0
            for block in blocks():
                rows += _rows(block)
                for run in batcher.push(block):
                    yield tuple(run[k] for k in keys)
            if not repeat or rows == 0:
                break
        for run in batcher.finish():
            yield tuple(run[k] for k in keys)

    runs_signature = tuple(tf.TensorSpec([None, *spec.shape], spec.dtype)
                           for spec in _packed_signature(signature, plan))
    packed = tf.data.Dataset.from_generator(runs, output_signature=runs_signature).unbatch()
    return packed.map(_unpacker(columns, plan))


def _check_batch_size(batch_size) -> None:
    if not isinstance(batch_size, (int, np.integer)) or isinstance(batch_size, bool) \
            or batch_size < 1:
        raise ValueError(f"Argument `batch_size` must be an int >= 1. Received: {batch_size!r}")


def _check_has_split(data, split: str) -> None:
    if split != "eval":
        return
    if data.source == "generator":
        missing = data.generator.eval_rows <= 0
        why = "data.generator.eval_rows is 0"
    elif data.source == "movielens":
        missing = data.movielens.eval_fraction <= 0
        why = "data.movielens.eval_fraction is 0"
    else:
        missing = not data.eval
        why = "data.eval is not set"
    if missing:
        raise ValueError(f"Invalid `split`: 'eval', but the data has no eval split ({why}).")


def _block_source(data, split: str, plan: ColumnPlan):
    """A function returning an iterator of blocks, one pass over the split per call."""
    if data.source == "generator":
        block = readers.generator_block(data.generator, split, plan)
        return lambda: iter((block,))
    if data.source == "movielens":
        block = readers.movielens_block(data.movielens, split, plan)
        return lambda: iter((block,))
    files = readers.expand_paths(getattr(data, split), f"data.{split}")
    if data.source == "parquet":
        return readers.parquet_blocks(files, plan)
    return readers.csv_blocks(data.source, files, data.csv, plan)


# --- packing -------------------------------------------------------------------------------

def _packed_keys(plan: ColumnPlan) -> list[str]:
    keys = ["labels"] + (["dense"] if plan.dense else [])
    keys += ["single:" + name for name, _ in plan.single]
    keys += ["multi:" + name for name, _, _ in plan.multi]
    return keys + (["timestamp"] if plan.timestamp else [])


def _packed_signature(signature, plan: ColumnPlan) -> tuple:
    out = [signature["labels"]] + ([signature["dense"]] if plan.dense else [])
    out += [signature[name] for name, _ in plan.single]
    out += [signature[name] for name, _, _ in plan.multi]
    return tuple(out + ([signature[plan.timestamp]] if plan.timestamp else []))


def _unpacker(columns, plan: ColumnPlan):
    """A map function from the packed tuple to the batch dict (sparse columns in config order)."""
    def unpack(*packed):
        packed = list(packed)
        out = {"labels": packed.pop(0)}
        if plan.dense:
            out["dense"] = packed.pop(0)
        sparse = {}
        for name, _ in plan.single:
            sparse[name] = packed.pop(0)
        for name, _, _ in plan.multi:
            sparse[name] = packed.pop(0)
        for c in columns.sparse:
            out[c.name] = sparse[c.name]
        if plan.timestamp:
            out[plan.timestamp] = packed.pop(0)
        return out
    return unpack


# --- re-batching and shuffling (numpy) -----------------------------------------------------

def _rows(block: dict) -> int:
    return next(iter(block.values())).shape[0]


def _take(block: dict, start: int, stop: int) -> dict:
    return {k: v[start:stop] for k, v in block.items()}


def _run_of_one(batch: dict) -> dict:
    """One batch as a run of one: ``[1, B, ...]`` views."""
    return {k: v[np.newaxis] for k, v in batch.items()}


class Rebatcher:
    """Cuts a stream of blocks into batches of exactly ``batch_size`` rows, handed out in
    *runs*: dicts of ``[m, batch_size, ...]`` arrays holding m consecutive batches.

    ``push(block)`` yields the runs the block completes: a batch joined from the rows left
    over from earlier blocks (a run of one), then the whole batches left in the block as runs
    of at most ``run_rows`` rows (at least one batch), views of the block; ``finish()`` drops
    the rest. The cap keeps a source that is one block (the generator, MovieLens) from
    crossing into TensorFlow as one element of the whole split.
    """

    def __init__(self, batch_size: int, run_rows: int = readers.READ_ROWS):
        self.batch_size = batch_size
        self.run_batches = max(1, run_rows // batch_size)
        self.parts: list[dict] = []
        self.pending = 0

    def push(self, block: dict):
        n, start, size = _rows(block), 0, self.batch_size
        if self.pending:
            take = min(size - self.pending, n)
            self.parts.append(_take(block, 0, take))
            self.pending += take
            start = take
            if self.pending == size:
                yield _run_of_one({k: np.concatenate([p[k] for p in self.parts])
                                   for k in block})
                self.parts, self.pending = [], 0
        while n - start >= size:
            m = min((n - start) // size, self.run_batches)
            yield {k: v[start:start + m * size].reshape((m, size) + v.shape[1:])
                   for k, v in block.items()}
            start += m * size
        if start < n:
            self.parts.append(_take(block, start, n))
            self.pending += n - start

    def finish(self):
        self.parts, self.pending = [], 0
        return iter(())


class Shuffler:
    """Buffer shuffling: each batch is drawn uniformly without replacement from ``buffer_rows``
    buffered rows plus the next ``batch_size`` rows; at the end the buffer is permuted and
    emptied in full batches. O(batch_size) work per batch and column. Each batch is handed
    out as a run of one (see :class:`Rebatcher`).
    """

    def __init__(self, batch_size: int, buffer_rows: int, rng: np.random.Generator):
        self.batch_size = batch_size
        self.capacity = buffer_rows + batch_size
        self.rng = rng
        self.buffer: dict | None = None
        self.rows: dict | None = None   # each buffer as 1-D whole rows: fast take / put
        self.filled = 0

    def push(self, block: dict):
        n, start = _rows(block), 0
        if self.buffer is None and n:
            self.buffer = {k: np.empty((self.capacity,) + v.shape[1:], v.dtype)
                           for k, v in block.items()}
            self.rows = {k: v.view(np.dtype((np.void, v.itemsize * (v.size // self.capacity))))
                         .reshape(self.capacity) for k, v in self.buffer.items()}
        while start < n:
            take = min(self.capacity - self.filled, n - start)
            for k, v in block.items():
                self.buffer[k][self.filled:self.filled + take] = v[start:start + take]
            self.filled += take
            start += take
            if self.filled == self.capacity:
                yield _run_of_one(self._draw())

    def _draw(self) -> dict:
        size, full = self.batch_size, self.filled
        chosen = self.rng.choice(full, size, replace=False)
        tail = full - size
        # Refill the chosen slots below ``tail`` with the unchosen rows at or above it.
        in_tail = np.zeros(size, bool)
        in_tail[chosen[chosen >= tail] - tail] = True
        holes = chosen[chosen < tail]
        movers = tail + np.flatnonzero(~in_tail)
        batch = {k: self.buffer[k].take(chosen, axis=0) for k in self.buffer}
        for rows in self.rows.values():
            rows[holes] = rows.take(movers)
        self.filled = tail
        return batch

    def finish(self):
        if not self.filled:
            return
        order = self.rng.permutation(self.filled)
        for start in range(0, self.filled - self.batch_size + 1, self.batch_size):
            idx = order[start:start + self.batch_size]
            yield _run_of_one({k: buf.take(idx, axis=0) for k, buf in self.buffer.items()})
        self.filled = 0
