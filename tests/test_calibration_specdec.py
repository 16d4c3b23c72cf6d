"""Real speculative decoding on random tiny weights is lossless: a Monte Carlo chi-square test.

Thousands of requests share one engine batch (two prompts of different lengths, so
verification is variable-length across contexts). The first two output tokens of
each request must follow the verifier's own joint distribution p(y1) p(y2 | y1)
at temperature 1, whatever the drafter proposes and the policy verifies.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from calibration.models.drafters import build_drafter
from calibration.models.model import Verifier
from calibration.serving.specdec import SpeculativeDecoder
from policies import make_policy
from policies.base import CostCurve
from tests.chi_square import chi_square

PROMPTS = ((1, 2, 3), (4, 5, 6, 7, 0, 1))
NUM_PER_PROMPT = 1500
VOCAB = 8
FLAT_COST = CostCurve(batch_tokens=np.array([1, 1_000_000]), steps_per_s=np.array([100.0, 100.0]))


pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def verifier(tiny_verifier_v8):
    return tiny_verifier_v8


def exact_first_two(model: Verifier, prompt: tuple[int, ...]) -> np.ndarray:
    """p(y1, y2 | prompt) -> [V, V], from V + 1 plain forwards."""
    with torch.inference_mode():
        rows = []
        for extra in [(), *((y,) for y in range(VOCAB))]:
            tokens = torch.tensor(prompt + extra)
            cache = model.new_cache(1, tokens.numel())
            rows.append(torch.softmax(model(tokens, cache.batch([0], [tokens.numel()]), cache).logits[-1], -1))
    p = torch.stack(rows).double().numpy()
    return p[0][:, None] * p[1:]


@pytest.mark.parametrize("kind, policy, sharpen_confidence, max_kept_tokens", [
    # threshold reads c_2(x_1): admission of x_2 depends on the sampled x_1, never on x_2 itself
    ("dspark", make_policy("threshold", theta=0.3), True, None),
    ("dflash", make_policy("mtp3"), False, None),  # static: every drafted token verified
    # a dense-log recording: the whole block verified, one token kept per step (x_2 from the next step)
    ("dspark", make_policy("mtp3"), False, 1),
])
def test_first_two_tokens_follow_the_verifier(verifier: Verifier, kind: str, policy, sharpen_confidence: bool,
                                              max_kept_tokens: int | None) -> None:
    drafter = build_drafter(kind, verifier, torch.Generator().manual_seed(5), num_layers=1, std=0.1)
    if sharpen_confidence:  # make c_k hinge on the Markov embedding W1[x_{k-1}], so l_r varies with x_1
        with torch.no_grad():
            drafter.confidence_head.weight[:, verifier.s.hidden_size:].mul_(100.0)
    decoder = SpeculativeDecoder(verifier, drafter, policy, FLAT_COST, gamma=3)
    prompts = [list(p) for p in PROMPTS for _ in range(NUM_PER_PROMPT)]
    decoder.start(prompts, max_new_tokens=2)
    first = decoder.step(np.random.default_rng(2024), torch.Generator().manual_seed(2024), max_kept_tokens)
    if max_kept_tokens is not None:
        assert {len(o) for o in decoder.outputs} == {max_kept_tokens}
        assert first.accepted.max() > max_kept_tokens  # the record reports the whole verification
    while min(len(o) for o in decoder.outputs) < 2:
        decoder.step(np.random.default_rng(7), torch.Generator().manual_seed(7), max_kept_tokens)

    assert 0 < first.accepted.mean() < first.lengths.mean()  # both accepts and rejections happen
    if sharpen_confidence:
        assert len(set(first.lengths.tolist())) > 1  # the policy's decisions really vary
    for i, prompt in enumerate(PROMPTS):
        outs = np.array([o[:2] for o in decoder.outputs[i * NUM_PER_PROMPT:(i + 1) * NUM_PER_PROMPT]])
        observed = np.zeros((VOCAB, VOCAB))
        np.add.at(observed, (outs[:, 0], outs[:, 1]), 1)
        stat, critical = chi_square(observed.ravel(), NUM_PER_PROMPT * exact_first_two(verifier, prompt).ravel())
        assert stat < critical, f"prompt {prompt}: chi2 {stat:.1f} >= {critical:.1f}"


def test_a_policy_reading_true_outcomes_is_refused(verifier: Verifier) -> None:
    drafter = build_drafter("dflash", verifier, torch.Generator().manual_seed(5), num_layers=1)
    with pytest.raises(ValueError, match="true outcomes"):
        SpeculativeDecoder(verifier, drafter, make_policy("oracle"), FLAT_COST, gamma=3)


@pytest.mark.parametrize("name, builds", [("mtp1", 0), ("greedy", 3)])
def test_the_loop_builds_a_cost_curve_only_for_policies_that_read_it(verifier: Verifier, name: str,
                                                                     builds: int) -> None:
    """Building the step's cost curve is host time in every step; a static policy never reads it, and no engine
    running one spends it, so the loop must not build it for such a policy (nor would the loop probe's static
    steps, which price mtp1's)."""
    calls = []

    def cost(num_requests: int) -> CostCurve:
        calls.append(num_requests)
        return FLAT_COST

    drafter = build_drafter("dspark", verifier, torch.Generator().manual_seed(5), num_layers=1, std=0.1)
    decoder = SpeculativeDecoder(verifier, drafter, make_policy(name), cost, gamma=3)
    decoder.start([list(p) for p in PROMPTS], max_new_tokens=8)
    for seed in range(3):
        decoder.step(np.random.default_rng(seed), torch.Generator().manual_seed(seed))
    assert len(calls) == builds
