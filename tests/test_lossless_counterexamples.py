"""The checks have teeth: policies that look at drafted tokens before admitting them are caught.

* ``global_sync`` reproduces Appendix A of the DSpark paper exactly, and a search over
  random worlds finds further counterexamples on its own.
* Every registered policy flagged lossy (``global_sync``, ``dspark`` with
  ``staleness_steps=0``) is found by the search, and so are two deliberately
  anticipating variants of ``greedy`` (tests/lossless_policies.py): one looks one
  candidate past a falling Theta, one breaks survival ties towards the deeper
  position (so a tie created by c = 1 after the drafted token moves the request's
  earlier candidates along the path).
* The search compares the joint law of all requests, not only each request's own:
  two requests whose decisions peek at each other's drafts keep both laws exact and
  are found by their dependence alone; a peek that goes one way (no cycle) is exact.
* The exact checker matches a hand-derived formula on the Appendix A family, for
  both the lossy and the lossless scheduler, so its verdicts are not an artefact.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import Phase, example, find, given, settings
from hypothesis import strategies as st

from policies import Policy
from policies.dspark import DSpark
from policies.greedy import GlobalSync, Greedy
from policies.lossless.sampler import accept_prob, residual
from tests.lossless_policies import DeeperFirstTieGreedy, LookaheadGreedy, OneWayPeek, RingPeek, lossy_variants
from tests.lossless_strategies import (
    APPENDIX_A,
    APPENDIX_A_WARM,
    MarkovCase,
    assert_lossless,
    law_deviation,
    markov_cases,
    max_deviation,
    sized,
)

DEVIATION = 1e-6  # a lossy policy must miss the target by more than this (rounding is ~1e-15)


def first_token_law(case: MarkovCase, policy: Policy) -> np.ndarray:
    exact = case.exact(policy).marginal(0)
    return np.array([exact.get((y,), 0.0) for y in range(case.vocab_size)])


# --- Appendix A ------------------------------------------------------------------------------------

@pytest.mark.parametrize("policy, expected", [
    (GlobalSync(), [0.85, 0.15]),                   # the paper's counterexample
    (DSpark(staleness_steps=0), [0.85, 0.15]),      # capacity from the current pool = global_sync
    (LookaheadGreedy(), [0.85, 0.15]),              # one look past Theta_1 < Theta_0 suffices
    (Greedy(), [0.7, 0.3]),                         # early stop: Theta_1 = 0.9 < 1.0, verify nothing
])
def test_appendix_a(policy, expected):
    assert first_token_law(APPENDIX_A, policy) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("policy", [DSpark(staleness_steps=1), DSpark(staleness_steps=2, ema_decay=0.8)],
                         ids=["staleness1", "staleness2_ema"])
def test_appendix_a_with_stale_capacity(policy):
    # on a warm engine K = 2 is fixed before drafting: both positions verified in every branch, law exact
    exact = APPENDIX_A_WARM.exact(policy)
    assert exact.max_verified_tokens == 2
    assert first_token_law(APPENDIX_A_WARM, policy) == pytest.approx([0.7, 0.3], abs=1e-12)


# --- the checker against a hand-derived formula -----------------------------------------------------

@st.composite
def appendix_a_family(draw: st.DrawFn) -> MarkovCase:
    """One request, V = 2, gamma = 2, m = 1, constant p and q, c_1 fixed, c_2 set by the first draft token."""
    weight = st.integers(0, 10)
    p = np.array([draw(weight), 10]) / 1.0
    q = np.array([draw(weight), 10]) / 1.0
    a_1, after_0, after_1 = (draw(st.sampled_from([0.0, 0.3, 0.5, 0.8, 0.9, 1.0])) for _ in range(3))
    sps = np.array(draw(st.lists(st.sampled_from([1.0, 0.8, 0.5, 0.45, 0.3]), min_size=3, max_size=3)))
    return MarkovCase(target=np.array([p / p.sum()] * 3), draft=np.array([[q / q.sum()] * 3] * 2),
                      confidence=np.array([[a_1] * 3, [after_0, after_1, after_0]]), prompts=((),),
                      sps=sps, num_tokens=1)


def hand_first_token_law(case: MarkovCase, early_stop: bool) -> np.ndarray:
    """P(first output token) for Algorithm 1 with or without the break, written out by hand."""
    p, q = case.target[2], case.draft[0, 2]
    sps = case.sps
    a_1 = case.confidence[0, 2]
    law = np.zeros(2)
    for x_1 in (0, 1):
        a_2 = a_1 * case.confidence[1, x_1]
        survivals = [a for a in (a_1, a_2) if a > 0]  # candidates with a = 0 never enter the path
        theta = [sps[n] * (1 + sum(survivals[:n])) for n in range(len(survivals) + 1)]
        if early_stop:
            length = next((n for n in range(1, len(theta)) if theta[n] <= theta[n - 1]), len(theta)) - 1
        else:
            length = max(range(len(theta)), key=lambda n: (theta[n], -n))  # first argmax
        if length == 0:
            law += q[x_1] * p  # nothing verified: the bonus token comes straight from p
        else:
            alpha = accept_prob(p[x_1], q[x_1])
            law += q[x_1] * (alpha * np.eye(2)[x_1] + (1 - alpha) * residual(p, q))
    return law


@sized(150)
@given(case=appendix_a_family())
@example(case=APPENDIX_A)
def test_checker_matches_hand_formula(case):
    assert first_token_law(case, GlobalSync()) == pytest.approx(hand_first_token_law(case, False), abs=1e-12)
    assert first_token_law(case, Greedy()) == pytest.approx(hand_first_token_law(case, True), abs=1e-12)
    assert first_token_law(case, Greedy()) == pytest.approx(case.target[2], abs=1e-12)


# --- search finds counterexamples on its own -------------------------------------------------------

# Search without shrinking: finding one counterexample is the point, and a seeded sharp
# world does not shrink to anything simpler anyway.
SEARCH = settings(sized(400), phases=[Phase.generate])
SEARCHED = [*lossy_variants(), ("lookahead_greedy", LookaheadGreedy()),
            ("deeper_first_tie_greedy", DeeperFirstTieGreedy()),
            ("dspark_staleness0_ema", DSpark(staleness_steps=0, ema_decay=0.5))]


@pytest.mark.parametrize("policy", [policy for _, policy in SEARCHED], ids=[name for name, _ in SEARCHED])
def test_search_finds_counterexample(policy):
    found = find(markov_cases(), lambda case: law_deviation(case, case.exact(policy)) > DEVIATION, settings=SEARCH)
    assert law_deviation(found, found.exact(policy)) > DEVIATION
    # and the schedulers it tampers with are exact on the very same world
    assert law_deviation(found, found.exact(Greedy())) < 1e-9
    assert law_deviation(found, found.exact(DSpark(staleness_steps=1))) < 1e-9


def test_search_finds_requests_that_peek_at_each_other():
    # two requests, each admitting its first draft token on the other's second-position confidence:
    # the search over joint laws finds it, and in the world it finds every request's own law is exact
    policy = RingPeek(2)
    found = find(markov_cases(num_requests=st.integers(2, 4)),
                 lambda case: law_deviation(case, case.exact(policy)) > DEVIATION, settings=SEARCH)
    exact = found.exact(policy)
    assert law_deviation(found, exact) > DEVIATION
    assert max_deviation(found, exact) < 1e-9  # a search over each request's own law alone cannot see it


@pytest.mark.slow  # ~5 s: 60 exact checks of up to four requests
@sized(60)
@given(case=markov_cases(num_requests=st.integers(2, 4)))
def test_a_peek_in_one_direction_is_lossless(case):
    # request 0 decides on request 1's drafted token, never the other way: an order without cycles
    assert_lossless(case, OneWayPeek())
