"""Which worker this process is, from ``TF_CONFIG`` (what ``MultiWorkerMirroredStrategy``
reads too), and the ``TF_CONFIG`` of each local worker ``sparseflow train --workers N``
starts."""

from __future__ import annotations

import dataclasses
import json
import os


@dataclasses.dataclass(frozen=True)
class World:
    """This worker's place: ``index`` in ``[0, size)``; ``size`` workers in all."""

    index: int
    size: int

    @property
    def chief(self) -> bool:
        """Worker 0 writes what is written once (dense checkpoints, the summary)."""
        return self.index == 0


def world_from_env(environ=None) -> World | None:
    """The world ``TF_CONFIG`` describes, or None when it is unset.

    ``TF_CONFIG`` is JSON: ``{"cluster": {"worker": ["host:port", ...]}, "task": {"type":
    "worker", "index": i}}``.

    Raises:
      ValueError: ``TF_CONFIG`` is not such JSON (names what is wrong and shows the value).
    """
    environ = os.environ if environ is None else environ
    raw = environ.get("TF_CONFIG")
    if not raw:
        return None
    example = ('{"cluster": {"worker": ["host1:2222", "host2:2222"]}, '
               '"task": {"type": "worker", "index": 0}}')
    try:
        config = json.loads(raw)
        workers = config["cluster"]["worker"]
        task = config["task"]
        index = task["index"]
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"Environment variable TF_CONFIG must be JSON like {example}; "
                         f"received {raw!r} ({type(err).__name__}: {err}).") from None
    if set(config["cluster"]) - {"worker"}:
        raise ValueError(f"TF_CONFIG's cluster must list workers only (no chief, ps or "
                         f"evaluator: every worker trains); received jobs "
                         f"{sorted(config['cluster'])}.")
    if not isinstance(workers, list) or not workers or not all(
            isinstance(w, str) for w in workers):
        raise ValueError(f"TF_CONFIG's cluster.worker must be a non-empty list of "
                         f"'host:port' strings; received {workers!r}.")
    if task.get("type") != "worker" or not isinstance(index, int) or isinstance(
            index, bool) or not 0 <= index < len(workers):
        raise ValueError(f"TF_CONFIG's task must be {{\"type\": \"worker\", \"index\": i}} "
                         f"with i in [0, {len(workers) - 1}]; received {task!r}.")
    return World(index, len(workers))


def local_tf_config(ports: list[int], index: int) -> str:
    """The ``TF_CONFIG`` of local worker ``index`` of ``len(ports)`` on loopback."""
    return json.dumps({"cluster": {"worker": [f"localhost:{p}" for p in ports]},
                       "task": {"type": "worker", "index": index}})
