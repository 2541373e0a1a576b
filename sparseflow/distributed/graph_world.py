"""The ranks of a ``tf.compat.v1`` graph program (the Session API, ``mx_rec``): one gRPC
server per rank, sessions bound to it, and collectives as graph ops.

A Rec SDK program opens ``tf.compat.v1.Session(config=...)`` itself, a local session that
cannot reach another process. When :func:`join` has made this process one of N ranks,
sessions created with no target are opened on this rank's server instead, with the config
TensorFlow's graph-mode collectives need (``collective_group_leader``, and
``device_filters`` so that the graph runs on this rank's devices only). The program's text
does not change.

Collective ops in a graph are run by every rank once per ``Session.run`` that fetches them,
in an order the executor chooses. Each op is a collective group of its own, numbered when
it is built (the same order on every rank, which runs the same script), and each run of it
takes the next instance key (``GraphExchange``). A step whose collectives include an
all-to-all also holds a reduction (the width agreement), without which TensorFlow's master
runs the step without a collective executor. Each run that executes collectives carries a
collective graph key that changes after a failed one (``step_keys.py``), so that a step
ending the data cannot break the next.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import threading

import tensorflow as tf

from sparseflow.distributed.cluster import World, address_in_use, world_from_env
from sparseflow.distributed.exchange import RunKeyedExchange
from sparseflow.distributed.ranks import Ranks
from sparseflow.distributed.step_keys import StepKeys
from sparseflow.pipeline.graph_cache import graph_cache

# Above the keys of the eager Exchange's groups (1000-1002).
GRAPH_GROUP_KEY = 2000
DEFAULT_TIMEOUT_SECONDS = 300.0
TIMEOUT_VARIABLE = "SPARSEFLOW_COLLECTIVE_TIMEOUT"
_LEADER = "/job:worker/replica:0/task:0"


def collective_timeout(environ=None) -> float:
    """Seconds a collective among the ranks may wait for its peers before it fails (a rank
    died, hung or left): ``SPARSEFLOW_COLLECTIVE_TIMEOUT``, default 300 (generous: a first
    step traces and allocates).

    Raises:
      ValueError: the variable is not a number in (0, 86400].
    """
    import os

    environ = os.environ if environ is None else environ
    raw = environ.get(TIMEOUT_VARIABLE, "")
    if not raw:
        return DEFAULT_TIMEOUT_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 86_400:
        raise ValueError(f"Environment variable {TIMEOUT_VARIABLE} must be a number of "
                         f"seconds in (0, 86400]; received {raw!r}.")
    return value


class RankLostError(tf.errors.DeadlineExceededError):
    """A collective among the ranks did not complete: another rank died, hung or left
    (see :func:`rank_lost_error`)."""


def rank_lost_error(err, world: "GraphWorld"):
    """``err`` (a collective's failure) as the error a user reads: which rank, why a peer
    is presumed lost, and the last checkpoint every rank completed. A
    ``tf.errors.DeadlineExceededError`` (not the preemption errors a MonitoredSession
    would recreate its session on, waiting for a peer that is gone)."""
    last = last_complete_checkpoint()
    lines = [line.strip() for line in err.message.splitlines() if line.strip()]
    cause = next((line for line in lines if "ollective" in line), lines[0] if lines else "")
    message = (f"Rank {world.rank} of {world.size}: a collective among the ranks did not "
               f"complete, so another rank died, hung or left (collectives wait "
               f"{world.timeout_seconds:g} s, {TIMEOUT_VARIABLE}). The last checkpoint every "
               f"rank completed: "
               + (f"{last} (restore it on a rerun to resume)." if last else "none.")
               + f" Cause: {type(err).__name__}: {cause}")
    return RankLostError(err.node_def, err.op, message)


_CHECKPOINTS: list = []


def record_checkpoint(prefix: str) -> None:
    """A Saver of this rank wrote the checkpoint ``prefix`` (for :func:`rank_lost_error`)."""
    _CHECKPOINTS.append(prefix)


def last_complete_checkpoint() -> str | None:
    """The newest checkpoint this rank saved whose every shard is complete, or None."""
    from sparseflow.checkpoint.saver import every_shard_written

    return next((p for p in reversed(_CHECKPOINTS) if every_shard_written(p)), None)


@dataclasses.dataclass
class GraphWorld:
    """This rank's place among the ranks of a graph program and its running server (None
    in a world of one rank, which needs no collectives).

    ``hash`` is the owner rule of every table's keys (``sharding.owner_of``: "mod", Rec
    SDK's ``key mod N``, or "mix"); ``send_count``, if set, the most unique keys of one
    table a rank sends one owner per batch (a static buffer width; None: the ranks agree on
    each batch's width). A YAML job sets both (:func:`configure`).
    """

    rank: int
    size: int
    server: object
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    hash: str = "mod"
    send_count: int | None = None

    @property
    def target(self) -> str:
        """The ``Session`` target of this rank's server."""
        return self.server.target

    def session_config(self, config=None):
        """``config`` (a ``ConfigProto`` or None) with what graph collectives need."""
        merged = tf.compat.v1.ConfigProto()
        if config is not None:
            merged.CopyFrom(config)
        merged.experimental.collective_group_leader = _LEADER
        own = f"/job:worker/task:{self.rank}"
        if own not in merged.device_filters:
            del merged.device_filters[:]
            merged.device_filters.append(own)
        return merged

    def exchange(self, graph=None) -> "GraphExchange":
        """The collectives (a :class:`GraphExchange`, one per graph) that ops built in
        ``graph`` (default: the current one) run among the ranks."""
        graph = graph or tf.compat.v1.get_default_graph()
        cache = graph_cache(graph, "graph_exchange")
        if "exchange" not in cache:
            # No timeout on the ops: TensorFlow starts a thread per collective run that has
            # one, which sleeps out the timeout (15 threads a step lived 300 s: a 2-rank job
            # held 8,000 threads after 40 s and would exhaust the machine's pids). A
            # collective step's Session.run carries the timeout instead (bind_sessions).
            cache["exchange"] = GraphExchange(self.size, 0.0, graph)
        return cache["exchange"]


class GraphExchange(RunKeyedExchange):
    """:class:`RunKeyedExchange` for a graph program: each collective op a group numbered
    from one process-wide counter (graphs are built in the same order on every rank)."""

    def __init__(self, world_size: int, timeout_seconds: float, graph):
        del graph   # groups are numbered across graphs: an old graph's ids stay its own
        super().__init__(world_size, timeout_seconds, lambda: next(_GROUPS))


# Group keys of graph collective ops: above the eager Exchange's (1000-1002) and the TF2
# faces' (1010).
_GROUPS = itertools.count(GRAPH_GROUP_KEY)


_WORLD: GraphWorld | None = None
_LOCK = threading.Lock()


def current() -> GraphWorld | None:
    """The world :func:`join` made, or None (one process)."""
    return _WORLD


def join(ranks: Ranks, environ=None) -> GraphWorld:
    """Makes this process rank ``ranks.rank`` of ``ranks.size`` for graph programs: starts
    its gRPC server from ``TF_CONFIG``, opens sessions created without a target on it and
    waits until every rank has joined (as HCCL's set-up under Rec SDK's ``init()`` does).
    A second call returns the same world.

    Args:
      ranks: what ``ranks.detect`` found (size > 1).
      environ: the environment to read ``TF_CONFIG`` from (default ``os.environ``).

    Returns:
      The :class:`GraphWorld`.

    Raises:
      RuntimeError: no ``TF_CONFIG`` names the ranks' addresses, or it disagrees with
        ``ranks``; both say what was found.
      AddressInUseError: this rank's server could not listen on its address.
      RankLostError: a rank did not join within the collective timeout
        (``SPARSEFLOW_COLLECTIVE_TIMEOUT``).
    """
    global _WORLD
    with _LOCK:
        if _WORLD is not None:
            return _WORLD
        world = world_from_env(environ)
        if world is None:
            raise RuntimeError(
                f"This process is rank {ranks.rank} of {ranks.size} ({ranks.source}), but no "
                f"TF_CONFIG gives the ranks' addresses, which TensorFlow's collectives need. "
                f"Start the script with `sparseflow launch -n {ranks.size} script.py ...` "
                f"(it sets TF_CONFIG), or set TF_CONFIG on every rank to "
                f'{{"cluster": {{"worker": ["host:port", ...]}}, "task": {{"type": "worker", '
                f'"index": RANK}}}}.')
        if (world.index, world.size) != (ranks.rank, ranks.size):
            raise RuntimeError(
                f"TF_CONFIG makes this process worker {world.index} of {world.size}, but "
                f"{ranks.source} says rank {ranks.rank} of {ranks.size}: they must agree.")
        timeout = collective_timeout(environ)
        server = _start_server(world, environ)
        _WORLD = GraphWorld(world.index, world.size, server, timeout)
        _bind_sessions(_WORLD)
        _meet(_WORLD)
        return _WORLD


def _meet(world: GraphWorld) -> None:
    """Returns once every rank has joined (one all-reduce, in a graph of its own), or raises
    :class:`RankLostError` after ``world.timeout_seconds``. Rec SDK's ``init()`` meets every
    rank (HCCL's set-up), and programs written for it rely on that: each rank clears what
    the ranks share (a model_dir) before ``init()`` and writes there after; a rank that went
    on alone lost what it wrote to a later rank's clearing."""
    graph = tf.Graph()
    with graph.as_default():
        met = world.exchange(graph).reduce(tf.constant(1, tf.int32), "Add")
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(met)


def configure(*, hash: str = "mod", send_count: int | None = None,
              timeout_seconds: float | None = None) -> None:
    """Sets the current world's owner rule, static send width and collective timeout
    (:class:`GraphWorld`); call before the tables and lookups are built. No world: nothing
    to set."""
    world = _WORLD
    if world is None:
        return
    world.hash, world.send_count = hash, send_count
    if timeout_seconds is not None:
        world.timeout_seconds = float(timeout_seconds)


@contextlib.contextmanager
def one_rank():
    """A world of one rank for the ``with`` block (none joined before it): the sharded
    layer's path with no collectives (its ops are identities), so that one process keys,
    counts and evicts at the owner in the step exactly as N ranks do. Restored on exit.

    Raises:
      RuntimeError: this process is already one of several ranks.
    """
    global _WORLD
    with _LOCK:
        if _WORLD is not None:
            raise RuntimeError(f"This process is already rank {_WORLD.rank} of {_WORLD.size}.")
        _WORLD = GraphWorld(0, 1, None)
        _CHECKPOINTS.clear()
    try:
        yield _WORLD
    finally:
        with _LOCK:
            _WORLD = None
            _CHECKPOINTS.clear()   # its checkpoints are no later run's


def _start_server(world: World, environ=None):
    import json
    import os

    environ = os.environ if environ is None else environ
    cluster = tf.train.ClusterSpec(json.loads(environ["TF_CONFIG"])["cluster"])
    config = tf.compat.v1.ConfigProto()
    config.experimental.collective_group_leader = _LEADER
    config.device_filters.append(f"/job:worker/task:{world.index}")
    try:
        return tf.distribute.Server(cluster, job_name="worker", task_index=world.index,
                                    config=config, protocol="grpc", start=True)
    except tf.errors.UnknownError as err:
        if "Could not start gRPC server" not in str(err):
            raise
        raise address_in_use(world, "rank") from None


def _bind_sessions(world: GraphWorld) -> None:
    """Sessions created with no target from now on run on ``world``'s server; a run whose
    collective fails says that a rank was lost (:func:`rank_lost_error`)."""
    from tensorflow.python.client import session

    original = session.Session.__init__
    if getattr(original, "_sparseflow_bound", False):
        return

    @functools.wraps(original)
    def __init__(self, target="", graph=None, config=None):
        bound = _WORLD
        if bound is not None and not target:
            target, config = bound.target, bound.session_config(config)
        original(self, target, graph, config)

    original_run = session.Session.run

    @functools.wraps(original_run)
    def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
        bound = _WORLD
        keyed = False
        if bound is not None:
            options, keyed = _STEP_KEYS.run_options(self.graph, fetches, options,
                                                    bound.timeout_seconds)
        try:
            return original_run(self, fetches, feed_dict, options, run_metadata)
        except tf.errors.OpError as err:
            if keyed:
                _STEP_KEYS.failed()
            # A peer's collective timing out, the channel to it failing, or this rank's
            # collective executor aborted after another collective failed.
            # A collective step past its deadline (its run's timeout) waited for a peer.
            timed_out = keyed and isinstance(err, tf.errors.DeadlineExceededError)
            if bound is None or not isinstance(err, _PEER_ERRORS) or not (
                    timed_out or _from_collective(err)):
                raise
            raise rank_lost_error(err, bound) from err

    __init__._sparseflow_bound = True
    __init__._sparseflow_original = original
    session.Session.__init__ = __init__
    session.Session.run = run


_PEER_ERRORS = (tf.errors.DeadlineExceededError, tf.errors.UnavailableError,
                tf.errors.CancelledError, tf.errors.AbortedError, tf.errors.InternalError)
_STEP_KEYS = StepKeys()


def _from_collective(err) -> bool:
    return not isinstance(err, RankLostError) and (
        "ollective" in err.message or "sparseflow_collective" in err.message)
