"""The sampler (policies/lossless/sampler.py) draws from the law the exact checker computes.

Each case runs ``generate`` many times with a fixed seed and compares the counts of
the outputs with the exact distribution by a chi-square goodness-of-fit test at
level 1e-6 (cells expected fewer than 5 times are pooled; a sample in a cell of
probability 0 fails outright). A lossy policy is included on purpose: the sampler
must reproduce the checker's distorted law, and the same test must reject p's.
"""

from __future__ import annotations

from collections import Counter
from types import MappingProxyType

import numpy as np
import pytest
from scipy import stats

from policies import Policy, prefix_survival
from policies.driver import PolicyMemory
from policies.dspark import DSpark
from policies.greedy import GlobalSync, Greedy
from policies.lossless.sampler import generate
from policies.threshold import Threshold
from tests.lossless_strategies import APPENDIX_A, MarkovCase, knife_edge_sps

FALSE_FAILURE_RATE = 1e-6


def chi_square(counts: Counter, probs: dict, num_samples: int) -> tuple[float, float]:
    """(statistic, critical value at FALSE_FAILURE_RATE) of counts against probs."""
    impossible = {cell: n for cell, n in counts.items() if probs.get(cell, 0.0) == 0.0}
    assert not impossible, f"samples in cells of probability 0: {impossible}"
    cells = sorted((p, cell) for cell, p in probs.items() if p > 0.0)
    observed, expected, pooled_obs, pooled_exp = [], [], 0, 0.0
    for p, cell in cells:
        if p * num_samples < 5.0:
            pooled_obs, pooled_exp = pooled_obs + counts.get(cell, 0), pooled_exp + p * num_samples
        else:
            observed.append(counts.get(cell, 0))
            expected.append(p * num_samples)
    if pooled_exp > 0.0:
        observed.append(pooled_obs)
        expected.append(pooled_exp)
    observed_arr, expected_arr = np.array(observed, float), np.array(expected)
    statistic = float(((observed_arr - expected_arr) ** 2 / expected_arr).sum())
    dof = max(len(observed) - 1, 1)
    return statistic, float(stats.chi2.isf(FALSE_FAILURE_RATE, dof))


def sample_outputs(case: MarkovCase, policy: Policy, num_samples: int, seed: int) -> Counter:
    rng = np.random.default_rng(seed)
    models, memory = case.models(), case.memory_for(policy)
    return Counter(generate(models, case.prompts, policy, case.cost, case.gamma, case.num_tokens, rng,
                            join_steps=case.join_steps or None, retire=case.retire, memory=memory)
                   for _ in range(num_samples))


# Two requests (prompts "0" and "1"), gamma = 2, m = 2, a warm engine whose stale pool
# and EMA rows already exist, so dspark verifies from the first step.
TWO_REQUESTS = MarkovCase(
    target=np.array([[0.6, 0.4], [0.2, 0.8], [0.5, 0.5]]),
    draft=np.array([[[0.3, 0.7], [0.5, 0.5], [0.5, 0.5]], [[0.9, 0.1], [0.4, 0.6], [0.5, 0.5]]]),
    confidence=np.array([[0.8, 0.9, 0.8], [1.0, 0.0, 0.9]]),
    prompts=((0,), (1,)),
    sps=knife_edge_sps(9, 2, np.cumsum([0.8, 0.8, 0.5, 0.4])),
    num_tokens=2,
    memory=PolicyMemory((prefix_survival(np.array([[0.9, 0.9], [0.8, 0.5]])),),
                        MappingProxyType({0: np.array([0.7, 0.7])})),
)

# One request, V = 3 with zeros in p and q (the residual carries the mass q lacks),
# gamma = 3, m = 2, on an Appendix-A-like cliff.
ZEROS = MarkovCase(
    target=np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5], [0.0, 0.6, 0.4], [0.3, 0.3, 0.4]]),
    draft=np.array([[[0.9, 0.0, 0.1], [0.2, 0.8, 0.0], [0.5, 0.5, 0.0], [0.6, 0.4, 0.0]]] * 3),
    confidence=np.array([[0.9, 0.9, 0.8, 0.9], [1.0, 0.5, 0.0, 0.9], [0.9, 0.9, 0.9, 0.9]]),
    prompts=((),),
    sps=np.array([1.0, 0.6, 0.45, 0.4, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3]),
    num_tokens=2,
)


@pytest.mark.parametrize("case, policy, num_samples, seed", [
    (APPENDIX_A, GlobalSync(), 4000, 11),                          # lossy: the law is (0.85, 0.15)
    (APPENDIX_A, Greedy(), 4000, 12),
    (TWO_REQUESTS, DSpark(staleness_steps=1, ema_decay=0.8), 5000, 13),  # joint law of both requests
    (ZEROS, Greedy(), 5000, 14),
    (ZEROS, Threshold(theta=0.4, variant="position"), 5000, 15),
], ids=["appendix_a-global_sync", "appendix_a-greedy", "two_requests-dspark1_ema", "zeros-greedy",
        "zeros-threshold"])
def test_sampler_matches_exact_law(case, policy, num_samples, seed):
    exact = case.exact(policy)
    statistic, critical = chi_square(sample_outputs(case, policy, num_samples, seed), exact.joint, num_samples)
    assert statistic < critical, f"chi-square {statistic:.1f} >= {critical:.1f}"


def test_same_test_rejects_the_target_for_a_lossy_policy():
    num_samples = 4000
    counts = sample_outputs(APPENDIX_A, GlobalSync(), num_samples, seed=11)
    target = {((0,),): 0.7, ((1,),): 0.3}
    statistic, critical = chi_square(counts, target, num_samples)
    assert statistic > critical, "4000 samples should tell (0.85, 0.15) from (0.7, 0.3)"
