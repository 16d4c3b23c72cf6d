"""An online acceptance estimator: confidences learned from the verified outcomes of earlier steps (numpy only).

vLLM's adaptive verification prices draft tokens with an online logistic
estimate of acceptance where a drafter has no trained confidence head. This is
that estimator as a confidence source (``acceptance.confidence.source=online``):
every confidence-driven policy reads its estimates in place of the drafter's
confidences.

Model. For draft token k of a request, given that tokens 1..k-1 were accepted,
``P(accepted) = sigmoid(w . f)`` with features ``f = (1, logit(c_k), x_k,
x_k * logit(c_k))``: the drafter's own signal c_k (its head's confidence, or
the draft probability of a drafter without a head) and the position
``x_k = (k - 1) / (gamma - 1)``. It starts at ``w = (0, 1, 0, 0)``, the signal
taken as is.

Learning. After a step is verified, each request's labelled tokens are the
verified positions that were reached, ``k <= min(l_r, accepted_r + 1)``
(accepted iff ``k <= accepted_r``; nothing past the first rejection, nothing
unverified). w takes one Newton step on them (recursive IRLS): the curvature
``H`` accumulates ``sum p (1 - p) f f^T`` with older steps down-weighted by
``forgetting`` per step, over a prior ``prior_precision * I``.

Losslessness. An engine keeps one estimator and calls :meth:`estimate` before
its policy decides step t and :meth:`update` once step t is verified, so the
estimates of step t depend only on this step's drafter signals and the
outcomes of steps before t: fixed before the step's draft tokens are sampled,
the non-anticipating property that keeps a policy lossless (docs/lossless.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.special import expit

_EPS = 1e-6
NUM_FEATURES = 4


def features(signal: np.ndarray) -> np.ndarray:
    """[R, g] drafter signals in [0, 1] -> [R, g, 4] features (see the module docstring)."""
    g = signal.shape[1]
    logit = np.log(np.clip(signal, _EPS, 1.0 - _EPS) / np.clip(1.0 - signal, _EPS, 1.0))
    position = np.broadcast_to(np.arange(g) / max(g - 1, 1), signal.shape)
    return np.stack((np.ones_like(signal), logit, position, position * logit), axis=-1)


@dataclass
class OnlineAcceptanceEstimator:
    """Logistic estimate of conditional acceptance, updated from verified outcomes (see the module docstring)."""

    forgetting: float = 0.999
    prior_precision: float = 10.0
    weights: np.ndarray = field(default_factory=lambda: np.array([0.0, 1.0, 0.0, 0.0]))  # [4]
    num_labelled: int = 0  # tokens learned from so far

    def __post_init__(self) -> None:
        if not 0.0 < self.forgetting <= 1.0:
            raise ValueError(f"forgetting must lie in (0, 1], got {self.forgetting}")
        if not self.prior_precision > 0.0:
            raise ValueError(f"prior_precision must be > 0, got {self.prior_precision}")
        self.weights = np.array(self.weights, dtype=np.float64)
        self._curvature = self.prior_precision * np.eye(NUM_FEATURES)  # [4, 4]

    def estimate(self, signal: np.ndarray) -> np.ndarray:
        """Estimated conditional acceptance [R, g] for drafter signals [R, g]."""
        if signal.size == 0:
            return np.zeros(signal.shape)
        return expit(features(signal) @ self.weights)

    def update(self, signal: np.ndarray, lengths: np.ndarray, accepted: np.ndarray) -> None:
        """Learn from a verified step: signals [R, g], verified lengths l_r [R], accepted draft tokens [R]."""
        if signal.size == 0:
            return
        position = np.arange(1, signal.shape[1] + 1)[None, :]  # [1, g]
        labelled = position <= np.minimum(lengths, accepted + 1)[:, None]  # [R, g] verified and reached
        self._curvature *= self.forgetting
        if not labelled.any():
            return
        f = features(signal)[labelled]  # [N, 4]
        y = (position <= accepted[:, None])[labelled].astype(np.float64)  # [N]
        p = expit(f @ self.weights)
        self._curvature += (f * (p * (1.0 - p))[:, None]).T @ f
        self.weights = self.weights + np.linalg.solve(self._curvature, f.T @ (y - p))
        self.num_labelled += int(labelled.sum())
