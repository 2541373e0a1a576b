"""``sparseflow.Saver``: dense variables through TF's Saver, sparse tables beside them.

Used where a script calls ``tf.compat.v1.train.Saver``::

    saver = sparseflow.Saver(max_to_keep=3)
    saver.save(sess, "./saved-model/model", global_step=step)  # model-<step>.* + sparse-model-<step>/
    saver.restore(sess, sparseflow.latest_checkpoint("./saved-model"))

Layout (Rec SDK's naming, so its demo's existence check ``sparse-model-<step>`` works): the
dense checkpoint ``<dir>/<base>-<step>.index/.data-*`` and the sparse one
``<dir>/sparse-<base>-<step>/`` (see ``sparse_format``).

Atomicity: the sparse directory is written under a temporary name and renamed into place
first; TF's Saver then writes the dense files and, last, the ``checkpoint`` state file that
``latest_checkpoint`` reads. A process killed at any point leaves the previous checkpoint
the latest one, whole. Restore verifies every file before it changes any table.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import tensorflow as tf

from sparseflow import runtime as _runtime
from sparseflow.checkpoint import sparse_format as fmt
from sparseflow.checkpoint.table_state import (apply, capture, check_fits, merge,
                                               restore_window, take_window)
from sparseflow.embed.device_rows import DEVICE_ROWS_COLLECTION
from sparseflow.validation import check_bool, check_int, fail, is_int

# TF's own Saver, captured at import: the mx_rec facade may later point
# tf.compat.v1.train.Saver at sparseflow's, which must not then call itself.
_TF_SAVER = tf.compat.v1.train.Saver


def sparse_path(prefix: str) -> str:
    """The sparse checkpoint directory of a dense checkpoint prefix."""
    directory, base = os.path.split(prefix)
    return os.path.join(directory, f"sparse-{base}")


def latest_checkpoint(checkpoint_dir: str) -> str | None:
    """The newest checkpoint prefix in ``checkpoint_dir`` whose dense and sparse parts both
    exist, or None.

    Args:
      checkpoint_dir: the directory ``Saver.save`` wrote into.
    """
    state = tf.train.get_checkpoint_state(checkpoint_dir)
    if state is None:
        return None
    # get_checkpoint_state already resolves relative paths against checkpoint_dir.
    for prefix in reversed(list(state.all_model_checkpoint_paths)):
        if tf.compat.v1.train.checkpoint_exists(prefix) and every_shard_written(prefix):
            return prefix
    return None


def every_shard_written(prefix: str) -> bool:
    """Whether the sparse part of checkpoint ``prefix`` is complete (its manifest written)
    and, saved by several ranks, every rank's shard listed in it."""
    directory = sparse_path(prefix)
    try:
        world = fmt.read_manifest(directory).get("world")
    except fmt.CheckpointError:
        return False
    if world is None:
        return True
    parent = os.path.dirname(os.path.abspath(directory))
    return all(os.path.exists(os.path.join(parent, path, fmt.MANIFEST))
               for path in world["shards"])


def _dense_variables():
    """What ``tf.compat.v1.train.Saver`` saves by default, less device tables' variables
    (their rows are in the sparse checkpoint, by key; kept out of the dense one, a checkpoint
    restores into host and device tables alike). None (TF's default) when there are none, or
    nothing else."""
    device = {v.name for v in tf.compat.v1.get_collection(DEVICE_ROWS_COLLECTION)}
    if not device:
        return None
    saveables = (tf.compat.v1.global_variables()
                 + tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS))
    dense = [v for v in saveables if getattr(v, "name", None) not in device]
    return dense or None


def read_sparse_states(prefix: str, known=None, skip_unknown: bool = False) -> dict:
    """The tables of a checkpoint's sparse part, whole: as they were saved (incremental
    links merged onto their full base), and, for a checkpoint saved by several ranks, every
    rank's shard merged (what one process restores, exports or evaluates).

    Args:
      prefix: the checkpoint prefix (``Saver.save``'s return value; any rank's).
      known: None, or the table names that may appear (a dict or set); another raises,
        or is left out with ``skip_unknown``.
      skip_unknown: leave out the tables not in ``known`` instead of raising.

    Returns:
      dict table name -> ``TableState``.

    Raises:
      CheckpointError: the sparse part (or a rank's shard) is missing, corrupt or truncated
        (naming the file).
      ValueError: the checkpoint holds a table not in ``known``.
    """
    return read_rank_states(sparse_path(prefix), None, known, skip_unknown)


def read_shard_states(prefix: str, known=None, skip_unknown: bool = False) -> dict:
    """:func:`read_sparse_states` of this prefix's own part only: one rank's shard of a
    checkpoint saved by several ranks (dict table name -> ``TableState``).

    Raises:
      CheckpointError, ValueError: as :func:`read_sparse_states`.
    """
    return _read_states(sparse_path(prefix), known, skip_unknown)


def _read_states(directory: str, known, skip_unknown: bool) -> dict:
    """:func:`read_sparse_states` of a sparse directory."""
    tables = {}
    for link, manifest in fmt.chain(directory):  # verified, full checkpoint first
        for name, entry in manifest["tables"].items():
            if known is not None and name not in known:
                if skip_unknown:
                    continue
                raise ValueError(f"Checkpoint {link!r} holds table `{name}`, which does "
                                 f"not exist: create it before restoring. Tables: "
                                 f"{sorted(known)}")
            state = fmt.read_table_state(link, name, entry)
            tables[name] = state if name not in tables else merge(tables[name], state)
    return tables


class Saver:
    """Saves and restores dense variables and every sparse table under one step.

    Args:
      var_list: dense variables, as for ``tf.compat.v1.train.Saver`` (default: all).
      max_to_keep: checkpoints to keep (older ones are deleted, dense and sparse); int >= 0,
        0 keeps all.
      prefix_name: Rec SDK's argument, accepted; file names follow ``save_path``.
      restore_fewer_tables: restore a checkpoint holding tables this graph lacks (they are
        skipped: a serving or evaluation graph of part of the model); default False, such
        a checkpoint is refused.
      rank_files: over several ranks, ranks other than 0 save under ``<save_path>-rank<r>``
        with their own ``checkpoint-rank<r>`` state file, so that every rank may be given
        one path (the Estimator's ``model_dir``); rank 0's checkpoint lists every shard.
      **kwargs: passed to ``tf.compat.v1.train.Saver``.

    Raises:
      NotInitializedError: ``init`` was not called.
      TypeError, ValueError: ``max_to_keep`` is not an int >= 0.
    """

    def __init__(self, var_list=None, max_to_keep=3, prefix_name="checkpoint",
                 restore_fewer_tables=False, rank_files=False, **kwargs):
        self._runtime = _runtime.current("Saver")
        world = self._runtime.world
        self._rank_suffix = (f"-rank{world.rank}" if check_bool("rank_files", rank_files)
                             and world is not None and world.rank > 0 else "")
        self.restore_fewer_tables = check_bool("restore_fewer_tables", restore_fewer_tables)
        self.prefix_name = prefix_name  # Rec SDK's argument; the layout follows save_path
        if max_to_keep is None:  # TF's spelling of "keep all"
            max_to_keep = 0
        self.max_to_keep = check_int("max_to_keep", max_to_keep, 0)
        if var_list is None:
            var_list = _dense_variables()
        self._dense = _TF_SAVER(var_list=var_list, max_to_keep=max_to_keep, **kwargs)
        self._last_sparse: str | None = None  # the base of the next incremental save
        # Over several ranks each saves its shard; the ranks tell each other where.
        self._shard_paths = ShardPaths(world) if world is not None else None

    def __getattr__(self, name):
        # The rest of tf.compat.v1.train.Saver's interface (build, last_checkpoints,
        # saver_def, ...) so that Scaffold and TF's checkpoint hooks can drive this Saver.
        if name.startswith("__") or name == "_dense":
            raise AttributeError(name)
        return getattr(self._dense, name)

    @property
    def state_filename(self) -> str:
        """The checkpoint state file this saver writes ("checkpoint"; over several ranks
        with ``rank_files``, "checkpoint-rank<r>" on rank r > 0)."""
        return f"checkpoint{self._rank_suffix}"

    def _tables(self):
        return [t for t in self._runtime.tables.values() if t.config.is_save]

    def save(self, sess, save_path, global_step=None, latest_filename=None,
             meta_graph_suffix="meta", write_meta_graph=True, *, incremental=False,
             **kwargs) -> str:
        """Saves dense variables and every table with ``is_save=True``.

        Args:
          sess: the session holding the dense variables.
          save_path: checkpoint prefix, e.g. ``"./saved-model/model"``.
          global_step: None, an int, or a tensor/variable whose value is appended.
          write_meta_graph: as for TF's Saver.
          **kwargs: TF Saver.save's other options (``latest_filename``, ``write_state``...).
          incremental: write only the keys whose rows changed since this Saver's previous
            save (and the keys evicted since, as tombstones); restore reads the chain back to
            the last full save. Needs a previous save by this Saver.

        Returns:
          The checkpoint prefix (pass it to :meth:`restore`).

        Raises:
          RuntimeError: the pipeline has not started.
          ValueError: ``incremental=True`` before any save by this Saver.
        """
        check_bool("incremental", incremental)
        if incremental and self._last_sparse is None:
            fail("incremental", "False for this Saver's first save (an incremental checkpoint "
                 "needs a previous one as its base)", incremental)
        if not self._runtime.pipeline_started:
            raise RuntimeError("Saver.save() needs a started pipeline: call "
                               "start_asc_pipeline() first.")
        step = None
        if global_step is not None:
            step = int(global_step) if is_int(global_step) else int(sess.run(global_step))
        if self._rank_suffix:
            save_path += self._rank_suffix
            latest_filename = f"{latest_filename or 'checkpoint'}{self._rank_suffix}"
        prefix = f"{save_path}-{step}" if step is not None else save_path
        shards = None
        if self._shard_paths is not None:
            shards = self._shard_paths.exchange(sess, sparse_path(prefix))
        self._save_sparse(sparse_path(prefix), incremental, sess, shards)
        self._last_sparse = sparse_path(prefix)
        kept_before = list(self._dense.last_checkpoints)
        written = self._dense.save(sess, save_path, global_step=step,
                                   latest_filename=latest_filename,
                                   meta_graph_suffix=meta_graph_suffix,
                                   write_meta_graph=write_meta_graph, **kwargs)
        dropped = [p for p in kept_before if p not in self._dense.last_checkpoints]
        self._prune(os.path.dirname(prefix) or ".", os.path.basename(save_path), dropped)
        if shards is not None:
            # Every rank has written its shard before any returns: a rank that reads the
            # latest checkpoint next (the Estimator's evaluation) finds this one whole.
            self._shard_paths.barrier(sess)
            from sparseflow.distributed import graph_world
            graph_world.record_checkpoint(written)
        return written

    def _save_sparse(self, final: str, incremental: bool, sess, shards=None) -> None:
        parent = os.path.dirname(final) or "."
        os.makedirs(parent, exist_ok=True)
        tmp = f"{final}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        entries, windows = {}, []
        try:
            for table in self._tables():
                window = take_window(table)
                windows.append((table, window))
                state = capture(table, window if incremental else None, sess)
                config = {"key_dtype": table.key_dtype.name, "dim": table.dim,
                          "capacity": table.capacity(),
                          "access_threshold": table.access_threshold,
                          "eviction_threshold": table.eviction_threshold}
                entries[table.table_name] = fmt.write_table_state(tmp, table.table_name, state,
                                                                  table.dim, config)
            fmt.write_manifest(tmp, entries, os.path.basename(self._last_sparse)
                               if incremental else None, shards)
            if os.path.exists(final):  # the same step saved again: replace it
                old = f"{final}.old-{os.getpid()}"
                os.rename(final, old)
                os.rename(tmp, final)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.rename(tmp, final)
        except BaseException:
            for table, window in windows:  # not saved: the next save must still see them
                restore_window(table, window)
            raise

    def _prune(self, directory: str, base: str, dropped: list) -> None:
        """Deletes this saver's sparse parts whose dense checkpoint TF's Saver has deleted
        (max_to_keep), unless a kept incremental checkpoint builds on them: those of
        ``base`` (``sparse-<base>``, ``sparse-<base>-<step>``) and of the prefixes TF's
        Saver just ``dropped`` (a save path that changes with every save). Other savers'
        checkpoints in the directory (another rank's, whose dense part may not be written
        yet) are not this saver's to delete."""
        if self.max_to_keep == 0:
            return
        own = f"sparse-{base}"
        theirs = {f"sparse-{os.path.basename(p)}" for p in dropped
                  if os.path.dirname(os.path.abspath(p)) == os.path.abspath(directory)}
        names = [n for n in os.listdir(directory)
                 if (n == own or n in theirs
                     or (n.startswith(own + "-") and n[len(own) + 1:].isdigit()))
                 and os.path.isdir(os.path.join(directory, n))]
        kept = set()
        for name in names:
            # A V2 checkpoint exists when its index file does (what TF's deprecated
            # checkpoint_exists checked).
            if not os.path.exists(os.path.join(directory, name[len("sparse-"):]) + ".index"):
                continue
            link = name
            while link is not None and link not in kept:  # keep its chain of bases too
                kept.add(link)
                try:
                    link = fmt.read_manifest(os.path.join(directory, link)).get("base")
                except fmt.CheckpointError:
                    link = None
        for name in names:
            if name not in kept:
                shutil.rmtree(os.path.join(directory, name), ignore_errors=True)

    def restore(self, sess, save_path) -> None:
        """Restores dense variables and every saved table from a checkpoint prefix.

        Every sparse file is verified (size and CRC32) and parsed before any table changes;
        restore into tables of another capacity works as long as the keys fit. Call it before
        the first training step (batches already processed would hold pre-restore rows).
        A checkpoint saved by another number of ranks is read from every rank's shard, and
        each rank keeps the keys it owns now (:func:`read_rank_states`).

        Raises:
          CheckpointError: the sparse part is missing, corrupt or truncated (naming the file).
          ValueError: a table of the checkpoint does not exist now, or its keys do not fit.
        """
        if not isinstance(save_path, str):
            fail("save_path", "a checkpoint prefix (str)", save_path, TypeError)
        if not self._runtime.pipeline_started:
            raise RuntimeError("Saver.restore() needs a started pipeline (the tables' slot "
                               "layout): call start_asc_pipeline() first.")
        directory = sparse_path(save_path)
        tables = read_rank_states(directory, self._runtime.world, known=self._runtime.tables,
                                  skip_unknown=self.restore_fewer_tables)
        for name, state in tables.items():
            check_fits(self._runtime.tables[name], state, repr(directory))
        self._dense.restore(sess, save_path)
        for name, state in tables.items():
            apply(self._runtime.tables[name], state, repr(directory), sess)
        self._last_sparse = directory  # the tables now equal it: the next delta's base


# A shard's directory, as bytes in an int32 tensor, for the ranks' all-gather.
_PATH_BYTES = 4096


class ShardPaths:
    """Where every rank writes its shard of a checkpoint: an all-gather of the ranks'
    sparse directories, built with the Saver (the graph may be finalized by save time)
    and run by each rank's ``save``, which it also keeps in step.

    Args:
      world: the ranks (``graph_world.GraphWorld``).
    """

    def __init__(self, world):
        from sparseflow.distributed import collectives

        self.world = world
        self._path = tf.compat.v1.placeholder(tf.int32, [1, _PATH_BYTES],
                                              name="sparseflow_shard_path")
        self._paths = collectives.all_gather(self._path)
        self._barrier = collectives.all_reduce(tf.constant(1, tf.int32), "sum")

    def barrier(self, sess) -> None:
        """Returns once every rank has called it (after writing its shard)."""
        sess.run(self._barrier)

    def exchange(self, sess, directory: str) -> dict:
        """Every rank's shard of the checkpoint whose sparse part this rank writes at
        ``directory``: ``{"rank": r, "size": N, "shards": [directory of rank 0, ...]}``,
        each relative to this directory's parent when it is below it, else absolute.

        Raises:
          ValueError: the directory's path is longer than 4096 bytes, or two ranks would
            write one directory (every rank was given the same save path).
        """
        encoded = os.path.abspath(directory).encode()
        if len(encoded) > _PATH_BYTES:
            fail("save_path", f"a path of at most {_PATH_BYTES} bytes", directory)
        row = np.zeros([1, _PATH_BYTES], np.int32)
        row[0, :len(encoded)] = np.frombuffer(encoded, np.uint8)
        gathered = sess.run(self._paths, feed_dict={self._path: row})
        parent = os.path.dirname(os.path.abspath(directory))
        shards = []
        for r in range(self.world.size):
            path = bytes(gathered[r][gathered[r] > 0].astype(np.uint8)).decode()
            relative = os.path.relpath(path, parent)
            shards.append(relative if not relative.startswith("..") else path)
        if len(set(shards)) < len(shards):   # the same list on every rank: all raise
            fail("save_path", f"a path of its own on each of the {self.world.size} ranks "
                 f"(e.g. with the rank id in it, as Rec SDK's model-{{rank_id}}): every "
                 f"rank saves its shard", directory)
        return {"rank": self.world.rank, "size": self.world.size, "shards": shards,
                "hash": self.world.hash}


def read_rank_states(directory: str, world, known=None, skip_unknown: bool = False) -> dict:
    """The tables this rank holds after restoring the checkpoint whose sparse part (this
    rank's shard, or the one process's) is ``directory``.

    Saved by as many ranks as run now, this rank's own shard is read. Saved by another
    number (N ranks to M, one process to several, several to one), every shard the
    manifest lists is read and each table re-split by owner: this rank keeps the keys it
    owns among M, with their rows, slots, counts and timestamps (``sharding.rebucket``).

    Args:
      directory: the sparse directory (``sparse_path(prefix)``).
      world: the ranks now (``GraphWorld``), or None for one process.
      known, skip_unknown: as for :func:`read_sparse_states`.

    Raises:
      CheckpointError: a shard is missing, corrupt or truncated (naming the file).
      ValueError: as :func:`read_sparse_states`.
    """
    from sparseflow.distributed.sharding import rebucket

    rank, size = (world.rank, world.size) if world is not None else (0, 1)
    hash_ = world.hash if world is not None else "mod"
    saved = fmt.read_manifest(directory).get("world") or {"rank": 0, "size": 1,
                                                          "shards": [directory]}
    # The same owners: as many ranks under the same owner rule (checkpoints written before
    # the rule was recorded used "mod").
    same = saved["size"] == size and (size == 1 or saved.get("hash", "mod") == hash_)
    if same and saved["rank"] == rank:
        return _read_states(directory, known, skip_unknown)
    parent = os.path.dirname(os.path.abspath(directory))
    if same:   # another rank's prefix: this rank's shard is listed in it
        return _read_states(os.path.join(parent, saved["shards"][rank]), known, skip_unknown)
    shards = [_read_states(os.path.join(parent, path), known, skip_unknown)
              for path in saved["shards"]]
    names = sorted({name for shard in shards for name in shard})
    for name in names:
        for r, shard in enumerate(shards):
            if name not in shard:
                raise fmt.CheckpointError(
                    f"Checkpoint shard {saved['shards'][r]!r} (rank {r} of {saved['size']}) "
                    f"has no table `{name}`, which the other shards hold.")
    return {name: rebucket([shard[name] for shard in shards], size, hash_)[rank]
            for name in names}
