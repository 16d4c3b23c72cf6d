"""Combining a validation's profile passes into one profile, the combined price's standard error, the recombine
command's checks on a run folder and the price slopes' fit (their end-to-end runs: the slow
test_validation_command_meets_the_error_bound)."""

from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from calibration.profiling.profile_file import write_profile
from calibration.validation.passes import COMBINE_RULES, combine_passes, price_se_factor, profile_price_se
from calibration.validation.price_slopes import fitted_slope
from calibration.validation.price_slopes import main as price_slopes_main
from calibration.validation.recombine import main as recombine_main
from calibration.validation.recombine import resampled_logs
from calibration.validation.setup import ValidationConfig
from calibration.validation.validate import parse_args
from simulator.costs import load_profile, profile_from_dict

FIRST = load_profile("h200_qwen3-8b_analytic")


def scaled(time_factor: float) -> object:
    """The first pass on a machine ``time_factor`` times as slow: rates divided by it, seconds multiplied."""
    raw = copy.deepcopy(FIRST.raw)
    raw["verify"]["steps_per_s"] = [v / time_factor for v in raw["verify"]["steps_per_s"]]
    raw["prefill"]["fixed_s"] = time_factor * raw["prefill"]["fixed_s"]
    return profile_from_dict(raw)


def test_the_median_ignores_one_pass_far_off() -> None:
    combined = combine_passes([FIRST, scaled(10.0), scaled(1.5)], "median")
    np.testing.assert_allclose(combined.verify_sps.y, FIRST.verify_sps.y / 1.5)
    np.testing.assert_array_equal(combined.verify_sps.x, FIRST.verify_sps.x)
    assert combined.prefill_fixed_s == pytest.approx(1.5 * FIRST.prefill_fixed_s)
    assert combined.metadata["profile_passes"] == 3 and combined.source == FIRST.source
    assert "element-wise median of 3 passes" in combined.metadata["timing"]


def test_the_mean_averages_seconds_and_rates_through_their_seconds() -> None:
    """A machine twice as slow in one pass of two: every time of the mean is 1.5 times the first's, rates too (the
    harmonic mean of the rates, not their mean, which would price 1.33 times as slow)."""
    combined = combine_passes([FIRST, scaled(2.0)], "mean")
    np.testing.assert_allclose(combined.verify_sps.y, FIRST.verify_sps.y / 1.5)
    assert combined.prefill_fixed_s == pytest.approx(1.5 * FIRST.prefill_fixed_s)
    # with two passes the median is the midpoint of the values themselves
    np.testing.assert_allclose(combine_passes([FIRST, scaled(2.0)], "median").verify_sps.y, FIRST.verify_sps.y * 0.75)


def test_the_trimmed_mean_drops_each_elements_extremes() -> None:
    passes = [scaled(1.0), scaled(10.0), scaled(1.2), scaled(1.4), scaled(0.5)]
    combined = combine_passes(passes, "trimmed")  # keeps 1.0, 1.2 and 1.4: their mean time 1.2
    assert combined.prefill_fixed_s == pytest.approx(1.2 * FIRST.prefill_fixed_s)
    np.testing.assert_allclose(combined.verify_sps.y, FIRST.verify_sps.y / 1.2)
    two = combine_passes([FIRST, scaled(3.0)], "trimmed")  # nothing to drop: the mean
    assert two.prefill_fixed_s == pytest.approx(2.0 * FIRST.prefill_fixed_s)


def with_policy_excess(raw_excess_s: list[float]) -> object:
    """The first pass with a dynamic policy's probe excess as the profiler writes it: the raw per-R means in
    metadata.policy_steps, the entry clamped at 0."""
    raw = copy.deepcopy(FIRST.raw)
    raw["scheduler"] = {**raw["scheduler"], "inline": True, "policies": {"greedy": {
        "num_candidates": [7.0, 14.0], "s": [max(e, 0.0) for e in raw_excess_s]}}}
    raw["metadata"] = {**raw["metadata"], "policy_steps": {"greedy": {"mean_excess_s": raw_excess_s}}}
    return profile_from_dict(raw)


@pytest.mark.parametrize("rule", COMBINE_RULES)
def test_a_policys_excess_is_combined_raw_and_clamped_after(rule: str) -> None:
    """Four passes whose excess at R = 1 is -1, -0.5, 0.2 and 0.5 ms: their clamped entries (0, 0, 0.2, 0.5) would
    combine to 0.175 ms by the mean and 0.1 by the median and the trimmed mean; the raw ones combine to -0.2, -0.15
    and -0.15 ms, which is 0 once clamped. At R = 2 the combination of positive figures is what it was."""
    passes = [with_policy_excess([r1, r2]) for r1, r2 in ((-1e-3, 1e-4), (-5e-4, 2e-4), (2e-4, 3e-4), (5e-4, 4e-4))]
    combined = combine_passes(passes, rule)
    assert combined.scheduler_s(7, "greedy") == 0.0
    raw_r1 = combined.metadata["policy_steps"]["greedy"]["mean_excess_s"][0]
    assert raw_r1 == pytest.approx({"mean": -2e-4, "median": -1.5e-4, "trimmed": -1.5e-4}[rule])
    assert combined.scheduler_s(14, "greedy") == pytest.approx(2.5e-4)  # 0.1-0.4 ms: 0.25 by every rule


def test_passes_on_other_grids_or_an_unknown_rule_are_refused() -> None:
    short = copy.deepcopy(FIRST.raw)
    short["verify"]["steps_per_s"].pop()
    short["verify"]["batch_tokens"].pop()
    with pytest.raises(ValueError, match="differ in the length of profile.verify.batch_tokens"):
        combine_passes([FIRST, profile_from_dict(short)], "mean")
    with pytest.raises(ValueError, match="combine_passes must be one of median, trimmed, mean, got 'average'"):
        combine_passes([FIRST, FIRST], "average")
    with pytest.raises(ValueError, match="combine_passes must be one of"):
        ValidationConfig(combine_passes="average")
    assert parse_args(["--combine-passes", "trimmed"])[0].combine_passes == "trimmed"
    assert ValidationConfig().combine_passes == "trimmed" and set(COMBINE_RULES) == {"median", "trimmed", "mean"}


def test_a_churn_cost_one_pass_fitted_as_none_counts_as_zero() -> None:
    """A pass's loop fit sets a churn cost it finds negative to 0 and leaves the field out of the profile
    (``LoopCosts.fold``): the passes then combine with 0 for it, not fail; any other field one pass lacks is named."""
    def with_verify(**fields: float) -> object:
        raw = copy.deepcopy(FIRST.raw)
        raw["version"], raw["verify"] = 2, {**raw["verify"], **fields}
        return profile_from_dict(raw)

    combined = combine_passes([with_verify(join_s=3e-4, wake_s=1e-3), with_verify(wake_s=2e-3)], "mean")
    assert combined.join_s == pytest.approx(1.5e-4) and combined.wake_s == pytest.approx(1.5e-3)
    assert combined.leave_s == 0.0 and "leave_s" not in combined.raw["verify"]
    lacking = copy.deepcopy(FIRST.raw)
    del lacking["prefill"]["fixed_s"]
    with pytest.raises(ValueError, match=r"profile.prefill.fixed_s is missing from pass\(es\) 3"):
        combine_passes([FIRST, FIRST, dataclasses.replace(FIRST, raw=lacking)], "mean")


def test_prefill_tails_of_different_lengths_combine_with_zeros_beyond_their_end() -> None:
    """``LoopCosts.fold`` ends a pass's ``prefill.decode_tail_s`` after its last step that pays (and leaves it out
    when none does): the passes combine as if each went on with zeros."""
    def with_tail(*tail: float) -> object:
        raw = copy.deepcopy(FIRST.raw)
        raw["version"] = 2
        if tail:
            raw["prefill"] = {**raw["prefill"], "decode_tail_s": list(tail)}
        return profile_from_dict(raw)

    combined = combine_passes([with_tail(1e-3, 3e-4, 1e-4), with_tail(1.2e-3), with_tail()], "mean")
    np.testing.assert_allclose(combined.decode_tail_s, [2.2e-3 / 3, 1e-4, 1e-4 / 3], rtol=1e-12)


def test_the_price_error_of_a_mean_is_the_passes_spread_over_sqrt_n() -> None:
    ratios = np.array([1.0, 1.1, 0.95, 1.05])
    prices = 1 / ratios
    spread = np.std(prices / prices.mean(), ddof=1) / 2
    assert profile_price_se(ratios, "mean") == pytest.approx(spread)
    assert profile_price_se(ratios, "median") == pytest.approx(np.sqrt(np.pi / 2) * spread)
    assert price_se_factor("trimmed") == price_se_factor("median")
    assert np.isnan(profile_price_se([1.0], "mean"))


def test_recombine_names_what_a_folder_lacks(tmp_path, capsys) -> None:
    def fails(match: str) -> None:
        with pytest.raises(SystemExit):
            recombine_main([str(tmp_path)])
        assert match in capsys.readouterr().err

    fails("no config.json (not the output folder of calibration.validate)")
    (tmp_path / "config.json").write_text(json.dumps({"users": [1, 2], "rounds": 3, "colour": "red"}))
    fails("config.json: unknown key(s) colour (written by another version)")
    (tmp_path / "config.json").write_text(json.dumps({"users": [1, 2], "rounds": 3}))
    write_profile(FIRST.raw, tmp_path / "profile_passes" / "pass1.json")
    fails("needs profile_passes/pass<k>.json from two profile passes or more")
    write_profile(FIRST.raw, tmp_path / "profile_passes" / "pass2.json")
    fails("no probes.csv (the drift readings that say which profile passes the run kept)")
    (tmp_path / "probes.csv").write_text("round,phase,policy,num_users,before_s,after_s\n"
                                         "0,profile,,0,0.002,0.002\n1,profile,,0,0.002,0.002\n")
    fails("pricing_profile.json")
    write_profile(FIRST.raw, tmp_path / "pricing_profile.json")
    (tmp_path / "points.csv").write_text("policy,num_users,spoiled\nmtp1,1,True\n")
    (tmp_path / "slices.csv").write_text("policy,num_users,slice,kept\nmtp1,1,0,False\n")
    fails("points.csv: every point is spoiled (column spoiled): nothing to compare")
    with pytest.raises(SystemExit):
        recombine_main([str(tmp_path), "--rules", "median,average"])
    assert "combine_passes must be one of median, trimmed, mean, got 'average'" in capsys.readouterr().err


def test_price_slopes_name_the_real_steps_a_folder_lacks(tmp_path, capsys) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"users": [1], "rounds": 2}))
    for name in ("profile_passes/pass1.json", "profile_passes/pass2.json", "pricing_profile.json"):
        write_profile(FIRST.raw, tmp_path / name)
    (tmp_path / "probes.csv").write_text("round,phase,policy,num_users,before_s,after_s\n"
                                         "0,profile,,0,0.002,0.002\n1,profile,,0,0.002,0.002\n")
    (tmp_path / "points.csv").write_text("policy,num_users,spoiled\nmtp1,1,False\n")
    (tmp_path / "slices.csv").write_text("policy,num_users,slice,kept\nmtp1,1,0,True\nmtp1,1,1,True\n")
    with pytest.raises(SystemExit):
        price_slopes_main([str(tmp_path)])
    assert "no real_mtp1_u1_steps.parquet (the real steps of mtp1 x1 that the passes price)" in \
        capsys.readouterr().err


def test_a_price_slope_is_the_least_squares_slope_of_the_logs() -> None:
    price = np.array([1.0, 1.03, 0.98, 1.06])
    slope, se = fitted_slope(price, 7.0 * price ** -1.5)  # one and a half times the price, exactly
    assert slope == pytest.approx(1.5) and se == pytest.approx(0.0, abs=1e-9)
    noisy = 7.0 * price ** -1.5 * np.array([1.01, 0.99, 1.0, 1.0])
    slope, se = fitted_slope(price, noisy)
    assert slope == pytest.approx(-np.polyfit(np.log(price), np.log(noisy), 1)[0]) and se > 0
    slope, se = fitted_slope(price[:2], 7.0 / price[:2])  # two passes: a slope, no standard error
    assert slope == pytest.approx(1.0) and np.isnan(se)
    assert all(np.isnan(fitted_slope(np.ones(3), np.arange(1.0, 4.0))))  # prices that do not differ tell nothing


def toy_log(num_draft: int, shift: float) -> pd.DataFrame:
    """Two domains of three requests; each row's confidence names its request (domain, id) and the log."""
    rows = [{"domain": d, "request_id": r, "position": k, "confidence": shift + 10 * i + r}
            for i, d in enumerate(("chat", "math")) for r in range(3) for k in range(num_draft)]
    return pd.DataFrame(rows)


def test_log_resampling_draws_the_same_texts_for_every_block_size() -> None:
    logs = {1: toy_log(1, 0.0), 7: toy_log(7, 0.5)}
    out = resampled_logs(logs, np.random.default_rng(3))
    for g, log in out.items():
        assert sorted(log.groupby("domain")["request_id"].unique().map(sorted).tolist()) == [[0, 1, 2], [0, 1, 2]]
        assert (log.groupby(["domain", "request_id"]).size() == g).all()  # whole requests, every position
    # the original request behind new request j is the same in both logs: confidence - shift identifies it
    one = out[1].set_index(["domain", "request_id"])["confidence"]
    seven = out[7].groupby(["domain", "request_id"])["confidence"].first() - 0.5
    pd.testing.assert_series_equal(one.sort_index(), seven.sort_index(), check_names=False)
    drawn = [resampled_logs(logs, np.random.default_rng(s))[1]["confidence"].tolist() for s in range(20)]
    assert any(len(set(d)) < len(d) for d in drawn)  # with replacement: some draw repeats a request
    assert resampled_logs(logs, np.random.default_rng(3))[7].equals(out[7])  # same seed, same draw


def test_log_resampling_refuses_logs_of_other_prompts(capsys) -> None:
    logs = {1: toy_log(1, 0.0), 7: toy_log(7, 0.0).query("request_id != 2")}
    with pytest.raises(ValueError, match="domain chat lacks request"):
        for s in range(50):  # some draw picks request 2
            resampled_logs(logs, np.random.default_rng(s))
    with pytest.raises(SystemExit):
        recombine_main(["nowhere", "--log-resamples", "1"])
    assert "--log-resamples must be >= 2 (a spread needs two draws), got 1" in capsys.readouterr().err
