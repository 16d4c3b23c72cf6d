"""Joint extremes of a fitted profile: the cheapest and dearest fits of a speculative probe step."""

from __future__ import annotations

import numpy as np
import pytest

from calibration.fitting.export import ExportOptions, profiles
from calibration.fitting.extremes import Alternative, probes
from calibration.fitting.identify import DELTA_CHI2
from calibration.fitting.model import DrafterCost
from calibration.fitting.pipeline import FitConfig, fit_runs
from calibration.fitting.report import unidentified_words
from simulator.costs import profile_from_dict
from tests.test_fit_profile import DRAFT_FIXED_S, DRAFT_PER_POSITION_S, known_profile, known_runs

DRAFT_TOKEN_S = 60e-6  # the target's work per verified draft token
PARALLEL_FROM = 3  # the drafter costs no more beyond this many positions


def parallel_truth():
    """The known profile with a drafter that is flat beyond k = 3 and a target that pays per verified draft token:
    from runs at k = 1 and 3, both are beyond what static runs can tell apart."""
    data = known_profile(draft_token_s=DRAFT_TOKEN_S).raw
    data["draft"]["mtp"]["latency_s"] = [[DRAFT_FIXED_S + DRAFT_PER_POSITION_S * min(g, PARALLEL_FROM)
                                          for g in range(1, 9)]] * 2
    return profile_from_dict(data, "<parallel truth>")


@pytest.fixture(scope="module")
def report():
    """Fitted from k = 0, 1 and 3 runs of :func:`parallel_truth`, extremes built for k = 7."""
    return fit_runs(known_runs(profile=parallel_truth()), FitConfig(max_batch_tokens=32 * 8, probe_draft_tokens=7))


def true_step_s(truth, r: int, k: int, verified: int, context: float) -> float:
    return (truth.verify_s(r, r * (1 + verified)) + truth.attention_s(np.full(r, context), 1 + verified)
            + truth.draft_s("mtp", r, k))


def _predictions(report, fits, shapes, context):
    r, k, v = (np.array([s[i] for s in shapes], dtype=np.float64) for i in range(3))
    return np.array([report.model.predict_s(a.theta, r, r * (1 + v), np.full(r.size, context), k,
                                            draft_cap=a.draft_cap) for a in fits])  # [fits, shapes]


def test_the_joint_extremes_cover_steps_that_no_single_alternative_covers(report):
    """Fitted from k = 0, 1, 3 runs of a truth whose drafter is parallel and whose target pays per verified draft
    token, a k = 7 step is cheapest with both at once. The single alternatives (one parameter or one
    extrapolation at an end) leave some k = 7 steps outside their interval; with the joint extremes every one
    of them is inside, and every extreme explains the runs within delta chi-square of the best fit."""
    truth = parallel_truth()
    assert report.extremes, "no joint extremes for a fitted parallel drafter"
    context = float(np.median(report.fit.problem.obs.context_tokens))
    shapes = [(r, 7, v) for r in (1, 4, 16, 32) for v in (1, 3, 7)]
    truth_s = np.array([true_step_s(truth, r, k, v, context) for r, k, v in shapes])
    single = [a for name, a in report.alternatives.items() if name not in report.extremes]
    everything = list(report.alternatives.values())
    central = Alternative(report.central)
    p_single = _predictions(report, [central, *single], shapes, context)
    p_all = _predictions(report, [central, *everything], shapes, context)
    tolerance = 1e-3 * truth_s
    outside_single = (truth_s < p_single.min(axis=0) - tolerance) | (truth_s > p_single.max(axis=0) + tolerance)
    outside_all = (truth_s < p_all.min(axis=0) - tolerance) | (truth_s > p_all.max(axis=0) + tolerance)
    assert outside_single.any(), "the single alternatives already cover every shape: the test shows nothing"
    assert not outside_all.any(), [s for s, o in zip(shapes, outside_all, strict=True) if o]
    problem = report.fit.problem
    for name, alternative in report.extremes.items():
        # the data rows only: beyond the runs' largest batch the extremes take the dense curve flat or
        # proportional, which no run sees but the smoothness rows do
        assert problem.data_chi2(alternative.theta) <= report.fit.chi2 + DELTA_CHI2 + 1e-6, name


def test_the_extremes_reach_the_profile_and_the_report(report):
    data = profiles(report, ExportOptions(device="test", model="known", created="2025-01-01", max_requests=64,
                                          max_draft_tokens=8))
    written = data["metadata"]["fit"]["alternatives"]
    for name in report.extremes:
        assert name in written
        profile_from_dict(written[name], name)
    cheapest = [n for n in report.extremes if n.endswith(".cheapest")]
    assert cheapest and all(report.extremes[n].draft_cap == 3 for n in cheapest)
    assert all(report.extremes[n].draft_cap is None for n in report.extremes if n.endswith(".dearest"))
    assert "jointly" in unidentified_words(report)
    # a profile whose tables stop at the largest k run keeps the cheapest extremes, priced without a cap
    upto3 = profiles(report, ExportOptions(device="test", model="known", created="2025-01-01", max_requests=64,
                                           max_draft_tokens=3))["metadata"]["fit"]["alternatives"]
    assert set(cheapest) <= set(upto3) and "draft_beyond_data.flat" not in upto3


def test_no_extremes_without_a_fitted_drafter_and_none_for_a_bad_probe_length():
    nospec = fit_runs(known_runs(configs=((0, 1.0),)), FitConfig())
    assert nospec.extremes == {}
    given = DrafterCost(DRAFT_FIXED_S, DRAFT_PER_POSITION_S, 0.0)
    assert fit_runs(known_runs(configs=((0, 1.0),)), FitConfig(drafter_cost=given, probe_draft_tokens=7)).extremes == {}
    with pytest.raises(ValueError, match="probe_draft_tokens"):
        FitConfig(probe_draft_tokens=0)


def test_probes_stay_within_the_batches_the_runs_reached():
    found = probes(np.array([1.0, 2.0, 8.0]), 32.0, 7)
    assert [(p.num_requests, p.verified_tokens) for p in found] == [(1.0, 7), (4.0, 7), (1.0, 1), (8.0, 1)]
    assert all(p.batch_tokens <= 32.0 for p in found)
    # one request's probe would already pass the largest batch: it takes fewer (a fractional mean batch)
    assert [p.num_requests for p in probes(np.array([1.0, 2.0]), 6.0, 7)] == [0.75, 1.0, 2.0]
