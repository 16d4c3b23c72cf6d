"""The losslessness bench: every registered policy, in every catalogue world and in random ones.

Policies come from the registry (tests/lossless_policies.registered_variants: the
defaults and one parameter changed at a time), so a new policy module is on the
bench with no edit here; upper bounds that read true outcomes are left out with
the reason recorded. A policy whose ``lossless`` trait is true must pass every
check of :mod:`policies.lossless.laws` to 1e-9 (its own law, pairs, the joint
law) in every world; one whose trait is false must be caught somewhere.

Worlds: the fixed catalogue (tests/lossless_worlds.py: every shape up to gamma 5
and 4 requests, exact throughput ties, deep look-ahead, warm engines with late
joiners) and random worlds drawn by Hypothesis (tests/lossless_strategies.py).
The tests at the end check that the catalogue keeps its promises and that it
catches every kind of leak written in tests/lossless_policies.py.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from policies import policy_classes
from policies.base import Policy, path_throughput, sorted_survivals
from policies.dspark import DSpark
from policies.goodput import Goodput
from policies.greedy import GlobalSync, Greedy
from policies.lossless.exact import draft_branches
from policies.lossless.laws import CHECKS, failed_checks
from policies.threshold import Threshold
from tests.lossless_policies import (
    DeeperFirstTieGreedy,
    DeepPeekGreedy,
    EmaGated,
    LookaheadGreedy,
    PoolGated,
    RingPeek,
    TiePeekGreedy,
    XorPeek,
    lossless_variants,
    lossy_variants,
    registered_variants,
    skipped_policies,
)
from tests.lossless_strategies import (
    APPENDIX_A,
    APPENDIX_A_WARM,
    TOLERANCE,
    assert_lossless,
    dspark_policies,
    goodput_policies,
    greedy_policies,
    markov_cases,
    max_deviation,
    sized,
    threshold_policies,
)
from tests.lossless_worlds import (
    catalogue,
    catalogue_gaps,
    coverage_worlds,
    deep_worlds,
    late_join_worlds,
    runs_in,
    tie_worlds,
)

LOSSLESS = lossless_variants()
LOSSY = lossy_variants()
DEVIATION = 1e-6  # a lossy policy must miss by more than this (rounding is ~1e-15)
RANDOM_EXAMPLES = 25  # random worlds per policy family (the slow sweep runs 200 per variant)


def worst_gap(gaps: dict[str, float]) -> float:
    return max(gaps[check] for check in CHECKS)


# --- every registered policy ------------------------------------------------------------------------

def test_every_registered_policy_is_on_the_bench():
    on_bench, skipped = {policy.name for _, policy in registered_variants()}, skipped_policies()
    assert on_bench | set(skipped) == set(policy_classes())
    assert all(policy_classes()[name].needs_outcomes for name in skipped)  # only upper bounds are left out
    # the variants reach both sides of the lossless line of every family that has one
    assert {"global_sync", "dspark"} <= {policy.name for _, policy in LOSSY}
    assert {"dspark", "greedy", "threshold", "goodput", "mtp", "none"} <= {policy.name for _, policy in LOSSLESS}


def quick_or_slow(name: str, policy: Policy):  # -> a pytest parameter set
    """Each family's defaults and dspark carrying EMA rows (its most stateful form) in the quick suite; the other
    variants, one parameter changed at a time, in the slow step (together 12 s of the quick suite's 2 minutes)."""
    quick = policy == type(policy)() or policy == DSpark(ema_decay=0.8)
    return pytest.param(policy, id=name, marks=() if quick else pytest.mark.slow)


@pytest.mark.parametrize("policy", [quick_or_slow(name, policy) for name, policy in LOSSLESS])
def test_lossless_policy_is_exact_in_every_catalogue_world(policy):
    failures = {}
    for entry in catalogue():
        if runs_in(policy, entry.case):
            gaps = catalogue_gaps(entry.name, policy)
            failed = failed_checks(gaps, TOLERANCE)
            if failed:
                failures[entry.name] = {check: f"{gaps[check]:.3g}" for check in failed}
    assert not failures, f"{policy} misses the target law in: {failures}"


@pytest.mark.parametrize("policy", [policy for _, policy in LOSSY], ids=[name for name, _ in LOSSY])
def test_lossy_policy_is_caught_in_the_catalogue(policy):
    caught = [entry.name for entry in catalogue()
              if runs_in(policy, entry.case) and worst_gap(catalogue_gaps(entry.name, policy)) > DEVIATION]
    assert caught, f"{policy} is flagged lossy but no catalogue world shows it"


FAMILIES = sorted({policy.name for _, policy in LOSSLESS})


@pytest.mark.parametrize("family", FAMILIES)
def test_lossless_policies_in_random_worlds(family):
    variants = [policy for _, policy in LOSSLESS if policy.name == family]

    @sized(RANDOM_EXAMPLES)
    @given(case=markov_cases(), policy=st.sampled_from(variants))
    @example(case=APPENDIX_A, policy=variants[0])
    @example(case=APPENDIX_A_WARM, policy=variants[-1])
    def check(case, policy):
        assume(runs_in(policy, case))
        assert_lossless(case, policy)

    check()


@pytest.mark.slow
@pytest.mark.parametrize("policy", [policy for _, policy in LOSSLESS], ids=[name for name, _ in LOSSLESS])
def test_lossless_policy_in_many_random_worlds(policy):
    @sized(200)
    @given(case=markov_cases())
    def check(case):
        assume(runs_in(policy, case))
        assert_lossless(case, policy)

    check()


@pytest.mark.slow
@pytest.mark.parametrize("policies", [greedy_policies(), threshold_policies(), dspark_policies(), goodput_policies()],
                         ids=["greedy", "threshold", "dspark", "goodput"])
def test_lossless_families_with_random_parameters(policies):
    @sized(200)
    @given(case=markov_cases(), policy=policies)
    def check(case, policy):
        assert_lossless(case, policy)

    check()


# --- the catalogue keeps its promises ---------------------------------------------------------------

def branching_depths(case) -> set[int]:
    """1-based positions at which the drafter has more than one possible token in some context."""
    return {k + 1 for k in range(case.gamma) if (np.count_nonzero(case.draft[k] > 0, axis=1) > 1).any()}


def test_catalogue_covers_every_shape_and_depth():
    shapes = {(entry.case.num_requests, entry.case.gamma) for entry in coverage_worlds()}
    assert shapes == {(r, g) for r in range(1, 5) for g in range(1, 6)}
    for num_requests, gamma in shapes:
        depths = set().union(*(branching_depths(e.case) for e in coverage_worlds()
                               if (e.case.num_requests, e.case.gamma) == (num_requests, gamma)))
        wanted = set(range(1, gamma)) if num_requests <= 2 else {1, 2, gamma - 1} & set(range(1, gamma))
        assert wanted <= depths, f"R={num_requests}, gamma={gamma}: no world branches at {wanted - depths}"
    assert any(e.case.memory is None and e.case.num_tokens >= 3 for e in coverage_worlds())  # fresh engines
    assert {e.case.gamma for e in deep_worlds()} == {4, 5} and min(e.case.num_tokens for e in deep_worlds()) >= 3


def test_late_joiners_share_warm_engines():
    for entry in late_join_worlds():
        case = entry.case
        assert case.memory is not None and case.memory.pools and max(case.join_steps) >= 1
        new_to_engine = set(range(case.num_requests)) - set(case.memory.smoothed)
        assert new_to_engine, "some request must be new to the engine (no EMA row)"
    assert {e.case.retire for e in late_join_worlds()} == {False, True}


def test_tie_worlds_tie_exactly():
    # some draft outcome of each tie world puts two consecutive Theta values on the same float
    for entry in tie_worlds():
        case = entry.case
        cost = case.cost(case.num_requests)
        blocks = [draft_branches(case.models()[r], case.prompts[r], case.gamma) for r in range(case.num_requests)]
        ties = False
        for combo in itertools.product(*blocks):
            survival = np.cumprod(np.array([block.confidence for _, block in combo]), axis=1)
            theta = path_throughput(cost, case.num_requests, sorted_survivals(survival))
            ties |= bool((theta[1:] == theta[:-1]).any())
        assert ties, f"{entry.name}: no exact throughput tie"


@pytest.mark.parametrize("policy, min_share", [
    (Greedy(), 0.4),     # measured 0.49
    (Threshold(), 0.8),  # 1.0: c_1 >= 0.5 everywhere
    (DSpark(), 0.35),    # 0.44: fresh engines verify nothing until a stale pool exists
    (Goodput(), 0.4),    # 0.50
], ids=["greedy", "threshold", "dspark", "goodput"])
def test_catalogue_makes_schedulers_verify_drafts(policy, min_share):
    # the checks only bite where drafts get verified
    share = np.mean([catalogue_gaps(e.name, policy)["verified"] > 0 for e in catalogue()])
    assert share >= min_share, f"{policy} verifies drafts in {share:.2f} of the catalogue worlds"


# Each kind of leak, the worlds meant to show it, and the checks that must see it there.
DOORS = [
    (GlobalSync(), coverage_worlds, None),           # Appendix A and its relatives
    (LookaheadGreedy(), catalogue, None),            # one look past a falling Theta
    (DeeperFirstTieGreedy(), catalogue, None),       # deeper positions first on survival ties
    (TiePeekGreedy(), tie_worlds, None),             # a look past an exact throughput tie
    (DeepPeekGreedy(3, 2), deep_worlds, None),       # from position 3 on, two positions ahead (gamma 5)
    (PoolGated(), catalogue, None),                  # gated on its own stale pool
    (EmaGated(), catalogue, None),                   # gated on its own EMA rows
    (RingPeek(2), catalogue, "pairwise"),            # two requests peeking at each other
    (RingPeek(3), catalogue, "joint"),               # a ring of three: every pair independent
    (RingPeek(4), catalogue, "joint"),               # a ring of four: needs four requests
    (XorPeek(), catalogue, None),                    # three requests, an XOR of two peeks
]


DOOR_IDS = [policy.name + str(getattr(policy, "ring", "")) for policy, _, _ in DOORS]


@pytest.mark.parametrize("policy, worlds, check", DOORS, ids=DOOR_IDS)
def test_catalogue_catches_every_kind_of_leak(policy, worlds, check):
    caught = {e.name: failed_checks(catalogue_gaps(e.name, policy), DEVIATION) for e in worlds()}
    caught = {name: failed for name, failed in caught.items() if failed}
    assert caught, f"no world of {worlds.__name__} catches {policy}"
    if check is not None:
        assert any(check in failed for failed in caught.values())


def test_leaks_that_need_four_requests_or_gamma_five_are_seen_only_there():
    ring = {e.name: e.case.num_requests for e in catalogue()
            if worst_gap(catalogue_gaps(e.name, RingPeek(4))) > DEVIATION}
    assert ring and set(ring.values()) == {4}
    assert all(failed_checks(catalogue_gaps(name, RingPeek(4)), DEVIATION) == ["joint"] for name in ring)
    deep = {e.name for e in catalogue() if worst_gap(catalogue_gaps(e.name, DeepPeekGreedy(3, 2))) > DEVIATION}
    assert deep and all(world_gamma >= 5 for world_gamma in (e.case.gamma for e in catalogue() if e.name in deep))


def test_global_sync_misses_in_a_good_share_of_worlds():
    # the measured share is 0.33; a drop means the worlds lost their edges
    missed = [worst_gap(catalogue_gaps(e.name, GlobalSync())) > DEVIATION for e in catalogue()]
    assert np.mean(missed) >= 0.25


# --- random worlds keep their teeth (minutes: a sweep) -----------------------------------------------

COVERAGE_EXAMPLES = 400


@pytest.mark.slow
@pytest.mark.parametrize("policies, min_verifying_share", [
    (greedy_policies(), 0.4),
    (threshold_policies(), 0.4),
    (dspark_policies(), 0.25),   # fresh engines verify nothing until a stale pool exists
    (goodput_policies(), 0.2),
], ids=["greedy", "threshold", "dspark", "goodput"])
def test_random_worlds_make_policies_verify_drafts(policies, min_verifying_share):
    shares = []

    @sized(COVERAGE_EXAMPLES)
    @given(case=markov_cases(), policy=policies)
    def record(case, policy):
        shares.append(case.exact(policy).max_verified_tokens > 0)

    record()
    assert np.mean(shares) >= min_verifying_share


@pytest.mark.slow
def test_random_worlds_catch_looking_ahead():
    deviations = []

    @sized(COVERAGE_EXAMPLES)
    @given(case=markov_cases())
    def record(case):
        deviations.append(max_deviation(case, case.exact(GlobalSync())))

    record()
    assert np.mean(np.array(deviations) > 1e-6) >= 0.05
