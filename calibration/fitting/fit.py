"""Regularised least squares on step time: the objective, its solution, and cliff detection.

The objective is a chi-square in one unit, so that data, smoothness and prior
weigh against each other by stated scales::

    chi2(theta) = sum_runs ((predicted - measured) / (measured * noise))^2          # relative error, noise ~1%
                + sum_knots (kink_j * span_j / (step_ref * smoothness))^2               # dense curve: no jags
                + sum_priors ((theta_i - prior_i) / (prior_std * prior_i))^2             # roofline, when given

minimised over ``theta >= 0`` (``scipy.optimize.lsq_linear``). ``kink_j`` is the
change of the dense curve's slope at knot ``j`` and ``span_j`` the width of the
two segments around it, so a kink that moves the step time by ``smoothness``
(5%) of the median step over its span costs as much as a run missed by its
noise. Cliffs are explicit parameters, never kinks of the dense curve.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
from scipy.optimize import lsq_linear

from calibration.fitting.model import CostModel, Observations

HOLD_WEIGHT = 1e6  # weight of the row that holds a quantity at a value while the rest is refitted
MIN_DENSE_S = 1e-9  # lower bound of the dense curve (the profile format needs step times > 0)


@dataclass(frozen=True)
class Prior:
    """Gaussian prior means per parameter name (those absent are free) and their relative standard deviation."""

    means: dict[str, float]
    relative_std: float
    label: str  # e.g. "roofline qwen3-8b@h200 (analytic)"

    def __post_init__(self) -> None:
        if not self.relative_std > 0:
            raise ValueError(f"prior relative std must be > 0, got {self.relative_std}")


@dataclass(frozen=True)
class FitOptions:
    noise: float = 0.01  # relative measurement noise of a run's step time
    smoothness: float = 0.05  # relative step-time effect of a unit kink (see the module docstring)
    prior: Prior | None = None


@dataclass(frozen=True)
class Problem:
    """The stacked least-squares system ``|A theta - b|^2`` of the objective, ``theta >= 0``."""

    model: CostModel
    obs: Observations
    options: FitOptions
    matrix: np.ndarray  # [rows, P]
    rhs: np.ndarray  # [rows]
    num_data: int  # the first num_data rows are the runs

    def solve(self, fixed: tuple[np.ndarray, float] | None = None) -> tuple[np.ndarray, float]:
        """Best theta and its chi-square; with ``fixed = (c, v)``, the best theta with ``c @ theta = v`` (held by a
        row of weight :data:`HOLD_WEIGHT`, whose own residual is left out of the returned chi-square)."""
        matrix, rhs = self.matrix, self.rhs
        scale = np.linalg.norm(matrix, axis=0)
        scale[scale == 0] = 1.0
        scaled = matrix / scale  # unit columns: the hold row below outweighs every column alike
        if fixed is not None:
            vec, value = fixed
            unit = vec / scale
            size = np.linalg.norm(unit)
            scaled = np.vstack([scaled, HOLD_WEIGHT * unit / size])
            rhs = np.append(rhs, HOLD_WEIGHT * value / size)
        lower = np.zeros(matrix.shape[1])
        lower[0] = MIN_DENSE_S * scale[0]  # the dense curve's first value: a step never costs nothing
        result = lsq_linear(scaled, rhs, bounds=(lower, np.inf), method="bvls", tol=1e-12)
        theta = result.x / scale
        return theta, self.chi2(theta)

    def chi2(self, theta: np.ndarray) -> float:
        return float(np.sum((self.matrix @ theta - self.rhs) ** 2))

    def data_chi2(self, theta: np.ndarray) -> float:
        res = self.matrix[: self.num_data] @ theta - self.rhs[: self.num_data]
        return float(np.sum(res ** 2))

    def relative_errors(self, theta: np.ndarray) -> np.ndarray:
        """(predicted - measured) / measured per run."""
        predicted = self.model.predict_s(theta, self.obs.num_requests, self.obs.batch_tokens,
                                         self.obs.context_tokens, self.obs.draft_tokens)
        return predicted / self.obs.step_s - 1.0


def smoothness_rows(knots: np.ndarray, num_params: int, step_ref_s: float, smoothness: float) -> np.ndarray:
    """[K-2, P] kink rows over the dense curve: parameter ``j`` (1..K-1) is its rise over segment j-1..j."""
    rows = np.zeros((max(knots.size - 2, 0), num_params))
    for j in range(1, knots.size - 1):
        left, right = knots[j] - knots[j - 1], knots[j + 1] - knots[j]
        span = 0.5 * (knots[j + 1] - knots[j - 1])
        rows[j - 1, j] = -1.0 / left  # slope right of knot j minus slope left of it
        rows[j - 1, j + 1] = 1.0 / right
        rows[j - 1] *= span / (step_ref_s * smoothness)
    return rows


def prior_rows(model: CostModel, prior: Prior | None) -> tuple[np.ndarray, np.ndarray]:
    """One row per profile parameter with a positive prior mean (dense knots and scalars alike)."""
    size = len(model.names)
    if prior is None:
        return np.zeros((0, size)), np.zeros(0)
    quantities = dict(model.quantities())
    unknown = sorted(set(prior.means) - set(quantities))
    if unknown:
        raise ValueError(f"prior names parameters the model does not have: {', '.join(unknown)}")
    rows, rhs = [], []
    for name, mean in prior.means.items():
        if mean <= 0:
            continue  # a zero prior mean has no scale: leave the parameter free
        rows.append(quantities[name] / (prior.relative_std * mean))
        rhs.append(1.0 / prior.relative_std)
    return (np.array(rows), np.array(rhs)) if rows else (np.zeros((0, size)), np.zeros(0))


def build_problem(model: CostModel, obs: Observations, options: FitOptions) -> Problem:
    target = obs.target_s(model)
    if np.any(target <= 0):
        i = int(np.flatnonzero(target <= 0)[0])
        raise ValueError(f"run {i + 1}: the known drafter cost exceeds the measured step time "
                         f"({obs.step_s[i] * 1e3:.3g} ms); check --drafter-cost")
    design = obs.design(model)
    weight = 1.0 / (obs.step_s * options.noise)
    data = design * weight[:, None]
    rhs = target * weight
    smooth = smoothness_rows(model.knots_tokens, design.shape[1], float(np.median(obs.step_s)), options.smoothness)
    prior, prior_rhs = prior_rows(model, options.prior)
    matrix = np.vstack([data, smooth, prior])
    return Problem(model, obs, options, matrix, np.concatenate([rhs, np.zeros(len(smooth)), prior_rhs]),
                   num_data=len(rhs))


@dataclass(frozen=True)
class Fit:
    """The best fit of a problem. ``noise`` is the noise the chi-square is in units of: the stated noise, or the
    fit's own RMS relative error when the model misses the data by more than that."""

    problem: Problem
    theta: np.ndarray
    chi2: float
    noise: float
    notes: list[str] = field(default_factory=list)

    @property
    def model(self) -> CostModel:
        return self.problem.model

    @property
    def relative_errors(self) -> np.ndarray:
        return self.problem.relative_errors(self.theta)

    @property
    def rms_error(self) -> float:
        return float(np.sqrt(np.mean(self.relative_errors ** 2)))

    def value(self, name: str) -> float:
        return dict(self.quantities)[name]

    @property
    def quantities(self) -> list[tuple[str, float]]:
        """The profile's parameters at the best fit (dense curve at each knot, scalar costs)."""
        return [(name, float(vec @ self.theta)) for name, vec in self.model.quantities()]


def fit(model: CostModel, obs: Observations, options: FitOptions) -> Fit:
    """Solve; when the RMS relative error exceeds the stated noise, solve again with the noise set to it, so that
    the ranges of :mod:`calibration.fitting.identify` reflect how well the model can fit at all."""
    problem = build_problem(model, obs, options)
    theta, chi2 = problem.solve()
    rms = float(np.sqrt(np.mean(problem.relative_errors(theta) ** 2)))
    notes = []
    if rms > options.noise:
        notes.append(f"the best fit misses the runs by {100 * rms:.2f}% RMS, more than the stated noise "
                     f"{100 * options.noise:.2f}%: ranges use {100 * rms:.2f}%")
        options = replace(options, noise=rms)
        problem = build_problem(model, obs, options)
        theta, chi2 = problem.solve()
    return Fit(problem, theta, chi2, options.noise, notes)


@dataclass(frozen=True)
class Cliff:
    """A detected cliff: eager above ``max_captured_tokens``, which the data place in [low, high]."""

    max_captured_tokens: int
    low_tokens: int
    high_tokens: int
    chi2_gain: float


def detect_cliff(model: CostModel, obs: Observations, options: FitOptions, min_gain: float = 9.0,
                 min_runs_above: int = 2) -> Cliff | None:
    """Try a cliff between every two neighbouring observed batch sizes (at least ``min_runs_above`` runs above it);
    keep the best if it lowers the chi-square by ``min_gain`` (3 standard deviations) or more. The data only say
    the cliff lies between the two batch sizes; the lower one is used and both are reported."""
    if model.max_captured_tokens is not None:
        return None
    base = fit(model, obs, options)
    batches = np.unique(np.round(obs.batch_tokens).astype(int))
    best: Cliff | None = None
    for low, high in zip(batches[:-1], batches[1:], strict=True):
        if int(np.sum(obs.batch_tokens > low + 0.5)) < min_runs_above:
            continue
        knots = np.union1d(model.knots_tokens, [float(low)])
        trial = replace(model, knots_tokens=knots, max_captured_tokens=int(low))
        gain = build_problem(trial, obs, replace(options, noise=base.noise)).solve()[1]
        gain = base.chi2 - gain
        if gain >= min_gain and (best is None or gain > best.chi2_gain):
            best = Cliff(int(low), int(low), int(high) - 1, gain)
    return best
