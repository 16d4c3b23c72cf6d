"""Token-level speculative decoding: draft a block, let a policy decide, verify it.

Terms (one request, one engine step):

* *prefix* - the token ids the request holds so far (its prompt, then every token
  emitted by earlier steps, accepted draft tokens included), as a tuple.
* *target* ``p(. | prefix)`` - the distribution the output must follow exactly.
* *drafter* ``q_k(. | prefix, x_<k)`` - the proposal for draft position k = 1..g. It
  sees the draft tokens already sampled in this block, so Markov heads are
  expressible.
* *confidence* ``c_k(prefix, x_<k)`` - the drafter's estimate that x_k is accepted
  given x_1..x_{k-1} were; it may depend on the sampled draft tokens.
* *accepted* - a verified draft token x_k passes with probability
  ``min(1, p(x_k) / q_k(x_k))``; verification runs left to right and stops at the
  first rejection.
* *residual* - ``norm(max(0, p - q_k))``, the distribution of the correction token
  emitted at the first rejection.
* *bonus* - the token drawn from ``p(. | prefix, x_1..x_l)`` when all ``l`` verified
  draft tokens are accepted.

Every step emits ``accepted + 1`` tokens per request. With a non-anticipating policy
the emitted sequence follows ``p`` exactly (docs/lossless.md). All randomness comes
from the ``np.random.Generator`` the caller passes in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from policies.base import Decision, Policy
from policies.driver import CostSource, PolicyMemory, active_requests, check_decision, cost_for

Prefix = tuple[int, ...]
TargetFn = Callable[[Prefix], np.ndarray]  # prefix -> [V]
DraftFn = Callable[[Prefix, Prefix], np.ndarray]  # (prefix, x_<k) -> [V]
ConfidenceFn = Callable[[Prefix, Prefix], float]  # (prefix, x_<k) -> c_k in [0, 1]

_SUM_TOLERANCE = 1e-9


@dataclass(frozen=True)
class TokenModels:
    """The three functions that describe one request: target, drafter, confidence."""

    target: TargetFn
    drafter: DraftFn
    confidence: ConfidenceFn


def checked_distribution(values: np.ndarray, what: str) -> np.ndarray:
    """Return ``values`` as a float vector after checking it is a probability distribution."""
    dist = np.asarray(values, dtype=np.float64)
    if dist.ndim != 1 or dist.size == 0:
        raise ValueError(f"{what}: expected a non-empty 1-D probability vector, got shape {dist.shape}")
    if not np.all(np.isfinite(dist)) or dist.min() < 0.0 or abs(dist.sum() - 1.0) > _SUM_TOLERANCE:
        raise ValueError(f"{what}: expected non-negative probabilities summing to 1, got {dist.tolist()}")
    return dist


def checked_confidence(value: float, what: str) -> float:
    conf = float(value)
    if not 0.0 <= conf <= 1.0:
        raise ValueError(f"{what}: expected a confidence in [0, 1], got {value!r}")
    return conf


def accept_prob(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Acceptance probability ``min(1, p / q)`` elementwise (1 where q = 0: never drafted)."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    # min(p, q) / q is min(1, p / q) without overflow when q is tiny
    return np.divide(np.minimum(p, q), q, out=np.ones(np.broadcast_shapes(p.shape, q.shape)), where=q > 0.0)


def acceptance_rate(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Probability that a token drafted from q is accepted: ``sum_v min(p, q) = 1 - TV(p, q)``."""
    return np.minimum(np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)).sum(axis=-1)


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Correction distribution ``norm(max(0, p - q))`` over the last axis.

    Where p = q the rejection probability is 0 and the residual is never used; it is
    then defined as p so that the result is always a distribution.
    """
    p = np.asarray(p, dtype=np.float64)
    excess = np.maximum(0.0, p - np.asarray(q, dtype=np.float64))  # [..., V]
    total = excess.sum(axis=-1, keepdims=True)
    return np.where(total > 0.0, excess / np.where(total > 0.0, total, 1.0), p)


def sample_token(dist: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token id from ``dist``; a zero-probability token is never returned."""
    cumulative = np.cumsum(dist)
    index = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return min(index, int(np.flatnonzero(dist)[-1]))


@dataclass(frozen=True)
class DraftBlock:
    """One request's drafted block: tokens x_1..x_g, their proposals and confidences."""

    tokens: Prefix  # (x_1, ..., x_g)
    draft_probs: np.ndarray  # [g, V] q_k(. | prefix, x_<k)
    confidence: np.ndarray  # [g] c_k(prefix, x_<k)


def stack_rows(rows: Sequence[np.ndarray]) -> np.ndarray:
    """Stack per-position distributions -> [g, V] ([0, 0] for an empty block)."""
    return np.array(rows, dtype=np.float64) if len(rows) else np.zeros((0, 0))


def draft_block(models: TokenModels, prefix: Prefix, num_draft: int, rng: np.random.Generator) -> DraftBlock:
    """Sample x_1..x_g sequentially, x_k ~ q_k(. | prefix, x_<k), recording c_k."""
    tokens: list[int] = []
    rows, confidences = [], []
    for k in range(num_draft):
        drafted = tuple(tokens)
        q = checked_distribution(models.drafter(prefix, drafted), f"drafter q_{k + 1} after {prefix}+{drafted}")
        confidences.append(checked_confidence(models.confidence(prefix, drafted), f"c_{k + 1} after {drafted}"))
        rows.append(q)
        tokens.append(sample_token(q, rng))
    return DraftBlock(tuple(tokens), stack_rows(rows), np.array(confidences, dtype=np.float64))


def target_rows(models: TokenModels, prefix: Prefix, tokens: Prefix) -> np.ndarray:
    """p(. | prefix, x_<k) for k = 1..l+1 -> [l + 1, V] (what one target pass over the block yields)."""
    return np.array([checked_distribution(models.target(prefix + tokens[:k]), f"target after {prefix + tokens[:k]}")
                     for k in range(len(tokens) + 1)])


@dataclass(frozen=True)
class BlockOutcome:
    """Verification result of one request: accepted draft tokens, then one correction or bonus."""

    num_accepted: int
    tokens: Prefix  # emitted: x_1..x_accepted followed by the correction/bonus token


def verify_block(target_probs: np.ndarray, draft_probs: np.ndarray, draft_tokens: Sequence[int],
                 rng: np.random.Generator) -> BlockOutcome:
    """Verify the first ``l = len(draft_tokens)`` draft tokens of one request.

    ``target_probs`` [l + 1, V]: row k is p(. | prefix, x_<k+1) (row l gives the bonus);
    ``draft_probs`` [l, V]: the rows the tokens were drawn from.
    """
    length = len(draft_tokens)
    if target_probs.shape[0] != length + 1 or draft_probs.shape[0] < length:
        raise ValueError(f"verify_block: expected {length + 1} target rows and >= {length} draft rows, "
                         f"got {target_probs.shape[0]} and {draft_probs.shape[0]}")
    for k, token in enumerate(draft_tokens):
        if rng.random() >= accept_prob(target_probs[k, token], draft_probs[k, token]):
            correction = sample_token(residual(target_probs[k], draft_probs[k]), rng)
            return BlockOutcome(k, tuple(int(t) for t in draft_tokens[:k]) + (correction,))
    return BlockOutcome(length, tuple(int(t) for t in draft_tokens) + (sample_token(target_probs[length], rng),))


@dataclass(frozen=True)
class StepResult:
    """One engine step: the drafted blocks, the policy's decision, what each request emitted."""

    blocks: tuple[DraftBlock, ...]
    decision: Decision
    outcomes: tuple[BlockOutcome, ...]
    memory: PolicyMemory  # to pass to the next step


def speculative_step(models: Sequence[TokenModels], prefixes: Sequence[Prefix], policy: Policy, cost: CostSource,
                     gamma: int, rng: np.random.Generator, memory: PolicyMemory | None = None,
                     request_ids: Sequence[int] | None = None) -> StepResult:
    """Run one step for requests sharing it: draft, decide l_r with ``policy``, verify.

    ``gamma`` is the drafter's block size (the policy may draft fewer, see
    ``Policy.draft_tokens``); ``request_ids`` name the requests so that EMA state
    follows them across steps (default 0..R-1).
    """
    if len(models) != len(prefixes) or not prefixes:
        raise ValueError(f"speculative_step: expected one model per prefix (>= 1), got {len(models)} "
                         f"models and {len(prefixes)} prefixes")
    if policy.needs_outcomes:
        raise ValueError(f"policy {policy.name!r} reads true outcomes; it is a bound, not a runnable policy")
    memory = memory if memory is not None else PolicyMemory()
    ids = tuple(range(len(prefixes))) if request_ids is None else tuple(request_ids)
    num_draft = policy.draft_tokens(gamma)
    blocks = tuple(draft_block(m, prefix, num_draft, rng) for m, prefix in zip(models, prefixes, strict=True))
    confidence = np.array([b.confidence for b in blocks]).reshape(len(blocks), num_draft)  # [R, g]
    decision = policy.decide(memory.view(ids, confidence, cost_for(cost, len(ids))))
    lengths = check_decision(policy, decision, len(ids), num_draft)
    outcomes = []
    for m, prefix, block, length in zip(models, prefixes, blocks, lengths, strict=True):
        verified = block.tokens[:length]
        outcomes.append(verify_block(target_rows(m, prefix, verified), block.draft_probs, verified, rng))
    return StepResult(blocks, decision, tuple(outcomes), memory.after(policy, ids, decision))


def generate(models: Sequence[TokenModels], prompts: Sequence[Prefix], policy: Policy, cost: CostSource,
             gamma: int, num_tokens: int, rng: np.random.Generator, join_steps: Sequence[int] | None = None,
             retire: bool = False, memory: PolicyMemory | None = None) -> tuple[Prefix, ...]:
    """Run engine steps until every request has ``num_tokens`` output tokens; return the first ``num_tokens``.

    Request r shares steps from engine step ``join_steps[r]`` on (default: all from
    step 0); with ``retire`` a request leaves the batch once it has ``num_tokens``
    tokens. The policy's memory (stale pools, EMA rows) is carried as an engine does,
    starting from ``memory`` (default empty: a fresh engine).
    """
    if len(models) != len(prompts) or not prompts or num_tokens < 1:
        raise ValueError(f"generate: expected one model per prompt (>= 1) and num_tokens >= 1, got "
                         f"{len(models)} models, {len(prompts)} prompts, num_tokens={num_tokens}")
    joins = tuple(join_steps) if join_steps is not None else (0,) * len(prompts)
    outputs: list[Prefix] = [() for _ in prompts]
    memory = memory if memory is not None else PolicyMemory()
    step = 0
    while min(len(out) for out in outputs) < num_tokens:
        ids = active_requests(step, [len(out) for out in outputs], joins, num_tokens, retire)
        step += 1
        if not ids:
            continue
        result = speculative_step([models[r] for r in ids], [tuple(prompts[r]) + outputs[r] for r in ids],
                                  policy, cost, gamma, rng, memory, ids)
        memory = result.memory
        for r, outcome in zip(ids, result.outcomes, strict=True):
            outputs[r] += outcome.tokens
    return tuple(out[:num_tokens] for out in outputs)


__all__ = [
    "BlockOutcome", "DraftBlock", "PolicyMemory", "Prefix", "StepResult", "TokenModels",
    "accept_prob", "acceptance_rate", "draft_block", "generate", "residual", "sample_token",
    "speculative_step", "stack_rows", "target_rows", "verify_block",
]
