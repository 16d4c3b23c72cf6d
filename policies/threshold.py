"""Fixed confidence thresholds (the paper's Figure 5 baseline)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np

from policies import kernels
from policies.base import Decision, PolicyTraits, StepView, survival_by_position, trim_to_budget
from policies.registry import register


@register
@dataclass(frozen=True)
class Threshold(PolicyTraits):
    """Fixed confidence threshold theta.

    ``variant="position"`` (default): l_r = max{j : c[r, i] >= theta for all i <= j} - the paper's rule
    (DeepSpec's eval stops a proposal at the first c_k < theta).
    ``variant="prefix"``: l_r = max{j : a[r, j] >= theta} (survival of the whole prefix).
    Both read only c[r, 1..j] to admit position j, so they are non-anticipating.
    Under a token budget the requests scheduled last verify fewer
    (:func:`policies.base.trim_to_budget`).
    """

    theta: float = 0.5
    variant: Literal["prefix", "position"] = "position"
    name: ClassVar[str] = "threshold"
    synchronous: ClassVar[bool] = True
    reads_cost: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.theta <= 1.0:
            raise ValueError(f"threshold: theta must lie in [0, 1], got {self.theta}")
        if self.variant not in ("prefix", "position"):
            raise ValueError(f"threshold: variant must be 'prefix' or 'position', got {self.variant!r}")

    def decide(self, view: StepView) -> Decision:
        by_position = survival_by_position(view.confidence)  # [gamma, R]
        budget = view.draft_budget
        if view.confidence.dtype == np.float64 and by_position.ndim == 2:  # the same rules, compiled
            lengths, total = kernels.threshold_lengths(view.confidence, by_position, float(self.theta),
                                                       self.variant == "prefix", budget is not None,
                                                       0 if budget is None else budget)
            return Decision(lengths=lengths, pool=by_position.T, capacity=total)
        if self.variant == "prefix":
            passed = by_position >= self.theta
        else:
            passed = np.logical_and.accumulate(view.confidence.T >= self.theta, axis=0)  # [gamma, R]
        lengths = trim_to_budget(passed.sum(axis=0, dtype=np.int64), budget)
        return Decision(lengths=lengths, pool=by_position.T, capacity=int(lengths.sum()))
