"""Exact output distribution of speculative decoding under a policy, by enumeration.

For small vocabularies and blocks this walks every branch an engine could take -
every draft block, the policy's decision on it, every accept/reject outcome and
every correction or bonus token - and sums the probabilities of the first m output
tokens of each request. Steps repeat (each emits accepted + 1 tokens per request)
until every request holds m tokens; the policy's memory (stale pools, EMA rows) is
carried along each branch exactly as :func:`policies.lossless.sampler.generate` carries it.

No sampling: results are sums of float products, exact up to rounding (~1e-15).
Policies must be pure (the ``Policy`` contract): decisions are cached by input.

*Merging.* Branches that reach the same state are merged (their probabilities
added), which keeps long runs small. Two branches are in the same state only
when everything the rest of the run can read is equal: each request's first m
outputs (what is counted), its model context (what the drafter, confidence and
target read next) and the policy's whole memory, every field of it (stale pools,
EMA rows, and whatever :class:`policies.driver.PolicyMemory` may carry later),
compared value for value by :func:`state_key`. A policy's decision is a function
of its view, and the view is built from exactly these (plus the step number and
the request ids, equal along one frontier), so merged branches decide alike.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from policies.base import Policy
from policies.driver import CostSource, PolicyMemory, active_requests, check_decision, cost_for
from policies.lossless.sampler import (
    DraftBlock,
    Prefix,
    TokenModels,
    accept_prob,
    checked_confidence,
    checked_distribution,
    residual,
    stack_rows,
    target_rows,
)

Branch = tuple[float, Prefix]  # (probability, emitted tokens)
Outputs = tuple[Prefix, ...]  # output tokens of every request, in request order


def verify_branches(target_probs: np.ndarray, draft_probs: np.ndarray, draft_tokens: Sequence[int]) -> list[Branch]:
    """Every outcome of verifying ``draft_tokens`` with its probability (the exact form of ``verify_block``).

    Shapes as in :func:`policies.lossless.sampler.verify_block`. The probabilities sum to 1.
    """
    branches: list[Branch] = []
    survive = 1.0  # probability that x_1..x_k were all accepted
    for k, token in enumerate(draft_tokens):
        alpha = float(accept_prob(target_probs[k, token], draft_probs[k, token]))
        if alpha < 1.0:
            correction = residual(target_probs[k], draft_probs[k])
            kept = tuple(int(t) for t in draft_tokens[:k])
            branches += [(survive * (1.0 - alpha) * float(correction[y]), kept + (int(y),))
                         for y in np.flatnonzero(correction)]
        survive *= alpha
        if survive == 0.0:
            return branches
    bonus = target_probs[len(draft_tokens)]
    verified = tuple(int(t) for t in draft_tokens)
    branches += [(survive * float(bonus[y]), verified + (int(y),)) for y in np.flatnonzero(bonus)]
    return branches


def draft_branches(models: TokenModels, prefix: Prefix, num_draft: int) -> list[tuple[float, DraftBlock]]:
    """Every draft block x_1..x_g with q-probability > 0, with that probability."""
    blocks: list[tuple[float, DraftBlock]] = []

    def extend(tokens: Prefix, prob: float, rows: list[np.ndarray], confs: list[float]) -> None:
        if len(tokens) == num_draft:
            block = DraftBlock(tokens, stack_rows(rows), np.array(confs, dtype=np.float64))
            blocks.append((prob, block))
            return
        where = f"after {prefix}+{tokens}"
        q = checked_distribution(models.drafter(prefix, tokens), f"drafter q_{len(tokens) + 1} {where}")
        conf = checked_confidence(models.confidence(prefix, tokens), f"c_{len(tokens) + 1} {where}")
        for x in np.flatnonzero(q):
            extend(tokens + (int(x),), prob * float(q[x]), rows + [q], confs + [conf])

    extend((), 1.0, [], [])
    return blocks


def sequence_distribution(models: TokenModels, prompt: Prefix, num_tokens: int) -> dict[Prefix, float]:
    """The reference: P(y_1..y_m) = prod_i p(y_i | prompt, y_<i) over all sequences of length m."""
    dist: dict[Prefix, float] = {(): 1.0}
    for _ in range(num_tokens):
        grown: dict[Prefix, float] = {}
        for seq, prob in dist.items():
            p = checked_distribution(models.target(tuple(prompt) + seq), f"target after {tuple(prompt) + seq}")
            grown.update({seq + (int(y),): prob * float(p[y]) for y in np.flatnonzero(p)})
        dist = grown
    return dist


@dataclass(frozen=True)
class ExactDistribution:
    """Joint distribution of every request's first m output tokens."""

    joint: Mapping[Outputs, float]
    num_steps: int  # engine steps enumerated (the longest branch)
    num_decisions: int  # distinct policy decisions evaluated
    max_verified_tokens: int  # the most draft tokens (sum of l_r) any of those decisions verified

    def marginal(self, request: int) -> dict[Prefix, float]:
        out: dict[Prefix, float] = defaultdict(float)
        for outputs, prob in self.joint.items():
            out[outputs[request]] += prob
        return dict(out)

    def pair(self, first: int, second: int) -> dict[tuple[Prefix, Prefix], float]:
        out: dict[tuple[Prefix, Prefix], float] = defaultdict(float)
        for outputs, prob in self.joint.items():
            out[outputs[first], outputs[second]] += prob
        return dict(out)

    def product_deviation(self, first: int, second: int) -> float:
        """max |P(y_r, y_s) - P(y_r) P(y_s)| over all pairs of sequences."""
        pair, left, right = self.pair(first, second), self.marginal(first), self.marginal(second)
        return max(abs(pair.get((a, b), 0.0) - pa * pb) for a, pa in left.items() for b, pb in right.items())


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def state_key(value: object) -> Hashable:
    """A hashable value equal for two states exactly when they are equal, value for value.

    Arrays compare by dtype, shape and bytes; dataclasses (such as
    :class:`policies.driver.PolicyMemory`) by *every* field, so a field added to the
    memory is part of the key without an edit here; mappings by sorted items;
    floats by their exact bits (``-0.0`` and ``0.0`` stay apart, as a policy could
    tell them apart). A type it does not know is an error, never silently left out.
    """
    if isinstance(value, np.ndarray):
        return "array", value.dtype.str, value.shape, value.tobytes()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return type(value).__qualname__, tuple((name, state_key(getattr(value, name)))
                                               for name in _field_names(type(value)))
    if isinstance(value, Mapping):
        return "mapping", tuple(sorted((state_key(k), state_key(v)) for k, v in value.items()))
    if isinstance(value, (tuple, list)):
        return type(value).__name__, tuple(state_key(item) for item in value)
    if isinstance(value, (float, np.floating)):
        return "float", float(value).hex()
    if value is None or isinstance(value, (bool, int, str, np.integer, np.bool_)):
        return type(value).__name__, value
    raise TypeError(f"state_key: cannot compare policy state of type {type(value).__name__} value for value")


def max_abs_difference(first: Mapping, second: Mapping) -> float:
    """max |first[x] - second[x]| over the union of keys (missing keys count as 0)."""
    return max(abs(first.get(key, 0.0) - second.get(key, 0.0)) for key in set(first) | set(second))


class _Enumeration:
    """Caches and the branch expansion of one exact run (draft blocks, decisions, verifications)."""

    def __init__(self, models: Sequence[TokenModels], prompts: Sequence[Prefix], policy: Policy,
                 cost: CostSource, num_draft: int, context: Callable[[Prefix], Hashable], num_tokens: int,
                 merge: bool) -> None:
        self.models, self.prompts, self.policy, self.cost = models, prompts, policy, cost
        self.num_draft, self.context, self.num_tokens, self.merge = num_draft, context, num_tokens, merge
        self.drafts: dict[tuple[int, Hashable], list[tuple[float, DraftBlock]]] = {}
        self.verifies: dict[tuple[int, Hashable, Prefix], list[Branch]] = {}
        self.grows: dict[tuple[int, Prefix, Prefix], list[tuple[float, Prefix]]] = {}
        self.decisions: dict[tuple, tuple[np.ndarray, PolicyMemory, Hashable]] = {}
        self.max_verified = 0

    def request_key(self, request: int, out: Prefix) -> Hashable:
        """What the rest of the run reads from one request's outputs: the counted ones and the model context."""
        return out[:self.num_tokens], self.context(tuple(self.prompts[request]) + out)

    def draft_options(self, request: int, prefix: Prefix) -> list[tuple[float, DraftBlock]]:
        key = (request, self.context(prefix))
        if key not in self.drafts:
            self.drafts[key] = draft_branches(self.models[request], prefix, self.num_draft)
        return self.drafts[key]

    def decide(self, ids: tuple[int, ...], confidence: np.ndarray, memory: PolicyMemory,
               memory_key: Hashable) -> tuple[np.ndarray, PolicyMemory, Hashable]:
        """Lengths [R], next memory and its key, for one joint draft outcome."""
        key = (ids, confidence.tobytes(), memory_key)
        if key not in self.decisions:
            view = memory.view(ids, confidence, cost_for(self.cost, len(ids)))
            decision = self.policy.decide(view)
            lengths = check_decision(self.policy, decision, len(ids), self.num_draft)
            after = memory.after(self.policy, ids, decision)
            self.decisions[key] = (lengths, after, state_key(after))
            self.max_verified = max(self.max_verified, int(lengths.sum()))
        return self.decisions[key]

    def verify_options(self, request: int, prefix: Prefix, block: DraftBlock, length: int) -> list[Branch]:
        verified = block.tokens[:length]
        key = (request, self.context(prefix), verified)
        if key not in self.verifies:
            rows = target_rows(self.models[request], prefix, verified)
            self.verifies[key] = verify_branches(rows, block.draft_probs, verified)
        return self.verifies[key]

    def grown_options(self, request: int, out: Prefix, prefix: Prefix, block: DraftBlock,
                      length: int) -> list[tuple[float, Prefix]]:
        """One request's outputs after verifying ``length`` draft tokens, with probabilities.

        When merging, outcomes that leave the request in the same state (same
        :meth:`request_key`) are added up here already, before the product over
        requests: the other requests' outcomes are independent of which it was.
        """
        key = (request, out, block.tokens[:length])
        if key not in self.grows:
            options = [(prob, out + tokens) for prob, tokens in self.verify_options(request, prefix, block, length)]
            if self.merge:
                merged: dict[Hashable, tuple[float, Prefix]] = {}
                for prob, grown in options:
                    state = self.request_key(request, grown)
                    held = merged.get(state)
                    merged[state] = (prob + held[0], held[1]) if held else (prob, grown)
                options = list(merged.values())
            self.grows[key] = options
        return self.grows[key]

    def step(self, ids: tuple[int, ...], outputs: Outputs, memory: PolicyMemory, memory_key: Hashable,
             prob: float) -> Iterator[tuple[Outputs, PolicyMemory, Hashable, float]]:
        """Every successor (outputs, memory, memory key, probability) of one engine step."""
        prefixes = [tuple(self.prompts[r]) + outputs[r] for r in ids]
        for combo in itertools.product(*(self.draft_options(r, pre) for r, pre in zip(ids, prefixes, strict=True))):
            confidence = np.array([block.confidence for _, block in combo]).reshape(len(ids), self.num_draft)
            lengths, next_memory, next_key = self.decide(ids, confidence, memory, memory_key)
            draft_prob = prob * math.prod([p for p, _ in combo])
            results = [self.grown_options(r, outputs[r], pre, block, int(length))
                       for r, pre, (_, block), length in zip(ids, prefixes, combo, lengths, strict=True)]
            for outcome in itertools.product(*results):
                branch_prob = draft_prob * math.prod([p for p, _ in outcome])
                if branch_prob > 0.0:
                    grown = list(outputs)
                    for r, (_, out) in zip(ids, outcome, strict=True):
                        grown[r] = out
                    yield tuple(grown), next_memory, next_key, branch_prob


def output_distribution(models: Sequence[TokenModels], prompts: Sequence[Prefix], policy: Policy,
                        cost: CostSource, gamma: int, num_tokens: int, join_steps: Sequence[int] | None = None,
                        retire: bool = False, memory: PolicyMemory | None = None,
                        context: Callable[[Prefix], Hashable] | None = None,
                        max_states: int = 200_000, merge: bool = True) -> ExactDistribution:
    """Exact joint distribution of the first ``num_tokens`` output tokens of every request.

    Arguments mean what they mean for :func:`policies.lossless.sampler.generate`
    (``memory``: the policy's state before the first step, default a fresh engine).
    Branches whose requests agree on their first ``num_tokens`` outputs and on
    their *context*, and whose policy memories are equal in every field, are
    merged (see the module docstring). The context of a prefix is the whole prefix
    unless ``context`` says what of it the three model functions read (for Markov
    models: its last token), which keeps long runs small. ``merge=False`` keeps
    every branch apart (a slow reference for the merging itself). ``max_states``
    bounds the branches held per step.
    """
    if len(models) != len(prompts) or not prompts or num_tokens < 1:
        raise ValueError(f"output_distribution: expected one model per prompt (>= 1) and num_tokens >= 1, got "
                         f"{len(models)} models, {len(prompts)} prompts, num_tokens={num_tokens}")
    if policy.needs_outcomes:
        raise ValueError(f"policy {policy.name!r} reads true outcomes; it is a bound, not a runnable policy")
    joins = tuple(join_steps) if join_steps is not None else (0,) * len(prompts)
    read = context if context is not None else (lambda prefix: prefix)
    run = _Enumeration(models, prompts, policy, cost, policy.draft_tokens(gamma), read, num_tokens, merge)

    apart = itertools.count()

    def branch_key(outputs: Outputs, memory_key: Hashable) -> Hashable:
        """Everything the rest of the run reads from a branch: counted outputs, model contexts, full memory."""
        if not merge:
            return next(apart)
        return tuple(run.request_key(r, out) for r, out in enumerate(outputs)), memory_key

    joint: dict[Outputs, float] = defaultdict(float)
    empty = tuple(() for _ in prompts)
    start = memory if memory is not None else PolicyMemory()
    start_key = state_key(start)
    # branch key -> (outputs, memory, memory key, probability); outputs of merged branches agree on what matters
    frontier: dict[Hashable, tuple[Outputs, PolicyMemory, Hashable, float]] = {
        branch_key(empty, start_key): (empty, start, start_key, 1.0)}
    step = 0
    while frontier:
        if len(frontier) > max_states:
            raise ValueError(f"output_distribution: {len(frontier)} branches at step {step} exceed "
                             f"max_states={max_states}; use a smaller vocabulary, gamma or num_tokens")
        grown: dict[Hashable, tuple[Outputs, PolicyMemory, Hashable, float]] = {}
        for outputs, branch_memory, memory_key, prob in frontier.values():
            ids = active_requests(step, [len(out) for out in outputs], joins, num_tokens, retire)
            successors = run.step(ids, outputs, branch_memory, memory_key, prob) if ids else \
                iter([(outputs, branch_memory, memory_key, prob)])
            for next_outputs, next_memory, next_key, next_prob in successors:
                if min(len(out) for out in next_outputs) >= num_tokens:
                    joint[tuple(out[:num_tokens] for out in next_outputs)] += next_prob
                    continue
                key = branch_key(next_outputs, next_key)
                held = grown.get(key)
                grown[key] = (next_outputs, next_memory, next_key, next_prob + (held[3] if held else 0.0))
        frontier = grown
        step += 1
    return ExactDistribution(dict(joint), step, len(run.decisions), run.max_verified)
