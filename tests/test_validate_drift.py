"""Pure pieces of the sim-vs-real validation (issue 15): the spread of a point's error over its slices, the real
loop's steps priced by a profile, the loop probe's variable-length policy, the fit of a policy's in-loop step
excess, the weight of the drift correction, and the loop's CPU clock."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from calibration.profiling.loop_costs import VariableLength
from calibration.profiling.policy_steps import fit_excess
from calibration.profiling.step_prices import priced_steps_s, step_cost_ratio
from calibration.serving.clock import LoopClock
from calibration.validation.agreement import main as agreement_main
from calibration.validation.points import (
    device_busy_fraction,
    drift_correction,
    drift_weight,
    kept_passes,
    least_refused,
    profile_price_se,
    reference_range,
    round_progress,
    slice_drifts,
)
from calibration.validation.report import (
    STEADY_MAX_PROFILE_PRICE_SE,
    drift_note,
    kept_slices,
    machine_verdict,
    noise_note,
    profile_note,
    sampling_note,
    sampling_se,
    slice_intervals,
)
from calibration.validation.setup import ValidationConfig
from calibration.validation.validate import PROBE_COLUMNS
from policies.base import CostCurve, StepView
from simulator.acceptance.logs import summary
from simulator.costs import load_profile
from tests.log_factories import synthetic_log
from traces.workload import DOMAINS


def _summary(tokens_per_s: float, per_user: float) -> dict:
    return {"output_tokens_per_s": tokens_per_s, "tokens_per_s_per_user": {"mean": per_user}}


def test_slice_intervals_are_student_t_over_the_slices_errors() -> None:
    reals = [_summary(100.0, 10.0), _summary(200.0, 20.0), _summary(400.0, 40.0)]
    sims = [_summary(110.0, 10.0), _summary(190.0, 22.0), _summary(420.0, 40.0)]
    out = slice_intervals(sims, reals)
    errors = np.array([0.10, -0.05, 0.05])
    sd = errors.std(ddof=1)
    assert out["throughput_slice_sd"] == pytest.approx(sd)
    assert out["throughput_ci"] == pytest.approx(stats.t.ppf(0.975, 2) * sd / np.sqrt(3))
    # a drift of +10% on the first slice: its real figure is scaled to the profile's speed before the error
    drifted = slice_intervals(sims, reals, np.array([0.1, 0.0, 0.0]))
    assert drifted["throughput_slice_sd"] == pytest.approx(np.array([0.0, -0.05, 0.05]).std(ddof=1))
    assert np.isnan(slice_intervals(sims[:1], reals[:1])["throughput_ci"])
    # a slice where no request finished has no tok/s/user (None in its summary): the other slices give the spread
    idle = {"output_tokens_per_s": 50.0, "tokens_per_s_per_user": {"mean": None}}
    out = slice_intervals([*sims, idle], [*reals, idle])
    assert out["tpu_mean_slice_sd"] == pytest.approx(np.array([0.0, 0.1, 0.0]).std(ddof=1))


def test_the_median_profiles_price_error_comes_from_the_passes_prices_of_the_same_steps() -> None:
    """Passes pricing a point's steps at 1.0, 0.98 and 1.02 (measured over priced 1/price): the median's standard
    error is sqrt(pi/2) times their relative standard deviation over sqrt(3); one pass says nothing."""
    prices = np.array([1.0, 0.98, 1.02])
    median_se = np.sqrt(np.pi / 2) * prices.std(ddof=1) / np.sqrt(3)
    assert profile_price_se(1.1 / prices, "median") == pytest.approx(median_se)
    assert profile_price_se([1.05, 1.05, 1.05]) == 0.0
    assert np.isnan(profile_price_se([1.05])) and np.isnan(profile_price_se([1.0, float("nan")]))


def _steps(profile, cycles_factor: float) -> pd.DataFrame:
    rows = pd.DataFrame({"num_requests": [1, 2, 4, 4], "batch_tokens": [8, 6, 20, 12],
                         "max_verified_tokens": [7, 3, 7, 2], "context_tokens": [40, 90, 200, 210],
                         "max_context_tokens": [40, 50, 60, 60], "wait_s": [0.0, 0.0, 0.002, 0.0]})
    priced = priced_steps_s(rows, profile, "dspark", "greedy", 7, synchronous=True)
    start = 1.0 + np.concatenate([[0.0], np.cumsum(priced[1:] * cycles_factor + rows["wait_s"].to_numpy()[1:])])
    return rows.assign(start_at=start, end_at=start)  # zero-length steps: the cycle is what counts


def test_step_cost_ratio_is_measured_over_priced_cycles() -> None:
    profile = load_profile("h200_qwen3-8b_analytic")
    steps = _steps(profile, 1.1)
    # the first step has no previous end and is left out; the sleep before the third is not step time
    assert step_cost_ratio([steps], profile, "dspark", "greedy", 7, warmup_s=0.0, synchronous=True) == \
        pytest.approx(1.1)
    padded = priced_steps_s(steps.assign(max_verified_tokens=7), profile, "dspark", "greedy", 7, synchronous=True)
    assert (padded >= priced_steps_s(steps, profile, "dspark", "greedy", 7, synchronous=True)).all()


def test_variable_length_probe_varies_lengths_within_gamma() -> None:
    rng = np.random.default_rng(0)
    curve = CostCurve(batch_tokens=np.arange(1, 65), steps_per_s=np.full(64, 100.0))
    lengths = np.concatenate([VariableLength().decide(StepView(rng.uniform(0.05, 1.0, (8, 7)), curve)).lengths
                              for _ in range(50)])
    assert lengths.min() >= 0 and lengths.max() <= 7
    assert set(np.unique(lengths)) == set(range(8))  # every length 0..gamma occurs
    view = StepView(rng.uniform(0.05, 1.0, (4, 7)), curve)
    assert (VariableLength().decide(view).lengths == VariableLength().decide(view).lengths).all()


def _excess_steps(users: list[int], excess_s: list[float]) -> pd.DataFrame:
    return pd.DataFrame({"users": users, "num_requests": users, "excess_s": excess_s, "priced_s": 1e-3})


def test_policy_excess_is_a_mean_fit_over_candidates() -> None:
    users = [1, 1, 2, 2, 4, 4, 8, 8]
    noise = [1e-5, -1e-5] * 4  # cancels in each R: the least-squares line is exact
    fit = fit_excess(_excess_steps(users, [1e-4 + 2e-6 * r * 7 + n for r, n in zip(users, noise, strict=True)]), 7)
    assert fit.fixed_s == pytest.approx(1e-4) and fit.per_candidate_s == pytest.approx(2e-6)
    assert fit.mean_excess_s == pytest.approx((1e-4 + 14e-6, 1e-4 + 28e-6, 1e-4 + 56e-6, 1e-4 + 112e-6))
    assert fit.num_steps == 8 and fit.entry()["s"] == pytest.approx(list(fit.mean_excess_s))  # charged per R
    # a falling excess is noise: its mean, no slope; the mean is kept, not the median
    falling = fit_excess(_excess_steps([1, 2, 2], [3e-4, 1e-4, 2e-4]), 7)
    assert (falling.fixed_s, falling.per_candidate_s) == (pytest.approx(2e-4), 0.0)
    skewed = fit_excess(_excess_steps([1, 1, 1], [0.0, 0.0, 3e-4]), 7)
    assert skewed.fixed_s == pytest.approx(1e-4)
    # a negative intercept under a rising line: no intercept, the slope that keeps the mean
    rising = fit_excess(_excess_steps([1, 8], [-1e-4, 6e-4]), 1)
    assert rising.fixed_s == 0.0 and rising.per_candidate_s * 4.5 == pytest.approx(2.5e-4)
    # steps cheaper than the shared model in the mean: no decision time (not negative)
    cheaper = fit_excess(_excess_steps([2, 2], [-2e-4, -1e-4]), 7)
    assert (cheaper.fixed_s, cheaper.per_candidate_s) == (0.0, 0.0) and cheaper.mean_excess_s[0] < 0


def test_cpu_clock_counts_sleeps_once_and_not_other_time() -> None:
    clock = LoopClock("cpu")
    at = clock.now() + 0.05
    clock.wait_until(at)
    assert at <= clock.now() < at + 0.01  # the sleep counts as asked, however long the thread was away
    wall = LoopClock("wall")
    before = wall.now()
    time.sleep(0.02)
    assert wall.now() - before >= 0.02


def test_drift_weight_corrects_what_the_probe_can_tell_from_its_own_noise() -> None:
    """Every slice's probe read 2% apart before and after it (noise 1% about the mean: variance 1e-4) and the
    profile passes' references 2% apart (relative variance 2e-4, over two passes 1e-4): drifts whose mean square is
    4e-4 are corrected by 1 - 2e-4 / 4e-4; with one pass the reference counts as much as a slice's bracket; drifts
    no larger than the noise are not corrected; a noiseless probe fully; no drift, nothing."""
    before, after = np.full(4, 0.99), np.full(4, 1.01)
    drifts = np.array([0.02, -0.02, 0.02, -0.02])
    assert drift_weight(drifts, before, after, np.array([0.99, 1.01])) == pytest.approx(0.5)
    assert drift_weight(drifts, before, after, np.array([1.0])) == pytest.approx(0.5)
    assert drift_weight(drifts, before, after, np.array([1.0, 1.0])) == pytest.approx(0.75)
    assert drift_weight(np.array([0.01, -0.005, 0.0, 0.005]), before, after) == 0.0
    assert drift_weight(np.array([0.03, 0.01]), np.ones(2), np.ones(2), np.ones(3)) == 1.0
    assert drift_weight(np.zeros(3), before[:3], after[:3]) == 0.0


def test_a_profile_pass_the_machine_spoiled_is_refused_as_a_slice_would_be() -> None:
    """Nine passes at 1.97 ms but one at 2.47 ms (+25%) and one at 2.19 ms (+11%): both beyond 10% of the median
    are left out of the combination; within it, all kept; two passes 25% apart (each 11% off their median) would
    leave fewer than two, so both stay and their spread says the machine was unsteady."""
    pass_s = np.array([1.95, 1.97, 1.97, 2.07, 1.95, 2.47, 2.05, 2.195, 1.96])
    assert kept_passes(pass_s, 0.10) == [0, 1, 2, 3, 4, 6, 8]
    assert kept_passes(pass_s, 0.30) == list(range(9))
    assert kept_passes(np.array([2.0, 2.5]), 0.10) == [0, 1]
    assert kept_passes(np.array([2.0]), 0.10) == [0]


def test_the_drift_correction_measures_from_the_run_s_own_slices_or_from_the_profile_passes() -> None:
    """Passes read 10 ms; four slices 10.2-10.6 ms (drifts +2..+6% against the passes) and one at 12 ms (+20%,
    refused at 10%). Against the passes the correction is the screened drifts themselves; against the slices it
    is each reading over the kept slices' mean (10.4 ms), so the run's common +4% is left alone and the refused
    slice's departure is measured from that level too. Its weight counts the level's own error: the kept
    readings' relative variance over their number."""
    pass_s = np.array([10.0, 10.0, 10.0])
    slice_s = np.array([10.2, 10.6, 10.4, 10.4, 12.0])
    before, after = slice_s * 0.999, slice_s * 1.001
    drifts = slice_drifts(before, after, pass_s)
    assert drifts == pytest.approx([0.02, 0.06, 0.04, 0.04, 0.2])
    same, weight = drift_correction(drifts, before, after, pass_s, 0.1, "passes")
    assert same is drifts and weight == drift_weight(drifts, before, after, pass_s)
    centred, weight = drift_correction(drifts, before, after, pass_s, 0.1, "slices")
    assert centred == pytest.approx([10.2 / 10.4 - 1, 10.6 / 10.4 - 1, 0.0, 0.0, 12.0 / 10.4 - 1])
    kept = slice_s[:4] / slice_s[:4].mean()
    noise = 0.001 ** 2
    assert weight == pytest.approx(1 - (noise + np.var(kept, ddof=1) / 4) / np.mean(centred ** 2))
    # a run whose every slice reads 2% off the passes, alike: nothing to correct against its own level
    level, weight = drift_correction(np.full(4, 0.02), np.full(4, 10.2), np.full(4, 10.2), pass_s, 0.1, "slices")
    assert level == pytest.approx(np.zeros(4)) and weight == 0.0


def _points(slices_kept: list[int], slices: int = 5) -> pd.DataFrame:
    kept = np.array(slices_kept)
    return pd.DataFrame({"policy": "mtp1", "num_users": np.arange(1, kept.size + 1), "slices": slices,
                         "slices_kept": kept, "spoiled": 2 * kept < slices,
                         "throughput_err": 0.01, "tpu_mean_err": 0.02, "throughput_ci": 0.01, "tpu_mean_ci": 0.01})


def test_machine_verdict_flags_refused_slices_spoiled_points_and_disagreeing_profile_passes(tmp_path, capsys) -> None:
    assert machine_verdict(_points([5] * 12)) is None
    assert machine_verdict(_points([5] * 6 + [4] * 6)) is None  # 6 of 60 refused: the 10% limit itself
    verdict = machine_verdict(_points([5] * 5 + [4] * 7))  # 7 of 60
    assert verdict is not None and "7 of 60 slices refused" in verdict and "spoiled" not in verdict
    verdict = machine_verdict(_points([5] * 11 + [2]))  # 3 of 60, but a point spoiled
    assert verdict is not None and "1 point(s) spoiled" in verdict
    assert machine_verdict(_points([5] * 4).drop(columns="slices_kept")) is None  # no drift screening
    # profile passes that disagree: their mean price error over the reported points, against 2% / sqrt(2 / pi)
    assert STEADY_MAX_PROFILE_PRICE_SE == pytest.approx(0.02507, abs=1e-5)
    assert machine_verdict(_points([5] * 4).assign(profile_price_se=[0.02, 0.03, 0.02, 0.03])) is None  # 2.5%
    verdict = machine_verdict(_points([5] * 4).assign(profile_price_se=[0.02, 0.03, 0.02, 0.032]))
    assert verdict is not None and "mean standard error of 2.55% (above 2.51%" in verdict and "refused" not in verdict
    spoiled_point = _points([5, 5, 5, 2]).assign(profile_price_se=[0.02, 0.02, 0.02, 0.2])
    spoiled_point.loc[3, "throughput_err"] = np.nan
    verdict = machine_verdict(spoiled_point)  # the spoiled point's price error is not the run's
    assert verdict is not None and "1 point(s) spoiled" in verdict and "standard error" not in verdict
    verdict = machine_verdict(_points([5] * 5 + [4] * 7).assign(profile_price_se=0.04))
    assert verdict is not None and "7 of 60 slices refused" in verdict and "standard error of 4.00%" in verdict
    steady, unsteady = tmp_path / "steady", tmp_path / "unsteady"
    for d, kept in ((steady, [5] * 4), (unsteady, [5, 3, 3, 5])):
        d.mkdir()
        _points(kept).to_csv(d / "points.csv", index=False)
    agreement_main([str(steady), str(unsteady)])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines if "MACHINE NOT STEADY" in line] == [f"run2 ({unsteady})"]


def test_the_drift_note_names_the_measure_the_run_read() -> None:
    points = _points([5, 2]).assign(drift_weight=0.81)
    probe, meter = drift_note(points, 0.1, "probe"), drift_note(points, 0.1, "meter")
    assert probe.startswith("; 3 of 10 slices refused (reference probe beyond +-10% of profiling's)")
    assert "not reported (spoiled by drift): mtp1 x2" in probe and "weight 0.81 (1 - the reference probe's" in probe
    assert "(speed meter beyond +-10%" in meter and "the speed meter's own noise" in meter and "probe" not in meter
    assert drift_note(points.drop(columns="slices_kept"), 0.1, "meter") == ""  # no drift screening
    assert "correction against the kept slices' mean reading, weight 0.81" in probe
    assert "correction against the profile passes' reading" in drift_note(points, 0.1, "probe", "passes")


def test_sampling_se_is_one_draws_spread_plus_the_mean_of_the_draws() -> None:
    """The real run is one draw of the acceptance process, the simulator's figure the mean of n: the error's
    standard error is sd * sqrt(1 + 1/n), relative to the mean; the report quotes its largest and the mean
    |error| it alone would make, sqrt(2/pi) times its mean over the reported points."""
    draws = [98.0, 102.0, 100.0, 100.0]
    assert sampling_se(draws) == pytest.approx(np.std(draws, ddof=1) * np.sqrt(1.25) / 100.0, rel=1e-12)
    assert np.isnan(sampling_se([100.0]))
    table = pd.DataFrame({"policy": ["mtp1", "dspark"], "num_users": [1, 2], "tpu_mean_err": [0.01, np.nan],
                          "tpu_mean_sampling_se": [0.02, 0.05]})  # the spoiled point (NaN error) is left out
    note = sampling_note(table)
    assert "up to 2.0% (mtp1 x1)" in note and f"about {100 * np.sqrt(2 / np.pi) * 0.02:.1f}%" in note
    assert "needs --sim-replicas >= 2" in sampling_note(table.assign(tpu_mean_sampling_se=np.nan))
    # the profile's own price error: the largest and the mean over the reported points, in the report's noise lines
    table = table.assign(throughput_err=[0.01, np.nan], profile_price_se=[0.012, 0.5])
    assert "up to 1.2% (mtp1 x1), 1.2% on average" in profile_note(table) and profile_note(table) in noise_note(table)
    assert "needs two profile passes" in profile_note(table.assign(profile_price_se=np.nan))
    # the acceptance log's text sample: tau and its standard error per domain the traffic uses, from the longest
    # block's log
    log = synthetic_log(np.random.default_rng(5), num_requests=12, num_tokens=20)
    per_domain = summary(log).set_index("domain")
    note = noise_note(table, {1: log.iloc[:0], 7: log}, "mixed")
    for domain in DOMAINS:
        tau, se = per_domain.loc[domain, "tau"], per_domain.loc[domain, "tau_se"]
        assert f"{domain} {tau:.2f} +- {100 * se / tau:.1f}% (12 texts)" in note
    assert "at 7 draft tokens" in note and profile_note(table) in note
    only_chat = noise_note(table, {7: log}, "chat")
    assert "chat " in only_chat and "math " not in only_chat and "code " not in only_chat


def test_a_point_keeps_the_slices_within_the_drift_tolerance_and_is_spoiled_below_half() -> None:
    assert kept_slices(np.array([0.02, -0.15, 0.1, 0.3, -0.05]), 0.1) == ([0, 2, 4], False)
    assert kept_slices(np.array([0.02, -0.15, 0.12, 0.3, -0.05]), 0.1) == ([0, 4], True)
    assert kept_slices(np.array([0.2, 0.05]), 0.1) == ([1], False)  # one of two: half kept
    assert kept_slices(np.array([0.2, -0.3]), 0.1) == ([], True)
    assert kept_slices(np.array([0.2, -0.3]), 10.0) == ([0, 1], False)


def _probes(pass_s: list[float], slice_s: list[float], users: list[int] | None = None) -> pd.DataFrame:
    """A probe log: profile passes, then slices (of mtp1 at ``users``, default one point each), each timed the same
    before and after."""
    users = users if users is not None else list(range(1, len(slice_s) + 1))
    rows = [(k, "profile", "", 0, t, t, float("nan"), float("nan"), 0) for k, t in enumerate(pass_s)]
    rows += [(0, "slice", "mtp1", u, t, t, float("nan"), float("nan"), 0) for u, t in zip(users, slice_s, strict=True)]
    return pd.DataFrame(rows, columns=list(PROBE_COLUMNS))


def test_each_round_says_how_many_slices_drifted_so_far_and_warns_when_the_run_is_heading_for_unsteady() -> None:
    """Passes at 10 and 12 ms (median 11): a slice at 11.55 ms drifted +5%, one at 13.2 ms +20%. One of ten
    beyond 10% is the verdict's limit itself (no warning); two of ten exceed it and the line says the run is
    heading for MACHINE NOT STEADY; the verdict is decided once it follows whatever the later passes read."""
    assert slice_drifts(np.array([11.0, 13.0]), np.array([11.0, 13.4]), np.array([10.0, 12.0, 30.0])) == \
        pytest.approx([11.0 / 12.0 - 1, 13.2 / 12.0 - 1])
    steady, decided = round_progress(_probes([10.0, 12.0], [11.55] * 9 + [13.2]), ValidationConfig(rounds=2), 2)
    assert steady.startswith("round 2/2: 1 of 10 slices so far beyond +-10%") and "(drift +5% .. +20%)" in steady
    assert "MACHINE NOT STEADY" not in steady and not decided
    # 2 of 10 so far: heading for the verdict, not decided (two later passes could move the reference to 11.55)
    heading, decided = round_progress(_probes([10.0, 12.0], [11.55] * 8 + [13.2] * 2), ValidationConfig(rounds=4), 2)
    assert heading.startswith("round 2/4: 2 of 10 slices so far") and "(drift +5% .. +20%)" in heading
    assert "MACHINE NOT STEADY" in heading and "already decided" not in heading and not decided
    # decided, what --stop-when-unsteady stops on: with every pass run, 1 of the run's 4 slices refused is > 10% ...
    line, decided = round_progress(_probes([10.0, 12.0], [11.55, 13.2]), ValidationConfig(rounds=2), 2)
    assert decided and line.endswith("(already decided, whatever the later profile passes read: at least 1 of the "
                                     "run's 2 slices refused)")
    # ... or after one pass of five, by slices that disagree with each other: a reference keeps one of 8, 12, 17
    line, decided = round_progress(_probes([10.0], [8.0, 12.0, 17.0]), ValidationConfig(rounds=5), 1)
    assert decided and "at least 2 of the run's 15 slices refused)" in line
    # ... or by a point whose 3 slices of 5 no reference keeps beside the run's other 15 (3 of 30 is 10%, not more)
    users = [1, 1, 1] + [2, 3, 4, 5, 6] * 3
    line, decided = round_progress(_probes([10.0, 11.0, 12.0], [20.0] * 3 + [11.55] * 15, users),
                                   ValidationConfig(rounds=5), 3)
    assert decided and "3 of the run's 30 slices refused, a point left with fewer than half its slices" in line
    assert "0 of 1 slices" in round_progress(_probes([10.0], [10.5]), ValidationConfig(rounds=1), 1)[0]
    assert round_progress(_probes([10.0], []), ValidationConfig(rounds=1), 1) == ("round 1/1: no slice served yet",
                                                                                   False)


def test_the_unsteady_verdict_waits_for_the_rounds_max_rounds_may_still_add() -> None:
    """Seven points after three rounds of three: point 1 lost two slices of three, fewer than half kept, and 2 of
    21 refused is 9.5%. A fourth round that --max-rounds may still add would leave it two of four, half."""
    users = [1, 1, 1] + [2, 3, 4, 5, 6, 7] * 3
    probes = _probes([10.0, 11.0, 12.0], [20.0, 20.0, 11.0] + [11.0] * 18, users)
    line, decided = round_progress(probes, ValidationConfig(rounds=3), 3)
    assert decided and "a point left with fewer than half its slices" in line
    line, decided = round_progress(probes, ValidationConfig(rounds=3), 3, most_rounds=4)
    assert not decided and "already decided" not in line


def test_the_unsteady_verdict_waits_for_the_passes_that_could_still_move_the_reference() -> None:
    """Every slice 20-40% faster than the first pass read is no verdict yet: four later passes can put the median
    reference anywhere, and the slices agree with each other. Three passes of five bound it to their range."""
    line, decided = round_progress(_probes([10.0], [6.5, 7.0, 7.5, 7.8]), ValidationConfig(rounds=5), 1)
    assert "4 of 4 slices so far" in line and "MACHINE NOT STEADY" in line and not decided
    assert reference_range(np.array([10.0]), 5) == (0.0, np.inf)
    assert reference_range(np.array([10.0, 30.0, 12.0]), 5) == (10.0, 30.0)
    assert reference_range(np.array([10.0, 12.0]), 2) == (11.0, 11.0)
    # the same slices against three passes at 9.5-10 ms: the reference cannot reach them
    assert round_progress(_probes([10.0, 9.5, 10.0], [6.5, 7.0, 7.5, 7.8]), ValidationConfig(rounds=5), 3)[1]
    assert least_refused(np.array([6.5, 7.0, 7.5, 7.8]), np.arange(4), np.array([10.0, 9.5, 10.0]), 5, 0.1, 5) == \
        (4, False, True)


def test_the_busy_share_counts_the_steps_that_end_in_each_window() -> None:
    def part(start_at: float, end_at: float, steps: list[tuple[float, float]]) -> SimpleNamespace:
        return SimpleNamespace(summary={"window_start_at": start_at, "window_end_at": end_at},
                               steps=pd.DataFrame(steps, columns=["start_at", "end_at"]))
    # window 1 of 2 s: 0.2 s of the step across its start, then 0.5 + 0.25 s (the steps ending at 0.9 and 3.2 lie
    # outside it)
    first = part(1.0, 3.0, [(0.5, 0.9), (0.9, 1.2), (1.5, 2.0), (2.5, 2.75), (3.0, 3.2)])
    # window 2 of 1 s: one step of 0.5 s ending at its end
    second = part(0.0, 1.0, [(0.5, 1.0)])
    assert device_busy_fraction([first]) == pytest.approx(0.475)
    assert device_busy_fraction([first, second]) == pytest.approx(1.45 / 3.0)
    assert device_busy_fraction([part(0.0, 1.0, [(-0.5, 0.5), (0.5, 1.0)])]) == pytest.approx(1.0)  # never above
