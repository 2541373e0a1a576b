"""Progress of long runs (``sparseflow train``, ``eval``, ``stats``) and the final summary
table.

One helper, :class:`Progress`, for every command: on a terminal a tqdm bar (rate, ETA, the
terminal's width, redrawn in place); elsewhere (CI logs, files, pipes) a plain line every
``every`` units, with the same count, rate and ETA from tqdm's meter. A multi-worker run
gives each worker its own ``desc`` (``[worker 1/2] step``): one bar or one line stream per
worker process, never two bars on one line.
"""

from __future__ import annotations

import logging
import sys
from typing import IO, Sequence

from tqdm import tqdm

# Plain lines: the count, elapsed<remaining and tqdm's smoothed rate; no bar to redraw.
_LINE_FORMAT = "{desc} {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]"
_LINE_FORMAT_NO_TOTAL = "{desc} {n_fmt} [{elapsed}, {rate_fmt}]"
# Plain lines when `every` is not given: about this many over a run of known length.
_DEFAULT_LINES = 20


class _Meter(tqdm):
    """tqdm's counting, rate smoothing and formatting without its display: for plain lines,
    which :class:`Progress` writes itself (tqdm redraws one line with ``\\r``, which a log file
    keeps as one ever longer line)."""

    def display(self, msg=None, pos=None):
        return False


class _Discard:
    """A file that drops what is written (the meter's file: it never displays)."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


class Progress:
    """Progress toward ``total`` (steps, batches, files): a tqdm bar on a terminal, periodic
    plain lines elsewhere.

    Args:
      total: the position the run ends at (``schedule.max_steps``, the number of files), or
        None when unknown (no ETA); may be given later to :meth:`update`.
      desc: what is counted, shown before the count: ``"step"``, ``"[worker 1/2] step"``.
      unit: the rate's unit (``"step"`` shows ``12.50step/s``).
      initial: the position the run starts at (a resumed run's step): rate and ETA count
        from it.
      every: plain lines: one at each multiple of ``every`` and one at ``total``; default
        about 20 lines over a run of known ``total``, else one per unit. Ignored on a terminal.
      stream: where to write; default ``sys.stdout``.
      tty: bar (True) or plain lines (False); default: ``stream.isatty()``.

    Raises:
      ValueError: ``total`` < ``initial``, ``initial`` < 0 or ``every`` < 1.

    Example::

        with Progress(100, desc="step", unit="step") as progress:
            for step in range(1, 101):
                ...
                progress.update(step, f"loss {loss:.4f}")
    """

    def __init__(self, total: int | None, *, desc: str, unit: str, initial: int = 0,
                 every: int | None = None, stream: IO[str] | None = None,
                 tty: bool | None = None):
        if isinstance(initial, bool) or not isinstance(initial, int) or initial < 0:
            raise ValueError(f"Argument `initial` must be an int >= 0. Received: {initial!r}")
        if total is not None and (isinstance(total, bool) or not isinstance(total, int)
                                  or total < initial):
            raise ValueError(f"Argument `total` must be None or an int >= initial ({initial}). "
                             f"Received: {total!r}")
        if every is not None and (isinstance(every, bool) or not isinstance(every, int)
                                  or every < 1):
            raise ValueError(f"Argument `every` must be None or an int >= 1. Received: "
                             f"{every!r}")
        self.stream = stream if stream is not None else sys.stdout
        isatty = getattr(self.stream, "isatty", None)
        self.tty = bool(isatty and isatty()) if tty is None else bool(tty)
        self.desc = desc
        self._every = every
        self._status = ""
        self._last_line = initial
        if self.tty:
            # dynamic_ncols: the bar follows the terminal's width when the window is resized.
            # position 0: this process's one bar, on the current line.
            self._bar = tqdm(total=total, initial=initial, desc=desc, unit=unit,
                             file=self.stream, dynamic_ncols=True, leave=True, position=0)
        else:
            self._bar = _Meter(total=total, initial=initial, desc=desc, unit=unit,
                               file=_Discard(), leave=False)

    @property
    def total(self) -> int | None:
        """The position the run ends at (None: unknown)."""
        return self._bar.total

    def update(self, n: int, status: str | None = None, *, total: int | None = None) -> None:
        """Moves to position ``n`` (an absolute count, not an increment).

        Args:
          n: the units done so far (the step just finished, the files counted).
          status: text shown after the rate (``"loss 0.6931"``); None keeps the last one.
          total: the run's end, when it becomes known only now; None keeps it.
        """
        if total is not None and total != self._bar.total:
            self._bar.total = total
        if status is not None:
            self._status = status
            if self.tty:
                self._bar.set_postfix_str(status, refresh=False)
        self._bar.update(n - self._bar.n)
        if not self.tty and self._line_due(n):
            self._write_line()

    def _line_due(self, n: int) -> bool:
        total = self._bar.total
        every = self._every or (max(1, total // _DEFAULT_LINES) if total else 1)
        due = n // every > self._last_line // every or (total is not None and n >= total)
        return due and n != self._last_line

    def _write_line(self) -> None:
        self._last_line = self._bar.n
        self._bar.bar_format = _LINE_FORMAT if self._bar.total else _LINE_FORMAT_NO_TOTAL
        line = str(self._bar) + (f"  {self._status}" if self._status else "")
        self.stream.write(line + "\n")
        self.stream.flush()

    def message(self, text: str) -> None:
        """Writes a line of its own (an evaluation's result, a checkpoint): above the bar on a
        terminal, which is redrawn below it."""
        if self.tty and not self._bar.disable:
            self._bar.write(text, file=self.stream)
        else:
            self.stream.write(text + "\n")
            self.stream.flush()

    def close(self) -> None:
        """Ends the bar (it stays on screen at its last position); idempotent."""
        self._bar.close()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ProgressLogHandler(logging.Handler):
    """Writes log records to ``stream`` between a progress bar's redraws (``tqdm.write``), so
    that a log line (an eviction's) does not land inside the bar on the terminal.

    Args:
      stream: where records go; default ``sys.stderr``.
    """

    def __init__(self, stream: IO[str] | None = None):
        super().__init__()
        self.stream = stream if stream is not None else sys.stderr

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # noqa: BLE001 -- logging's contract: report, do not raise
            self.handleError(record)


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
