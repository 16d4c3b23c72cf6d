"""The sampler draws from the law the exact checker computes, and Monte Carlo covers what enumeration cannot.

Each case runs ``generate`` (policies/lossless/sampler.py) many times with a fixed
seed and compares the counts of the outputs with a law by Pearson's chi-square
test (tests/chi_square.py): false-failure rate 1e-6 per test, and a sample size
chosen so that a law ``LEAK`` away in total variation (moved between the two
likeliest cells, the hardest such leak to see) is rejected with probability
>= 0.999. A sample in a cell of probability 0 fails outright.

* Small worlds: the samples against the exact law (the sampler and the checker
  are two implementations of one process). A lossy policy is included on
  purpose: the sampler must reproduce the checker's distorted law, and the same
  test must reject p's.
* Dense worlds with 4 requests and gamma 5 (every draft position random, about
  a million joint draft outcomes per step: too many to enumerate): the samples
  against the product of the targets, for lossless schedulers; the same test
  rejects ``global_sync`` there.
"""

from __future__ import annotations

import itertools
from collections import Counter
from types import MappingProxyType

import numpy as np
import pytest

from policies import Policy, prefix_survival
from policies.driver import PolicyMemory
from policies.dspark import DSpark
from policies.greedy import GlobalSync, Greedy
from policies.lossless.sampler import generate
from policies.threshold import Threshold
from tests.chi_square import chi_square as pearson
from tests.chi_square import samples_for_power
from tests.lossless_policies import lossless_variants
from tests.lossless_strategies import APPENDIX_A, MarkovCase, knife_edge_sps
from tests.lossless_worlds import runs_in, sparse_world

LEAK = 0.06  # total variation a Monte Carlo test must see (power >= 0.999); dense worlds: DENSE_LEAK
DENSE_LEAK = 0.05


def chi_square(counts: Counter, probs: dict, num_samples: int) -> tuple[float, float]:
    """(statistic, critical value at the false-failure rate) of counts against probs."""
    impossible = {cell: n for cell, n in counts.items() if probs.get(cell, 0.0) == 0.0}
    assert not impossible, f"samples in cells of probability 0: {impossible}"
    cells = [cell for cell, p in probs.items() if p > 0.0]
    observed = np.array([counts.get(cell, 0) for cell in cells], dtype=float)
    expected = np.array([probs[cell] for cell in cells]) * num_samples
    return pearson(observed, expected)


def samples(probs: dict, leak: float = LEAK) -> int:
    return samples_for_power(np.array([p for p in probs.values() if p > 0.0]), leak)


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


@pytest.mark.parametrize("case, policy, seed", [
    (APPENDIX_A, GlobalSync(), 11),                          # lossy: the law is (0.85, 0.15)
    (APPENDIX_A, Greedy(), 12),
    (TWO_REQUESTS, DSpark(staleness_steps=1, ema_decay=0.8), 13),  # joint law of both requests
    (ZEROS, Greedy(), 14),
    (ZEROS, Threshold(theta=0.4, variant="position"), 15),
], ids=["appendix_a-global_sync", "appendix_a-greedy", "two_requests-dspark1_ema", "zeros-greedy",
        "zeros-threshold"])
def test_sampler_matches_exact_law(case, policy, seed):
    exact = case.exact(policy)
    num_samples = samples(exact.joint)
    statistic, critical = chi_square(sample_outputs(case, policy, num_samples, seed), exact.joint, num_samples)
    assert statistic < critical, f"chi-square {statistic:.1f} >= {critical:.1f}"


def test_same_test_rejects_the_target_for_a_lossy_policy():
    target = {((0,),): 0.7, ((1,),): 0.3}
    num_samples = samples(target, leak=0.15)  # the leak Appendix A shows
    counts = sample_outputs(APPENDIX_A, GlobalSync(), num_samples, seed=11)
    statistic, critical = chi_square(counts, target, num_samples)
    assert statistic > critical, "the samples should tell (0.85, 0.15) from (0.7, 0.3)"


# --- dense worlds: 4 requests, gamma 5 --------------------------------------------------------------

def dense_world(seed: int) -> MarkovCase:
    """4 requests, gamma 5, every draft position random (2^5 blocks per request), Appendix A's dip in SPS."""
    return sparse_world(seed, 4, 5, (1, 2, 3, 4, 5), shape="dip")


def product_of_targets(case: MarkovCase) -> dict:
    references = [case.reference(r) for r in range(case.num_requests)]
    return {cells: float(np.prod([ref[cell] for ref, cell in zip(references, cells, strict=True)]))
            for cells in itertools.product(*(sorted(ref) for ref in references))}


DENSE = dense_world(301)  # global_sync misses the product of targets by ~0.12 in total variation here


@pytest.mark.slow  # ~4 s each: a sampled chi-square test; the exact catalogue (test_lossless.py) stays in the quick run
@pytest.mark.parametrize("policy, seed", [(Greedy(), 21), (DSpark(), 22)], ids=["greedy", "dspark"])
def test_dense_world_follows_the_targets(policy, seed):
    law = product_of_targets(DENSE)
    num_samples = samples(law, DENSE_LEAK)
    statistic, critical = chi_square(sample_outputs(DENSE, policy, num_samples, seed), law, num_samples)
    assert statistic < critical, f"chi-square {statistic:.1f} >= {critical:.1f}"


@pytest.mark.slow  # ~4 s: the sampled counterpart of the catalogue's global_sync counterexample
def test_dense_world_rejects_global_sync():
    law = product_of_targets(DENSE)
    num_samples = samples(law, DENSE_LEAK)
    statistic, critical = chi_square(sample_outputs(DENSE, GlobalSync(), num_samples, 23), law, num_samples)
    assert statistic > critical


@pytest.mark.slow
@pytest.mark.parametrize("policy", [policy for _, policy in lossless_variants()],
                         ids=[name for name, _ in lossless_variants()])
def test_dense_worlds_follow_the_targets_for_every_lossless_policy(policy):
    for seed in (302, 303, 309):  # worlds whose first tokens are not all certain
        case = dense_world(seed)
        if not runs_in(policy, case):
            continue
        law = product_of_targets(case)
        num_samples = samples(law, DENSE_LEAK)
        statistic, critical = chi_square(sample_outputs(case, policy, num_samples, seed), law, num_samples)
        assert statistic < critical, f"world {seed}: chi-square {statistic:.1f} >= {critical:.1f}"
