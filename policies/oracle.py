"""An upper bound, not a policy: verify exactly the draft tokens that will be accepted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from policies.base import Decision, PolicyTraits, StepView, path_throughput, prefix_survival, top_k_lengths
from policies.greedy import best_prefix_count
from policies.registry import register


@register
@dataclass(frozen=True)
class Oracle(PolicyTraits):
    """Upper bound that knows how many draft tokens each request would get accepted.

    It only ever verifies tokens that will be accepted (no waste) and picks how
    many of them by a full search of Theta, admitting shallow positions first so
    that every request advances. Not a real policy: it reads the outcome. Under a
    token budget it admits at most ``token_budget - R`` tokens.
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
        num_good = int(good.sum()) if view.draft_budget is None else min(int(good.sum()), view.draft_budget)
        theta = path_throughput(view.cost, view.num_requests, np.ones(num_good), "tokens_x_sps")
        count = best_prefix_count(theta)
        # Survival 1 for the tokens that will be accepted, 0 otherwise: the top-count
        # entries go position-major (all first tokens, then all second tokens, ...).
        return Decision(lengths=top_k_lengths(good.astype(np.float64), count), pool=survival, capacity=count)
