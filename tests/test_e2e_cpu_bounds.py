"""The e2e benchmark's CPU per step and the step floors it derives from it
(benchmarks/e2e.py): what the cores allow each target ratio."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))

import e2e  # noqa: E402
import e2e_variants as ev  # noqa: E402


def _result(step_ms: float, cpu_ms: float | None, steps: int = 4) -> ev.RunResult:
    cpu = None if cpu_ms is None else [cpu_ms / 1e3] * steps
    return ev.RunResult([step_ms / 1e3] * steps, [], [], 0.0, None, cpu)


def test_the_floors_are_each_variant_s_cpu_over_the_cores_and_the_ratios_use_them():
    r = {"a": _result(30.0, 54.0), "c": _result(45.0, 90.0), "d": _result(36.0, 66.0),
         "b": _result(300.0, 500.0), "b_tf2": _result(270.0, None)}
    got = e2e.cpu_bounds_of_round(r, cores=2)
    assert got["d_floor"] == pytest.approx(33.0)
    assert got["a_floor"] == pytest.approx(27.0)
    assert got["d/a as is"] == pytest.approx(30.0 / 33.0)
    assert got["d/a any"] == pytest.approx(30.0 / 27.0)
    assert got["d/c as is"] == pytest.approx(45.0 / 33.0)
    assert got["d/c any"] == pytest.approx(45.0 / 27.0)
    # The faster (b), as d/b itself uses: b_tf2's 270 ms, though its CPU was not measured.
    assert got["d/b as is"] == pytest.approx(270.0 / 33.0)
    assert got["d/b any"] == pytest.approx(270.0 / 27.0)


def test_more_cores_lower_the_floors():
    r = {"a": _result(30.0, 54.0), "d": _result(36.0, 66.0)}
    two, four = e2e.cpu_bounds_of_round(r, 2), e2e.cpu_bounds_of_round(r, 4)
    assert four["d_floor"] == pytest.approx(two["d_floor"] / 2)
    assert "d/c as is" not in two and "d/b any" not in two   # no (c), no (b) in the round


def test_no_bounds_without_the_ceiling_s_and_sparseflow_s_cpu():
    assert e2e.cpu_bounds_of_round({"a": _result(30.0, None), "d": _result(36.0, 66.0)},
                                   2) == {}
    assert e2e.cpu_bounds_of_round({"d": _result(36.0, 66.0)}, 2) == {}


def test_the_summary_takes_the_median_of_each_bound_over_rounds():
    rounds = [{"a": _result(30.0, cpu_a), "d": _result(36.0, 66.0)}
              for cpu_a in (50.0, 60.0, 54.0)]

    class Args:
        variants = ["a", "d"]

    summary = e2e.summarize(rounds, Args())
    cores = summary["cores"]
    assert summary["bounds"]["a_floor"]["median"] == pytest.approx(54.0 / cores)
    assert summary["per"]["a"]["cpu_ms"] == pytest.approx(54.0)
    text = "\n".join(e2e.render_cpu_bounds(summary))
    assert f"{54.0 / cores:.1f} ms" in text and "| d/a | >= 0.8 |" in text


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
