"""The parametric confidence head: per-position AUC, calibration of prefix survival, and Figures 5 and 6 from its
samples.

Samples come from the offline protocol (every draft verified, whole
requests), the population of steps the AUCs are defined over. With about 70k
rounds an AUC's standard error is about 0.003 and an ECE's noise floor about
0.3 %, so the tolerances below are several of those wide.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from calibration.acceptance.confidence import figure6_table, sample, survival_auc
from calibration.acceptance.sts import auc, ece, fit_sts
from policies import make_policy
from policies.base import CostCurve, StepView
from simulator.acceptance.offline import run_offline
from simulator.acceptance.paper import FIGURE5_ACCEPTANCE_RATE, FIGURE6_AUC, FIGURE6_ECE_RAW, FIGURE6_POSITIONS
from simulator.acceptance.parametric import DEFAULT_OVERCONFIDENCE, AcceptanceModel, ConfidenceSpec


def rounds(confidence: ConfidenceSpec, preset: str = "qwen3-8b_dflash", domain: str = "code", seed: int = 0):
    model = AcceptanceModel(preset, 7, confidence=confidence)
    result = run_offline(model, domain, 7, np.random.default_rng(seed), 4000, 64, collect=True)
    return result.confidence, result.accepted


def conditional_auc(confidence: np.ndarray, accepted: np.ndarray, k: int) -> float:
    """AUC of c_k against acceptance among rounds that reached position k (1-based)."""
    reached = accepted >= k - 1
    return auc(confidence[reached, k - 1], accepted[reached] >= k)


def test_auc_is_set_per_position():
    wanted = (0.78, 0.80, 0.83, 0.85, 0.87, 0.88, 0.89)
    confidence, accepted = rounds(ConfidenceSpec(auc=wanted))
    for k, target in enumerate(wanted, start=1):
        assert conditional_auc(confidence, accepted, k) == pytest.approx(target, abs=0.015), f"position {k}"


def test_one_auc_stands_for_every_position_and_a_list_carries_its_last_value_on():
    one = rounds(ConfidenceSpec(auc=0.84))
    listed = rounds(ConfidenceSpec(auc=[0.84, 0.84]))
    np.testing.assert_array_equal(one[0], listed[0])
    np.testing.assert_array_equal(one[1], listed[1])


@pytest.mark.parametrize("preset, domain", [("qwen3-8b_dflash", "code"), ("qwen3-4b_eagle3", "chat")])
def test_calibrated_confidence_is_calibrated_for_prefix_survival(preset, domain):
    confidence, accepted = rounds(ConfidenceSpec(), preset, domain)
    survival = np.cumprod(confidence, axis=1)
    for k in range(1, 8):
        observed = (accepted >= k).mean()
        assert survival[:, k - 1].mean() == pytest.approx(observed, abs=0.006), f"a_{k}"
        assert ece(survival[:, k - 1], (accepted >= k).astype(float)) < 0.01, f"ECE of a_{k}"
        reached = accepted >= k - 1  # and each c_k among the rounds that reached k
        assert confidence[reached, k - 1].mean() == pytest.approx((accepted[reached] >= k).mean(), abs=0.008)


@pytest.fixture(scope="module")
def figure6():
    result, model = sample(ConfidenceSpec(), seed=5)
    return result, model, figure6_table(result, model).set_index("position")


@pytest.mark.parametrize("position, paper", list(zip(FIGURE6_POSITIONS, FIGURE6_AUC, strict=True)))
def test_survival_auc_follows_figure6(figure6, position, paper):
    assert figure6[2].loc[position, "auc"] == pytest.approx(paper, abs=0.02)


@pytest.mark.parametrize("position, paper", list(zip(FIGURE6_POSITIONS, FIGURE6_ECE_RAW, strict=True)))
def test_raw_head_ece_follows_figure6_and_sts_takes_it_to_about_one_percent(figure6, position, paper):
    table = figure6[2]
    assert table.loc[position, "ece_raw"] == pytest.approx(paper, abs=0.015)
    assert table.loc[position, "ece_sts"] < 0.012


def test_sts_removes_the_raw_heads_miscalibration_for_the_right_reason(figure6):
    """The raw head is the calibrated one through a temperature per position: STS finds those temperatures."""
    result, model, _ = figure6
    raw = model.raw(result.confidence)
    fitted = fit_sts(raw, result.accepted).temperatures
    np.testing.assert_allclose(fitted, DEFAULT_OVERCONFIDENCE, rtol=0.08)
    assert survival_auc(result.confidence, result.accepted, 1) == pytest.approx(
        survival_auc(raw, result.accepted, 1))  # a temperature never changes the order at position 1


def test_a_logit_bias_is_what_sts_cannot_remove():
    spec = ConfidenceSpec(calibrated=False, overconfidence=1.0, bias=0.8)
    confidence, accepted = rounds(spec)
    calibrated = fit_sts(confidence, accepted).apply(confidence)
    errors = [ece(np.prod(calibrated[:, :k], axis=1), (accepted >= k).astype(float)) for k in range(1, 8)]
    assert max(errors) > 0.02  # temperature scaling alone leaves a shift behind


@pytest.mark.parametrize("kwargs, match", [
    ({"auc": 0.4}, "strictly between 0.5 and 1"),
    ({"auc": [0.8, 1.0]}, "strictly between 0.5 and 1"),
    ({"overconfidence": [1.2, 0.0]}, "finite number > 0"),
    ({"source": "oracle"}, "must be head or online"),
])
def test_bad_confidence_settings_name_the_key(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ConfidenceSpec(**kwargs)


def test_an_unreachable_auc_names_the_position_and_the_range():
    model = AcceptanceModel("qwen3-8b_eagle3", 7, confidence=ConfidenceSpec(auc=(0.8, 0.99)))
    with pytest.raises(ValueError, match=r"auc=0\.990 at position 2 cannot be reached .* reaches 0\.\d+\.\.0\.\d+"):
        model.sample_step(np.random.default_rng(0), np.zeros(4, dtype=np.int64), np.zeros(4), 7)


FIGURE5_BENCHMARKS = {"math": "gsm8k", "code": "humaneval", "chat": "mt_bench"}


@pytest.fixture(scope="module")
def figure5():
    """Acceptance rate with the bonus token at theta 0, 0.4 and 0.8 per variant and domain (Qwen3-4B DSpark)."""
    cost = CostCurve(np.arange(1, 3), np.ones(2))  # the threshold rule reads confidences only
    rates = {}
    for variant in ("position", "prefix"):
        for domain, bench in FIGURE5_BENCHMARKS.items():
            for theta in (0.0, 0.4, 0.8):
                policy = make_policy("threshold", theta=theta, variant=variant)
                model = AcceptanceModel("qwen3-4b_dspark", 7, benchmark_mix={bench: 1.0})
                result = run_offline(model, domain, 7, np.random.default_rng(2), 3000, 48,
                                     lengths=lambda c, p=policy: p.decide(StepView(c, cost)).lengths)
                rates[variant, domain, theta] = result.acceptance_rate
    return rates


@pytest.mark.parametrize("domain", FIGURE5_BENCHMARKS)
def test_figure5_threshold_sweep(figure5, domain):
    at_zero, at_top = FIGURE5_ACCEPTANCE_RATE[domain]
    for variant in ("position", "prefix"):
        rates = [figure5[variant, domain, theta] for theta in (0.0, 0.4, 0.8)]
        assert rates[0] == pytest.approx(at_zero, abs=0.012)  # every draft verified: tau / 8 of the benchmark
        assert rates[0] < rates[1] < rates[2]
    # At the top threshold the paper's rule lands 3-5 points under Figure 5, prefix survival within 2.5.
    assert figure5["position", domain, 0.8] == pytest.approx(at_top, abs=0.06)
    assert figure5["prefix", domain, 0.8] == pytest.approx(at_top, abs=0.025)
    # Chat, where fixed-length verification wastes most, gains most from the threshold.
    gain = {d: figure5["position", d, 0.8] - figure5["position", d, 0.0] for d in FIGURE5_BENCHMARKS}
    assert gain["chat"] == max(gain.values())


def test_a_long_fit_says_so_in_the_log_and_a_floored_auc_warns(caplog):
    rng = np.random.default_rng(0)
    mix = {"gsm8k": 1.0, "math500": 1.0, "aime25": 1.0}
    with caplog.at_level(logging.INFO, logger="simulator.acceptance.parametric"):
        model = AcceptanceModel("qwen3-8b_dspark", 17, benchmark_mix=mix)  # 3 curves x 17 positions
        model.sample_step(rng, np.zeros(3000, dtype=np.int64), model.request_difficulty(rng, 3000), 17)
    assert "fitting the acceptance model of preset qwen3-8b_dspark: 3 curve(s) x 17 positions" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="simulator.acceptance.parametric"):
        model = AcceptanceModel("qwen3-8b_dspark", 7, confidence=ConfidenceSpec(auc=0.6))
        model.sample_step(rng, np.zeros(5, dtype=np.int64), np.zeros(5), 7)
    assert "below what knowing the step's difficulty alone gives" in caplog.text
