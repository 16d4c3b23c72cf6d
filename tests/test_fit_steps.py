"""What a benchmark run says of the mean step time: TPOT less the last step's overshoot, and ITL as a client sees it."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from calibration.fitting.runs import BenchmarkRun, ResultsError, observe, overshoot_tokens
from calibration.fitting.synthetic import SyntheticPoint, synthetic_run
from calibration.validation.bench_export import real_run


def _exact_overshoot(a: float, k: int, needed: int) -> float:
    """Mean tokens accepted past ``needed`` by steps gaining ``t`` tokens with P(t >= j + 1) = a**j (j <= k),
    computed exactly by recursion over the tokens still needed."""
    gain = np.array([a ** (t - 1) * (1 - a) for t in range(1, k + 1)] + [a ** k])  # P(t) for t = 1..k+1
    past = np.zeros(needed + 1)  # past[m]: mean overshoot when m tokens are still needed (past[0] unused)
    for m in range(1, needed + 1):
        past[m] = sum(p * (t - m if t >= m else past[m - t]) for t, p in enumerate(gain, start=1))
    return float(past[needed])


@pytest.mark.parametrize(("a", "k"), [(0.65, 1), (0.5, 3), (0.8, 7), (0.3, 7), (0.95, 4)])
def test_overshoot_is_the_renewal_limit_of_the_exact_recursion(a: float, k: int):
    tau = float(sum(a ** j for j in range(k + 1)))
    assert overshoot_tokens(tau, k) == pytest.approx(_exact_overshoot(a, k, 400), abs=1e-7)


def test_overshoot_at_the_ends():
    assert overshoot_tokens(1.0, 7) == 0.0  # nothing accepted, nothing over
    assert overshoot_tokens(2.5, 0) == 0.0  # no drafts
    assert overshoot_tokens(8.0, 7) == pytest.approx(3.5)  # every draft accepted: the end falls evenly over 8 tokens


def _run(**fields) -> BenchmarkRun:
    base = dict(source="r.csv", row=1, spec_method="mtp", num_speculative_tokens=3, mean_prompt_tokens=100.0,
                mean_output_tokens=65.0, output_tokens_per_s=1000.0, mean_tpot_ms=4.0, concurrency=4.0,
                requests_per_s=10.0, acceptance_length=2.5, mean_itl_ms=9.0)
    return BenchmarkRun(**{**base, **fields})


def test_tpot_step_takes_the_overshoot_off_and_itl_is_the_step():
    run = _run()
    expected = 4e-3 * 2.5 * 64 / (64 + overshoot_tokens(2.5, 3))
    assert observe(run).step_s == pytest.approx(expected)
    assert observe(run).step_s < 4e-3 * 2.5  # the overshoot only ever shortens the step
    assert observe(run, step="itl").step_s == pytest.approx(9e-3)
    # long outputs make the overshoot negligible; no speculation has none
    assert observe(_run(mean_output_tokens=100_001.0)).step_s == pytest.approx(1e-2, rel=1e-4)
    assert observe(_run(num_speculative_tokens=0, acceptance_length=None)).step_s == pytest.approx(4e-3)


@pytest.mark.parametrize(("fields", "message"), [
    ({"acceptance_length": 4.5}, r"r\.csv row 1: acceptance length 4\.5 is above k \+ 1 = 4"),
    ({"mean_output_tokens": 1.0}, r"r\.csv row 1: mean output of 1 tokens leaves no time per output token"),
])
def test_impossible_runs_are_named(fields, message):
    with pytest.raises(ResultsError, match=message):
        observe(_run(**fields))


def _slice(requests: pd.DataFrame, steps: pd.DataFrame, warmup_s: float, window_s: float):
    summary = {"tpot_s": {"mean": 1.0, "p50": 1.0, "p99": 1.0}, "ttft_s": {"mean": 0.0, "p50": 0.0, "p99": 0.0},
               "window_s": window_s, "output_tokens_per_s": 1.0, "mean_acceptance_length": 2.0,
               "mean_num_requests": 1.5}
    return SimpleNamespace(spec=SimpleNamespace(warmup_s=warmup_s), summary=summary, requests=requests, steps=steps)


def test_itl_is_every_chunk_gap_of_the_window_requests():
    # one engine, steps of 1 ms from 0 to 10 ms, one of them slow (to 5.5 ms) and a 0.5 ms pause after it
    starts = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 7.0, 8.0, 9.0]) * 1e-3
    ends = np.array([1.0, 2.0, 3.0, 4.0, 5.5, 7.0, 8.0, 9.0, 10.0]) * 1e-3
    steps = pd.DataFrame({"engine": 0, "start_at": starts, "end_at": ends})
    requests = pd.DataFrame({
        "engine": [0, 0, 0, -1],
        # A: first token at -0.5 ms, steps 0-3; B: first token at 1.4 ms, joins the step at 2 ms, runs to 10 ms;
        # C finished before the window; D ended at its first token (no chunks after it)
        "first_token_at": [-0.5e-3, 1.4e-3, -2e-3, 3e-3], "decode_start_at": [starts[0], starts[2], starts[0], np.nan],
        "finished_at": [ends[3], ends[8], ends[0], 3e-3], "num_steps": [4, 7, 1, 0],
        "prompt_tokens": 10, "output_tokens": [9, 15, 3, 1]})
    part = _slice(requests, steps, warmup_s=2e-3, window_s=10e-3)
    run = real_run("mtp1", 2, "dspark", 7, [part], "bench.json", 1, "test")
    gaps_a = [1.5, 1, 1, 1]  # first chunk 1 ms after the step began, 0.5 ms after the first token before it
    gaps_b = [1.6, 1, 1.5, 1.5, 1, 1, 1]  # a 0.6 ms wait to join; the slow step; the pause in the next gap
    gaps = np.array(gaps_a + gaps_b)
    assert run.mean_itl_ms == pytest.approx(gaps.mean())
    assert run.median_itl_ms == pytest.approx(np.median(gaps))
    assert run.p99_itl_ms == pytest.approx(np.percentile(gaps, 99))
    # the mean is every request's time after its first token over its steps, as a client's TPOT x chunks reads it
    kept = requests.iloc[[0, 1]]
    total_ms = 1e3 * (kept["finished_at"] - kept["first_token_at"]).sum()
    assert run.mean_itl_ms == pytest.approx(total_ms / kept["num_steps"].sum())


def test_itl_refuses_a_request_whose_steps_are_broken():
    starts = np.arange(6) * 1e-3
    steps = pd.DataFrame({"engine": 0, "start_at": starts, "end_at": starts + 1e-3})
    # in six steps by the table, four by its own count: it sat some out (preempted), which the gaps cannot show
    requests = pd.DataFrame({"engine": [0], "first_token_at": [-1e-3], "decode_start_at": [starts[0]],
                             "finished_at": [steps["end_at"].iloc[-1]], "num_steps": [4], "prompt_tokens": 10,
                             "output_tokens": [9]})
    part = _slice(requests, steps, warmup_s=0.0, window_s=10e-3)
    with pytest.raises(ValueError, match="not one unbroken run"):
        real_run("mtp1", 1, "dspark", 7, [part], "bench.json", 1, "test")


def test_synthetic_runs_round_trip_through_both_step_estimates(default_profile):
    for point in (SyntheticPoint(4, 7, 3.6, 500, 40), SyntheticPoint(8, 1, 1.8, 2000, 200)):
        run = synthetic_run(default_profile, "dspark", point, "synthetic", 1)
        assert observe(run).step_s == pytest.approx(observe(run, step="itl").step_s)
        assert run.mean_itl_ms < run.mean_tpot_ms * point.tokens_per_step  # TPOT x tau reads the step long
