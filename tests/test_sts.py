"""Sequential temperature scaling: order-preserving, lowers ECE on a miscalibrated log, sane metrics."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from calibration.acceptance.sts import (
    auc,
    brier,
    ece,
    fit_sts,
    position_metrics,
    reliability_diagram,
    sts_report,
    temperature_scale,
)
from simulator.acceptance.logs import to_blocks
from tests.log_factories import synthetic_log

probabilities = arrays(np.float64, st.integers(2, 60), elements=st.floats(1e-4, 1 - 1e-4))


@settings(max_examples=60, deadline=None)
@given(confidence=probabilities, temperature=st.floats(0.05, 20.0))
def test_temperature_scaling_never_reorders_confidences(confidence, temperature):
    scaled = temperature_scale(confidence, temperature)
    order = np.argsort(confidence, kind="stable")
    assert np.all(np.diff(scaled[order]) >= 0.0)
    assert np.all((scaled >= 0.0) & (scaled <= 1.0))  # may saturate to 1.0 in float64 at small T


@pytest.mark.parametrize("score, label, expected", [
    ([0.1, 0.2, 0.8, 0.9], [0, 0, 1, 1], 1.0),  # perfect ranking
    ([0.9, 0.8, 0.2, 0.1], [0, 0, 1, 1], 0.0),  # reversed
    ([0.5, 0.5, 0.5, 0.5], [0, 1, 0, 1], 0.5),  # all tied: half credit
    ([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1], 0.75),  # the textbook example
])
def test_auc_table(score, label, expected):
    assert auc(np.array(score), np.array(label, bool)) == pytest.approx(expected)


def test_ece_and_brier_of_calibrated_and_overconfident_predictions():
    rng = np.random.default_rng(0)
    p = rng.random(200_000)
    outcome = (rng.random(p.size) < p).astype(float)
    assert ece(p, outcome) < 0.01
    assert ece(np.clip(p * 1.3, 0, 1), outcome) > 0.05
    assert brier(p, outcome) == pytest.approx(1 / 6, abs=0.005)  # E[p (1 - p)] for uniform p


@pytest.fixture(scope="module")
def overconfident():
    """Blocks whose raw confidences are overconfident on the logit scale (x 2.5, shifted up)."""
    df = synthetic_log(np.random.default_rng(8), num_requests=200, num_tokens=60, overconfidence=2.5, bias=0.8)
    blocks = to_blocks(df)
    return blocks


def test_sts_lowers_ece_on_a_miscalibrated_log(overconfident):
    report = sts_report(overconfident, overconfident.confidence, np.random.default_rng(1))
    before, after = report.before, report.after
    assert (after["ece"] < before["ece"]).all()
    assert after["ece"].mean() < 0.5 * before["ece"].mean()
    assert (report.calibration.temperatures > 1.0).all()  # overconfident: soften every position
    # Position 1's ranking is untouched; later positions change only through earlier temperatures.
    assert after["auc"].iloc[0] == pytest.approx(before["auc"].iloc[0])


def test_sts_keeps_a_calibrated_log_nearly_as_is():
    df = synthetic_log(np.random.default_rng(9), num_requests=200, num_tokens=60, domains=("code",))
    blocks = to_blocks(df)
    # The synthetic confidence is P(accept) itself, so prefix products are calibrated already.
    raw = position_metrics(blocks.confidence, blocks.num_accepted)
    assert raw["ece"].max() < 0.03
    cal = fit_sts(blocks.confidence, blocks.num_accepted)
    np.testing.assert_allclose(cal.temperatures, 1.0, atol=0.35)


def test_sts_order_within_each_position_on_a_log(overconfident):
    cal = fit_sts(overconfident.confidence, overconfident.num_accepted)
    out = cal.apply(overconfident.confidence)
    for k in range(out.shape[1]):
        order = np.argsort(overconfident.confidence[:, k], kind="stable")
        assert np.all(np.diff(out[order, k]) >= 0.0)


def test_reliability_diagram_writes_a_png(tmp_path, overconfident):
    report = sts_report(overconfident, overconfident.confidence, np.random.default_rng(2))
    path = tmp_path / "reliability.png"
    reliability_diagram(report, path, title="synthetic")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
