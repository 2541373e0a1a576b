"""tests/workers/sequence.py, which runs several test programs in one process: each run sees
its own argv, environment, directory and sibling modules, and a failed run fails alone."""

import json

from tests.rank_runs import run_sequence

PROGRAM = """
import json, os, sys
import tensorflow as tf
from helper import NAME
assert tf.compat.v1.get_default_graph().get_operations() == [], "graph not fresh"
tf.constant(1.0, name="left_behind")
if os.environ.get("FAIL"):
    raise RuntimeError(os.environ["FAIL"])
with open("out.json", "w") as f:
    json.dump({"argv": sys.argv[1:], "helper": NAME, "seen": os.environ.get("SEEN"),
               "unset": os.environ.get("UNSET")}, f)
"""


def test_each_run_sees_its_own_argv_env_directory_and_modules_and_fails_alone(tmp_path,
                                                                            monkeypatch):
    runs = []
    for name in ("one", "two", "three", "four"):
        program = tmp_path / f"program-{name}"
        program.mkdir()
        (program / "main.py").write_text(PROGRAM)
        (program / "helper.py").write_text(f"NAME = {name!r}\n")
        runs.append({"label": name, "path": str(program / "main.py"), "argv": [name, 1],
                     "cwd": str(program), "rename": {"out.json": f"{name}.json"},
                     "env": {"SEEN": name} if name == "one" else {"UNSET": None}
                     if name == "three" else {"FAIL": f"{name} broke"}})
    monkeypatch.setenv("UNSET", "inherited")
    statuses = run_sequence(runs, None, tmp_path)
    assert statuses["one"] == "ok" and statuses["three"] == "ok"
    # Each failed run reports its own error, not the first one's.
    assert "two broke" in statuses["two"] and "four broke" not in statuses["two"]
    assert "four broke" in statuses["four"] and "two broke" not in statuses["four"]
    one = json.loads((tmp_path / "program-one" / "one.json").read_text())
    three = json.loads((tmp_path / "program-three" / "three.json").read_text())
    assert one == {"argv": ["one", "1"], "helper": "one", "seen": "one", "unset": "inherited"}
    # run three: its own helper.py, the first run's SEEN gone again, UNSET unset.
    assert three == {"argv": ["three", "1"], "helper": "three", "seen": None, "unset": None}
    assert not (tmp_path / "program-two" / "two.json").exists()
