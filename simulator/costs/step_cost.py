"""What one engine step costs, and what its policy prices it with (see :mod:`simulator.costs.profile`).

:class:`StepPricer` serves one engine: the drafter's and the scheduler's time
and the policy's cost curve before the decision, then the target's time once
the step's tokens are known. What depends on the number of requests R only is
cached per R (version-1 profiles: everything a policy sees); what depends on
the requests' contexts is computed per step, vectorised over the requests.

:func:`decision_s` and :func:`target_cost` (the target's forward once the
decode attention is known) are the arithmetic every pricer of a step uses:
the engine's :class:`StepPricer`, and ``calibration.profiling.step_prices``
for the real loop's logged steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from policies import CostCurve, Policy
from simulator.costs.profile import HardwareProfile


@dataclass(frozen=True)
class VerifyCost:
    """The target's time of one step and the parts that explain it (seconds)."""

    verify_s: float  # everything below plus query padding, per-request overhead and host work per decode token
    dense_s: float  # dense part over all batch tokens, CUDA-graph cliff included
    attention_s: float  # decode attention plus prefill-chunk attention
    eager: bool  # the step ran above the largest captured CUDA graph


def decision_s(profile: HardwareProfile, policy: str, synchronous: bool, num_requests: int,
               draft_tokens: int) -> float:
    """Seconds of ``policy``'s decision over ``num_requests`` x ``draft_tokens`` candidates, when it is on the
    step's critical path (synchronous, or the profile's scheduler inline), else 0."""
    charged = draft_tokens and profile.charges_decision(synchronous)
    return profile.scheduler_s(num_requests * draft_tokens, policy) if charged else 0.0


def target_cost(profile: HardwareProfile, num_requests: int, decode_tokens: int, longest_verified_tokens: int,
                decode_attention_s: float, chunk_context_tokens: np.ndarray, chunk_tokens: np.ndarray,
                detailed: bool = False, drafting: bool = True) -> VerifyCost:
    """The target's time of a step of ``num_requests`` decoding requests with ``decode_tokens`` = sum_r 1 + l_r
    (the longest l_r ``longest_verified_tokens``, for query padding) whose attention is ``decode_attention_s``,
    and prefill chunks of ``chunk_tokens`` [P] (zeros: no chunk) over ``chunk_context_tokens`` [P] computed prompt
    tokens: dense part over all batch tokens, padding, per-request work of R + chunks, ``decode_token_s`` on the
    decode tokens alone, decode and chunk attention, and ``prefill.mixed_step`` when chunks share the step with
    decoding requests. ``detailed`` also fills the dense part (otherwise 0); ``drafting`` false (a policy that drafts
    nothing): the chunks' attention leaves out the drafter's context build over them."""
    num_chunks = int(np.count_nonzero(chunk_tokens)) if chunk_tokens.size else 0
    batch_tokens = decode_tokens + (int(chunk_tokens.sum()) if num_chunks else 0)
    padded_slots = num_requests * (1 + longest_verified_tokens) - decode_tokens if num_requests else 0
    verify_s = profile.verify_s(num_requests + num_chunks, batch_tokens, padded_slots, decode_tokens,
                                max(decode_tokens - num_requests, 0))
    attention_s = decode_attention_s
    if num_chunks:
        has = chunk_tokens > 0
        attention_s += profile.chunk_attention_s(chunk_context_tokens[has], chunk_tokens[has], drafting)
        if num_requests:
            verify_s += profile.mixed_step_s(num_requests)
    if attention_s:
        verify_s += attention_s
    dense_s = profile.dense_s(batch_tokens) if detailed else 0.0
    return VerifyCost(verify_s, dense_s, attention_s, profile.is_eager(batch_tokens))


class StepPricer:
    """Prices the steps of one engine; ``profile`` keeps time, ``policy_profile`` is what the policy believes."""

    def __init__(self, profile: HardwareProfile, policy_profile: HardwareProfile, policy: Policy, drafter: str,
                 draft_tokens: int) -> None:
        self.profile, self.policy_profile, self.policy = profile, policy_profile, policy
        self.drafter, self.draft_tokens = drafter, draft_tokens
        self.draft_needs_context = profile.draft_uses_context(drafter)
        self.curve_needs_context = policy_profile.uses_context(drafter)
        self.attention = profile.attention is not None
        self.needs_context = profile.uses_context(drafter) or self.curve_needs_context
        self._by_requests: dict[int, tuple[float, float, CostCurve]] = {}  # R -> (draft_s, sched_s, curve)
        # The current step's attention rows [R, 1 + g] and the contexts they are for (see verify).
        self._rows: np.ndarray | None = None
        self._rows_context: np.ndarray | None = None

    def _cached(self, num_requests: int) -> tuple[float, float, CostCurve]:
        cached = self._by_requests.get(num_requests)
        if cached is None:
            g, profile = self.draft_tokens, self.profile
            draft_s = 0.0 if self.draft_needs_context else profile.draft_s(self.drafter, num_requests, g)
            sched_s = decision_s(profile, self.policy.name, self.policy.synchronous, num_requests, g)
            curve = None if self.curve_needs_context else self.policy_profile.step_cost_curve(
                self.drafter, num_requests, g)
            cached = (draft_s, sched_s, curve)  # type: ignore[assignment]
            self._by_requests[num_requests] = cached
        return cached

    def before_decision(self, num_requests: int, context_tokens: np.ndarray | None) -> tuple[float, float, CostCurve]:
        """Draft time, scheduler time and the policy's cost curve of a step with these requests (``context_tokens``
        [R], needed when :attr:`needs_context`)."""
        draft_s, sched_s, curve = self._cached(num_requests)
        if self.draft_needs_context:
            draft_s = self.profile.draft_s(self.drafter, num_requests, self.draft_tokens,
                                           self.profile.draft_context(self.drafter, context_tokens))
        rows = None
        if self.attention:
            rows = self.profile.attention_rows(context_tokens, 1 + self.draft_tokens)  # type: ignore[arg-type]
            self._rows, self._rows_context = rows, context_tokens
        if self.curve_needs_context:
            same = self.policy_profile is self.profile
            curve = self.policy_profile.step_cost_curve(self.drafter, num_requests, self.draft_tokens,
                                                        context_tokens, rows if same else None)
        return draft_s, sched_s, curve

    def _decode_attention_s(self, context_tokens: np.ndarray, lengths: np.ndarray) -> float:
        """sum_r attention(c_r, 1 + l_r), from the rows priced before the decision when they are these requests'
        (the oldest ``R`` of them when the newest were preempted)."""
        rows, seen = self._rows, self._rows_context
        if rows is not None and seen is not None and (context_tokens is seen or context_tokens.base is seen):
            return float(rows[np.arange(lengths.size), lengths].sum())
        return self.profile.attention_s(context_tokens, 1 + lengths)

    def verify(self, lengths: np.ndarray, decode_tokens: int, context_tokens: np.ndarray | None,
               chunk_context_tokens: np.ndarray, chunk_tokens: np.ndarray, detailed: bool) -> VerifyCost:
        """The target's time of a step (:func:`target_cost`): ``lengths`` [R] verified draft tokens
        (``decode_tokens`` = sum_r 1 + l_r) over ``context_tokens`` [R], and prefill chunks of ``chunk_tokens`` [P]
        over ``chunk_context_tokens`` [P] computed prompt tokens. ``detailed`` also fills the dense part (otherwise
        0) for the step log."""
        num_requests = lengths.size
        attention_s = 0.0
        if self.attention and num_requests:
            attention_s = self._decode_attention_s(context_tokens, lengths)  # type: ignore[arg-type]
        return target_cost(self.profile, num_requests, decode_tokens, int(lengths.max()) if num_requests else 0,
                           attention_s, chunk_context_tokens, chunk_tokens, detailed, self.draft_tokens > 0)
