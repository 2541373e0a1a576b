"""YAML loading that remembers where every value came from.

A job file is composed with PyYAML's ``SafeLoader`` (``yaml.compose``) and its node tree walked
into plain Python values (dict, list, str, int, float, bool, None), recording for each key path
the place it was written: a file line, or the ``--set`` / environment override that set it.
Validation then reports errors as ``file:line key.path: reason``.

Loading steps, later wins: the file (with ``${VAR}`` / ``${VAR:-default}`` replaced inside
string values), then ``SPARSEFLOW__A__B=value`` environment variables, then ``--set a.b=value``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, NoReturn, Sequence

import yaml

ENV_PREFIX = "SPARSEFLOW__"
MISSING: Any = type("Missing", (), {"__repr__": lambda self: "MISSING"})()

_STR_TAG = "tag:yaml.org,2002:str"
_MERGE_TAG = "tag:yaml.org,2002:merge"
# YAML 1.1 reads 1e-8 (no dot) as a string; YAML 1.2 and every user read it as a number.
_EXP_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")

Path = tuple  # a key path: str keys of mappings and int indices of lists


class ConfigError(ValueError):
    """An invalid job config, located in the file or in the override that caused it.

    Attributes:
      file: the config file as the user passed it, or ``--set`` / ``$SPARSEFLOW__...`` for an
        override.
      line: 1-based line in ``file``, or None (overrides, unreadable file).
      path: the dotted key path, e.g. ``tables.user.dim`` (list items as ``top_mlp[1]``); ""
        when the error is not about one key (YAML syntax).
      reason: what is wrong and what is allowed.

    ``str(error)`` is ``"{file}:{line} {path}: {reason}"``, leaving out ``:{line}`` when the
    line is None and `` {path}`` when the path is empty.
    """

    def __init__(self, file: str, line: int | None, path: str, reason: str):
        self.file, self.line, self.path, self.reason = file, line, path, reason
        where = file if line is None else f"{file}:{line}"
        super().__init__(f"{where} {path}: {reason}" if path else f"{where}: {reason}")

    def __reduce__(self):
        return type(self), (self.file, self.line, self.path, self.reason)


@dataclass(frozen=True)
class Loc:
    """Where a value was written: ``file`` and 1-based ``line`` (None for an override)."""

    file: str
    line: int | None = None


def dotted(path: Path) -> str:
    """Formats a key path: ``("model", "top_mlp", 1)`` -> ``"model.top_mlp[1]"``."""
    text = ""
    for key in path:
        text += f"[{key}]" if isinstance(key, int) else (f".{key}" if text else str(key))
    return text


class Tree:
    """The loaded config: ``value`` (plain Python, a dict at the root) and ``locs`` (path -> Loc)."""

    def __init__(self, value: dict, locs: dict[Path, Loc]):
        self.value = value
        self.locs = locs

    def loc(self, path: Path) -> Loc:
        """The Loc of ``path``, or of its nearest recorded ancestor (e.g. for a missing key)."""
        for end in range(len(path), -1, -1):
            if path[:end] in self.locs:
                return self.locs[path[:end]]
        raise KeyError(path)  # the root is always recorded

    def node(self) -> Node:
        """The root as a :class:`Node`."""
        return Node(self, (), self.value)


class Node:
    """A value of a :class:`Tree` with its key path, so that checks can raise located errors.

    ``node[key]`` is the child (``value`` is ``MISSING`` when absent, or when ``node`` is not a
    mapping/list); ``node.fail(reason)`` raises :class:`ConfigError` at the node's place.
    """

    __slots__ = ("tree", "path", "value")

    def __init__(self, tree: Tree, path: Path, value: Any):
        self.tree, self.path, self.value = tree, path, value

    @property
    def present(self) -> bool:
        """Whether the key was given (a null value counts as given)."""
        return self.value is not MISSING

    def __getitem__(self, key: str | int) -> Node:
        value = self.value
        if isinstance(value, dict):
            child = value.get(key, MISSING)
        elif isinstance(value, list) and isinstance(key, int) and -len(value) <= key < len(value):
            key = key % len(value)
            child = value[key]
        else:
            child = MISSING
        return Node(self.tree, self.path + (key,), child)

    def items(self) -> Iterator[tuple[Any, Node]]:
        """(key, child) of a mapping, or (index, child) of a list; nothing otherwise."""
        if isinstance(self.value, dict):
            return ((k, self[k]) for k in self.value)
        if isinstance(self.value, list):
            return ((i, self[i]) for i in range(len(self.value)))
        return iter(())

    def fail(self, reason: str) -> NoReturn:
        """Raises ConfigError for this node: its own place, or its parent's when missing."""
        loc = self.tree.loc(self.path)
        raise ConfigError(loc.file, loc.line, dotted(self.path), reason)


def load_tree(text: str, file: str, overrides: Sequence[str] = (),
              environ: Mapping[str, str] | None = None) -> Tree:
    """Parses a job file's text and applies the environment and ``--set`` overrides.

    Args:
      text: the YAML text.
      file: how to name the file in errors (the path as the user passed it).
      overrides: ``"a.b=value"`` strings from ``--set``, applied last, in order; the value is
        read as YAML (``[64, 16]``, ``true``, ``100``).
      environ: the environment for ``${VAR}`` and ``SPARSEFLOW__A__B`` variables; None reads
        ``os.environ``.

    Returns:
      A :class:`Tree` whose value is a dict (an empty file gives ``{}``).

    Raises:
      ConfigError: YAML syntax error, duplicate key, a non-mapping document, an unset
        ``${VAR}``, or a malformed override.
    """
    environ = os.environ if environ is None else environ
    locs: dict[Path, Loc] = {}
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        _syntax_error(file, e)
    if root is None:
        value: Any = {}
        locs[()] = Loc(file, 1)
    else:
        value = _Walker(file, environ, None, locs).walk(root, ())
    if not isinstance(value, dict):
        raise ConfigError(file, locs[()].line, "", "the file must be a mapping of keys "
                          f"(data, columns, tables, ...), got a {type(value).__name__}")
    env_items = sorted((k, v) for k, v in environ.items() if k.startswith(ENV_PREFIX))
    for name, raw in env_items:
        path = tuple(part.lower() for part in name[len(ENV_PREFIX):].split("__"))
        _override(value, locs, f"${name}", path, raw)
    for item in overrides:
        key, sep, raw = item.partition("=")
        path = tuple(key.strip().split("."))
        if not sep:
            raise ConfigError("--set", None, "", f"expected KEY.PATH=VALUE, got {json.dumps(item)}")
        _override(value, locs, "--set", path, raw)
    return Tree(value, locs)


def _syntax_error(file: str, error: yaml.YAMLError) -> NoReturn:
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    problem, context = getattr(error, "problem", None), getattr(error, "context", None)
    reason = f"invalid YAML: {problem or context or error}"
    if context and problem:
        reason += f" ({context})"
    raise ConfigError(file, None if mark is None else mark.line + 1, "", reason) from None


def _override(root: dict, locs: dict[Path, Loc], source: str, path: Path, raw: str) -> None:
    """Sets ``path`` (creating missing mappings on the way) to YAML ``raw``; records ``source``."""
    loc = Loc(source)
    if not all(path):
        raise ConfigError(source, None, dotted(path), "empty key in the key path")
    try:
        node = yaml.compose(raw, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        problem = getattr(e, "problem", None) or getattr(e, "context", None) or e
        raise ConfigError(source, None, dotted(path),
                          f"invalid YAML value {json.dumps(raw)}: {problem}") from None
    sub: dict[Path, Loc] = {}
    value = None if node is None else _Walker(source, {}, loc, sub).walk(node, path)
    parent = root
    for end in range(1, len(path)):
        child = parent.get(path[end - 1])
        if child is None:  # missing or null: the override creates it
            child = parent[path[end - 1]] = {}
            locs[path[:end]] = loc
        elif not isinstance(child, dict):
            raise ConfigError(source, None, dotted(path), f"cannot set it: "
                              f"{dotted(path[:end])} is not a mapping")
        parent = child
    for old in [p for p in locs if p[:len(path)] == path]:
        del locs[old]
    parent[path[-1]] = value
    locs.update(sub)
    locs[path] = loc


class _Walker:
    """Turns composed YAML nodes into plain values, recording each path's Loc in ``locs``."""

    def __init__(self, file: str, environ: Mapping[str, str], fixed: Loc | None,
                 locs: dict[Path, Loc]):
        self.file, self.environ, self.fixed, self.locs = file, environ, fixed, locs
        self.constructor = yaml.SafeLoader("")

    def loc(self, node: yaml.Node) -> Loc:
        return self.fixed or Loc(self.file, node.start_mark.line + 1)

    def fail(self, node: yaml.Node, path: Path, reason: str) -> NoReturn:
        loc = self.loc(node)
        raise ConfigError(loc.file, loc.line, dotted(path), reason)

    def walk(self, node: yaml.Node, path: Path, key_loc: Loc | None = None) -> Any:
        # A collection is located at its key (a block collection starts on the next line).
        self.locs[path] = key_loc or self.loc(node)
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path)
        if isinstance(node, yaml.SequenceNode):
            return [self.walk(item, path + (i,)) for i, item in enumerate(node.value)]
        self.locs[path] = self.loc(node)
        return self._scalar(node, path)

    def _mapping(self, node: yaml.MappingNode, path: Path) -> dict:
        out: dict[str, Any] = {}
        lines: dict[str, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                self.fail(key_node, path, "YAML merge keys (<<) are not supported; use an "
                          "anchor for the whole value, or tables.defaults for tables")
            if not isinstance(key_node, yaml.ScalarNode):
                self.fail(key_node, path, "mapping keys must be plain names")
            key = key_node.value
            if key in out:
                self.fail(key_node, path + (key,),
                          f"duplicate key (first at line {lines[key]})")
            lines[key] = key_node.start_mark.line + 1
            out[key] = self.walk(value_node, path + (key,), self.loc(key_node))
        return out

    def _scalar(self, node: yaml.ScalarNode, path: Path) -> Any:
        try:
            value = self.constructor.construct_object(node)
        except yaml.MarkedYAMLError as e:
            self.fail(node, path, f"invalid value: {e.problem}")
        if node.tag != _STR_TAG or not isinstance(value, str):
            return value
        if self.fixed is None and "${" in value:
            value = self._interpolate(node, path, value)
            if node.style is None:  # plain scalar: its text decides its type, as in YAML
                tag = self.constructor.resolve(yaml.ScalarNode, value, (True, False))
                if tag != _STR_TAG:
                    try:
                        return self.constructor.construct_object(yaml.ScalarNode(tag, value))
                    except (yaml.YAMLError, ValueError):
                        return value
        if node.style is None and _EXP_FLOAT.fullmatch(value):
            return float(value)
        return value

    def _interpolate(self, node: yaml.ScalarNode, path: Path, text: str) -> str:
        def replace(match: re.Match) -> str:
            name, default = match.group(1), match.group(2)
            value = self.environ.get(name)
            if default is not None and not value:
                return default
            if value is None:
                self.fail(node, path, f"environment variable {name} is not set (write "
                          f"${{{name}:-default}} to give a default)")
            return value
        return _VAR.sub(replace, text)
