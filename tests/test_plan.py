"""Capacity planner: SLO parsing, percentiles in the window, the bisection, fleet sizing, and a tiny real plan."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from experiments import plan
from experiments.plan import Probe, Slo, percentile_of, search_load, summarize_search


@pytest.mark.parametrize(
    "text, expected",
    [
        ("ttft_s:p90<=0.5", Slo("ttft_s", 90.0, 0.5)),
        ("tpot_s:p99.9 <= 0.02", Slo("tpot_s", 99.9, 0.02)),
        ("tokens_per_s_per_user:p10>=60", Slo("tokens_per_s_per_user", 10.0, 60.0)),
    ],
)
def test_slo_parse(text, expected):
    assert Slo.parse(text) == expected


@pytest.mark.parametrize(
    "text, message",
    [
        ("ttft:p90<=0.5", "metric one of ttft_s"),  # unknown metric
        ("ttft_s:p90>=0.5", "ttft_s takes <="),  # a latency is an upper bound
        ("tokens_per_s_per_user:p10<=60", "tokens_per_s_per_user takes >="),
        ("tpot_s:p120<=0.1", "percentile must lie in 0..100"),
        ("tpot_s:p90<=0", "positive number"),
    ],
)
def test_slo_parse_errors_name_what_is_valid(text, message):
    with pytest.raises(ValueError, match=message):
        Slo.parse(text)


def test_percentile_reads_only_the_window():
    requests = pd.DataFrame({
        "first_token_at": [0.5, 1.5, 2.5, 3.5],  # the first and last are outside (1, 3]
        "finished_at": [2.0, 2.9, 3.1, np.nan],  # two finish inside, one after, one never
        "ttft_s": [10.0, 0.2, 0.4, 5.0],
        "tpot_s": [0.01, 0.03, 9.0, np.nan],
    })
    assert percentile_of(requests, "ttft_s", 50, 1.0, 3.0) == pytest.approx(0.3)
    assert percentile_of(requests, "tpot_s", 100, 1.0, 3.0) == pytest.approx(0.03)
    assert percentile_of(requests, "tpot_s", 50, 5.0, 6.0) is None


class _Threshold:
    """A stand-in for a simulation: every SLO holds exactly up to ``limit`` (users or req/s)."""

    def __init__(self, limit: float) -> None:
        self.limit, self.loads = limit, []

    def __call__(self, spec, load, slos, label=None):
        self.loads.append(load)
        return Probe(policy=label or "p", load=load, passed=load <= self.limit, overloaded=False, values=(load,),
                     finished_per_s=load / 2, tokens_per_s_per_gpu=0.0)


@pytest.mark.parametrize(
    "limit, rel_tol, expected",
    [
        (37.3, 0.05, 37),  # bisection down to 1 user: exact
        (1.0, 0.05, 1),  # only one user passes
        (500.0, 0.05, 64),  # passes at the concurrency limit: no search
    ],
)
def test_closed_loop_search_finds_the_highest_passing_users(monkeypatch, small_spec, limit, rel_tol, expected):
    from policies import make_policy

    spec = small_spec(make_policy("dspark"))  # closed loop, max_concurrency 64
    fake = _Threshold(limit)
    monkeypatch.setattr(plan, "probe", fake)
    probes = search_load(spec, [Slo("tpot_s", 90, 1.0)], rel_tol)
    best = max(p.load for p in probes if p.passed)
    assert best == expected
    assert len(fake.loads) <= 2 + math.ceil(math.log2(64)) + 1  # the two ends, then halving


@pytest.mark.parametrize("limit", [0.7, 13.0, 95.5])
def test_open_loop_search_brackets_then_bisects_to_the_tolerance(monkeypatch, small_spec, limit):
    from policies import make_policy
    from traces.synthetic import TrafficSpec

    spec = small_spec(make_policy("dspark"), traffic=TrafficSpec(arrival="poisson", rate_per_s=4.0))
    monkeypatch.setattr(plan, "probe", _Threshold(limit))
    probes = search_load(spec, [Slo("ttft_s", 90, 1.0)], rel_tol=0.02)
    best = max(p.load for p in probes if p.passed)
    lowest_failure = min(p.load for p in probes if not p.passed)
    assert best <= limit < lowest_failure
    assert lowest_failure - best <= 0.02 * lowest_failure  # the stated tolerance, on the safe side


def _probe(load, passed, rate=10.0):
    return Probe(policy="p", load=load, passed=passed, overloaded=False, values=(0.0,), finished_per_s=rate,
                 tokens_per_s_per_gpu=0.0)


def test_fleet_size_from_the_per_replica_rate():
    probes = [_probe(1, True, 1.0), _probe(64, False), _probe(40, True, 7.0), _probe(48, False)]
    result = summarize_search(probes, closed=True, max_load=64, target_rate_per_s=100.0, gpus_per_replica=8)
    assert (result.max_load, result.per_replica_per_s, result.num_replicas, result.num_gpus) == (40, 7.0, 15, 120)
    assert result.limited_by == "slo" and not result.non_monotone
    open_loop = summarize_search([_probe(12.5, True), _probe(25.0, False)], closed=False, max_load=64,
                                 target_rate_per_s=100.0, gpus_per_replica=1)
    assert (open_loop.per_replica_per_s, open_loop.num_replicas) == (12.5, 8)  # open loop: the arrival rate


def test_infeasible_limited_and_non_monotone_searches_are_reported():
    infeasible = summarize_search([_probe(1, False)], True, 64, 10.0, 1)
    assert infeasible.limited_by == "infeasible" and infeasible.num_gpus is None
    limited = summarize_search([_probe(1, True), _probe(64, True, 20.0)], True, 64, 10.0, 1)
    assert limited.limited_by == "max_concurrency" and limited.num_replicas == 1
    odd = summarize_search([_probe(1, True), _probe(8, False), _probe(16, True)], True, 64, 10.0, 1)
    assert odd.non_monotone


def test_tiny_plan_end_to_end(tmp_path, capsys):
    """Two policies on a tiny closed-loop config (mtp1 is bisected, dspark meets the SLO up to the concurrency
    limit here): the printed GPUs follow from the frontier's rates."""
    overrides = ["duration_s=3", "warmup_s=0.5", "cluster.max_concurrency=16", "traffic.max_output_tokens=64",
                 "drafter.gamma=3"]
    plan.main(["--policies", "mtp1,dspark", "--slo", "tpot_s:p90<=0.0045", "--target-rate", "20",
               "--out", str(tmp_path), *overrides])
    out = capsys.readouterr().out
    assert "GPUs to serve 20 req/s" in out
    table = pd.read_csv(tmp_path / "plan.csv")
    frontier = pd.read_csv(tmp_path / "frontier.csv")
    assert list(table["policy"]) == ["mtp1", "dspark"]
    for row in table.itertuples():
        probes = frontier[frontier["policy"] == row.policy]
        if row.limited_by == "infeasible":
            assert not probes["passed"].any()
            continue
        best = probes[probes["passed"]].sort_values("load").iloc[-1]
        assert row.max_load == best["load"]
        if row.limited_by == "slo":  # bisected down to one user: the next user up fails
            assert (~probes[probes["load"] == best["load"] + 1]["passed"]).all()
            assert (probes["load"] == best["load"] + 1).any()
        assert row.num_gpus == math.ceil(20 / best["finished_per_s"])  # one GPU per replica in this profile
    assert (tmp_path / "plan.png").stat().st_size > 0 and (tmp_path / "plan.svg").stat().st_size > 0
