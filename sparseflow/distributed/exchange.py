"""The all-to-all between workers: per-owner buffers out, what each owner sent back in.

Built on TensorFlow's own collectives: ``tf.raw_ops.CollectiveAllToAllV2`` under a
``tf.distribute.MultiWorkerMirroredStrategy`` (which starts the gRPC server and the collective
executor on every worker; see docs/design-notes.md, "Multi-worker training"). Every worker
gives the same collective the same group and instance keys: :class:`Exchange` counts them
in a variable, :class:`RunKeyedExchange` (graphs run by a Session) numbers its ops,
:class:`CountedExchange` (eager code and ``tf.function``s) hashes each collective's
signature; an exchange buffer whose width varies keeps one key per width rung
(``width_buckets``).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import threading

import numpy as np
import tensorflow as tf

from sparseflow.distributed import width_buckets
from sparseflow.ops.progress_ops import FINISHED, STARTED
from sparseflow.validation import INT32_MAX, check_float, check_int

# Above the group keys the strategy allocates for itself (1, 2, ...).
GROUP_KEY = 1000
FIRST_INSTANCE_KEY = 10_000


class Exchange:
    """All-to-all of ``[world_size, ...]`` buffers among the strategy's workers.

    Args:
      world_size: workers in the group (the strategy's ``num_replicas_in_sync``).
      timeout_seconds: a collective that has not completed by then raises
        ``DeadlineExceededError`` (a dead or stuck peer); generous, because it also ends a
        step that is only slow (a first trace on a loaded machine).
      group_key: the collective group's key.

    Raises:
      ValueError: an argument out of range.
    """

    def __init__(self, world_size: int, timeout_seconds: float = 60.0,
                 group_key: int = GROUP_KEY):
        self.world_size = check_int("world_size", world_size, 1, INT32_MAX)
        self.timeout_seconds = check_float("timeout_seconds", timeout_seconds, 0.0, 86_400.0,
                                           low_open=True)
        self.group_key = check_int("group_key", group_key, 1, INT32_MAX)
        self._instance = tf.Variable(FIRST_INSTANCE_KEY, dtype=tf.int32, trainable=False,
                                     name="sparseflow_collective_instance")

    def _keys(self, n: int, after: tf.Tensor | None = None):
        with tf.control_dependencies(_ready(after)):
            last = self._instance.assign_add(n)
        return [last - n + 1 + i for i in range(n)]

    def _id(self, after: tf.Tensor | None = None):
        """The next collective's ``(group_key, instance_key)``, the key taken once ``after``
        (the data the collective waits for) is computed."""
        return self.group_key, self._keys(1, after)[0]

    def _run(self, op, x: tf.Tensor, rung=None, **attrs) -> tf.Tensor:
        """Collective ``op`` (a ``tf.raw_ops`` V2 collective) of ``x`` under this
        exchange's group, its instance key taken once ``x`` is computed (``rung``: as
        :meth:`all_to_all`; no rungs here)."""
        group, key = self._id(after=x)
        return op(input=x, group_size=self.world_size, group_key=group, instance_key=key,
                  ordering_token=[], timeout_seconds=self.timeout_seconds, **attrs)

    @contextlib.contextmanager
    def watched_as_one(self):
        """The collectives built inside report to the process's collective watchdog as one
        (:class:`CountedExchange`): started before the first, finished after all of them.
        Other exchanges have no watchdog: nothing changes. Yields a :class:`WatchSpan`."""
        yield WatchSpan(None)

    def all_to_all(self, x: tf.Tensor, rung=None) -> tf.Tensor:
        """``x`` ``[world_size, ...]`` (row r for worker r) in; row r of the result came from
        worker r. Same shape on every worker. One worker: ``x`` itself.

        ``rung``: for an exchange buffer ``[world_size, m, ...]`` whose ``m`` is already a
        rung of ``width_buckets.RUNGS`` (what :meth:`all_to_all_dynamic` received, and the
        buffers of its replies), the rung's index (int or int32 scalar tensor): the buffer
        is sent as it is, not padded to its rung again (~20 ops per collective, 26 Keras
        layers' exchanges: ~1,600 ops a step)."""
        if self.world_size == 1:
            return tf.convert_to_tensor(x)
        return self._run(tf.raw_ops.CollectiveAllToAllV2, x, communication_hint="auto",
                         rung=rung)

    def reduce(self, x: tf.Tensor, op: str) -> tf.Tensor:
        """Element-wise ``op`` (``"Add"``, ``"Max"``, ``"Min"`` or ``"Mul"``) of ``x`` over
        the workers (same shape everywhere); every worker gets the result. One worker: ``x``
        itself."""
        if op not in ("Add", "Max", "Min", "Mul"):
            raise ValueError(f"Argument `op` must be Add, Max, Min or Mul; received: {op!r}")
        if self.world_size == 1:
            return tf.convert_to_tensor(x)
        return self._run(tf.raw_ops.CollectiveReduceV2, x, merge_op=op, final_op="Id")

    def gather(self, x: tf.Tensor) -> tf.Tensor:
        """Every worker's ``x`` (same shape everywhere) concatenated along axis 0, in worker
        order. One worker: ``x`` itself."""
        if self.world_size == 1:
            return tf.convert_to_tensor(x)
        return self._run(tf.raw_ops.CollectiveGatherV2, x)

    def all_to_all_dynamic(self, x: tf.Tensor, counts: tf.Tensor, pad_value=0,
                           also_max: tf.Tensor | None = None, with_rung: bool = False):
        """``use_dynamic``: rows of ``x`` ``[world_size, width, ...]`` hold ``counts[r]`` real
        entries each (``counts`` int ``[world_size]``, or ``[world_size, parts]`` counting
        each part of a row); the workers exchange counts and agree on the widest ``x``, then
        exchange ``x`` padded (with ``pad_value``) to it, rounded up to its rung of
        ``width_buckets.RUNGS``: each worker's width may differ.

        Args:
          also_max: an int64 scalar whose largest value over the workers the counts'
            all-to-all finds too (e.g. the step's timestamp), or None.

          with_rung: also return the rung's index (int32 scalar), for the replies'
            :meth:`all_to_all` (``rung``).

        Returns:
          (received ``[world_size, m, ...]``, ``m`` the rung of the widest ``x``; received
          counts int32 shaped as ``counts``; the largest ``also_max`` (int64; -1 without
          one)), and with ``with_rung`` the rung's index.
        """
        x = tf.convert_to_tensor(x)
        # The counts and the width (a constant when x's shape is static) wait for x: a step
        # whose batch never arrives (the end of the data) then launches no collective on any
        # rank, instead of one that a peer's aborted step leaves half done.
        with tf.control_dependencies([x]):
            counts = tf.identity(tf.cast(counts, tf.int32))
            width = tf.identity(tf.cast(tf.shape(x)[1], tf.int64))
        n = self.world_size
        rows = tf.reshape(counts, [n, -1])
        parts = rows.shape[1] if rows.shape[1] is not None else tf.shape(rows)[1]
        extra = tf.constant(-1, tf.int64) if also_max is None else tf.cast(also_max, tf.int64)
        # One all-to-all carries each worker's counts for the receiver together with its
        # width and ``also_max`` (the same to every receiver, ``also_max`` as two int32s):
        # the largest that arrive are the workers' largest. Two collectives (an all-to-all
        # and a max-reduce) took two rounds of loopback latency per exchange.
        mine = tf.concat([tf.cast(width, tf.int32)[None], tf.bitcast(extra, tf.int32)], 0)
        header = tf.concat([rows, tf.tile(mine[None], [n, 1])], 1)
        received = self.all_to_all(header)
        received_counts = tf.reshape(received[:, :parts], counts.shape if
                                     counts.shape.is_fully_defined() else tf.shape(counts))
        most_width = tf.reduce_max(received[:, parts])
        most_extra = tf.reduce_max(tf.bitcast(received[:, parts + 1:], tf.int64))
        # Padded to the width's rung (``width_buckets``): a few shapes over a run, each with
        # one instance key, instead of a fresh key per width.
        rung, index = width_buckets.rounded_width(most_width)
        short = rung - tf.shape(x)[1]
        padding = [[0, 0], [0, short]] + [[0, 0]] * (x.shape.rank - 2)
        x = tf.pad(x, padding, constant_values=tf.cast(pad_value, x.dtype))
        received = self.all_to_all(x, rung=index)
        return ((received, received_counts, most_extra, index) if with_rung
                else (received, received_counts, most_extra))


class RunKeyedExchange(Exchange):
    """:class:`Exchange` for graphs whose collective ops may execute in any order (a
    ``tf.compat.v1`` graph run by a Session), needing no variable. Each collective op is a
    group of its own, numbered when it is built (the same order on every rank: every rank
    builds the same graphs). An op of a static shape keeps instance key
    :data:`FIXED_INSTANCE_KEY`, an all-to-all of an exchange buffer ``[N, m, ...]`` whose
    width varies is padded to its rung and keeps key ``FIRST_RUNG_KEY + `` the rung's index
    (the ranks share each step's id, which keeps the runs apart; TensorFlow keeps a resolved
    instance's shape for its ids, and a rung's shape is always the same); any other op
    counts its runs.

    Args:
      world_size, timeout_seconds: as :class:`Exchange`.
      groups: returns the next op's group key, the same sequence on every rank.
    """

    def __init__(self, world_size: int, timeout_seconds: float, groups):
        self.world_size = world_size
        self.timeout_seconds = timeout_seconds
        self._groups = groups

    def _id(self, after: tf.Tensor | None = None):
        if after is not None and after.shape.is_fully_defined():
            # One shape every run: the runs share the op's ids (all ranks agree on each
            # run's step id, which keeps the runs' buffers apart), so TensorFlow resolves
            # the instance once instead of asking the group's leader on every run, and no
            # Python call takes a key.
            return self._groups(), tf.constant(FIXED_INSTANCE_KEY, tf.int32)
        return self._groups(), _counted_key(_run_counter(1), after)

    def _run(self, op, x: tf.Tensor, rung=None, **attrs) -> tf.Tensor:
        if x.shape.is_fully_defined() or not (_is_all_to_all(op) and _rung_shaped(x)):
            return super()._run(op, x, **attrs)
        # A width that varies: padded to its rung, each rung one key of the op's group,
        # for the reason a static shape keeps one.
        padded, index, width = _to_rung(x, rung)
        key = FIRST_RUNG_KEY + index
        out = op(input=padded, group_size=self.world_size, group_key=self._groups(),
                 instance_key=key, ordering_token=[], timeout_seconds=self.timeout_seconds,
                 **attrs)
        return out if width is None else out[:, :width]


# The instance key of every run of a RunKeyedExchange op whose input has a static shape.
FIXED_INSTANCE_KEY = 1
# A RunKeyedExchange op whose width varies: the key of rung i is FIRST_RUNG_KEY + i.
FIRST_RUNG_KEY = 2

# Each RunKeyedExchange op counts its runs with one of these (a name tests can watch).
_run_counter = itertools.count

# The instance keys of CountedExchange: one counter for every exchange of the process.
_COUNTED_RUNS = itertools.count(1)

COUNTED_KEY_LIMIT = 1 << 30   # counted instance keys wrap below this
# CountedExchange's collectives of a static or bucketed shape: a group per signature, a
# hash of it from here up (far above the strategy's groups and the graph faces' numbered
# ones).
SIGNATURE_GROUP_BASE = 1 << 24
_SIGNATURE_GROUPS: dict = {}   # group key -> signature, to catch two that hash alike
_SIGNATURE_LOCK = threading.Lock()


class CountedExchange(Exchange):
    """:class:`Exchange` for eager code and ``tf.function``s, needing no variable (a
    variable made under a distribution strategy's scope is the strategy's).

    Each all-to-all of an exchange buffer ``[world_size, m, ...]`` is padded along ``m``
    to its rung (``width_buckets``) and keeps one instance key per rung; any other
    collective of a static shape (a barrier) keeps one key. TensorFlow resolves each key
    once instead of asking the group's leader on every run, and no Python call takes a
    key. The group is a hash of the collective's signature: the exchange's group, the
    number of the op chain it is built in (``op_chains``: chains are numbered in the order
    first opened in their graph), the op, the shape with ``m`` left out, the dtype and the
    attributes. The same on every rank whatever else a rank built, so an exchange only one
    rank makes shifts nothing; two signatures of one process that hash alike are refused
    by name (about one chance in 10^11 for a hundred signatures).

    Runs of one key never meet: the collectives of one chain run in program order, a run
    ends only when its peers have what it sent, two chains' collectives (which may run at
    once) differ in signature, and an op that runs a function body (a ``tf.cond``, a loop)
    is ordered with every chain of its graph.

    A collective of any other varying shape takes the next count of one process-wide
    counter at run time as its instance key (in the exchange's group), which holds only
    for collectives that run in program order with every other such one: it is refused in
    an op chain. None of sparseflow's exchanges makes one.

    The collective ops carry no timeout (TensorFlow would start a thread per op run that
    sleeps out the timeout); the process's :class:`CollectiveWatchdog` enforces
    ``timeout_seconds`` instead, told when each collective starts and ends.

    Args:
      world_size, timeout_seconds, group_key: as :class:`Exchange`.
    """

    def __init__(self, world_size: int, timeout_seconds: float, group_key: int):
        from sparseflow.distributed.collective_watchdog import process_watchdog

        self.world_size = world_size
        self.timeout_seconds = timeout_seconds
        self.group_key = group_key
        self._watchdog = process_watchdog(timeout_seconds) if world_size > 1 else None
        self._span = _OpenSpan()

    def _id(self, after: tf.Tensor | None = None):
        return self.group_key, _counted_key(_COUNTED_RUNS, after, self._watchdog)

    def _run(self, op, x: tf.Tensor, rung=None, **attrs) -> tf.Tensor:
        from sparseflow.distributed import op_chains

        watchdog = self._watchdog
        chain = op_chains.current_number()
        width = None
        if _is_all_to_all(op) and _rung_shaped(x):
            x, index, width = _to_rung(x, rung)
            shape = (x.shape[0], None) + tuple(x.shape.as_list()[2:])
            key = FIRST_RUNG_KEY + index
        elif x.shape.is_fully_defined():
            shape = tuple(x.shape.as_list())
            key = FIXED_INSTANCE_KEY
        else:
            if chain is not None:
                raise RuntimeError(
                    f"A collective {op.__name__} of shape {x.shape} in an op chain: its "
                    f"instance key would be counted at run time, in an order that chains "
                    f"running side by side make different on each rank. Give it a static "
                    f"shape, or [world_size, None, ...] for an all-to-all.")
            return self._collective(op, x, *self._id(after=x), **attrs)
        group = _signature_group((self.group_key, chain, op.__name__, shape, x.dtype.name,
                                  tuple(sorted(attrs.items()))))
        span = self._span.current
        if span is None or not span.outputs:   # a span's first collective reports its start
            x = _after_mark(x, watchdog, STARTED, "sparseflow_collective_started")
        out = self._collective(op, x, group, key, report_end=span is None, **attrs)
        if span is not None:
            span.outputs.append(out)
        return out if width is None else out[:, :width]

    @contextlib.contextmanager
    def watched_as_one(self):
        """The chained collectives built inside (one exchange's counts, keys and rows) report
        to the watchdog as one: started before the first, finished once all have completed.
        Each report was a numpy function on the chain's path, ~30 us and a turn of the GIL
        (26 Keras layers' exchanges made ~200 of them a step); the span's start and end
        are now compiled ops, and an end that a numpy function reports
        (:meth:`WatchSpan.take_end`, :meth:`WatchSpan.guard`) is a call inside it. A span
        stays pending while the work between its collectives runs (the owners' key
        processing: milliseconds a step, seconds on a first step that loads its kernels,
        against a default timeout of 300 s).
        A numpy function between the collectives reports the span's end if it fails
        (:meth:`WatchSpan.guard`): the rest of the span never runs then. A collective whose
        instance key is counted at run time reports alone."""
        if self._span.current is not None:   # nested: the outer span reports
            yield WatchSpan(None)
            return
        span = WatchSpan(self._watchdog)
        self._span.current = span
        try:
            yield span
        except BaseException:
            # Eagerly, the span's first collective has run and reported its start: the end
            # report the span would have added never comes.
            if span.outputs and not span.end_taken and tf.executing_eagerly():
                self._watchdog.finished()
            raise
        finally:
            self._span.current = None
        if span.outputs and not span.end_taken:
            # A stateful op (compiled for the process's watchdog): a tf.function runs it in
            # the chain's order even though nothing reads it; eagerly it reports here, after
            # the collectives.
            _mark(self._watchdog, FINISHED, "sparseflow_collective_finished", span.outputs)

    def _collective(self, op, x: tf.Tensor, group, key, report_end: bool = True,
                    **attrs) -> tf.Tensor:
        """``op`` of ``x`` with these ids, no timeout; the watchdog told when it ends unless
        ``report_end`` is False (a span reports it)."""
        out = op(input=x, group_size=self.world_size, group_key=group, instance_key=key,
                 ordering_token=[], timeout_seconds=0.0, **attrs)
        if not report_end:
            return out
        return _after_mark(out, self._watchdog, FINISHED, "sparseflow_collective_finished")


def _is_all_to_all(op) -> bool:
    """Whether ``op`` is ``tf.raw_ops.CollectiveAllToAllV2`` (by name: tests pass fakes)."""
    return getattr(op, "__name__", "") == "collective_all_to_all_v2"


def _rung_shaped(x: tf.Tensor) -> bool:
    """Whether ``x`` is an exchange's buffer: ``[world_size, m, ...]``, every size but
    ``m``'s known."""
    dims = x.shape.as_list() if x.shape.rank is not None else None
    return (dims is not None and len(dims) >= 2
            and all(d is not None for i, d in enumerate(dims) if i != 1))


def _to_rung(x: tf.Tensor, rung=None):
    """``x`` ``[n, m, ...]`` padded with zeros along ``m`` to its rung: ``(padded, the
    rung's index (int or int32 tensor), m (int or int32 tensor))``. With ``rung`` (the
    index of the rung ``m`` already is: :meth:`Exchange.all_to_all`): ``(x, rung, None)``,
    nothing to pad or cut back."""
    if rung is not None:
        return x, rung, None
    width = x.shape[1] if x.shape[1] is not None else tf.shape(x)[1]
    rung, index = width_buckets.rounded_width(width)
    if isinstance(rung, int) and rung == width:
        return x, index, width
    padding = [[0, 0], [0, rung - width]] + [[0, 0]] * (x.shape.rank - 2)
    padded = tf.pad(x, padding)
    if isinstance(rung, int):
        padded = tf.ensure_shape(padded, [x.shape[0], rung] + x.shape.as_list()[2:])
    return padded, index, width


def _signature_group(signature: tuple) -> int:
    """The group key of CountedExchange collectives of ``signature``: a hash of it in
    ``[SIGNATURE_GROUP_BASE, INT32_MAX)``.

    Raises:
      RuntimeError: another signature of this process has the same group (about one chance
        in 10^11 for a hundred signatures), which TensorFlow would refuse for its shape.
    """
    digest = hashlib.blake2b(repr(signature).encode(), digest_size=8).digest()
    group = (SIGNATURE_GROUP_BASE
             + int.from_bytes(digest, "little") % (INT32_MAX - SIGNATURE_GROUP_BASE))
    with _SIGNATURE_LOCK:
        other = _SIGNATURE_GROUPS.setdefault(group, signature)
    if other != signature:
        raise RuntimeError(f"Two collectives of different signatures share the group key "
                           f"{group}: {other} and {signature}. Change either's shape.")
    return group


class WatchSpan:
    """The collectives of one :meth:`Exchange.watched_as_one`, in build order."""

    def __init__(self, watchdog):
        self.outputs: list = []
        self.end_taken = False
        self._watchdog = watchdog

    def take_end(self):
        """The span's end report, as a callable for the numpy function that consumes the
        span's last collective to call first (instead of a numpy function of its own).
        Returns a no-op when no watchdog watches the span or it has no collective yet."""
        if self._watchdog is None or not self.outputs:
            return _no_report
        self.end_taken = True
        return self._watchdog.finished

    def guard(self, function):
        """``function`` for a numpy function run between the span's collectives: if it
        raises, the step stops there and the span's end report never runs, so the wrapper
        reports it before the error goes on (else the watchdog would count the span pending
        and abort the rank's collectives once the timeout passed). ``function`` itself
        when no watchdog watches the span or it has no collective yet (nothing started)."""
        if self._watchdog is None or not self.outputs:
            return function
        finished = self._watchdog.finished

        def guarded(*args):
            try:
                return function(*args)
            except BaseException:
                self.end_taken = True   # eagerly, the span's own exit must not report again
                finished()
                raise

        return guarded


def _no_report() -> None:
    """Nothing watches the collectives: nothing to report."""


class _OpenSpan(threading.local):
    """The span this thread is building, or None."""

    def __init__(self):
        self.current: WatchSpan | None = None


def _mark(watchdog, which: int, name: str, after: list):
    """Reports a start (``STARTED``) or an end (``FINISHED``) to ``watchdog`` once every
    tensor of ``after`` is computed: in a graph, a stateful op (which a ``tf.function``
    runs even if nothing reads it; ``CollectiveWatchdog.report_op``, compiled for the
    process's watchdog: no turn of the GIL on the chain's path); eagerly, now. Returns
    the op (None eagerly)."""
    if tf.executing_eagerly():
        (watchdog.started if which == STARTED else watchdog.finished)()
        return None
    with tf.control_dependencies([t for a in after for t in _ready(a)]):
        return watchdog.report_op(which, name)


def _after_mark(x: tf.Tensor, watchdog, which: int, name: str) -> tf.Tensor:
    """``x``, once :func:`_mark` reported ``which`` after ``x`` was computed."""
    mark = _mark(watchdog, which, name, [x])
    with tf.control_dependencies([] if mark is None else [mark]):
        return tf.identity(x)


def _counted_key(runs, after: tf.Tensor | None = None, watchdog=None) -> tf.Tensor:
    """An int32 scalar instance key: the next count of ``runs``, taken each time the op
    runs, once ``after`` (if given) is computed; ``watchdog`` (if given) is told that a
    collective starts."""
    @tf.autograph.experimental.do_not_convert
    def next_run():
        if watchdog is not None:
            watchdog.started()
        return np.int32(1 + (next(runs) - 1) % (COUNTED_KEY_LIMIT - 1))

    # A key taken on one rank in a step that another rank aborts (its data never came)
    # would put the ranks' counts of this op out of step for good.
    with tf.control_dependencies(_ready(after)):
        key = tf.numpy_function(next_run, [], tf.int32, stateful=True,
                                name="sparseflow_collective_key")
    key.set_shape([])
    return key


def _ready(after) -> list:
    """Control inputs that hold a collective's instance key back until its data exists."""
    if after is None or tf.executing_eagerly():
        return []
    return [after]
