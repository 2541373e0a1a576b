"""Field checks for the job config: each takes a :class:`~sparseflow.jobs.yaml_tree.Node`,
returns its value (or the default when the key is absent) and raises a located
:class:`~sparseflow.jobs.yaml_tree.ConfigError` otherwise.

Message shape: ``must be <what is allowed>, got <value as written>`` (plus ``did you mean``
for names), e.g. ``must be an integer in [1, 8192], got "16x"``.
"""

from __future__ import annotations

import difflib
import json
from typing import Any, NamedTuple, Sequence

from sparseflow.jobs.yaml_tree import Node
from sparseflow.validation import INT32_MAX

REQUIRED: Any = object()


class Range(NamedTuple):
    """A number interval; a None bound is unbounded, ``*_open`` excludes the bound."""
    low: float | None
    high: float | None
    low_open: bool = False
    high_open: bool = False

    def text(self) -> str:
        if self.low is not None and self.high is not None:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            return f"a number in {left}{self.low:g}, {self.high:g}{right}"
        if self.low is not None:
            return f"a number {'>' if self.low_open else '>='} {self.low:g}"
        if self.high is not None:
            return f"a number {'<' if self.high_open else '<='} {self.high:g}"
        return "a finite number"

    def contains(self, v: float) -> bool:
        return ((self.low is None or v > self.low or (v == self.low and not self.low_open))
                and (self.high is None or v < self.high or (v == self.high and not self.high_open)))


def show(value: Any) -> str:
    """A value as the user wrote it (YAML/JSON spelling), shortened."""
    text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def suggestion(word: Any, options: Sequence[str]) -> str:
    """`` (did you mean X?)`` for the closest option, or ""."""
    close = difflib.get_close_matches(str(word), list(options), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def missing(n: Node, default: Any) -> Any:
    """``default``, or a "required" error when it is REQUIRED."""
    if default is REQUIRED:
        n.fail("required key is missing")
    return default


def mapping(n: Node, allowed: Sequence[str] | None, default: Any = REQUIRED) -> dict:
    """Checks that ``n`` is a mapping (null counts as empty) whose keys are all ``allowed``
    (None: any). Returns its dict, or ``default`` when absent."""
    if not n.present:
        return missing(n, default)
    if n.value is None:
        return {}
    if not isinstance(n.value, dict):
        n.fail(f"must be a mapping, got {show(n.value)}")
    if allowed is not None:
        for key in n.value:
            if key not in allowed:
                n[key].fail(f"unknown key; allowed: {', '.join(sorted(allowed))}"
                            + suggestion(key, allowed))
    return n.value


def integer(n: Node, low: int, high: int | None = None, default: Any = REQUIRED) -> int:
    """An int (not a bool) in ``[low, high]``."""
    if not n.present:
        return missing(n, default)
    v = n.value
    ok = isinstance(v, int) and not isinstance(v, bool)
    if not ok or v < low or (high is not None and v > high):
        allowed = f"an integer in [{low}, {high}]" if high is not None else f"an integer >= {low}"
        n.fail(f"must be {allowed}, got {show(v)}")
    return v


def number(n: Node, rng: Range, default: Any = REQUIRED) -> float:
    """A finite int or float within ``rng``, returned as a float."""
    if not n.present:
        return missing(n, default)
    v = n.value
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) != float("inf")
    if not ok or v != v or not rng.contains(v):
        n.fail(f"must be {rng.text()}, got {show(v)}")
    return float(v)


def boolean(n: Node, default: Any = REQUIRED) -> bool:
    """true or false."""
    if not n.present:
        return missing(n, default)
    if not isinstance(n.value, bool):
        n.fail(f"must be true or false, got {show(n.value)}")
    return n.value


def string(n: Node, default: Any = REQUIRED, max_len: int = 1000) -> str:
    """A non-empty string of at most ``max_len`` characters."""
    if not n.present:
        return missing(n, default)
    if not isinstance(n.value, str) or not 1 <= len(n.value) <= max_len:
        n.fail(f"must be a non-empty string of at most {max_len} characters, got {show(n.value)}")
    return n.value


def choice(n: Node, options: Sequence[str], default: Any = REQUIRED) -> str:
    """One of ``options``."""
    if not n.present:
        return missing(n, default)
    if not isinstance(n.value, str) or n.value not in options:
        n.fail(f"must be one of {', '.join(options)}, got {show(n.value)}"
               + suggestion(n.value, options))
    return n.value


def strings(n: Node, default: Any = REQUIRED, min_items: int = 0) -> tuple[str, ...]:
    """A list of non-empty strings (a single string is a list of one), at least ``min_items``."""
    if not n.present:
        return missing(n, default)
    if isinstance(n.value, str):
        return (string(n),)
    if not isinstance(n.value, list):
        n.fail(f"must be a list of strings, got {show(n.value)}")
    if len(n.value) < min_items:
        n.fail(f"must list at least {min_items} item{'s' * (min_items > 1)}, got {show(n.value)}")
    return tuple(string(item) for _, item in n.items())


def widths(n: Node, default: Any = REQUIRED) -> list[int]:
    """A list of layer widths, ints >= 1 (may be empty)."""
    if not n.present:
        return missing(n, default)
    if not isinstance(n.value, list):
        n.fail(f"must be a list of layer widths (integers >= 1), got {show(n.value)}")
    return [integer(item, 1, INT32_MAX) for _, item in n.items()]


