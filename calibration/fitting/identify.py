"""Which parameters the data identify, the range of fits that explain the data equally well, and the alternatives.

For every parameter ``p`` the **profile range** is the set of values ``v`` for
which the best fit with ``p`` held at ``v`` stays within ``delta_chi2`` (4: two
standard deviations of the noise) of the best fit overall. The objective is
convex, so the set is an interval; its ends are found by bisection and the fits
at the ends are kept (:attr:`ParameterRange.theta_low` / ``theta_high``).

The **null directions** come from the singular values of the objective's matrix
with columns scaled to unit norm: a direction whose singular value is below
``1e-6`` of the largest changes no prediction at any run. A parameter's loading
on those directions, computed without the prior rows, says whether the *data*
can tell it from the others; with the prior rows, whether the prior pins it.

Status, in plain words:

* ``identified``: the range is within +-20% of its middle, or moves no run's
  step time by more than the noise (also on a null direction, when costs being
  >= 0 bound it that closely);
* ``poorly identified``: the data bound it, but widely;
* ``not identified``: it lies on a null direction of the data (another mix of
  parameters explains every run exactly as well); the range is bounded only by
  costs being >= 0, the prior, or the smoothness of the dense curve;
* ``extrapolated``: no run has a batch near this dense knot; its value is the
  smooth continuation of the fitted curve. Beyond the largest batch any run
  reaches, the range runs from a flat curve (no batch costs less than a smaller
  one) to a curve proportional to the batch from the last knot a run touches
  (no batch costs more than two steps of half its size would): the runs
  cannot tell how the curve goes on (a cliff there is for the user to state).

The **alternatives** are the fits at both ends of every range that is not
identified (the drafter and cost-split parameters first) and, when the curve
has knots beyond the data, the best fit with the curve flat and proportional
beyond the largest batch (``dense_beyond_data.flat`` / ``.proportional``); the
profile carries them so that simulations report an interval
(:mod:`calibration.fitting.export`). A fixed k larger than the runs' (mtp7 from
mtp1/mtp3 runs) reaches batches no run did; its interval says how much that
extrapolation is worth. Alternatives that move several of these at once, to the ends of a speculative step's
price, are :mod:`calibration.fitting.extremes`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from calibration.fitting.fit import Fit, Problem
from calibration.fitting.model import CostModel

DELTA_CHI2 = 4.0
NULL_RTOL = 1e-6
NULL_LOADING = 1e-3  # a quantity with this share on a null direction of the data moves with it
IDENTIFIED_RELATIVE = 0.2
MAX_ALTERNATIVES = 8
STATUSES = ("identified", "poorly identified", "not identified", "extrapolated")
# The alternatives with the dense curve flat / proportional to the batch beyond the largest batch any run reaches
BEYOND_DATA = ("dense_beyond_data.flat", "dense_beyond_data.proportional")


@dataclass(frozen=True)
class ParameterRange:
    name: str
    best: float
    low: float
    high: float
    status: str
    reason: str
    theta_low: np.ndarray | None = None
    theta_high: np.ndarray | None = None
    on_null_direction: bool = False  # moves along a null direction of the data

    @property
    def dense(self) -> bool:
        return self.name.startswith("dense_s[")


@dataclass(frozen=True)
class Identification:
    ranges: list[ParameterRange]
    null_directions: list[dict[str, float]]  # loadings (|loading| >= 0.05) of each null direction of the data
    alternatives: dict[str, np.ndarray]  # name ("per_request_s.low") -> theta
    delta_chi2: float

    def by_name(self, name: str) -> ParameterRange:
        return next(r for r in self.ranges if r.name == name)


def null_space(matrix: np.ndarray, rtol: float = NULL_RTOL) -> tuple[np.ndarray, np.ndarray]:
    """([P, m] orthonormal null directions in column-scaled coordinates, [P] the column scales)."""
    scale = np.linalg.norm(matrix, axis=0)
    scale[scale == 0] = 1.0
    _, s, vt = np.linalg.svd(matrix / scale, full_matrices=True)
    s_full = np.zeros(vt.shape[0])
    s_full[: s.size] = s
    return vt[s_full < rtol * max(s.max(initial=0.0), 1e-300)].T, scale


def loading(vec: np.ndarray, null: np.ndarray, scale: np.ndarray) -> float:
    """Share of the functional ``vec @ theta`` that moves along the null directions (0: none, 1: all of it)."""
    if null.size == 0:
        return 0.0
    scaled = vec / scale  # the functional in column-scaled coordinates
    return float(np.sum((null.T @ scaled) ** 2) / np.sum(scaled ** 2))


def profile_range(problem: Problem, vec: np.ndarray, fit: Fit, threshold: float, cap: float,
                   iterations: int = 40) -> tuple[float, float, np.ndarray, np.ndarray, bool]:
    """(low, high, theta at low, theta at high, high reached the cap) of the quantity ``vec @ theta``."""
    best = float(vec @ fit.theta)

    def solve(v: float) -> tuple[np.ndarray, float]:
        return problem.solve((vec, v))

    good_v, good_theta, bad_v = best, fit.theta, np.inf
    step = max(abs(best) * 0.05, cap * 1e-6)
    hit_cap = False
    while True:  # upper end: expand, then bisect
        v = min(best + step, cap)
        theta, chi2 = solve(v)
        if chi2 > threshold:
            bad_v = v
            break
        good_v, good_theta = v, theta
        if v >= cap:
            hit_cap = True
            break
        step *= 2.0
    for _ in range(0 if hit_cap else iterations):
        mid = 0.5 * (good_v + bad_v)
        theta, chi2 = solve(mid)
        if chi2 <= threshold:
            good_v, good_theta = mid, theta
        else:
            bad_v = mid
    high, theta_high = good_v, good_theta
    theta, chi2 = solve(0.0)  # lower end: zero, or bisect between zero and the estimate
    if chi2 <= threshold:
        return 0.0, high, theta, theta_high, hit_cap
    lo_bad, lo_good, lo_theta = 0.0, best, fit.theta
    for _ in range(iterations):
        mid = 0.5 * (lo_bad + lo_good)
        theta, chi2 = solve(mid)
        if chi2 <= threshold:
            lo_good, lo_theta = mid, theta
        else:
            lo_bad = mid
    return lo_good, high, lo_theta, theta_high, hit_cap


def _reach(model: CostModel, problem: Problem) -> list[float]:
    """Per profile parameter, the largest change of a run's step time per unit of it, all else fixed."""
    obs = problem.obs
    hats = model.hats(obs.batch_tokens)
    design = obs.design(model)
    out = [float(hats[:, j].max()) for j in range(model.num_dense)]
    out += [float(np.max(np.abs(design[:, i]))) for i in range(model.num_dense, design.shape[1])]
    return out


def identify(fit: Fit, delta_chi2: float = DELTA_CHI2) -> Identification:
    problem, model = fit.problem, fit.model
    num_smooth = max(model.num_dense - 2, 0)
    null_data, scale_data = null_space(problem.matrix[: problem.num_data + num_smooth])
    null_full, scale_full = null_space(problem.matrix)
    inside = knots_inside(model, problem.obs.batch_tokens)
    step_ref = float(np.median(problem.obs.step_s))
    threshold = fit.chi2 + delta_chi2
    beyond = curves_beyond_data(fit.theta, model, int(inside[-1]))
    ranges = []
    for (name, vec), reach in zip(model.quantities(), _reach(model, problem), strict=True):
        best = float(vec @ fit.theta)
        j = model.num_dense if not name.startswith("dense_s[") else list(model.knots_tokens).index(
            float(name[len("dense_s[B="):-1]))
        if j < model.num_dense and j > inside[-1] and beyond is not None:
            ranges.append(ParameterRange(name, best, float(vec @ beyond[0]), float(vec @ beyond[1]), "extrapolated",
                                         "no run at or beyond this batch size: from flat to proportional to the "
                                         "batch beyond the largest batch run (best: the smooth continuation)",
                                         *beyond))
            continue
        if j < model.num_dense and not inside[0] <= j <= inside[-1]:
            ranges.append(ParameterRange(name, best, best, best, "extrapolated",
                                         "no run at or below this batch size: the smooth continuation of the curve"))
            continue
        if reach == 0:
            ranges.append(ParameterRange(name, best, best, best, "extrapolated", "no run exercises it"))
            continue
        cap = 10.0 * float(np.max(problem.obs.step_s)) / reach
        low, high, theta_low, theta_high, hit_cap = profile_range(problem, vec, fit, threshold, cap)
        on_null = loading(vec, null_data, scale_data)
        status, reason = _status(best, low, high, reach, step_ref, fit.noise, on_null,
                                 loading(vec, null_full, scale_full), hit_cap, problem.options.prior is not None)
        ranges.append(ParameterRange(name, best, low, high, status, reason, theta_low, theta_high,
                                     on_null >= NULL_LOADING))
    directions = [{model.names[i]: float(v) for i, v in enumerate(col) if abs(v) >= 0.05} for col in null_data.T]
    alternatives = _alternatives(ranges, problem)
    if beyond is not None:
        alternatives.update(zip(BEYOND_DATA, beyond, strict=True))
    return Identification(ranges, directions, alternatives, delta_chi2)


def knots_inside(model: CostModel, batch_tokens: np.ndarray) -> np.ndarray:
    """Indices of the dense knots some run's batch touches (a batch of 32.00000001 is the knot at 32)."""
    return np.flatnonzero(model.hats(batch_tokens).max(axis=0) > 1e-9)


def same_fit(a: np.ndarray, b: np.ndarray, problem: Problem) -> bool:
    """Whether two parameter vectors are the same fit: equal to 0.1%, or within what moves the median run's
    step by 1e-4 of itself."""
    atol = 1e-4 * float(np.median(problem.obs.step_s)) / max(float(problem.obs.design(problem.model).max()), 1.0)
    return bool(np.allclose(a, b, rtol=1e-3, atol=atol))


def curves_beyond_data(theta: np.ndarray, model: CostModel, last_inside: int) -> tuple[np.ndarray, np.ndarray] | None:
    """``theta`` with the dense curve beyond knot ``last_inside`` (the last one a run's batch touches) flat, and
    proportional to the batch from that knot's value: the cheapest and the dearest curves the runs allow there if
    a batch never costs less than a smaller one, nor more than smaller steps that hold the same tokens. None when
    no knot lies beyond the data."""
    if last_inside >= model.num_dense - 1:
        return None
    knots, end = model.knots_tokens, model.num_dense
    flat = np.array(theta, dtype=np.float64)
    flat[last_inside + 1: end] = 0.0
    proportional = flat.copy()
    per_token_s = float(model.dense_values(theta)[last_inside]) / float(knots[last_inside])
    proportional[last_inside + 1: end] = per_token_s * np.diff(knots[last_inside:])
    return flat, proportional


def _status(best: float, low: float, high: float, reach: float, step_ref: float, noise: float,
            loading_data: float, loading_full: float, hit_cap: bool, has_prior: bool) -> tuple[str, str]:
    effect = (high - low) * reach / step_ref  # how much the range moves the step time of the run it touches most
    middle = 0.5 * (high + low)
    relative = (high - low) / (2 * middle) if middle > 0 else np.inf
    if relative <= IDENTIFIED_RELATIVE or effect <= noise:
        return "identified", ("the data pin it down" if loading_data < NULL_LOADING else
                              "on a null direction, but costs being >= 0 bound it closely")
    if loading_data >= NULL_LOADING:
        if has_prior and loading_full < NULL_LOADING and not hit_cap:
            return ("poorly identified", "the data cannot tell it from other parameters; the prior bounds it")
        bound = "no upper bound within 10x the largest step" if hit_cap else "bounded only by costs being >= 0"
        return "not identified", f"other parameter mixes explain every run as well ({bound})"
    if hit_cap:
        return "not identified", "the data do not bound it from above (within 10x the largest step)"
    return "poorly identified", "the data bound it only widely"


def _alternatives(ranges: list[ParameterRange], problem: Problem) -> dict[str, np.ndarray]:
    """The end fits of the ranges that are not identified, widest effect first, scalar parameters before dense
    knots, fits that predict the same at every run dropped, at most MAX_ALTERNATIVES."""
    loose = [r for r in ranges if r.status in ("not identified", "poorly identified") and r.theta_low is not None]
    scalar = [r for r in loose if not r.dense]
    chosen = scalar if scalar else loose
    chosen.sort(key=lambda r: -(r.high - r.low) / max(abs(r.best), 1e-300))
    out: dict[str, np.ndarray] = {}
    for r in chosen:
        for end, theta in (("low", r.theta_low), ("high", r.theta_high)):
            assert theta is not None
            if any(same_fit(t, theta, problem) for t in out.values()):
                continue
            out[f"{r.name}.{end}"] = theta
            if len(out) >= MAX_ALTERNATIVES:
                return out
    return out
