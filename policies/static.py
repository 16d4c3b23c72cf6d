"""Static policies: the verification length is fixed in advance (none, MTP-k)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from policies.base import Decision, PolicyTraits, StepView, prefix_survival, trim_to_budget
from policies.registry import register


@register
@dataclass(frozen=True)
class NoSpeculation(PolicyTraits):
    """Plain decoding: no drafter runs and every request verifies nothing (l_r = 0)."""

    name: ClassVar[str] = "none"
    reads_cost: ClassVar[bool] = False

    def draft_tokens(self, gamma: int) -> int:
        return 0

    def decide(self, view: StepView) -> Decision:
        return Decision(lengths=np.zeros(view.num_requests, dtype=np.int64),
                        pool=prefix_survival(view.confidence))


@register
@dataclass(frozen=True)
class Mtp(PolicyTraits):
    """Static speculation: the drafter proposes k tokens and all k are verified.

    MTP-1 (2 target tokens per request and step) is the production baseline of
    the DSpark paper (section 5.4). Under a token budget the requests scheduled
    last verify fewer (:func:`policies.base.trim_to_budget`), as vLLM does.
    """

    k: int = 1
    name: ClassVar[str] = "mtp"
    reads_cost: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"mtp: k must be >= 1, got {self.k}")

    def draft_tokens(self, gamma: int) -> int:
        return self.k

    def decide(self, view: StepView) -> Decision:
        lengths = trim_to_budget(np.full(view.num_requests, min(self.k, view.gamma), dtype=np.int64),
                                 view.draft_budget)
        return Decision(lengths=lengths, pool=prefix_survival(view.confidence), capacity=int(lengths.sum()))
