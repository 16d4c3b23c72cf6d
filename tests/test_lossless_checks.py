"""Every check of ``assert_lossless`` can fail, alone, and at its tolerance; the checker merges only equal states.

* For each check of :mod:`policies.lossless.laws` (marginal, pairwise, joint) a
  lossy policy in a small world breaks that check and no other, and
  ``assert_lossless`` names it; the mass check is pinned on a hand-made law.
* The tolerance (1e-9) is pinned per check: a leak twice the tolerance is caught,
  half of it is not.
* Merging: a policy whose decision is gated on its own memory (stale pool, EMA
  rows) is lossy; a checker that merged branches with different memories would
  report it exact (P(0, 0) = 0.49 instead of 0.5425). Merged and unmerged
  enumerations agree, and the merge key tells apart every field of the memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType

import numpy as np
import pytest

from policies.driver import PolicyMemory
from policies.dspark import DSpark
from policies.greedy import GlobalSync
from policies.lossless.exact import ExactDistribution, max_abs_difference, state_key
from policies.lossless.laws import failed_checks, law_gaps
from tests.lossless_policies import EmaGated, PoolGated, RingPeek, XorPeek
from tests.lossless_strategies import APPENDIX_A, TOLERANCE, MarkovCase, assert_lossless
from tests.lossless_worlds import late_join_worlds, sparse_world


def appendix_a_family(p_second: float = 0.3, num_requests: int = 1) -> MarkovCase:
    """Appendix A's world for ``num_requests`` requests, with p = (1 - p_second, p_second).

    Admitting x_1 only when c_2 is high (after token 0) moves P(y = 0) to
    q(0) + q(1) p(0): a leak of q(0) p_second = p_second / 2.
    """
    p = np.array([1.0 - p_second, p_second])
    return MarkovCase(target=np.array([p] * 3), draft=np.array([[[0.5, 0.5]] * 3] * 2),
                      confidence=np.array([[0.8, 0.8, 0.8], [0.9, 0.0, 0.9]]), prompts=((),) * num_requests,
                      sps=np.array([1.0, 0.5, 0.45] + [0.4] * 12), num_tokens=1)


def xor_world(p_second: float = 0.3) -> MarkovCase:
    """Three requests for :class:`XorPeek`: 0 and 1 draft from p (uniform, so their first outputs are
    their first draft tokens); request 2 sees Appendix A's p = (1 - p_second, p_second) after token 0."""
    target = np.array([[1.0 - p_second, p_second], [0.5, 0.5], [0.5, 0.5]])  # rows: after 0, after 1, no token
    return MarkovCase(target=target, draft=np.array([[[0.5, 0.5]] * 3] * 2),
                      confidence=np.array([[0.8, 0.8, 0.8], [0.9, 0.0, 0.9]]), prompts=((), (), (0,)),
                      sps=np.full(9, 0.5), num_tokens=1)


# Each check broken alone: (world, policy, the one check that fails)
ALONE = [
    (APPENDIX_A, GlobalSync(), "marginal"),                  # Appendix A: (0.85, 0.15) instead of (0.7, 0.3)
    (appendix_a_family(num_requests=2), RingPeek(2), "pairwise"),  # each law exact, P(0, 0) = 0.5125 != 0.49
    (xor_world(), XorPeek(), "joint"),                       # every pair independent, the three are not
    (appendix_a_family(num_requests=3), RingPeek(3), "joint"),  # a ring of three peeks, likewise
]


@pytest.mark.parametrize("case, policy, check", ALONE, ids=["marginal", "pairwise", "joint-xor", "joint-ring"])
def test_each_check_fails_alone(case, policy, check):
    gaps = case.gaps(case.exact(policy))
    assert failed_checks(gaps, TOLERANCE) == [check]
    with pytest.raises(AssertionError, match=rf"{check} gap") as raised:
        assert_lossless(case, policy)
    assert all(other not in str(raised.value) for other in ("mass", "marginal", "pairwise", "joint") if other != check)


def test_two_requests_peeking_at_each_other_keep_their_own_laws():
    # the numbers of docs/lossless.md: P(0) = 0.7 for each, P(0, 0) = 0.5125 instead of 0.49
    exact = appendix_a_family(num_requests=2).exact(RingPeek(2))
    assert [exact.marginal(r)[(0,)] for r in (0, 1)] == pytest.approx([0.7, 0.7], abs=1e-12)
    assert exact.joint[((0,), (0,))] == pytest.approx(0.5125, abs=1e-12)


def test_mass_check_fails_alone_on_a_law_that_loses_mass():
    # a checker bug (an unnormalised residual) loses mass; a policy cannot
    reference = {(0,): 0.5, (1,): 0.5}
    short = ExactDistribution({((0,),): 0.5 - 0.75 * TOLERANCE, ((1,),): 0.5 - 0.75 * TOLERANCE}, 1, 1, 0)
    assert failed_checks(law_gaps(short, [reference]), TOLERANCE) == ["mass"]


# (world family, policy, check, leak parameter giving twice the tolerance, giving half of it).
# The marginal and joint leaks grow like the parameter, the pairwise one like its square.
TOLERANCE_PINS = [
    (appendix_a_family, GlobalSync(), "marginal", 4e-9, 1e-9),
    (lambda p: appendix_a_family(p, num_requests=2), RingPeek(2), "pairwise", 8.944e-5, 4.472e-5),
    (xor_world, XorPeek(), "joint", 1.6e-8, 4e-9),
]


@pytest.mark.parametrize("family, policy, check, above, below", TOLERANCE_PINS, ids=["marginal", "pairwise", "joint"])
def test_tolerance_is_pinned(family, policy, check, above, below):
    caught, missed = family(above), family(below)
    caught_gap = caught.gaps(caught.exact(policy))[check]
    missed_gap = missed.gaps(missed.exact(policy))[check]
    assert 1.5 * TOLERANCE < caught_gap < 2.5 * TOLERANCE and 0.3 * TOLERANCE < missed_gap < 0.7 * TOLERANCE
    with pytest.raises(AssertionError, match=rf"{check} gap"):
        assert_lossless(caught, policy)
    assert_lossless(missed, policy)


# --- merging ----------------------------------------------------------------------------------------

APPENDIX_A_TWO_TOKENS = replace(APPENDIX_A, num_tokens=2)


@pytest.mark.parametrize("policy", [PoolGated(), EmaGated()], ids=["stale_pool", "ema_rows"])
def test_memory_gated_lossy_policy_is_caught(policy):
    # Step 1 has no memory: nothing verified, y_1 ~ p, and the memory records whether x_1 was token 0
    # (a_2 = 0.72, c_2 = 0.9) or 1 (a_2 = 0). Step 2 runs a full search (Appendix A's bias, P(0) = 0.85)
    # only in the first case: P(y = (0, 0)) = 0.7 x (0.5 x 0.85 + 0.5 x 0.7) = 0.5425. Branches after
    # step 1 agree on their outputs and differ only in memory: merging them would give 0.49.
    merged = APPENDIX_A_TWO_TOKENS.exact(policy)
    assert merged.joint[((0, 0),)] == pytest.approx(0.5425, abs=1e-12)
    apart = APPENDIX_A_TWO_TOKENS.exact(policy, merge=False)
    assert max_abs_difference(merged.joint, apart.joint) < 1e-12
    with pytest.raises(AssertionError, match="marginal gap"):
        assert_lossless(APPENDIX_A_TWO_TOKENS, policy)


@pytest.mark.parametrize("policy", [PoolGated(), EmaGated(), GlobalSync(), DSpark(staleness_steps=2, ema_decay=0.5),
                                    DSpark(staleness_steps=1)],
                         ids=["pool_gated", "ema_gated", "global_sync", "dspark2_ema", "dspark1"])
def test_merging_changes_no_law(policy):
    # small worlds, every branch kept apart as the reference; in the last, request 0 is done after step 1 but
    # keeps drafting while request 1 joins at step 2: its context (not its counted output) drives the decisions
    cases = [sparse_world(11, 1, 2, (1,), num_tokens=3), sparse_world(12, 2, 2, (1,), num_tokens=2),
             sparse_world(13, 1, 3, (1, 2), num_tokens=2, warm=False), late_join_worlds()[0].case,
             sparse_world(23, 2, 2, (1,), num_tokens=2, join_steps=(0, 2))]
    for case in cases:
        merged, apart = case.exact(policy), case.exact(policy, merge=False)
        assert max_abs_difference(merged.joint, apart.joint) < 1e-12


def test_state_key_tells_apart_every_field_of_the_memory():
    pools = (np.array([[0.8, 0.72]]),)
    memory = PolicyMemory(pools, MappingProxyType({0: np.array([0.5, 0.5])}))
    same = PolicyMemory((np.array([[0.8, 0.72]]),), MappingProxyType({0: np.array([0.5, 0.5])}))
    assert state_key(memory) == state_key(same)
    different = [
        PolicyMemory((np.array([[0.8, 0.0]]),), memory.smoothed),                        # a stale pool value
        PolicyMemory((np.array([[0.8], [0.72]]),), memory.smoothed),                     # a pool's shape
        PolicyMemory(pools * 2, memory.smoothed),                                        # how many pools
        PolicyMemory(pools, MappingProxyType({0: np.array([0.5, 0.9])})),                # an EMA row
        PolicyMemory(pools, MappingProxyType({1: np.array([0.5, 0.5])})),                # whose EMA row
        PolicyMemory(pools),                                                             # no EMA rows
        PolicyMemory((np.array([[0.8, -0.0]]),), memory.smoothed),                       # -0.0 vs 0.0
    ]
    keys = [state_key(m) for m in different]
    assert state_key(memory) not in keys
    assert keys[0] != keys[-1]


@dataclass(frozen=True)
class MemoryWithCounter(PolicyMemory):
    """A memory that carries one more field, as a later PolicyMemory might."""

    steps_since_idle: int = 0
    budget_used: tuple[int, ...] = field(default=())


def test_state_key_covers_fields_added_to_the_memory():
    base = MemoryWithCounter()
    assert state_key(base) != state_key(replace(base, steps_since_idle=1))
    assert state_key(base) != state_key(replace(base, budget_used=(3,)))
    with pytest.raises(TypeError, match="cannot compare"):
        state_key(object())
