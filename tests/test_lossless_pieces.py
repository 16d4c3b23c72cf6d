"""The reusable pieces of policies/lossless/sampler.py, policies/driver.py and policies/lossless/exact.py."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies import CostCurve
from policies.base import Decision, PolicyTraits, StepView, prefix_survival
from policies.driver import PolicyMemory, active_requests
from policies.dspark import DSpark
from policies.greedy import Greedy, search_capacity
from policies.lossless.exact import max_abs_difference, output_distribution, sequence_distribution, verify_branches
from policies.lossless.sampler import (
    TokenModels,
    accept_prob,
    acceptance_rate,
    generate,
    residual,
    sample_token,
    speculative_step,
    verify_block,
)
from policies.oracle import Oracle
from policies.static import Mtp, NoSpeculation
from tests.lossless_strategies import APPENDIX_A, distributions, dspark_policies, markov_cases, sized

COST = CostCurve(batch_tokens=np.arange(1, 13), steps_per_s=np.linspace(1.0, 0.3, 12))


def constant_models(p=(0.7, 0.3), q=(0.5, 0.5), confidence=0.8) -> TokenModels:
    return TokenModels(lambda prefix: np.array(p), lambda prefix, drafted: np.array(q),
                       lambda prefix, drafted: confidence)


@sized(200)
@given(data=st.data(), vocab_size=st.integers(1, 5))
def test_accept_and_residual_rebuild_the_target(data, vocab_size):
    # q(x) min(1, p/q) + P(reject) residual(x) = p(x): the one-token identity behind losslessness
    p, q = data.draw(distributions(vocab_size)), data.draw(distributions(vocab_size))
    rebuilt = q * accept_prob(p, q) + (1.0 - acceptance_rate(p, q)) * residual(p, q)
    assert rebuilt == pytest.approx(p, abs=1e-12)
    assert residual(p, q).sum() == pytest.approx(1.0)
    assert 0.0 <= acceptance_rate(p, q) <= 1.0 + 1e-12


@sized(100)
@given(data=st.data(), length=st.integers(0, 3))
def test_verify_branches_form_a_distribution(data, length):
    rows = np.array([data.draw(distributions(3)) for _ in range(length + 1)])
    drafts = np.array([data.draw(distributions(3)) for _ in range(length)]).reshape(length, 3)
    tokens = [int(np.argmax(row)) for row in drafts]  # a token each row can draw
    branches = verify_branches(rows, drafts, tokens)
    assert sum(prob for prob, _ in branches) == pytest.approx(1.0, abs=1e-12)
    assert all(1 <= len(emitted) <= length + 1 and emitted[:-1] == tuple(tokens[:len(emitted) - 1])
               for _, emitted in branches)


def test_accept_prob_is_one_where_q_is_zero_and_never_overflows():
    assert accept_prob(np.array([0.5, 0.5]), np.array([0.0, 1.0])).tolist() == [1.0, 0.5]
    with np.errstate(all="raise"):
        assert accept_prob(np.array([1.0]), np.array([5e-324])).tolist() == [1.0]


def test_residual_of_equal_distributions_is_the_target():
    p = np.array([0.25, 0.75])
    assert residual(p, p).tolist() == p.tolist()


class _AlmostOne:
    """A generator stand-in whose uniform draw is the largest float below 1."""

    def random(self) -> float:
        return float(np.nextafter(1.0, 0.0))


def test_sample_token_never_returns_a_zero_probability_token():
    assert sample_token(np.array([0.3, 0.7, 0.0, 0.0]), _AlmostOne()) == 1


def test_verify_block_accepts_all_then_draws_the_bonus(rng):
    # p = q: every draft token is accepted; the bonus comes from the last target row
    rows = np.array([[0.5, 0.5], [0.5, 0.5], [0.0, 1.0]])
    outcome = verify_block(rows, rows[:2], [0, 1], rng)
    assert outcome.num_accepted == 2 and outcome.tokens == (0, 1, 1)


def test_verify_block_rejects_a_token_the_target_never_emits(rng):
    rows = np.array([[1.0, 0.0], [0.5, 0.5]])
    outcome = verify_block(rows, np.array([[0.0, 1.0]]), [1], rng)
    assert outcome.num_accepted == 0 and outcome.tokens == (0,)


def test_verify_block_names_the_expected_shapes(rng):
    with pytest.raises(ValueError, match="expected 3 target rows"):
        verify_block(np.ones((2, 2)) / 2, np.ones((2, 2)) / 2, [0, 1], rng)


@pytest.mark.parametrize("models, message", [
    (constant_models(p=(0.7, 0.2)), "target after .*summing to 1"),            # p not normalised
    (constant_models(q=(0.5, -0.5, 1.0)), r"drafter q_1 .*non-negative"),       # negative q
    (constant_models(confidence=1.5), r"c_1 .*confidence in \[0, 1\]"),         # c out of range
], ids=["target", "drafter", "confidence"])
def test_bad_model_output_is_named(models, message, rng):
    with pytest.raises(ValueError, match=message):
        speculative_step([models], [()], Mtp(k=1), COST, 1, rng)
    with pytest.raises(ValueError, match=message):
        output_distribution([models], [()], Mtp(k=1), COST, 1, 1)


@dataclass(frozen=True)
class TooLong(PolicyTraits):
    name: ClassVar[str] = "too_long"

    def decide(self, view: StepView) -> Decision:
        return Decision(lengths=np.full(view.num_requests, view.gamma + 1), pool=view.confidence)


def test_bad_decisions_and_unrunnable_policies_are_refused(rng):
    models = constant_models()
    with pytest.raises(ValueError, match=r"lengths must lie in 0\.\.2"):
        speculative_step([models], [()], TooLong(), COST, 2, rng)
    with pytest.raises(ValueError, match="reads true outcomes"):
        output_distribution([models], [()], Oracle(), COST, 2, 1)
    with pytest.raises(ValueError, match="max_states=1"):
        output_distribution([models, models], [(), ()], Greedy(), COST, 2, 3, max_states=1)
    with pytest.raises(ValueError, match="one entry per request"):
        generate([models], [()], Greedy(), COST, 2, 1, rng, join_steps=(0, 1))
    with pytest.raises(TypeError, match="expected a CostCurve"):
        speculative_step([models], [()], Greedy(), lambda num_requests: "table", 2, rng)


def test_memory_keeps_the_last_pools_most_recent_last():
    memory = PolicyMemory()
    policy = DSpark(staleness_steps=2)
    for value in (0.1, 0.2, 0.3):
        pool = np.full((1, 2), value)
        memory = memory.after(policy, (0,), Decision(lengths=np.zeros(1, int), pool=pool))
    assert [float(p[0, 0]) for p in memory.pools] == [0.2, 0.3]
    assert memory.after(Greedy(), (0,), Decision(np.zeros(1, int), np.ones((1, 2)))).pools == ()


# Two stale pools that a full search sizes differently (one request, COST: SPS falls from 1.0 by 0.064 per token)
OLDER_POOL = np.array([[0.9, 0.8, 0.7]])  # two steps old: K = 3
NEWER_POOL = np.array([[0.1, 0.0, 0.0]])  # one step old: K = 1


@pytest.mark.parametrize("staleness, pool", [(1, NEWER_POOL), (2, OLDER_POOL)], ids=["staleness1", "staleness2"])
def test_dspark_sizes_capacity_from_the_pool_staleness_steps_old(staleness, pool):
    # history[-1] is one step old, history[-2] two: staleness 2 must read history[-2] (the paper's two-step
    # relay), not the fresher pool (still lossless, but another scheduler)
    view = StepView(confidence=np.full((1, 3), 0.9), cost=COST, history=(OLDER_POOL, NEWER_POOL))
    assert search_capacity(OLDER_POOL, COST, "tokens_x_sps") == 3
    assert search_capacity(NEWER_POOL, COST, "tokens_x_sps") == 1
    assert DSpark(staleness_steps=staleness).decide(view).capacity == search_capacity(pool, COST, "tokens_x_sps")


def test_dspark_staleness_two_reads_the_pool_of_two_steps_before_through_the_driver():
    # the driver hands pools oldest first; after steps with pools OLDER then NEWER, a staleness-2 engine
    # sizes its next step from OLDER: on Appendix A's world it verifies 3 tokens, staleness 1 verifies 1
    memory = PolicyMemory()
    for pool in (OLDER_POOL, NEWER_POOL):
        memory = memory.after(DSpark(staleness_steps=2), (0,), Decision(lengths=np.zeros(1, int), pool=pool))
    models = constant_models(confidence=0.9)
    for staleness, verified in [(2, 3), (1, 1)]:
        law = output_distribution([models], [()], DSpark(staleness_steps=staleness), COST, 3, 1, memory=memory)
        assert law.max_verified_tokens == verified


def test_memory_hands_back_ema_rows_by_request_and_nan_for_new_ones():
    memory = PolicyMemory((), MappingProxyType({7: np.array([0.5, 0.4])}))
    view = memory.view((3, 7), np.full((2, 2), 0.9), COST)
    assert np.isnan(view.smoothed[0]).all() and view.smoothed[1].tolist() == [0.5, 0.4]
    with pytest.raises(ValueError, match="do not have 3 entries"):
        memory.view((7,), np.full((1, 3), 0.9), COST)


def test_ema_state_follows_request_ids_across_steps(rng):
    policy = DSpark(staleness_steps=1, ema_decay=0.5)
    step = speculative_step([constant_models()] * 2, [(), ()], policy, COST, 2, rng, request_ids=(4, 9))
    assert sorted(step.memory.smoothed) == [4, 9]
    assert step.memory.pools[0].tolist() == prefix_survival(np.full((2, 2), 0.8)).tolist()


def test_active_requests_join_and_retire():
    assert active_requests(0, [0, 0, 0], (0, 1, 2), 2, retire=False) == (0,)
    assert active_requests(2, [2, 1, 0], (0, 1, 2), 2, retire=True) == (1, 2)
    assert active_requests(2, [2, 1, 0], (0, 1, 2), 2, retire=False) == (0, 1, 2)


def test_generate_returns_m_tokens_per_request(rng):
    outputs = generate(APPENDIX_A.models() * 2, [(), (1,)], Greedy(), COST, 2, 3, rng,
                       join_steps=(0, 2), retire=True)
    assert [len(out) for out in outputs] == [3, 3]


def test_no_speculation_reproduces_the_target_exactly():
    models = TokenModels(lambda prefix: np.array([0.2, 0.8]) if prefix[-1:] == (0,) else np.array([0.6, 0.4]),
                         lambda prefix, drafted: np.array([0.5, 0.5]), lambda prefix, drafted: 0.5)
    law = output_distribution([models], [()], NoSpeculation(), COST, 3, 3)
    reference = sequence_distribution(models, (), 3)
    assert law.joint.keys() == {(seq,) for seq in reference}
    assert all(law.joint[(seq,)] == pytest.approx(prob, abs=1e-15) for seq, prob in reference.items())


@sized(40)
@given(case=markov_cases(num_requests=st.integers(1, 2)), policy=dspark_policies())
def test_merging_by_context_changes_nothing(case, policy):
    # the tests pass context = last token (the worlds are Markov); without it every branch stays apart
    merged = case.exact(policy)
    apart = output_distribution(case.models(), case.prompts, policy, case.cost, case.gamma, case.num_tokens,
                                join_steps=case.join_steps or None, retire=case.retire,
                                memory=case.memory_for(policy))
    assert merged.joint.keys() == apart.joint.keys()
    assert max_abs_difference(merged.joint, apart.joint) < 1e-12
