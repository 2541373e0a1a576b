"""The e2e benchmark's CPU per step (benchmarks/e2e.py, e2e_variants.run_graph) and what it
allows d/c and d/b."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))

import e2e  # noqa: E402
import e2e_variants as ev  # noqa: E402


def _result(step_ms: float, cpu_ms: float | None, steps: int = 4) -> ev.RunResult:
    cpu = None if cpu_ms is None else [cpu_ms / 1e3] * steps
    return ev.RunResult([step_ms / 1e3] * steps, [], [], 0.0, None, cpu)


def test_the_cpu_ratios_are_the_baselines_cpu_over_sparseflow_s_and_the_ceiling_s():
    r = {"a": _result(30.0, 54.0), "c": _result(45.0, 81.0), "d": _result(36.0, 60.0),
         "b": _result(300.0, 540.0), "b_tf2": _result(270.0, None)}
    got = e2e.cpu_of_round(r)
    assert got["d/c as is"] == pytest.approx(81.0 / 60.0)
    assert got["d/c any"] == pytest.approx(81.0 / 54.0)
    assert got["d/b as is"] == pytest.approx(540.0 / 60.0)   # the Session (b): its CPU
    assert got["d/b any"] == pytest.approx(540.0 / 54.0)
    assert got["a busy"] == pytest.approx(54.0 / 30.0)
    assert got["d busy"] == pytest.approx(60.0 / 36.0)
    assert got["c cpu"] == pytest.approx(81.0)


def test_a_baseline_without_its_cpu_gets_no_ratio():
    r = {"a": _result(30.0, 54.0), "d": _result(36.0, 60.0), "c": _result(45.0, None)}
    got = e2e.cpu_of_round(r)
    assert "d/c as is" not in got and "d/b any" not in got and "c busy" not in got
    assert got["d cpu"] == pytest.approx(60.0)


def test_nothing_without_the_ceiling_s_and_sparseflow_s_cpu():
    assert e2e.cpu_of_round({"a": _result(30.0, None), "d": _result(36.0, 66.0)}) == {}
    assert e2e.cpu_of_round({"d": _result(36.0, 66.0), "c": _result(45.0, 81.0)}) == {}


def test_the_summary_takes_each_median_over_rounds_and_the_report_shows_it():
    rounds = [{"a": _result(30.0, 54.0), "c": _result(45.0, cpu_c), "d": _result(36.0, 60.0)}
              for cpu_c in (75.0, 90.0, 81.0)]

    class Args:
        variants = ["a", "c", "d"]

    summary = e2e.summarize(rounds, Args())
    assert summary["cpu"]["d/c as is"]["median"] == pytest.approx(81.0 / 60.0)
    assert summary["per"]["c"]["cpu_ms"] == pytest.approx(81.0)
    text = "\n".join(e2e.render_cpu(summary))
    assert f"| d/c | >= 1.5 | {81.0 / 60.0:.2f} " in text
    assert f"{81.0 / 54.0:.2f} ({75.0 / 54.0:.2f}, {90.0 / 54.0:.2f}, {81.0 / 54.0:.2f})" in text
    assert "| d/b |" not in text   # no (b) in these rounds


def test_run_graph_measures_the_process_cpu_of_each_untraced_step():
    data = ev.make_data(12)
    result = ev.run_graph(ev.build_dense_ceiling, data, 10_000, warmup=1, steps=4,
                          trace_every=3)
    assert len(result.cpu_s) == len(result.step_s) == 4   # traced steps left out
    assert all(c > 0 for c in result.cpu_s)
    assert result.cpu_ms == pytest.approx(1e3 * sum(result.cpu_s) / 4)
    # Every step traced (the profile's runs): their CPU is not a step's, none is reported.
    traced = ev.run_graph(ev.build_dense_ceiling, data, 10_000, warmup=1, steps=2,
                          trace_every=1)
    assert traced.cpu_s is None and traced.cpu_ms is None
