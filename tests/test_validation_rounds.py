"""A validation's rounds (calibration.validation.rounds): how many it serves, and ``max_rounds``, which adds rounds
while the profile passes disagree (the end-to-end run with it: the slow test at the bottom)."""

from __future__ import annotations

import json
from functools import partial
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from calibration.validation import rounds
from calibration.validation.recombine import main as recombine_main
from calibration.validation.report import STEADY_MAX_PROFILE_PRICE_SE, MachineNotSteady
from calibration.validation.setup import ValidationConfig
from calibration.validation.validate import main, parse_args
from simulator.costs import load_profile

PROFILE = load_profile("h200_qwen3-8b_analytic")


def test_max_rounds_is_checked_at_start() -> None:
    with pytest.raises(ValueError, match=r"max_rounds \(3\) must be >= rounds \(5\)"):
        ValidationConfig(rounds=5, max_rounds=3)
    with pytest.raises(ValueError, match="with a given profile there is one pass"):
        ValidationConfig(max_rounds=9, profile="profile.json")
    assert parse_args(["--rounds", "5", "--max-rounds", "9"])[0].max_rounds == 9
    assert ValidationConfig().max_rounds is None


@pytest.mark.parametrize("target", [0.0, -0.01, STEADY_MAX_PROFILE_PRICE_SE * 1.001, float("nan")])
def test_a_target_price_error_outside_0_to_the_steady_bound_is_refused_at_start(target: float) -> None:
    with pytest.raises(ValueError, match=r"target_price_se must lie in \(0, 0\.02507\] \(the steady bound\)"):
        ValidationConfig(target_price_se=target)
    assert parse_args(["--max-rounds", "9", "--target-price-se", "0.01"])[0].target_price_se == 0.01
    assert ValidationConfig(target_price_se=STEADY_MAX_PROFILE_PRICE_SE).target_price_se > 0  # the bound itself


@pytest.mark.parametrize(("duration_s", "warmup_s", "planned"), [(15.0, 0.5, 5), (4.0, 0.5, 5), (2.0, 0.3, 2),
                                                                 (8.0, 0.5, 2), (15.0, 0.5, 9)])
def test_a_run_with_more_rounds_keeps_the_slice_length(duration_s: float, warmup_s: float, planned: int) -> None:
    cfg = ValidationConfig(duration_s=duration_s, warmup_s=warmup_s, rounds=planned, max_rounds=planned + 4)
    assert cfg.with_rounds(planned) is cfg
    for served in range(planned + 1, planned + 5):
        more = cfg.with_rounds(served)
        assert more.rounds == served and more.max_rounds == planned + 4
        assert more.slice_duration_s == pytest.approx(cfg.slice_duration_s, rel=1e-12)
        assert more.duration_s - warmup_s == pytest.approx((duration_s - warmup_s) * served / planned, rel=1e-12)


def _fake_rounds(monkeypatch, price_ses: list[float]) -> list[str]:
    """measure_rounds without models: every pass is the analytic profile, every slice an empty result, the reference
    probe steady, and run_price_se reads ``price_ses`` in turn. Returns the progress lines."""
    ses = iter(price_ses)
    monkeypatch.setattr(rounds, "measure_profile", lambda cfg, models: PROFILE)
    monkeypatch.setattr(rounds, "loop_pricing", lambda *args: None)
    monkeypatch.setattr(rounds, "serve", lambda spec, models: SimpleNamespace(seed=spec.seed))
    monkeypatch.setattr(rounds, "run_price_se", lambda cfg, reals, passes: next(ses))
    return []


@pytest.mark.parametrize(("price_ses", "served"), [
    ([0.05, 0.01], 3),  # too wide after the 2 rounds asked for, narrow enough after one more
    ([0.05, 0.05, 0.05], 5),  # never narrow enough: up to max_rounds, no further
    ([0.015, 0.015], 3),  # at the target is narrow enough, once three passes tell it
    ([0.001, 0.05, 0.01], 4),  # two passes that agree are not enough: a third, which disagrees, then a fourth
    ([0.0151, 0.02, 0.015], 4),  # steady (below 2.51%) but above the target: rounds until it is met
    ([float("nan"), 0.01], 3),  # NaN (one pass cannot tell) counts as not narrow enough
])
def test_max_rounds_adds_rounds_while_the_passes_disagree(monkeypatch, price_ses: list[float], served: int) -> None:
    lines = _fake_rounds(monkeypatch, price_ses)
    cfg = ValidationConfig(users=(1, 2), policies=("mtp1",), rounds=2, max_rounds=5, target_price_se=0.015)
    probe_log: list[dict] = []
    passes, reals = rounds.measure_rounds(cfg, SimpleNamespace(verifier=None, drafter=None, prompts=None,
                                                               description="none"),
                                          [("mtp1", 1), ("mtp1", 2)], lambda: 1.0, lines.append,
                                          probe_log=probe_log)
    assert len(passes) == served and all(len(slices) == served for slices in reals.values())
    assert [s.seed for s in reals[("mtp1", 1)]] == list(range(served))  # each round its own seed, as before
    probes = pd.DataFrame(probe_log)
    assert probes.groupby("round").size().tolist() == [3] * served  # a pass and two slices per round
    extra = [line for line in lines if "one more round" in line]
    assert len(extra) == served - 2 and (not extra or extra[-1].endswith(f"{served} of at most 5"))
    if price_ses[0] <= 0.015:  # the second round's passes agree: the count, not the spread, adds the third
        assert "(target: at most 1.50%, read from at least 3 kept passes): one more round, 3 of at most 5" in extra[0]
    assert f"pass {served}/{served}" in [line for line in lines if line.startswith("profiling")][-1]


def test_without_max_rounds_a_run_serves_exactly_its_rounds(monkeypatch) -> None:
    lines = _fake_rounds(monkeypatch, [])  # run_price_se is never asked
    cfg = ValidationConfig(users=(1,), policies=("mtp1",), rounds=3)
    passes, reals = rounds.measure_rounds(cfg, SimpleNamespace(verifier=None, drafter=None, prompts=None,
                                                               description="none"),
                                          [("mtp1", 1)], lambda: 1.0, lines.append)
    assert len(passes) == 3 and len(reals[("mtp1", 1)]) == 3 and not any("one more" in line for line in lines)


def test_passes_that_the_remaining_rounds_cannot_bring_together_are_named() -> None:
    """The long run of 2026-12-05 at 18:46: 8.99% after two passes of at most four would still be 6.36% at four,
    above twice the steady bound (5.01%); 4% would come to 2.83%, which more rounds may still bring down."""
    line = rounds.hopeless_passes(0.0899, 2, 4)
    assert line is not None and "mean standard error of 8.99%; at the 4 passes the run may reach, the same spread " \
        "would still leave 6.36%, more than 2 times the steady bound (2.51%)" in line
    assert rounds.hopeless_passes(0.04, 2, 4) is None
    assert rounds.hopeless_passes(float("nan"), 2, 4) is None
    bound = rounds.STOP_PRICE_SE_FACTOR * STEADY_MAX_PROFILE_PRICE_SE
    assert rounds.hopeless_passes(bound * 1.001, 3, 3) is not None and rounds.hopeless_passes(bound, 3, 3) is None


@pytest.mark.parametrize(("price_ses", "stopped_after"), [
    ([0.0899], 2),  # hopeless after the second round: stops before max_rounds would add a third
    ([0.04, 0.04], None),  # wide, but not beyond mending: max_rounds adds rounds up to its 4, the last reported
])
def test_stop_when_unsteady_stops_passes_beyond_mending(monkeypatch, price_ses: list[float],
                                                         stopped_after: int | None) -> None:
    lines = _fake_rounds(monkeypatch, price_ses)
    cfg = ValidationConfig(users=(1,), policies=("mtp1",), rounds=2, max_rounds=4, stop_when_unsteady=True)
    measure = partial(rounds.measure_rounds, cfg, SimpleNamespace(verifier=None, drafter=None, prompts=None,
                                                                  description="none"),
                      [("mtp1", 1)], lambda: 1.0, lines.append)
    if stopped_after is None:
        passes, _ = measure()
        assert len(passes) == 4
        return
    with pytest.raises(MachineNotSteady, match=rf"stopped after round {stopped_after}/2 \(--stop-when-unsteady\): "
                                               r"the 2 profile passes .* 8\.99%.* 6\.36%"):
        measure()


@pytest.mark.parametrize(("max_rounds", "stops"), [(4, True), (2, False)])
def test_slices_that_decide_the_verdict_on_the_last_planned_round_stop_a_run_max_rounds_would_extend(
        monkeypatch, max_rounds: int, stops: bool) -> None:
    """Round 2 of 2 serves one slice at half and one at twice the passes' speed: no reference keeps both, which
    decides the verdict. When --max-rounds would add a round (passes 3% apart, rounds left) the run stops there;
    when it cannot (no round left), round 2 is the last and the run reports, as before."""
    lines = _fake_rounds(monkeypatch, [0.03])
    readings = iter([1.0] * 8 + [0.5, 0.5, 2.0, 2.0])
    cfg = ValidationConfig(users=(1, 2), policies=("mtp1",), rounds=2, max_rounds=max_rounds,
                           stop_when_unsteady=True)
    measure = partial(rounds.measure_rounds, cfg, SimpleNamespace(verifier=None, drafter=None, prompts=None,
                                                                  description="none"),
                      [("mtp1", 1), ("mtp1", 2)], lambda: next(readings, 1.0), lines.append)
    if stops:
        with pytest.raises(MachineNotSteady, match=r"stopped after round 2/2 \(--stop-when-unsteady\): round 2/2: "
                                                   r"2 of 4 slices"):
            measure()
        return
    passes, _ = measure()
    assert len(passes) == 2 and "already decided" in lines[-1]


@pytest.mark.slow  # ~60 s: acceptance logs, three profile passes and three rounds of real slices
def test_a_run_extended_by_max_rounds_reports_and_recombines_the_rounds_it_served(tmp_path, capsys) -> None:
    """With a target of 1e-9 no pair of passes is close enough, so a run asked for 1 round goes on to its
    max_rounds of 3: three passes and three slices per point, the measured window three times as long, the report
    saying so, and config.json holding the rounds served, from which recombine gives back its figures exactly."""
    out = tmp_path / "out"
    result = main(["--models", "random", "--users", "1,2", "--policies", "mtp1", "--duration-s", "1.3",
                   "--warmup-s", "0.3", "--rounds", "1", "--max-rounds", "3", "--target-price-se", "1e-9",
                   "--profile-repeats", "1",
                   "--log-requests", "4", "--output-tokens", "16", "--drift-tolerance", "10", "--out", str(out)])
    err = capsys.readouterr().err
    assert "one profile pass cannot tell its own error: one more round, 2 of at most 3" in err
    assert "the 2 profile passes price the points' real steps with a mean standard error of" in err
    assert result.config.rounds == 3 and result.planned_rounds == 1 and len(result.passes) == 3
    assert result.config.duration_s == pytest.approx(3.3) and result.config.slice_duration_s == pytest.approx(1.3)
    config = json.loads((out / "config.json").read_text())
    assert config["rounds"] == 3 and config["duration_s"] == pytest.approx(3.3)
    report = (out / "validation.md").read_text()
    assert "real runs in 3 round-robin slice(s) of 1.3 s, each with its warm-up (1 asked for, 2 more while the " \
           "profile passes disagreed; at most 3)" in report
    assert sorted(p.name for p in (out / "profile_passes").iterdir()) == ["pass1.json", "pass2.json", "pass3.json"]
    assert pd.read_parquet(out / "real_mtp1_u2_steps.parquet")["slice"].unique().tolist() == [0, 1, 2]
    assert (result.table["slices"] == 3).all() and np.isfinite(result.table["profile_price_se"]).all()
    recombined = recombine_main([str(out), "--rules", "trimmed"])[out]
    assert len(recombined) == 2 and (recombined[["throughput_moved", "tpu_mean_moved"]] == 0).all().all()
