"""Joint extremes: the fits that price a speculative step cheapest and dearest, each with the extrapolations
beyond the runs taken at the matching end.

An alternative of :mod:`calibration.fitting.identify` moves one parameter to an end of its range (the rest
refitted), or one extrapolation to an end. A prediction may hinge on several at once. On the real CPU loop,
fitted from runs at k = 1 and 3, a step that drafts 7 tokens per request is cheapest when the work per draft
token is the target's (paid per verified token) *and* the drafter costs no more beyond k = 3; no single
alternative has both, and the held-out points that needed both fell outside every interval.

So for a few **probe steps**, the speculative shapes a simulation's price is most sensitive to, the fit is
pushed to the ends of the probe's price over every fit within ``delta_chi2`` of the best (the bisection that
gives a parameter its range, on the probe's price instead):

* ``cheapest``: the fit that minimises the probe's price with the drafter held flat beyond the largest draft
  length a run used (when the drafter is fitted and not known to be sequential), and the dense curve flat
  beyond the largest batch a run reached;
* ``dearest``: the fit that maximises it with the drafter carried on linearly, and the dense curve
  proportional to the batch beyond the data.

Each probe drafts ``K`` tokens per request (the largest draft length the profile is meant for) and verifies all
of them (static k) or one (the fewest an early stop verifies, where the split of the per-draft-token work
between drafter and target matters most), at the fewest and the most requests any run decoded. A probe whose
batch would lie beyond the runs' uses fewer requests: beyond them the dense curve is the concern of the
beyond-data ends, which both extremes take.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from calibration.fitting.fit import Fit, Problem
from calibration.fitting.identify import DELTA_CHI2, curves_beyond_data, knots_inside, profile_range, same_fit


@dataclass(frozen=True)
class Alternative:
    """One fit that explains the runs as well as the central one: its parameters and, for fits whose drafter is
    held flat, the draft length beyond which the drafter costs no more."""

    theta: np.ndarray
    draft_cap: float | None = None

    def same_as(self, other: Alternative, problem: Problem) -> bool:
        return self.draft_cap == other.draft_cap and same_fit(self.theta, other.theta, problem)


@dataclass(frozen=True)
class Probe:
    """A step of ``num_requests`` requests, each drafting ``draft_tokens`` and verifying ``verified_tokens``."""

    num_requests: float
    draft_tokens: int
    verified_tokens: int

    @property
    def batch_tokens(self) -> float:
        return self.num_requests * (1 + self.verified_tokens)

    @property
    def name(self) -> str:
        return f"step[R={self.num_requests:.3g},k={self.draft_tokens},verified={self.verified_tokens}]"


def probes(num_requests: np.ndarray, max_batch_tokens: float, draft_tokens: int) -> list[Probe]:
    """The probe steps (see the module docstring) within ``max_batch_tokens``, duplicates dropped."""
    low, high = float(np.min(num_requests)), float(np.max(num_requests))
    out: list[Probe] = []
    for verified in sorted({draft_tokens, 1}, reverse=True):
        top = max_batch_tokens / (1 + verified)  # the most requests whose batch the runs reached
        for r in (min(low, top), min(high, top)):
            probe = Probe(r, draft_tokens, verified)
            if all(abs(p.num_requests - r) > 1e-6 * r or p.verified_tokens != verified for p in out):
                out.append(probe)
    return out


def joint_extremes(fit: Fit, draft_tokens: int, draft_cap: float | None,
                   existing: dict[str, Alternative], delta_chi2: float = DELTA_CHI2) -> dict[str, Alternative]:
    """``<probe>.cheapest`` / ``<probe>.dearest`` for every probe, those equal to an alternative in ``existing``
    (or to an earlier extreme) dropped; none unless the drafter is fitted (a given drafter leaves one split, per
    request vs per token, whose two ends are alternatives already). ``draft_cap``: the largest draft length run,
    when the drafter is fitted and may be parallel (None: the drafter is carried on linearly at both ends)."""
    problem, model = fit.problem, fit.model
    obs = problem.obs
    if draft_tokens < 1 or not model.fit_drafter:
        return {}
    threshold = fit.chi2 + delta_chi2
    cap_s = 10.0 * float(np.max(obs.step_s))  # no price above 10x the largest step is explored
    last_inside = int(knots_inside(model, obs.batch_tokens)[-1])
    context = np.array([float(np.median(obs.context_tokens))])
    seen = list(existing.values())
    out: dict[str, Alternative] = {}
    for probe in probes(obs.num_requests, float(np.max(obs.batch_tokens)), draft_tokens):
        shape = (np.array([probe.num_requests]), np.array([probe.batch_tokens]), context,
                 np.array([float(probe.draft_tokens)]))
        dear_vec, cheap_vec = model.design(*shape)[0], model.design(*shape, draft_cap=draft_cap)[0]
        dear = profile_range(problem, dear_vec, fit, threshold, cap_s)
        # one range gives both ends unless the cheap end prices the drafter flat (another functional)
        cheap = dear if np.array_equal(cheap_vec, dear_vec) else profile_range(problem, cheap_vec, fit, threshold,
                                                                               cap_s)
        cheap, dear = cheap[2], dear[3]
        beyond_cheap = curves_beyond_data(cheap, model, last_inside)
        beyond_dear = curves_beyond_data(dear, model, last_inside)
        ends = {"cheapest": Alternative(cheap if beyond_cheap is None else beyond_cheap[0], draft_cap),
                "dearest": Alternative(dear if beyond_dear is None else beyond_dear[1])}
        for end, alternative in ends.items():
            if not any(alternative.same_as(a, problem) for a in seen):
                out[f"{probe.name}.{end}"] = alternative
                seen.append(alternative)
    return out
