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


def test_over_ranks_a_run_starts_once_every_rank_ended_the_one_before(tmp_path):
    """Rank 1 ends its first run 4 s later than rank 0; rank 0's second run still
    finds both ranks' files of the first ({rank} in the renames: each its own)."""
    first, second = tmp_path / "first.py", tmp_path / "second.py"
    first.write_text("import os, time\n"
                     "rank = int(os.environ['SPARSEFLOW_RANK'])\n"
                     "time.sleep(4 * rank)\n"
                     "open('out.txt', 'w').write(str(rank))\n")
    second.write_text("import os\n"
                      "assert sorted(open(f'first-{r}.txt').read() for r in (0, 1)) == "
                      "['0', '1'], os.listdir()\n")
    statuses = run_sequence([{"label": "first", "path": str(first),
                              "rename": {"out.txt": "first-{rank}.txt"}},
                             {"label": "second", "path": str(second)}], 2, tmp_path)
    assert statuses == {"first": "ok", "second": "ok"}


def test_a_run_that_ends_the_process_fails_itself_and_every_run_after_it(tmp_path):
    crash, fine = tmp_path / "crash.py", tmp_path / "fine.py"
    crash.write_text("import os\nos._exit(3)\n")
    fine.write_text("x = 1\n")
    statuses = run_sequence([{"label": "fine", "path": str(fine)},
                             {"label": "crash", "path": str(crash)},
                             {"label": "after", "path": str(fine)}], None, tmp_path)
    assert statuses["fine"] == "ok"
    assert statuses["crash"].startswith("DID NOT RUN: crash")
    assert statuses["after"].startswith("DID NOT RUN: after")
