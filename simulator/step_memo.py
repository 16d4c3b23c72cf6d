"""What an engine remembers from step to step, to skip work whose result it already knows.

* :class:`StepCostMemo` - the target's time of a step. Without an attention
  table and without prefill chunks it depends on R, the batch tokens and (when
  the profile charges query padding) the longest verification only.
* :class:`NoDraftDecisions` - a policy's decision in steps without draft
  tokens. When the policy keeps nothing between steps (no history, no EMA rows,
  no outcomes, no online estimator) and prices with one cost curve per R, its
  view holds nothing but R, and its decision, a pure function of the view, is
  the same for the same R.
* :func:`repeat_without_drafts` - such steps, priced by R alone, repeat
  exactly until a request finishes or something else happens: recorded in a
  tight loop.
"""

from __future__ import annotations

import numpy as np

from policies import CostCurve, Decision, Policy, PolicyMemory, check_decision
from simulator.batch import StepLog
from simulator.costs.step_cost import StepPricer, VerifyCost
from simulator.decode_step import DecodeStep

MAX_ENTRIES = 1 << 16  # step costs kept before the memo starts afresh


class StepCostMemo:
    """T_verify of an engine's steps (:meth:`StepPricer.verify`), remembered where nothing but the batch's shape
    enters it."""

    def __init__(self, pricer: StepPricer, detailed: bool) -> None:
        self.pricer, self.detailed = pricer, detailed
        self._enabled = not pricer.attention
        self._pads = pricer.profile.padded_slot_s != 0.0  # otherwise the longest verification does not matter
        self._costs: dict[tuple[int, int, int], VerifyCost] = {}

    def verify(self, plan: DecodeStep, chunk_context_tokens: np.ndarray) -> VerifyCost:
        if not self._enabled or (plan.chunks.size and plan.chunks.any()):
            return self.pricer.verify(plan.lengths, plan.decode_tokens, plan.context_tokens, chunk_context_tokens,
                                      plan.chunks, self.detailed)
        longest = 0
        if self._pads and plan.num_requests:
            longest = plan.longest if plan.longest >= 0 else int(plan.lengths.max())
        key = (plan.num_requests, plan.decode_tokens, longest)
        cost = self._costs.get(key)
        if cost is None:
            if len(self._costs) >= MAX_ENTRIES:
                self._costs.clear()
            cost = self._costs[key] = self.pricer.verify(plan.lengths, plan.decode_tokens, plan.context_tokens,
                                                         chunk_context_tokens, plan.chunks, self.detailed)
        return cost


class NoDraftDecisions:
    """Decisions of steps without draft tokens, by R (see the module docstring for when they may be kept)."""

    def __init__(self, policy: Policy, token_budget: int | None) -> None:
        self.policy, self.token_budget = policy, token_budget
        self._by_requests: dict[int, tuple[CostCurve, tuple[Decision, np.ndarray, np.ndarray]]] = {}

    @staticmethod
    def apply_to(policy: Policy, draft_tokens: int, online_estimate: bool, pricer: StepPricer) -> bool:
        return (draft_tokens == 0 and not online_estimate and not policy.needs_outcomes
                and policy.history_steps == 0 and not pricer.curve_needs_context)

    def decide(self, memory: PolicyMemory, request_ids: np.ndarray, cost: CostCurve
               ) -> tuple[Decision, np.ndarray, np.ndarray]:
        """The decision, its checked lengths [R] and the (zero) accepted counts [R]; nothing is sampled, as no
        draft token exists."""
        num_requests = request_ids.size
        known = self._by_requests.get(num_requests)
        if known is not None and known[0] is cost:
            return known[1]
        signal, accepted = np.zeros((num_requests, 0)), np.zeros(num_requests, dtype=np.int64)
        decision = self.policy.decide(memory.view(request_ids, signal, cost, None, token_budget=self.token_budget))
        result = (decision, check_decision(self.policy, decision, num_requests, 0, self.token_budget), accepted)
        if decision.smoothed is None and not memory.smoothed:  # EMA rows would change the next view
            self._by_requests[num_requests] = (cost, result)
        return result


def repeat_without_drafts(plan: DecodeStep, log: StepLog, engine_id: int, token_budget: int | None,
                          before_s: float, at_most_s: float, max_steps: int) -> list[float]:
    """Record ``plan``, a step without draft tokens, and the identical steps that follow it (same requests, same
    decision, same duration, each starting where the last ended) while each ends before ``before_s`` and at most at
    ``at_most_s``, at most ``max_steps`` of them -> their end times. ``plan.start_at`` is left at the last start."""
    ends: list[float] = []
    start_at, duration_s, num_requests = plan.start_at, plan.duration_s, plan.num_requests
    while len(ends) < max_steps:
        end_at = start_at + duration_s
        if not (end_at < before_s and end_at <= at_most_s):
            break
        plan.start_at = start_at
        log.record(engine_id, plan, end_at, num_requests, 0, token_budget)
        ends.append(end_at)
        start_at = end_at
    return ends
