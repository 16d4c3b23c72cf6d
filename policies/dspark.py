"""The production DSpark scheduler (paper section 5.2) and a uniform-k goodput policy.

Both size the step from an *older* candidate pool: the capacity is fixed before
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
    path_throughput,
    prefix_survival,
    top_k_lengths,
)
from policies.greedy import best_prefix_count, search_capacity


def smooth_confidence(confidence: np.ndarray, previous: np.ndarray | None, decay: float) -> np.ndarray:
    """EMA over steps: decay * previous + (1 - decay) * current; new requests start at current."""
    if previous is None:
        return confidence
    blended = decay * previous + (1.0 - decay) * confidence
    return np.where(np.isnan(previous), confidence, blended)


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
    """

    staleness_steps: int = 2
    objective: Objective = "tokens_x_sps"
    ema_decay: float | None = None
    name: ClassVar[str] = "dspark"

    def __post_init__(self) -> None:
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
        survival = prefix_survival(confidence)
        if self.staleness_steps == 0:
            capacity = search_capacity(survival, view.cost, self.objective)
        elif len(view.history) >= self.staleness_steps:
            capacity = search_capacity(view.history[-self.staleness_steps], view.cost, self.objective)
        else:
            capacity = 0
        return Decision(lengths=top_k_lengths(survival, capacity), pool=survival, capacity=capacity,
                        smoothed=smoothed)


@dataclass(frozen=True)
class Goodput(PolicyTraits):
    """One verification length k for the whole batch, chosen by expected throughput.

    SmartSpec-like: k maximises (R + sum_r a[r, k]-prefix sums) x SPS(R (1 + k))
    over a pool ``staleness_steps`` old (>= 1 keeps it lossless). Until enough
    history exists k is 0.
    """

    staleness_steps: int = 1
    objective: Objective = "tokens_x_sps"
    name: ClassVar[str] = "goodput"

    def __post_init__(self) -> None:
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
            k = best_prefix_count(view.cost.throughput(expected, batch, self.objective))
        lengths = np.full(view.num_requests, min(k, view.gamma), dtype=np.int64)
        return Decision(lengths=lengths, pool=survival, capacity=int(lengths.sum()))


@dataclass(frozen=True)
class Oracle(PolicyTraits):
    """Upper bound that knows how many draft tokens each request would get accepted.

    It only ever verifies tokens that will be accepted (no waste) and picks how
    many of them by a full search of Theta, admitting shallow positions first so
    that every request advances. Not a real policy: it reads the outcome.
    """

    name: ClassVar[str] = "oracle"
    needs_outcomes: ClassVar[bool] = True

    def decide(self, view: StepView) -> Decision:
        if view.accepted is None:
            raise ValueError("oracle: the engine must pass the true accepted lengths")
        survival = prefix_survival(view.confidence)
        gamma = view.gamma
        positions = np.arange(1, gamma + 1)
        good = positions[None, :] <= view.accepted[:, None]  # [R, gamma]
        theta = path_throughput(view.cost, view.num_requests, np.ones(int(good.sum())), "tokens_x_sps")
        count = best_prefix_count(theta)
        # Survival 1 for the tokens that will be accepted, 0 otherwise: the top-count
        # entries go position-major (all first tokens, then all second tokens, ...).
        return Decision(lengths=top_k_lengths(good.astype(np.float64), count), pool=survival, capacity=count)
