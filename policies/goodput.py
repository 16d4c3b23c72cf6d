"""A uniform-k goodput policy (SmartSpec-like): one verification length for the whole batch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from policies.base import Decision, Objective, PolicyTraits, StepView, check_objective, prefix_survival
from policies.greedy import best_prefix_count
from policies.registry import register


@register
@dataclass(frozen=True)
class Goodput(PolicyTraits):
    """One verification length k for the whole batch, chosen by expected throughput.

    SmartSpec-like: k maximises (R + sum_r a[r, k]-prefix sums) x SPS(R (1 + k))
    over a pool ``staleness_steps`` old (>= 1 keeps it lossless). Until enough
    history exists k is 0. Under a token budget k is at most ``(token_budget - R) // R``.
    """

    staleness_steps: int = 1
    objective: Objective = "tokens_x_sps"
    name: ClassVar[str] = "goodput"

    def __post_init__(self) -> None:
        check_objective("goodput", self.objective)
        if self.staleness_steps < 1:
            raise ValueError("goodput: staleness_steps must be >= 1 (0 would look at the current tokens)")

    @property
    def history_steps(self) -> int:  # type: ignore[override]
        return self.staleness_steps

    def decide(self, view: StepView) -> Decision:
        survival = prefix_survival(view.confidence)
        k = 0
        if len(view.history) >= self.staleness_steps:
            pool = view.history[-self.staleness_steps]
            num_old, gamma = pool.shape
            expected = num_old + np.concatenate(([0.0], np.cumsum(pool.sum(axis=0))))
            batch = num_old * (1 + np.arange(gamma + 1))
            top = gamma if view.draft_budget is None else min(gamma, view.draft_budget // view.num_requests)
            k = best_prefix_count(view.cost.throughput(expected[:top + 1], batch[:top + 1], self.objective))
        lengths = np.full(view.num_requests, min(k, view.gamma), dtype=np.int64)
        return Decision(lengths=lengths, pool=survival, capacity=int(lengths.sum()))
