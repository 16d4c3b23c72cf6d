"""The step-cost model the fit estimates: linear in its parameters, one row per run.

One engine step over ``R`` decoding requests, ``B`` batch tokens, mean context
``C`` tokens and ``k`` draft tokens per request costs::

    step_s = dense(B)                      # piecewise linear over a grid of batch tokens ("knots")
           + per_request_s * R             # per-request overhead (sampling, bookkeeping, input preparation)
           + attention_s_per_context_token * R * C   # each request's KV read once per step (fitted when the
                                                     # runs' contexts vary, else given: 0 or the prior's)
           + eager_s * [B > max_captured_tokens]     # the cliff, when stated or detected
           + draft_fixed_s * [k > 0] + draft_per_position_s * k   # the drafter, when fitted,
           + draft_per_token_s * R * k                               # per drafted token
           + draft_per_request_s * R * [k > 0]                       # per request it drafts for (its context)
           + verify_draft_token_s * (B - R)       # the target's work per verified draft token (rejection sampling)
           + known drafter cost (--drafter-cost), when given

``dense(B)`` is piecewise linear between its values at the knots; the parameters
are its value at the first knot and its rise over every segment, all >= 0 like
every other parameter: more batch tokens never cost less.

Why some parameters cannot be told apart (see :mod:`calibration.fitting.identify`):
without speculation ``B = R``, and ``R`` is itself a piecewise-linear function of
``B``, so per-request cost and a per-token slope in ``dense`` explain the same data;
a constant context makes ``R * C`` a multiple of ``R``; and in runs that verify
every drafted token a drafter cost per drafted token, ``R * k = B - R``, is never
separable from the two. It is a parameter all the same: it does not change a
static-k prediction, but it prices the steps of policies that verify fewer tokens
than they draft (greedy, dspark), so its range is carried forward; so is that of
the target's cost per verified draft token (``B - R``), the other end of the same
split, which no step without speculation pays. The drafter's
cost per request whatever k (taking in each request's accepted tokens: its
context) is what separates a step of R requests with a drafter from one without:
runs without speculation pay ``per_request_s`` alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from calibration.fitting.runs import StepObservation


@dataclass(frozen=True)
class DrafterCost:
    """A known drafter cost, subtracted from the step time: ``fixed_s + per_position_s * k + per_token_s * R * k``
    for ``k`` > 0 draft tokens per request over ``R`` requests."""

    fixed_s: float
    per_position_s: float
    per_token_s: float

    def __call__(self, num_requests: np.ndarray, draft_tokens: np.ndarray) -> np.ndarray:
        k = np.asarray(draft_tokens, dtype=np.float64)
        cost = self.fixed_s + self.per_position_s * k + self.per_token_s * np.asarray(num_requests) * k
        return np.where(k > 0, cost, 0.0)


@dataclass(frozen=True)
class CostModel:
    """Which parameters exist: the dense knots, the cliff, and how the drafter is priced."""

    knots_tokens: np.ndarray  # [K] strictly increasing batch tokens of the dense curve
    max_captured_tokens: int | None = None  # eager above it (one more parameter, eager_s)
    fit_drafter: bool = False  # the drafter's four costs and the target's per verified draft token are parameters
    known_drafter: DrafterCost | None = None
    fit_attention: bool = True  # False when the runs' contexts do not vary: then it is given
    known_attention_s_per_context_token: float = 0.0  # used when fit_attention is False

    def __post_init__(self) -> None:
        knots = np.asarray(self.knots_tokens, dtype=np.float64)
        if knots.ndim != 1 or knots.size < 2 or np.any(np.diff(knots) <= 0) or knots[0] < 1:
            raise ValueError(f"knots must be >= 2 strictly increasing batch sizes >= 1, got {self.knots_tokens}")
        if self.fit_drafter and self.known_drafter is not None:
            raise ValueError("the drafter is either fitted or given, not both")

    @property
    def names(self) -> list[str]:
        """Parameter names, in the order of the parameter vector: the dense curve as its value at the first knot
        and its rise over each segment (so that ``theta >= 0`` also says more batch tokens never cost less),
        then the scalar costs."""
        k = self.knots_tokens
        names = [dense_name(k[0])] + [f"dense_rise_s[B={a:g}..{b:g}]" for a, b in zip(k[:-1], k[1:], strict=True)]
        names.append("per_request_s")
        if self.fit_attention:
            names.append("attention_s_per_context_token")
        if self.max_captured_tokens is not None:
            names.append("eager_s")
        if self.fit_drafter:
            names += ["draft_fixed_s", "draft_per_position_s", "draft_per_token_s", "draft_per_request_s",
                      "verify_draft_token_s"]
        return names

    @property
    def num_dense(self) -> int:
        return int(self.knots_tokens.size)

    def index(self, name: str) -> int:
        return self.names.index(name)

    def quantities(self) -> list[tuple[str, np.ndarray]]:
        """The profile's parameters as linear functionals of theta: the dense curve at each knot, then the
        scalar costs."""
        size = len(self.names)
        out = []
        for j, knot in enumerate(self.knots_tokens):
            vec = np.zeros(size)
            vec[: j + 1] = 1.0
            out.append((dense_name(knot), vec))
        for i in range(self.num_dense, size):
            vec = np.zeros(size)
            vec[i] = 1.0
            out.append((self.names[i], vec))
        return out

    def dense_values(self, theta: np.ndarray) -> np.ndarray:
        """[K] the dense curve at the knots (seconds)."""
        return np.cumsum(theta[: self.num_dense])

    def value(self, theta: np.ndarray, name: str) -> float:
        """A scalar cost, or 0 when the model has no such parameter."""
        return float(theta[self.index(name)]) if name in self.names else 0.0

    def hats(self, batch_tokens: np.ndarray) -> np.ndarray:
        """[N, K] hat-function values: dense(B) = hats(B) @ dense_values. Errors outside the knots."""
        b = np.asarray(batch_tokens, dtype=np.float64)
        knots = self.knots_tokens
        tolerance = 1e-6 * knots[-1]  # a batch estimated as 32.0000001 is the knot at 32
        if b.size and (b.min() < knots[0] - tolerance or b.max() > knots[-1] + tolerance):
            raise ValueError(f"batch tokens {b.min():g}..{b.max():g} lie outside the dense grid "
                             f"{knots[0]:g}..{knots[-1]:g}")
        b = np.clip(b, knots[0], knots[-1])
        out = np.zeros((b.size, knots.size))
        j = np.clip(np.searchsorted(knots, b, side="right") - 1, 0, knots.size - 2)
        frac = (b - knots[j]) / (knots[j + 1] - knots[j])
        rows = np.arange(b.size)
        out[rows, j] = 1.0 - frac
        out[rows, j + 1] = frac
        return out

    def design(self, num_requests: np.ndarray, batch_tokens: np.ndarray, context_tokens: np.ndarray,
               draft_tokens: np.ndarray, draft_cap: float | None = None) -> np.ndarray:
        """[N, P] columns of the model at the given step shapes (units: seconds per parameter unit). With
        ``draft_cap`` the fitted drafter prices ``min(k, draft_cap)`` positions: flat beyond that draft length."""
        r = np.asarray(num_requests, dtype=np.float64)
        k = np.asarray(draft_tokens, dtype=np.float64)
        k_priced = k if draft_cap is None else np.minimum(k, draft_cap)
        hats = self.hats(batch_tokens)
        cols = [np.cumsum(hats[:, ::-1], axis=1)[:, ::-1], r[:, None]]  # dense: value at knot j = sum of rises <= j
        if self.fit_attention:
            cols.append((r * np.asarray(context_tokens, dtype=np.float64))[:, None])
        if self.max_captured_tokens is not None:
            cols.append((np.asarray(batch_tokens) > self.max_captured_tokens).astype(np.float64)[:, None])
        if self.fit_drafter:
            drafts = (k > 0).astype(np.float64)
            verified = np.maximum(np.asarray(batch_tokens, dtype=np.float64) - r, 0.0)
            cols += [drafts[:, None], k_priced[:, None], (r * k_priced)[:, None], (r * drafts)[:, None],
                     verified[:, None]]
        return np.hstack(cols)

    def known_s(self, num_requests: np.ndarray, context_tokens: np.ndarray, draft_tokens: np.ndarray) -> np.ndarray:
        """The part of the step time that is given, not fitted (a known drafter cost, a given attention cost)."""
        r = np.asarray(num_requests, dtype=np.float64)
        known = np.zeros(r.shape)
        if not self.fit_attention:
            known += self.known_attention_s_per_context_token * r * np.asarray(context_tokens, dtype=np.float64)
        if self.known_drafter is not None:
            known += self.known_drafter(r, draft_tokens)
        return known

    def predict_s(self, theta: np.ndarray, num_requests: np.ndarray, batch_tokens: np.ndarray,
                  context_tokens: np.ndarray, draft_tokens: np.ndarray, draft_cap: float | None = None) -> np.ndarray:
        return (self.design(num_requests, batch_tokens, context_tokens, draft_tokens, draft_cap) @ theta
                + self.known_s(num_requests, context_tokens, draft_tokens))


def dense_name(knot: float) -> str:
    return f"dense_s[B={knot:g}]"


@dataclass(frozen=True)
class Observations:
    """The observations as arrays, in run order."""

    step_s: np.ndarray  # [N]
    num_requests: np.ndarray  # [N]
    batch_tokens: np.ndarray  # [N]
    context_tokens: np.ndarray  # [N]
    draft_tokens: np.ndarray  # [N]

    @classmethod
    def of(cls, observations: Sequence[StepObservation]) -> Observations:
        def col(name: str) -> np.ndarray:
            return np.array([getattr(o, name) for o in observations], dtype=np.float64)
        return cls(col("step_s"), col("num_requests"), col("batch_tokens"), col("context_tokens"),
                   col("num_draft_tokens"))

    def design(self, model: CostModel) -> np.ndarray:
        return model.design(self.num_requests, self.batch_tokens, self.context_tokens, self.draft_tokens)

    def target_s(self, model: CostModel) -> np.ndarray:
        """Step time less what is known (the fit's left-hand side)."""
        return self.step_s - model.known_s(self.num_requests, self.context_tokens, self.draft_tokens)


def default_knots(batch_tokens: np.ndarray, num_knots: int, max_batch_tokens: int | None,
                  cliff: int | None) -> np.ndarray:
    """Dense knots: 1 and every observed batch size (rounded) when there are at most ``num_knots`` of them, else
    ``num_knots`` log-spaced sizes over the observed range; then doublings up to ``max_batch_tokens`` (set by the
    smoothness assumption alone: no run is there) and the cliff."""
    observed = np.unique(np.maximum(np.round(batch_tokens), 1.0))
    top = float(np.ceil(np.max(batch_tokens) * (1 - 1e-7)))  # not one more knot for 32.0000001
    if observed.size <= num_knots:
        knots = set(observed.tolist())
    else:
        knots = set(np.unique(np.round(np.geomspace(observed[0], top, num_knots))).tolist())
    knots |= {1.0, top}
    if max_batch_tokens is not None and max_batch_tokens > top:
        ext = top * 2.0
        while ext < max_batch_tokens:
            knots.add(float(np.round(ext)))
            ext *= 2.0
        knots.add(float(max_batch_tokens))
    if cliff is not None:
        knots.add(float(cliff))
    return np.array(sorted(knots))
