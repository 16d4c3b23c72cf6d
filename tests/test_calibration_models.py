"""Torch verifier and drafters on the tiny preset: shapes, parameter counts, variable-length verification."""

from __future__ import annotations

import pytest
import torch

from calibration.models.drafters import DraftOutput, ParallelDrafter, build_drafter
from calibration.models.model import Verifier, build_verifier
from calibration.models.shapes import get_shape

pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(1234)


@pytest.fixture
def verifier(gen: torch.Generator) -> Verifier:
    return build_verifier("tiny", gen, std=0.2)


@pytest.mark.parametrize("name", ["tiny", "qwen3-4b", "qwen3-8b", "qwen3-14b"])
def test_torch_parameter_count_equals_the_shape(name: str) -> None:
    with torch.device("meta"):  # no memory: the big presets are only counted
        model = Verifier(name)
    assert sum(p.numel() for p in model.parameters()) == get_shape(name).total_params


def test_moe_shapes_are_roofline_only() -> None:
    with pytest.raises(ValueError, match="MoE"):
        Verifier("v4flash-like")


def _separately(model: Verifier, prompt: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    cache = model.new_cache(1, 64)
    tokens = torch.cat([prompt, new])
    return model(tokens, cache.batch([0], [tokens.numel()]), cache).logits[prompt.numel():]


@pytest.mark.parametrize("slots", [[0, 1, 2], [2, 0, 1]])  # contiguous slice / gathered slots
def test_varlen_verification_equals_each_request_alone(verifier: Verifier, gen: torch.Generator,
                                                       slots: list[int]) -> None:
    prompt_lens, query_lens = [5, 9, 3], [1, 4, 3]  # contexts and 1 + l_r differ per request
    prompts = [torch.randint(0, 128, (n,), generator=gen) for n in prompt_lens]
    queries = [torch.randint(0, 128, (n,), generator=gen) for n in query_lens]
    cache = verifier.new_cache(3, 64)
    with torch.inference_mode():
        verifier(torch.cat(prompts), cache.batch(slots, prompt_lens), cache)  # prefill, flattened
        cache.commit(slots, prompt_lens)
        out = verifier(torch.cat(queries), cache.batch(slots, query_lens), cache)
        expected = torch.cat([_separately(verifier, p, q) for p, q in zip(prompts, queries, strict=True)])
    assert out.logits.shape == (sum(query_lens), 128)
    assert out.features.shape == (sum(query_lens), 64 * len(verifier.feature_layers))
    torch.testing.assert_close(out.logits, expected, atol=1e-5, rtol=1e-5)


def test_cache_overflow_and_empty_queries_are_errors(verifier: Verifier) -> None:
    cache = verifier.new_cache(2, 8)
    with pytest.raises(ValueError, match="would hold 9 tokens; the cache holds 8"):
        cache.batch([0], [9])
    with pytest.raises(ValueError, match=">= 1 query token"):
        cache.batch([0, 1], [2, 0])


def _drafter_ready(kind: str, verifier: Verifier, gen: torch.Generator, **kw) -> tuple:
    drafter = build_drafter(kind, verifier, gen, **kw)
    drafter.new_cache(3, 32)
    counts = [5, 9, 3]
    cache = verifier.new_cache(3, 32)
    tokens = torch.randint(0, 128, (sum(counts),), generator=gen)
    with torch.inference_mode():
        out = verifier(tokens, cache.batch([0, 1, 2], counts), cache)
        drafter.extend_context([0, 1, 2], drafter.features_of(out), counts)
    anchor = torch.randint(0, 128, (3,), generator=gen)
    return drafter, anchor


@pytest.mark.parametrize("kind, head, has_confidence", [
    ("dspark", "markov", True),  # parallel backbone + Markov head + confidence head
    ("dspark", "rnn", True),  # RNN head (eq. 6)
    ("dflash", "markov", False),  # no sequential head (head ignored)
    ("eagle3", "markov", False),
    ("mtp", "markov", False),
])
def test_drafters_return_tokens_and_valid_distributions(verifier: Verifier, gen: torch.Generator, kind: str,
                                                        head: str, has_confidence: bool) -> None:
    drafter, anchor = _drafter_ready(kind, verifier, gen, head=head, max_depth=6)
    with torch.inference_mode():
        out: DraftOutput = drafter.propose(anchor, torch.arange(3), 5, gen)
    assert out.tokens.shape == (3, 5) and out.probs.shape == (3, 5, 128)
    assert torch.all(out.probs >= 0)
    torch.testing.assert_close(out.probs.sum(-1), torch.ones(3, 5))
    drawn = out.probs.gather(-1, out.tokens[..., None])[..., 0]
    assert torch.all(drawn > 0)  # every token came from its row
    if has_confidence:
        assert out.confidence is not None and out.confidence.shape == (3, 5)
        assert torch.all((out.confidence > 0) & (out.confidence < 1))
    else:
        assert out.confidence is None
    shared = {id(verifier.embed.weight), id(verifier.lm_head.weight)}
    assert not shared & {id(p) for p in drafter.parameters()}  # embedding and LM head are shared, not copied


def test_markov_head_conditions_on_the_sampled_token(verifier: Verifier, gen: torch.Generator) -> None:
    drafter, anchor = _drafter_ready("dspark", verifier, gen)
    assert isinstance(drafter, ParallelDrafter)
    with torch.inference_mode():
        out = drafter.propose(anchor, torch.arange(3), 4, torch.Generator().manual_seed(7))
        base = verifier.lm_head(drafter.backbone(anchor, torch.arange(3), 4)).float()  # U_k
        previous = torch.cat([anchor[:, None], out.tokens[:, :-1]], dim=1)  # x_{k-1}
        expected = torch.softmax(base + drafter.w2(drafter.w1(previous)).float(), dim=-1)  # eq. 4-5
    torch.testing.assert_close(out.probs, expected)


def test_drafting_is_reproducible_and_mtp_depth_is_checked(verifier: Verifier, gen: torch.Generator) -> None:
    drafter, anchor = _drafter_ready("dflash", verifier, gen)
    with torch.inference_mode():
        a = drafter.propose(anchor, torch.arange(3), 4, torch.Generator().manual_seed(3))
        b = drafter.propose(anchor, torch.arange(3), 4, torch.Generator().manual_seed(3))
    assert torch.equal(a.tokens, b.tokens)
    mtp, anchor = _drafter_ready("mtp", verifier, gen, max_depth=2)
    with pytest.raises(ValueError, match="2 depths; cannot draft 3"):
        mtp.propose(anchor, torch.arange(3), 3, gen)
    with pytest.raises(ValueError, match="unknown drafter kind 'medusa'"):
        build_drafter("medusa", verifier, gen)
