"""Real speculative decoding with the torch models: draft -> policy -> verify -> rejection sampling -> bonus.

One :meth:`SpeculativeDecoder.step` runs an engine step for every active request:

1. the drafter proposes ``policy.draft_tokens(gamma)`` tokens per request from its
   anchor (the last emitted token, not yet in the verifier's cache);
2. the policy decides the verification lengths ``l_r`` from the confidences
   (drafters without a confidence head report 1.0 everywhere);
3. the verifier runs ONE flattened forward over ``[anchor, x_1..x_l]`` of every
   request (variable lengths, different contexts);
4. token-level verification (:func:`policies.lossless.sampler.verify_block`: accept with
   ``min(1, p/q)``, residual at the first rejection, bonus otherwise) emits
   ``accepted + 1`` tokens per request;
5. the caches keep the anchor and the accepted tokens; the drafter receives their
   target features; the last emitted token becomes the next anchor.

A policy that drafts nothing (``none``) runs no drafter at all, as an engine
without speculation does: its drafter is an :class:`IdleDrafter`, which keeps no
context (building it cost 20% of a step on the tiny CPU models).

Acceptance randomness comes from an injected ``np.random.Generator``, draft sampling
from an injected ``torch.Generator``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import torch

from calibration.models.drafters import Drafter, softmax_t
from calibration.models.model import Verifier, VerifierOutput
from policies.base import CostCurve, Decision, Policy
from policies.driver import CostSource, PolicyMemory, check_decision, cost_for
from policies.lossless.sampler import sample_token, verify_block

# A cost curve that prices every batch alike: for runs where the policy's pricing does not matter (static
# policies, probes). 100 steps/s over any batch size.
FLAT_COST = CostCurve(batch_tokens=np.array([1, 1_000_000]), steps_per_s=np.array([100.0, 100.0]))


@dataclass(frozen=True)
class PrefillChunk:
    """Prompt tokens computed in a step after the decoding requests' tokens (co-located chunked prefill): ``tokens``
    go to cache slot ``slot`` after what it holds; ``last``: they complete the prompt, so the step samples the
    request's first output token from the last row."""

    slot: int
    tokens: tuple[int, ...]
    last: bool


ChunkFill = Callable[[int], Sequence[PrefillChunk]]  # decode tokens of the step -> the chunks that fill the budget


@dataclass(frozen=True)
class StepRecord:
    """One step's outcome; the last three fields feed :mod:`simulator.acceptance.logs`."""

    decision: Decision
    lengths: np.ndarray  # [R] verified draft tokens
    accepted: np.ndarray  # [R] accepted draft tokens
    emitted: tuple[tuple[int, ...], ...]  # per request: accepted tokens + correction/bonus
    confidence: np.ndarray | None = None  # [R, g] confidence head output c_k; None without a head
    draft_prob: np.ndarray | None = None  # [R, g] q_k(x_k), the drafter's probability of its own token
    analytic_acceptance: np.ndarray | None = None  # [R, g] sum_v min(p, q_k) = 1 - TV; NaN where not verified
    first_tokens: tuple[int | None, ...] = ()  # per prefill chunk: the first output token when the chunk completes


def _as_numpy_rows(probs: torch.Tensor) -> np.ndarray:
    rows = probs.double().cpu().numpy()
    return rows / rows.sum(axis=-1, keepdims=True)


@dataclass(frozen=True)
class ContextCost:
    """What a policy prices a step with when that depends on the requests' contexts, as the simulator's engine prices
    it: ``curve(R, context_tokens [R])``, the KV tokens each request holds before the step (for example
    ``HardwareProfile.step_cost_curve`` of a profile with an attention table)."""

    curve: Callable[[int, np.ndarray], CostCurve]


class IdleDrafter:
    """The drafter of a policy that drafts nothing: it keeps no context, so a step without speculation costs what
    an engine without a drafter pays; asked to propose, it refuses."""

    kind = "none"

    def features_of(self, out: VerifierOutput) -> torch.Tensor:
        return out.hidden  # read by nobody: its context writes are no-ops

    def new_cache(self, num_slots: int, max_tokens: int) -> None:
        pass

    def extend_context(self, slots: object, features: torch.Tensor, counts: object) -> None:
        pass

    def staged_context(self, features: torch.Tensor) -> None:
        return None

    def slot_context(self, slot: int) -> None:
        return None

    def load_slot(self, slot: int, context: object) -> None:
        pass

    def move_slot(self, src: int, dst: int) -> None:
        pass

    def clear_slots(self, slots: object) -> None:
        pass

    def propose(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError("a policy that drafts nothing has no drafter to propose")


def working_drafter(drafter: Drafter, policy: Policy, gamma: int) -> Drafter | IdleDrafter:
    """``drafter``, or the idle one when ``policy`` drafts no token."""
    return drafter if policy.draft_tokens(gamma) > 0 else IdleDrafter()


PREFILL_ELEMENTS = 1 << 24  # most (requests x query rows x keys) one prefill forward pads its attention to


def prefill_groups(counts: Sequence[int], limit: int = PREFILL_ELEMENTS) -> list[list[int]]:
    """Consecutive requests prefilled together: a forward pads every request's queries and keys to the longest
    (``R x n_max x n_max`` attention entries), so long prompts go in smaller groups; short ones stay in one forward
    (one group keeps the numbers of a single batched forward)."""
    groups: list[list[int]] = []
    longest = 0
    for r, n in enumerate(counts):
        if groups and (len(groups[-1]) + 1) * max(longest, n) ** 2 <= limit:
            groups[-1].append(r)
            longest = max(longest, n)
        else:
            groups.append([r])
            longest = n
    return groups


class SpeculativeDecoder:
    """A batch of requests decoded speculatively by ``verifier`` + ``drafter`` under ``policy``.

    Request r lives in cache slot r. ``cost`` gives the policy its SPS curve (a
    :class:`policies.base.CostCurve`, a function of the number of requests, e.g.
    ``HardwareProfile.cost_curve``, or a :class:`ContextCost` of the requests' contexts).
    """

    def __init__(self, verifier: Verifier, drafter: Drafter, policy: Policy, cost: CostSource | ContextCost,
                 gamma: int, temperature: float = 1.0) -> None:
        if policy.needs_outcomes:
            raise ValueError(f"policy {policy.name!r} reads true outcomes; it cannot drive a real decoder")
        if gamma < 1:
            raise ValueError(f"gamma must be >= 1, got {gamma}")
        self.verifier, self.policy, self.cost = verifier, policy, cost
        self.drafter = working_drafter(drafter, policy, gamma)
        self.gamma, self.temperature = gamma, temperature
        self.memory = PolicyMemory()
        self.outputs: list[list[int]] = []
        self.anchors: torch.Tensor | None = None
        self.token_budget: int | None = None  # the most batch tokens a step holds (the policy sees it), or none

    @property
    def num_requests(self) -> int:
        return len(self.outputs)

    @torch.inference_mode()
    def start(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> None:
        """Prefill every prompt but its last token (which becomes the first anchor).

        The caches hold ``max_new_tokens`` steps of every request (each step stores at
        most gamma + 1 tokens), so any request can run until all have that many tokens.
        """
        if not prompts or min(len(p) for p in prompts) < 2:
            raise ValueError("need >= 1 prompt, each of >= 2 tokens (the last one is the first anchor)")
        device = self.verifier.embed.weight.device
        self.attach(len(prompts), max(len(p) for p in prompts) + max_new_tokens * (self.gamma + 1))
        counts = [len(p) - 1 for p in prompts]
        for slots in prefill_groups(counts):
            group = [counts[r] for r in slots]
            tokens = torch.tensor([t for r in slots for t in prompts[r][:-1]], device=device)
            out = self.verifier(tokens, self.cache.batch(slots, group), self.cache)
            self.cache.commit(slots, group)
            self.drafter.extend_context(slots, self.drafter.features_of(out), group)
        self.anchors = torch.tensor([p[-1] for p in prompts], device=device)
        self.outputs = [[] for _ in prompts]

    # A live batch (continuous batching, calibration.serving.batch.LiveBatch) drives the decoder through these three:
    # attach once, then admit requests whose KV rows it wrote into the next slot, and reorder when some leave.

    def attach(self, num_slots: int, max_tokens: int) -> None:
        """Empty caches of ``num_slots`` slots of ``max_tokens`` tokens (verifier and drafter) and no request in them:
        requests come in by :meth:`admit`."""
        self.cache = self.verifier.new_cache(num_slots, max_tokens)
        self.drafter.new_cache(num_slots, max_tokens)
        self.anchors = torch.empty(0, dtype=torch.long, device=self.verifier.embed.weight.device)
        self.outputs = []
        self.memory = PolicyMemory()

    def admit(self, first_token: int) -> int:
        """A request in the next slot (R), whose prompt's KV rows are already in both caches there and whose first
        output token (prefill's) is ``first_token``, the next step's anchor; returns the slot."""
        assert self.anchors is not None, "attach(num_slots, max_tokens) first"
        self.anchors = torch.cat((self.anchors, torch.tensor([first_token], device=self.anchors.device)))
        self.outputs.append([first_token])
        return len(self.outputs) - 1

    def reorder(self, order: Sequence[int]) -> None:
        """Keep the requests of the old slots ``order``, new slot i holding old slot ``order[i]``: their anchors,
        outputs and the policy's per-request memory move along; the caches' rows are the caller's to move."""
        assert self.anchors is not None, "attach(num_slots, max_tokens) first"
        self.anchors = self.anchors[torch.as_tensor(order, dtype=torch.long, device=self.anchors.device)]
        self.outputs = [self.outputs[s] for s in order]
        smoothed = {new: self.memory.smoothed[old] for new, old in enumerate(order) if old in self.memory.smoothed}
        self.memory = PolicyMemory(self.memory.pools, MappingProxyType(smoothed))

    @torch.inference_mode()
    def step(self, rng: np.random.Generator, generator: torch.Generator,
             max_kept_tokens: int | None = None, fill: ChunkFill | None = None) -> StepRecord:
        """One engine step of every request.

        ``max_kept_tokens``: keep only the first n of each request's emitted tokens
        and discard the rest (the record still reports the whole verification). Any
        prefix of a speculative step's output is distributed as the target's, so this
        stays lossless; with n = 1 every output position gets a verified block of its
        own (what an acceptance log replayed in order needs).

        ``fill``: called with the step's decode tokens once the policy has decided, returns prefill chunks computed
        in the same step (co-located chunked prefill), in the same verifier forward as the decoding requests' tokens
        (as vLLM runs a mixed batch): the dense layers run once over all of them, and attention runs per group - the
        decoding requests padded to each other, each chunk on its own (padding a 512-token chunk and the decoding
        requests to each other would cost what no varlen kernel spends).
        """
        if self.anchors is None:
            raise RuntimeError("call start(prompts, max_new_tokens) first")
        if max_kept_tokens is not None and max_kept_tokens < 1:
            raise ValueError(f"max_kept_tokens must be >= 1 or None, got {max_kept_tokens}")
        num_requests, device = self.num_requests, self.anchors.device
        slots = torch.arange(num_requests)
        num_draft = self.policy.draft_tokens(self.gamma)
        draft, draft_tokens, q_rows, confidence = self._draft(slots, num_draft, generator)
        ids = tuple(range(num_requests))
        decision = self.policy.decide(self.memory.view(ids, confidence, self._curve(num_requests),
                                                       token_budget=self.token_budget))
        lengths = check_decision(self.policy, decision, num_requests, num_draft, self.token_budget)

        anchors = self.anchors.cpu().numpy()
        flat = np.concatenate([np.concatenate(([anchors[r]], draft_tokens[r, :lengths[r]])) for r in ids])
        query_lens = (1 + lengths).tolist()
        chunks = list(fill(int(sum(query_lens)))) if fill is not None else []
        out = self._forward(slots.tolist(), query_lens, flat, chunks)
        decoded = int(sum(query_lens))  # the chunks' rows follow the decoding requests'
        p_rows = _as_numpy_rows(softmax_t(out.logits[:decoded], self.temperature))  # [T, V]

        starts = np.cumsum([0, *query_lens[:-1]])
        accepted, emitted = np.zeros(num_requests, dtype=np.int64), []
        analytic = np.full((num_requests, num_draft), np.nan)
        for r in ids:
            rows = p_rows[starts[r]:starts[r] + query_lens[r]]
            q = q_rows[r] if q_rows is not None else np.zeros((0, rows.shape[1]))
            analytic[r, :lengths[r]] = np.minimum(rows[:lengths[r]], q[:lengths[r]]).sum(axis=-1)
            outcome = verify_block(rows, q, [int(t) for t in draft_tokens[r, :lengths[r]]], rng)
            accepted[r] = outcome.num_accepted
            emitted.append(outcome.tokens[:max_kept_tokens])
            self.outputs[r].extend(emitted[-1])

        # The cache keeps the anchor and the kept accepted draft tokens; the last kept token is the next anchor.
        kept = [len(e) for e in emitted]
        keep_rows = torch.as_tensor(np.concatenate([starts[r] + np.arange(kept[r]) for r in ids]), device=device)
        self.cache.commit(slots, kept)
        self.drafter.extend_context(slots, self.drafter.features_of(out)[keep_rows], kept)
        self.anchors = torch.tensor([e[-1] for e in emitted], device=device)
        self.memory = self.memory.after(self.policy, ids, decision)
        first_tokens = self._commit_chunks(out, decoded, chunks, rng) if chunks else ()
        draft_prob = (np.take_along_axis(q_rows, draft_tokens[..., None], axis=-1)[..., 0] if q_rows is not None
                      else np.zeros((num_requests, 0)))
        head = None if num_draft > 0 and draft.confidence is None else confidence
        return StepRecord(decision, lengths, accepted, tuple(emitted), head, draft_prob, analytic, first_tokens)

    def _draft(self, slots: torch.Tensor, num_draft: int, generator: torch.Generator) -> tuple:
        """(draft output, tokens [R, g], proposal rows [R, g, V] or None, confidences [R, g])."""
        num_requests = slots.numel()
        if num_draft == 0:
            return None, np.zeros((num_requests, 0), dtype=np.int64), None, np.zeros((num_requests, 0))
        draft = self.drafter.propose(self.anchors, slots, num_draft, generator, self.temperature)
        confidence = (np.ones((num_requests, num_draft)) if draft.confidence is None
                      else draft.confidence.double().cpu().numpy())
        return draft, draft.tokens.cpu().numpy(), _as_numpy_rows(draft.probs), confidence

    def _curve(self, num_requests: int) -> CostCurve:
        # Building the real curve costs 0.1-0.3 ms of host time a step, which no engine running a static rule
        # spends (nor do the loop probe's static steps): a policy that never reads it gets the flat one.
        if not self.policy.reads_cost:
            return FLAT_COST
        if isinstance(self.cost, ContextCost):
            return self.cost.curve(num_requests, self.cache.lengths[:num_requests].numpy().copy())
        return cost_for(self.cost, num_requests)

    def _forward(self, slots: list[int], query_lens: list[int], tokens: np.ndarray,
                 chunks: Sequence[PrefillChunk]) -> VerifierOutput:
        """One flattened verifier forward: the decoding requests' tokens, then every chunk's; attention in groups
        (the decoding requests together, each chunk alone)."""
        device = self.verifier.embed.weight.device
        all_slots = slots + [c.slot for c in chunks]
        lens = query_lens + [len(c.tokens) for c in chunks]
        groups = ([len(slots)] if slots else []) + [1] * len(chunks)
        flat = np.concatenate([np.asarray(tokens, dtype=np.int64), *(np.asarray(c.tokens, dtype=np.int64)
                                                                     for c in chunks)])
        return self.verifier(torch.as_tensor(flat, device=device), self.cache.batch(all_slots, lens, groups),
                             self.cache)

    def _commit_chunks(self, out: VerifierOutput, offset: int, chunks: Sequence[PrefillChunk],
                       rng: np.random.Generator) -> tuple[int | None, ...]:
        """Keep the chunks' KV (verifier and drafter) and sample the first token of each completed prompt."""
        firsts: list[int | None] = []
        features = self.drafter.features_of(out)
        for chunk in chunks:
            n = len(chunk.tokens)
            self.cache.commit([chunk.slot], [n])
            self.drafter.extend_context([chunk.slot], features[offset:offset + n], [n])
            first = None
            if chunk.last:
                probs = softmax_t(out.logits[offset + n - 1], self.temperature).double().cpu().numpy()
                first = sample_token(probs / probs.sum(), rng)
            firsts.append(first)
            offset += n
        return tuple(firsts)

    @torch.inference_mode()
    def prefill_chunks(self, chunks: Sequence[PrefillChunk], rng: np.random.Generator) -> tuple[int | None, ...]:
        """A step of prefill chunks only (no request decoding): one forward over them; the first tokens of the
        prompts they complete (None for the others)."""
        if not chunks:
            raise ValueError("prefill_chunks needs at least one chunk")
        out = self._forward([], [], np.zeros(0, dtype=np.int64), chunks)
        return self._commit_chunks(out, 0, chunks, rng)

    def generate(self, prompts: Sequence[Sequence[int]], num_tokens: int, rng: np.random.Generator,
                 generator: torch.Generator) -> list[list[int]]:
        """Decode until every request has ``num_tokens`` output tokens; return the first ``num_tokens`` of each."""
        self.start(prompts, num_tokens)
        while min(len(o) for o in self.outputs) < num_tokens:
            self.step(rng, generator)
        return [o[:num_tokens] for o in self.outputs]
