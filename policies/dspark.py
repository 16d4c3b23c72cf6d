"""The production DSpark scheduler (paper section 5.2).

It sizes the step from an *older* candidate pool: the capacity is fixed before
the current draft tokens exist, so a full search (no early stop) is safe there.
The live ranking of the current candidates keeps each request's admitted set a
prefix because survivals are non-increasing along a request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from policies.base import (
    Decision,
    Objective,
    PolicyTraits,
    StepView,
    check_objective,
    survival_by_position,
    top_k_lengths,
)
from policies.greedy import search_capacity
from policies.registry import register


def smooth_confidence(confidence: np.ndarray, previous: np.ndarray | None, decay: float) -> np.ndarray:
    """EMA over steps: decay * previous + (1 - decay) * current; new requests start at current."""
    if previous is None:
        return confidence
    blended = decay * previous + (1.0 - decay) * confidence
    return np.where(np.isnan(previous), confidence, blended)


@register
@dataclass(frozen=True)
class DSpark(PolicyTraits):
    """Asynchronous top-K scheduler with capacity from a stale pool.

    ``staleness_steps``: how old the pool that sizes the capacity K is (2 in the
    paper's zero-overhead pipeline, 1 in vLLM's adaptive verification). 0 sizes
    K by a full search over the current pool, which is ``global_sync`` again and
    LOSSY; it exists only so users can measure what it would gain.
    ``ema_decay``: smooth confidences over steps before ranking (None = off).
    Until enough history exists (an engine's first steps) K is 0. The search
    prices the old pool with the current step's cost curve: K sizes this step.
    Under a token budget K is at most ``token_budget - R`` (the search stops
    there); the budget is known before the draft tokens, so this stays lossless.
    """

    staleness_steps: int = 2
    objective: Objective = "tokens_x_sps"
    ema_decay: float | None = None
    name: ClassVar[str] = "dspark"

    def __post_init__(self) -> None:
        check_objective("dspark", self.objective)
        if self.staleness_steps not in (0, 1, 2):
            raise ValueError(f"dspark: staleness_steps must be 0, 1 or 2, got {self.staleness_steps}")
        if self.ema_decay is not None and not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"dspark: ema_decay must lie in [0, 1) or be null, got {self.ema_decay}")

    @property
    def lossless(self) -> bool:  # type: ignore[override]
        return self.staleness_steps > 0

    @property
    def history_steps(self) -> int:  # type: ignore[override]
        return self.staleness_steps

    def decide(self, view: StepView) -> Decision:
        smoothed = None
        confidence = view.confidence
        if self.ema_decay is not None:
            smoothed = smooth_confidence(confidence, view.smoothed, self.ema_decay)
            confidence = smoothed
        survival = survival_by_position(confidence).T  # [R, gamma], position-major in memory
        if self.staleness_steps == 0:
            capacity = search_capacity(survival, view.cost, self.objective, view.draft_budget)
        elif len(view.history) >= self.staleness_steps:
            capacity = search_capacity(view.history[-self.staleness_steps], view.cost, self.objective,
                                       view.draft_budget)
        else:
            capacity = 0
        return Decision(lengths=top_k_lengths(survival, capacity), pool=survival, capacity=capacity,
                        smoothed=smoothed)
