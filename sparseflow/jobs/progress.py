"""Training progress on a terminal (one redrawn bar) or in a log (plain lines), and the final
summary table."""

from __future__ import annotations

import sys
from typing import IO, Sequence

_BAR_WIDTH = 24


class Progress:
    """Reports steps, steps/s and loss.

    On a TTY the bar is redrawn in place (``\\r``) at every :meth:`update`; elsewhere (CI logs,
    files, pipes) one plain line is written per :meth:`update`, so callers update every
    ``log_every`` steps.

    Args:
      total: the step the run ends at.
      stream: where to write; default ``sys.stdout``.
      tty: force bar (True) or lines (False); default: ``stream.isatty()``.
    """

    def __init__(self, total: int, stream: IO[str] | None = None, tty: bool | None = None):
        self.total = max(int(total), 1)
        self.stream = stream if stream is not None else sys.stdout
        isatty = getattr(self.stream, "isatty", None)
        self.tty = bool(isatty and isatty()) if tty is None else tty
        self._bar_open = False

    def update(self, step: int, steps_per_sec: float, loss: float) -> None:
        """Shows ``step`` of ``total`` with the current rate and (windowed) training loss."""
        if self.tty:
            done = int(_BAR_WIDTH * min(step, self.total) / self.total)
            bar = "#" * done + "." * (_BAR_WIDTH - done)
            self.stream.write(f"\r[{bar}] {step}/{self.total}  {steps_per_sec:6.2f} steps/s  "
                              f"loss {loss:.4f}")
            self._bar_open = True
        else:
            self.stream.write(f"step {step}/{self.total}  {steps_per_sec:.2f} steps/s  "
                              f"loss {loss:.4f}\n")
        self.stream.flush()

    def message(self, text: str) -> None:
        """Writes a line of its own (an evaluation's result, a checkpoint), below the bar."""
        self.close()
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        """Ends the bar's line, if one is open."""
        if self._bar_open:
            self.stream.write("\n")
            self._bar_open = False


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table: columns padded to their widest cell, numbers right-aligned.

    Args:
      headers: column titles.
      rows: cells (anything with ``str``); each row as long as ``headers``.

    Returns:
      The table as lines joined by newlines, a rule under the header.
    """
    cells = [[str(h) for h in headers]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    numeric = [all(_is_number(row[i]) for row in rows) if rows else False
               for i in range(len(headers))]

    def line(row):
        return "  ".join(c.rjust(w) if num else c.ljust(w)
                         for c, w, num in zip(row, widths, numeric)).rstrip()

    out = [line(cells[0]), "  ".join("-" * w for w in widths)]
    out += [line(row) for row in cells[1:]]
    return "\n".join(out)


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.4f}" if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
