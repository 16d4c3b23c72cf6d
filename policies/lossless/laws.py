"""What "lossless" asks of an exact joint law, as named checks with one job each.

The law of the first m output tokens of R requests sharing engine steps is the
target's law exactly when

* ``mass`` - its probabilities sum to 1;
* ``marginal`` - every request's own law is the target's,
  ``P(y_r) = p(y_r1) p(y_r2 | y_r1) ...`` (:func:`policies.lossless.exact.sequence_distribution`);
* ``pairwise`` - every two requests are independent, ``P(y_r, y_s) = P(y_r) P(y_s)``;
* ``joint`` - the requests are independent beyond pairs,
  ``P(y_1 .. y_R) = prod_r P(y_r)``, checked for R >= 3 (with two requests this
  is the pairwise check, which owns it).

Marginal, pairwise and joint together say the joint law is the product of the
targets' laws. Each check owns what the others cannot see, so a law can break
one of them alone: a single request's look-ahead breaks only ``marginal``
(Appendix A of the DSpark paper), two requests peeking at each other's drafts
can break only ``pairwise``, and three requests can be pairwise independent yet
dependent as a whole (``joint``). docs/lossless.md has the examples.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

from policies.lossless.exact import ExactDistribution, max_abs_difference
from policies.lossless.sampler import Prefix

CHECKS = ("mass", "marginal", "pairwise", "joint")


def independence_deviation(exact: ExactDistribution) -> float:
    """max |P(y_1 .. y_R) - prod_r P(y_r)| over every combination of the marginals' outcomes (0 for R < 3).

    Cells the joint law never reaches count too: a law that rules out a
    combination the marginals allow is dependent.
    """
    num_requests = len(next(iter(exact.joint)))
    if num_requests < 3:
        return 0.0
    marginals = [sorted(exact.marginal(r).items()) for r in range(num_requests)]
    gap = 0.0
    for combination in itertools.product(*marginals):
        product = 1.0
        for _, prob in combination:
            product *= prob
        outputs = tuple(seq for seq, _ in combination)
        gap = max(gap, abs(exact.joint.get(outputs, 0.0) - product))
    return gap


def law_gaps(exact: ExactDistribution, references: Sequence[Mapping[Prefix, float]]) -> dict[str, float]:
    """How far ``exact`` is from the targets' law, per check (see the module docstring).

    ``references[r]`` is request r's target law of its first m tokens.
    """
    num_requests = len(references)
    pairs = itertools.combinations(range(num_requests), 2)
    return {
        "mass": abs(sum(exact.joint.values()) - 1.0),
        "marginal": max(max_abs_difference(exact.marginal(r), references[r]) for r in range(num_requests)),
        "pairwise": max((exact.product_deviation(r, s) for r, s in pairs), default=0.0),
        "joint": independence_deviation(exact),
    }


def failed_checks(gaps: Mapping[str, float], tolerance: float) -> list[str]:
    """The checks whose gap is not below ``tolerance``, in the order of :data:`CHECKS`."""
    return [check for check in CHECKS if not gaps[check] < tolerance]
