"""sparseflow.jobs.progress.Progress: a tqdm bar on a terminal, periodic plain lines with the
count, rate and ETA elsewhere; messages and log records between the bar's redraws.

tqdm reads the time through ``tqdm.std.time``: a fake clock there makes rate and ETA exact.
"""

import errno
import fcntl
import io
import logging
import os
import pty
import re
import struct
import termios

import pytest
import tqdm.std

from sparseflow.jobs.progress import Progress, ProgressLogHandler


class Clock:
    """A clock the test moves: ``now`` seconds."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class Terminal(io.StringIO):
    """An in-memory stream that says it is a terminal."""

    def isatty(self):
        return True


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(tqdm.std, "time", fake)
    return fake


def run(progress, clock, steps, seconds_per_step=0.5, status=lambda step: None):
    for step in steps:
        clock.now += seconds_per_step
        progress.update(step, status(step))


def test_plain_lines_every_n_steps_with_count_rate_eta_and_status(clock):
    out = io.StringIO()   # not a terminal
    progress = Progress(10, desc="step", unit="step", every=4, stream=out)
    run(progress, clock, range(1, 11),
        status=lambda s: f"loss {1 / s:.4f}" if s % 4 == 0 or s == 10 else None)
    progress.close()
    # 0.5 s per step: 2 steps/s; at step 4, 6 steps remain: 3 s.
    assert out.getvalue().splitlines() == [
        "step 4/10 [00:02<00:03,  2.00step/s]  loss 0.2500",
        "step 8/10 [00:04<00:01,  2.00step/s]  loss 0.1250",
        "step 10/10 [00:05<00:00,  2.00step/s]  loss 0.1000",
    ]
    assert "\r" not in out.getvalue()


def test_a_resumed_run_counts_its_rate_and_lines_from_where_it_started(clock):
    out = io.StringIO()
    progress = Progress(20, desc="[worker 1/2] step", unit="step", initial=12, every=4,
                        stream=out, tty=False)
    run(progress, clock, range(13, 21), seconds_per_step=0.25)
    progress.close()
    assert out.getvalue().splitlines() == [
        "[worker 1/2] step 16/20 [00:01<00:01,  4.00step/s]",
        "[worker 1/2] step 20/20 [00:02<00:00,  4.00step/s]",
    ]


def test_an_unknown_total_is_given_later_or_never(clock):
    out = io.StringIO()
    files = Progress(None, desc="files", unit="file", stream=out)
    clock.now += 2
    files.update(1, "1,500 rows", total=2)
    clock.now += 2
    files.update(2, "3,000 rows", total=2)
    files.close()
    batches = Progress(None, desc="eval batch", unit="batch", every=2, stream=out)
    run(batches, clock, range(1, 5))
    batches.close()
    assert out.getvalue().splitlines() == [
        "files 1/2 [00:02<00:02,  2.00s/file]  1,500 rows",
        "files 2/2 [00:04<00:00,  2.00s/file]  3,000 rows",
        "eval batch 2 [00:01,  2.00batch/s]",
        "eval batch 4 [00:02,  2.00batch/s]",
    ]


def test_without_every_a_long_run_writes_about_twenty_lines(clock):
    out = io.StringIO()
    progress = Progress(1000, desc="step", unit="step", stream=out)
    run(progress, clock, range(1, 1001), seconds_per_step=0.125)
    assert len(out.getvalue().splitlines()) == 20
    assert out.getvalue().splitlines()[-1] == "step 1000/1000 [02:05<00:00,  8.00step/s]"


def test_a_terminal_gets_a_bar_redrawn_in_place(clock):
    term = Terminal()
    progress = Progress(10, desc="step", unit="step", every=4, stream=term)
    assert progress.tty
    run(progress, clock, range(1, 6), status=lambda s: "loss 0.2500")
    progress.close()
    frames = term.getvalue().split("\r")
    assert term.getvalue().endswith("\n") and term.getvalue().count("\n") == 1
    # A bar (tqdm's ASCII one on a stream without an encoding), the count, rate, ETA, status.
    assert "step:  50%|#####     | 5/10 [00:02<00:02,  2.00step/s, loss 0.2500]" in frames


def read_until_closed(master):
    """Everything written to a closed pseudo-terminal's slave, read from its master.

    One ``os.read`` returns only what the line discipline has passed on so far, which under
    load is not yet the last redraws; Linux reports the closed slave's end as EIO.
    """
    chunks = []
    try:
        while chunk := os.read(master, 1 << 16):
            chunks.append(chunk)
    except OSError as error:
        if error.errno != errno.EIO:
            raise
    finally:
        os.close(master)
    return b"".join(chunks)


def test_a_pseudo_terminal_gets_a_bar_sized_to_its_width(clock):
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 60, 0, 0))
    with os.fdopen(slave, "w") as stream:
        progress = Progress(10, desc="step", unit="step", stream=stream)
        run(progress, clock, range(1, 6))
        progress.close()
    text = read_until_closed(master).decode()
    frames = [f.strip("\n") for f in re.split(r"\r", text) if f.strip()]
    assert frames[-1].startswith("step:  50%|") and "5/10" in frames[-1]
    assert max(len(f) for f in frames) <= 60


def test_messages_and_log_records_go_between_the_bars_redraws(clock):
    term = Terminal()
    logger = logging.getLogger("sparseflow.test_progress")
    handler = ProgressLogHandler(term)
    logger.addHandler(handler)
    logger.propagate = False
    try:
        progress = Progress(10, desc="step", unit="step", stream=term)
        run(progress, clock, range(1, 4))
        progress.message("step 3: eval loss 0.5000")
        logger.warning("evicted 5 keys")
        run(progress, clock, range(4, 6))
        progress.close()
    finally:
        logger.removeHandler(handler)
    # Each on a line of its own, not appended to a bar's text; the bar drawn again after.
    pieces = re.split(r"[\r\n]", term.getvalue())
    assert "step 3: eval loss 0.5000" in pieces and "evicted 5 keys" in pieces
    after = term.getvalue().split("evicted 5 keys\n", 1)[1]
    assert "5/10" in after


def test_a_message_without_a_bar_is_a_plain_line():
    out = io.StringIO()
    progress = Progress(4, desc="step", unit="step", stream=out)
    progress.message("resumed from model-2")
    progress.close()
    progress.message("trained 2 steps")
    assert out.getvalue() == "resumed from model-2\ntrained 2 steps\n"


@pytest.mark.parametrize("kwargs, argument", [
    (dict(total=-1), "total"), (dict(total=3, initial=5), "total"), (dict(total=2.5), "total"),
    (dict(initial=-1), "initial"), (dict(every=0), "every"), (dict(every=True), "every"),
])
def test_bad_arguments_name_the_argument(kwargs, argument):
    args = dict(total=10, desc="step", unit="step", stream=io.StringIO()) | kwargs
    with pytest.raises(ValueError, match=f"Argument `{argument}` must be"):
        Progress(**args)
