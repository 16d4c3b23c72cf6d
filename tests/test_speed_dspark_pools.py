"""dspark's fast paths over steps: pools carried with their sorted values, and small tables decided in one call,
give the decisions of the general helpers (fresh sorts, partial sorts), step after step through the policy memory."""

from __future__ import annotations

import numpy as np
import pytest

import policies.dspark as dspark_module
from policies.base import CostCurve, top_k_lengths
from policies.driver import PolicyMemory, check_decision
from policies.dspark import DSpark
from policies.greedy import search_capacity


def reference(policy: DSpark, confidence: np.ndarray, history: tuple[np.ndarray, ...], cost: CostCurve,
              budget: int | None) -> tuple[int, list[int]]:
    """Capacity and lengths from the general helpers: the stale pool sorted afresh, the K-th value by numpy."""
    survival = np.cumprod(confidence, axis=1)
    limit = None if budget is None else budget - confidence.shape[0]
    if policy.staleness_steps == 0:
        capacity = search_capacity(np.array(survival), cost, policy.objective, limit)
    elif len(history) >= policy.staleness_steps:
        capacity = search_capacity(np.array(history[-policy.staleness_steps]), cost, policy.objective, limit)
    else:
        capacity = 0
    return capacity, top_k_lengths(np.array(survival), capacity).tolist()


def confidences(rng: np.random.Generator, num_requests: int, gamma: int) -> np.ndarray:
    confidence = rng.uniform(0.2, 1.0, (num_requests, gamma))
    ties = rng.random((num_requests, gamma)) < 0.3  # ties within and across requests (survivals of 1, 0.25, ...)
    confidence[ties] = rng.choice([0.0, 0.5, 1.0], ties.sum())
    return confidence


@pytest.mark.parametrize("staleness, objective, budget", [
    (2, "tokens_x_sps", None),  # the production setting
    (1, "tokens_per_s", None),
    (0, "tokens_x_sps", None),  # the lossy full search of the current pool
    (2, "tokens_x_sps", 900),  # a token budget cuts the search
])
def test_decisions_over_steps_equal_the_general_helpers(staleness, objective, budget):
    rng = np.random.default_rng(staleness * 7 + (budget or 0))
    policy = DSpark(staleness_steps=staleness, objective=objective)
    cost = CostCurve(batch_tokens=np.array([1, 300, 3000]), steps_per_s=np.array([60.0, 55.0, 9.0]), draft_s=0.002)
    memory, carried = PolicyMemory(), 0
    for step in range(40):
        # Batches of every size in turn: one-call tables (<= 48 survivals) and sorted, carried pools (above).
        num_requests = int(rng.choice([1, 3, 6, 7, 18, 40, 120]))
        confidence = confidences(rng, num_requests, 7)
        if step % 9 == 8:
            confidence[0, 3] = np.nan  # a NaN: numpy's order decides
        ids = np.arange(num_requests)
        view = memory.view(ids, confidence, cost, token_budget=budget)
        if 0 < staleness <= len(view.history):
            carried += dspark_module._sorted_values(view.history[-staleness]) is not None
        decision = policy.decide(view)
        want_capacity, want_lengths = reference(policy, confidence, view.history, cost, budget)
        assert decision.capacity == want_capacity, step
        assert check_decision(policy, decision, num_requests, 7, budget).tolist() == want_lengths, step
        np.testing.assert_array_equal(decision.pool, np.cumprod(confidence, axis=1))
        memory = memory.after(policy, ids, decision)
    assert carried >= 5 or staleness == 0  # the stale pool's sorted values came with it


def test_a_carried_pool_is_read_only_kept_without_a_copy_and_found_by_identity():
    policy, rng = DSpark(), np.random.default_rng(3)
    cost = CostCurve(batch_tokens=np.array([1, 3000]), steps_per_s=np.array([60.0, 9.0]))
    memory, ids = PolicyMemory(), np.arange(40)
    for _ in range(3):
        decision = policy.decide(memory.view(ids, confidences(rng, 40, 7), cost))
        memory = memory.after(policy, ids, decision)
        assert memory.pools[-1] is decision.pool and not decision.pool.flags.writeable
    stale = memory.pools[-2]
    ascending = dspark_module._sorted_values(stale)
    assert ascending is not None
    np.testing.assert_array_equal(ascending, np.sort(stale, axis=None))
    assert dspark_module._sorted_values(stale.copy()) is None  # an equal array that is not the pool: sorted again
