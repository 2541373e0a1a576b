"""sparseflow.malloc_tuning: glibc's malloc settings applied at import, and left alone when
the user chose their own."""

import os
import subprocess
import sys

import pytest

from sparseflow import malloc_tuning


class FakeLibc:
    def __init__(self, result=1):
        self.calls = []
        self.result = result

    def mallopt(self, param, value):
        self.calls.append((param, value))
        return self.result


@pytest.fixture(autouse=True)
def _keep_state(monkeypatch):
    monkeypatch.setattr(malloc_tuning, "_applied", malloc_tuning._applied)


def test_applies_every_setting():
    libc = FakeLibc()
    assert malloc_tuning.tune_malloc({}, libc, force=True) is True
    assert libc.calls == [(-3, 32 << 20), (-1, 256 << 20), (-2, 64 << 20)]


def test_once_per_process():
    libc = FakeLibc()
    malloc_tuning.tune_malloc({}, libc, force=True)
    assert malloc_tuning.tune_malloc({}, libc) is True
    assert len(libc.calls) == len(malloc_tuning.SETTINGS)


@pytest.mark.parametrize("environ", [
    {"SPARSEFLOW_MALLOC_TUNING": "0"},
    {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"},
    {"GLIBC_TUNABLES": "glibc.cpu.x86_rep_movsb_threshold=4096:glibc.malloc.top_pad=0"},
    {"MALLOC_ARENA_MAX": "4"},
    {"MALLOC_TRIM_THRESHOLD_": "0"},
    {"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"},
])
def test_leaves_the_users_choice_alone(environ):
    libc = FakeLibc()
    assert malloc_tuning.tune_malloc(environ, libc, force=True) is False
    assert libc.calls == []


def test_tunables_of_other_parts_of_glibc_do_not_count():
    libc = FakeLibc()
    environ = {"GLIBC_TUNABLES": "glibc.cpu.x86_rep_movsb_threshold=4096"}
    assert malloc_tuning.tune_malloc(environ, libc, force=True) is True


def test_empty_opt_out_value_means_the_default():
    assert malloc_tuning.tune_malloc({"SPARSEFLOW_MALLOC_TUNING": ""}, FakeLibc(),
                                     force=True) is True


def test_bad_opt_out_value_is_named():
    with pytest.raises(ValueError, match=r"SPARSEFLOW_MALLOC_TUNING.*'yes'"):
        malloc_tuning.tune_malloc({"SPARSEFLOW_MALLOC_TUNING": "yes"}, FakeLibc(), force=True)


def test_refused_setting_warns_and_reports_not_applied():
    libc = FakeLibc(result=0)
    with pytest.warns(RuntimeWarning, match=r"refused M_MMAP_THRESHOLD \(-3\) = 33554432"):
        assert malloc_tuning.tune_malloc({}, libc, force=True) is False
    assert libc.calls == [(-3, 32 << 20)]


_PROBE = """
import ctypes, sys
import sparseflow
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc_usable_size.argtypes = [ctypes.c_void_p]
n = 16 << 20
p = libc.malloc(n)
print(libc.malloc_usable_size(ctypes.c_void_p(p)) - n)
"""


def _slack_of_a_16_mib_block(**env) -> int:
    """Bytes a fresh process's 16 MiB malloc gets beyond what it asked: a few from the heap,
    most of a page when glibc mmaps the block on its own. Raises AssertionError (with the
    child's stderr) when the child fails."""
    environ = {k: v for k, v in os.environ.items()
               if k not in ("GLIBC_TUNABLES", "LD_PRELOAD", "SPARSEFLOW_MALLOC_TUNING")
               and not k.startswith("MALLOC_")}
    environ.update(env)
    out = subprocess.run([sys.executable, "-c", _PROBE], env=environ, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[-1])


def test_import_makes_large_blocks_come_from_the_heap():
    # glibc's default mmaps a block this large by itself (threshold 128 KiB, raised only by
    # freeing a larger mmapped block); with the settings it comes from the heap.
    assert _slack_of_a_16_mib_block() < 64
    assert _slack_of_a_16_mib_block(SPARSEFLOW_MALLOC_TUNING="0") >= 1024
