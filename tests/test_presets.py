"""Acceptance presets reproduce Table 1 and the Figure 2 anchors of the DSpark paper.

tau of a preset curve is computed exactly (1 + sum of prefix products); the
whole simulator is then checked to reproduce it (every draft verified,
requests run to completion so steps are weighted as in a per-round average),
with samples large enough that the tolerances are many standard errors wide.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import rankdata

from experiments.table1 import measure
from simulator.acceptance.parametric import AcceptanceModel, ConfidenceSpec
from simulator.acceptance.presets import FIGURE2_ANCHORS, PRESETS, TABLE1_QWEN3_4B, preset
from traces.workload import DOMAINS

CASES = [(d, dom) for d in TABLE1_QWEN3_4B for dom in DOMAINS]
NUM_STEPS = 200_000  # for the confidence checks: AUC standard error ~ 0.002


def simulate_block(drafter: str, domain: str, conf: ConfidenceSpec | None = None, seed: int = 0):
    """Confidences [N, 7] and accepted counts [N] of single steps of N fresh requests."""
    model = AcceptanceModel(drafter, 7, confidence=conf)
    rng = np.random.default_rng(seed)
    domain_idx = np.full(NUM_STEPS, DOMAINS.index(domain))
    return model.sample_step(rng, domain_idx, model.request_difficulty(rng, NUM_STEPS), 7)


SIMULATED_REQUESTS = 1000  # per cell: ~1e5 request-steps, standard error of tau ~ 0.7 %


@pytest.fixture(scope="module")
def simulated():
    """(tau, q_1..q_7) per paper cell, measured through the whole simulator."""
    return {(d, dom): measure(d, dom, SIMULATED_REQUESTS, seed=1) for d, dom in CASES}


@pytest.mark.parametrize("drafter, domain", CASES)
def test_preset_tau_matches_table1_within_3_percent(simulated, drafter, domain):
    target = float(np.mean(TABLE1_QWEN3_4B[drafter][domain]))
    assert preset(drafter, domain).tau() == pytest.approx(target, rel=0.03)
    tau, _ = simulated[drafter, domain]
    assert tau == pytest.approx(target, rel=0.03)


@pytest.mark.parametrize("key, value", sorted(FIGURE2_ANCHORS.items()))
def test_simulated_conditional_acceptance_hits_figure2_anchors(simulated, key, value):
    drafter, domain, position = key
    _, q = simulated[drafter, domain]
    assert q[position - 1] == pytest.approx(value, abs=0.03)


def test_dspark_math_stays_high():
    q = preset("dspark", "math").conditional(7)
    assert q.min() >= 0.85


def _auc(score: np.ndarray, label: np.ndarray) -> float:
    ranks = rankdata(score)
    n1, n0 = label.sum(), (~label).sum()
    return float((ranks[label].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def _ece(conf: np.ndarray, label: np.ndarray, bins: int = 10) -> float:
    idx = np.minimum((conf * bins).astype(int), bins - 1)
    total = 0.0
    for b in range(bins):
        sel = idx == b
        if sel.any():
            total += sel.mean() * abs(conf[sel].mean() - label[sel].mean())
    return total


@pytest.mark.parametrize("auc", [0.81, 0.86, 0.91])
def test_confidence_auc_is_configurable_per_position(auc):
    conf, accepted = simulate_block("dspark", "chat", ConfidenceSpec(auc=auc))
    for k in range(7):
        reached = accepted >= k
        got = _auc(conf[reached, k], accepted[reached] >= k + 1)
        assert got == pytest.approx(auc, abs=0.015), f"position {k + 1}"


def test_calibrated_confidence_is_calibrated_and_raw_is_not():
    for calibrated, low, high in ((True, 0.0, 0.02), (False, 0.03, 0.5)):
        conf, accepted = simulate_block("dflash", "code", ConfidenceSpec(calibrated=calibrated))
        ece = _ece(conf[:, 0], accepted >= 1)
        assert low <= ece <= high, (calibrated, ece)


def test_unreachable_auc_is_an_error():
    with pytest.raises(ValueError, match="above what the latent spread allows"):
        AcceptanceModel("eagle3", 3, confidence=ConfidenceSpec(auc=0.99))


def test_every_drafter_has_every_domain():
    assert set(PRESETS) == {"eagle3", "dflash", "dspark", "mtp"}
    for curves in PRESETS.values():
        assert set(curves) == set(DOMAINS)
    with pytest.raises(ValueError, match="valid drafters"):
        preset("medusa", "chat")
