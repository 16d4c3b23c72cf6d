"""Checks at start that every lookup a run can make lies inside a profile's tables and within its budget.

What a run can ask of a profile is known before the first simulated second
from the config: the largest step (concurrency x (1 + draft tokens), or the
token budget), the contexts the traffic can reach (from its shortest prompt to
its longest prompt + output), the query tokens a request verifies (1 + gamma)
the largest prefill chunk (the budget, in chunked mode) and the prompts a
disaggregated prefill prices (``prefill.table``). Each failure is a
``ValueError`` naming the profile file, the table and the config key to change.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.costs.profile import HardwareProfile
from simulator.costs.tables import Table1D, Table2D


@dataclass(frozen=True)
class RunDemand:
    """What a run can ask of a profile."""

    max_concurrency: int
    draft_tokens: int  # drafted per request and step
    token_budget: int | None  # None: no budget
    chunked: bool  # co-located chunked prefill
    min_context_tokens: int  # the shortest prompt
    max_context_tokens: int  # the longest prompt + output - 2: the largest KV before a step
    max_prompt_tokens: int | None = None  # the longest prefill; None: prefill.table checked at its shortest only
    decision_policy: str | None = None  # the policy whose decision the steps pay (None: none is charged)

    @property
    def max_step_tokens(self) -> int:
        decode = self.max_concurrency * (1 + self.draft_tokens)
        if self.token_budget is None:
            return decode
        return self.token_budget if self.chunked else min(decode, self.token_budget)


def _covers(table: Table2D, x_low: float, x_high: float, y_low: float, y_high: float, why: str) -> None:
    for low, high, axis, name in ((x_low, x_high, table.x, table.x_name), (y_low, y_high, table.y, table.y_name)):
        if low < axis[0] or high > axis[-1]:
            raise ValueError(f"profile {table.origin}: {table.what} covers {name} {axis[0]:g}..{axis[-1]:g}, but "
                             f"this run needs {low:g}..{high:g} ({why})")


def check_budget(demand: RunDemand, budget_key: str) -> None:
    """A budget leaves every decoding request its one token per step."""
    if demand.token_budget is not None and demand.token_budget < demand.max_concurrency:
        raise ValueError(f"the token budget ({budget_key}={demand.token_budget}) is below "
                         f"cluster.max_concurrency={demand.max_concurrency}: every decoding request needs one token "
                         "per step; raise the budget or lower the concurrency")


def check_profile_covers(profile: HardwareProfile, drafter: str, demand: RunDemand) -> None:
    """Every table lookup of the run lies inside ``profile``'s tables."""
    step = demand.max_step_tokens
    if step > profile.max_batch_tokens:
        raise ValueError(
            f"a step can hold {step} batch tokens (max_concurrency {demand.max_concurrency} x (1 + "
            f"{demand.draft_tokens} draft tokens), or the token budget) but profile {profile.path} covers only "
            f"{profile.max_batch_tokens}; lower cluster.max_concurrency or profile more")
    low, high = demand.min_context_tokens, max(demand.max_context_tokens, demand.min_context_tokens)
    why = ("the traffic's prompts and outputs; shorten them (traffic.max_prompt_tokens, max_output_tokens) "
           "or profile more")
    if profile.attention is not None:
        _covers(profile.attention, low, high, 1, 1 + demand.draft_tokens, why + ", or lower drafter.gamma")
    if demand.chunked:
        table = profile.chunk_attention if profile.chunk_attention is not None else profile.attention
        if table is not None:
            _covers(table, 0, high, 1, demand.token_budget or 1,
                    "prefill chunks up to the token budget over the traffic's contexts")
    if not demand.chunked and profile.prefill_table is not None:
        axis = profile.prefill_table.x
        top = demand.max_prompt_tokens if demand.max_prompt_tokens is not None else demand.min_context_tokens
        if demand.min_context_tokens < axis[0] or top > axis[-1]:
            raise ValueError(f"profile {profile.path}: prefill.table.prompt_tokens covers {axis[0]:g}..{axis[-1]:g}, "
                             f"but this run prefills prompts of {demand.min_context_tokens}..{top} tokens (the "
                             "traffic's prompts; shorten them with traffic.max_prompt_tokens or profile more)")
    decision = profile.scheduler_by_policy.get(demand.decision_policy or "")
    if demand.draft_tokens and isinstance(decision, Table1D):
        low_c, high_c = demand.draft_tokens, demand.max_concurrency * demand.draft_tokens
        if low_c < decision.x[0] or high_c > decision.x[-1]:
            raise ValueError(f"profile {profile.path}: scheduler.policies.{demand.decision_policy}.num_candidates "
                             f"covers {decision.x[0]:g}..{decision.x[-1]:g}, but this run decides over "
                             f"{low_c}..{high_c} (1..max_concurrency requests x {demand.draft_tokens} draft tokens); "
                             "lower cluster.max_concurrency or drafter.gamma, or profile more")
    if demand.draft_tokens and profile.draft_uses_context(drafter):
        axis = profile.draft[drafter].context_tokens
        assert axis is not None
        if low < axis[0] or high > axis[-1]:
            raise ValueError(f"profile {profile.path}: draft.{drafter}.context_tokens covers "
                             f"{axis[0]:g}..{axis[-1]:g}, but this run needs {low:g}..{high:g} ({why})")
