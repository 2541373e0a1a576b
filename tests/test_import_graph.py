"""sparseflow's modules import one another one way: no cycle between the YAML jobs
(``sparseflow.jobs``) and multi-worker training (``sparseflow.distributed``).

The graph is read from the source (every ``import`` statement, also those inside functions:
a deferred import hides a cycle from the interpreter, not from the design), so the test
needs neither TensorFlow nor an import order that happens to trip the cycle.
"""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "sparseflow"


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """sparseflow module -> the sparseflow modules it imports anywhere in its source."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    # `from sparseflow.jobs import runner` imports the module jobs.runner.
                    sub = f"{node.module}.{alias.name}"
                    targets.add(sub if sub in modules else node.module)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a list of nodes (the first repeated at the end), or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_find_cycle_finds_a_cycle_and_none_in_a_tree():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_import_graph_sees_deferred_imports():
    graph = import_graph()
    # cli imports the job runner inside a function (to start without TensorFlow).
    assert "sparseflow.jobs.runner" in graph["sparseflow.cli"]
    assert "sparseflow.jobs.schema" in graph["sparseflow.jobs.runner"]


def test_jobs_and_distributed_import_each_other_without_a_cycle():
    graph = import_graph()
    inside = {m for m in graph if m.startswith(("sparseflow.jobs", "sparseflow.distributed"))}
    sub = {m: graph[m] & inside for m in inside}
    cycle = find_cycle(sub)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
