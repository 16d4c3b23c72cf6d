"""Benchmark commands: the workloads they build and that they run end to end (figures are not asserted)."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from experiments import bench, bench_workloads
from experiments.bench_workloads import fleet_point, repeated_trace, time_run, vidur_spec, vidur_workload


def test_vidur_workload_is_the_stated_one():
    workload = vidur_workload(np.random.default_rng(0), num_requests=20_000, rate_per_s=8.0)
    total = workload.prompt_tokens + workload.output_tokens
    assert workload.num_requests == 20_000
    assert total.min() >= 256 and total.max() <= 2048
    assert np.array_equal(workload.prompt_tokens, np.rint(total * 0.8).astype(np.int64))  # prompt:decode 4:1
    gaps = np.diff(workload.arrival_at)
    assert gaps.mean() == pytest.approx(1 / 8.0, rel=0.03)  # Poisson at 8 req/s: exponential gaps
    assert gaps.std() == pytest.approx(gaps.mean(), rel=0.05)


def test_repeated_trace_keeps_the_trace_and_reaches_the_rate():
    from traces import load_trace_workload

    size = load_trace_workload("azure_conv").num_requests
    one = repeated_trace("azure_conv", 10, 1.0)
    workload = repeated_trace("azure_conv", 7_000, 50.0)  # the sample holds fewer than 3,500: 3 copies, cut
    assert workload.num_requests == 7_000
    assert np.all(np.diff(workload.arrival_at) >= 0)
    rate = (workload.num_requests - 1) / (workload.arrival_at[-1] - workload.arrival_at[0])
    assert rate == pytest.approx(50.0, rel=1e-9)
    np.testing.assert_array_equal(workload.output_tokens[:10], one.output_tokens)
    np.testing.assert_array_equal(workload.output_tokens[size:size + 10], one.output_tokens)  # the second copy
    assert workload.source.endswith("x3")


def test_time_run_counts_steps_and_simulated_time():
    workload = vidur_workload(np.random.default_rng(1), num_requests=40)
    timing = time_run(vidur_spec("none", workload))
    assert timing.num_requests == 40 and timing.num_steps > 0
    assert timing.simulated_s >= workload.arrival_at[-1] - workload.arrival_at[0]
    assert timing.steps_per_s > 0 and timing.simulated_per_wall_s > 0


def test_fleet_point_runs_the_replicas():
    args = argparse.Namespace(point=2, requests=0, requests_per_replica=30, trace="azure_conv", rate_per_replica=32.0,
                              policy="dspark", hardware=bench_workloads.DEFAULT_HARDWARE, router="round_robin",
                              seed=0)
    point = fleet_point(args)
    assert point["replicas"] == 2 and point["requests"] == 60 and point["steps"] > 0 and point["peak_rss_mb"] > 0


def test_bench_prints_a_row_per_point(capsys):
    bench.main(["--requests", "8", "--gammas", "3", "--steps", "30", "--repeats", "20",
                "--decision-policies", "dspark,greedy,threshold"])
    out = capsys.readouterr().out.splitlines()
    assert out[1].split() == ["R", "gamma", "engine", "steps/s", "dspark", "us", "greedy", "us", "threshold", "us"]
    row = out[2].split()
    assert row[:2] == ["8", "3"] and all(float(v.replace(",", "")) > 0 for v in row[2:])
