"""Acceptance curves: a drafter's position-wise conditional acceptance q_k.

q_k is the fraction of draft tokens at position k that the target accepts
among the steps whose tokens 1..k-1 were all accepted (the paper's Figure 2
metric). With every draft token verified, the prefix survival is
``s_k = prod_{i <= k} q_i`` (vLLM's and DeepSpec's per-position acceptance
rate, ``accept_rate@{k-1}``) and the mean accepted length per step, bonus
token included, is exactly ``tau = 1 + sum_k s_k``.

A curve stores q_1..q_K as measured or fitted; positions past K decay
geometrically, ``q_k = q_K * tail_decay ** (k - K)`` (1.0: flat), an
assumption wherever no data covers them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

PAPER_POSITIONS = 7  # the paper's block size: Table 1 and Figure 2 cover positions 1..7


@dataclass(frozen=True)
class AcceptanceCurve:
    """Conditional acceptance q_1..q_K, then a geometric tail; see the module docstring."""

    q: tuple[float, ...]
    tail_decay: float = 1.0

    def __post_init__(self) -> None:
        q = tuple(float(x) for x in np.atleast_1d(np.asarray(self.q, dtype=np.float64)))
        object.__setattr__(self, "q", q)
        if not q:
            raise ValueError("an acceptance curve needs q_k for at least position 1")
        bad = [k + 1 for k, x in enumerate(q) if not 0.0 < x < 1.0]
        if bad:
            raise ValueError(f"conditional acceptance must lie strictly between 0 and 1; positions {bad} of "
                             f"{[round(x, 4) for x in q]} do not")
        if not 0.0 < self.tail_decay <= 1.0:
            raise ValueError(f"tail_decay must lie in (0, 1], got {self.tail_decay}")

    @classmethod
    def family(cls, first: float, last: float, shape: float = 1.0, tail_decay: float = 1.0) -> AcceptanceCurve:
        """The paper-fitting family: ``q_k = first + (last - first) * ((k - 1) / 6) ** shape`` for k = 1..7."""
        k = np.arange(PAPER_POSITIONS, dtype=np.float64)
        return cls(tuple(first + (last - first) * (k / (PAPER_POSITIONS - 1)) ** shape), tail_decay)

    @classmethod
    def from_survival(cls, survival: Sequence[float], tail_decay: float = 1.0) -> AcceptanceCurve:
        """The curve whose prefix survival is s_1..s_K (strictly decreasing from below 1)."""
        s = np.asarray(survival, dtype=np.float64)
        if s.size == 0 or np.any(~(s > 0.0)) or np.any(np.diff(np.concatenate(([1.0], s))) >= 0.0):
            raise ValueError(f"prefix survival must be positive and strictly decreasing from below 1, got "
                             f"{s.round(4).tolist()}")
        return cls(tuple(s / np.concatenate(([1.0], s[:-1]))), tail_decay)

    @property
    def num_positions(self) -> int:
        """K: how many positions the curve stores (beyond them its tail applies)."""
        return len(self.q)

    def conditional(self, gamma: int) -> np.ndarray:
        """q_1..q_gamma -> [gamma]."""
        q = np.asarray(self.q)
        if gamma <= q.size:
            return q[:gamma].copy()
        tail = q[-1] * self.tail_decay ** np.arange(1, gamma - q.size + 1)
        return np.concatenate((q, tail))

    def survival(self, gamma: int) -> np.ndarray:
        """s_1..s_gamma -> [gamma]: probability that positions 1..k are all accepted."""
        return np.cumprod(self.conditional(gamma))

    def tau(self, gamma: int = PAPER_POSITIONS) -> float:
        """Mean accepted length (bonus included) when all gamma draft tokens are verified."""
        return float(1.0 + self.survival(gamma).sum())

    def to_dict(self) -> dict[str, object]:
        return {"q": [round(x, 6) for x in self.q], "tail_decay": self.tail_decay}
