"""The latent model behind the parametric acceptance source, and its fit to a curve (numpy/scipy only).

For request r at step t and draft position k the *ease* of the token is

    L[r, t, k] = mu_k + d[r, t] + position_spread * eps,   d[r, t] = request_spread * z_r + step_spread * zeta

with ``z_r`` the request's persistent difficulty (a hard chat request stays
hard), ``zeta`` a per-step shift and ``eps`` per-token noise, all standard
normal. The token is accepted iff ``L + u > 0`` (u standard normal); a step's
accepted draft count is its number of leading accepted positions.

The confidence head knows the shared shift d (the context it reads says how
hard the text is right now) and sees the token's own part ``position_spread
* eps`` through noise: it observes ``V_k = d + g_k * (position_spread * eps +
n_k * eta)`` with ``g_k = s^2 / (s^2 + n_k^2)`` (s = position_spread), the
regression of the token's part on its noisy view. ``g_k`` in (0, 1] is the
head's *gain* at position k (1: it sees eps exactly; near 0: it knows only d).
Given V_k, acceptance is ``Phi((mu_k + V_k) / sqrt(1 + s^2 (1 - g_k)))`` whatever
d is, and given d the positions are independent; so that probability, used as
the confidence c_k, is calibrated position by position *and* its prefix
products ``a_k = prod_{i <= k} c_i`` are calibrated for survival, which is
what the schedulers price with.

Fitting, on one uniform grid over d (trapezoid sums; the densities are smooth):

* ``mu_k`` is solved position by position so that the conditional acceptance
  among steps whose positions 1..k-1 survived equals q_k exactly, over the
  population of *steps*: a request contributes about L / tau_r steps, so a
  request's weight is 1 / tau(z_r) under the fitting protocol (every one of
  ``fit_positions`` drafts verified), found by fixed-point iteration;
* ``g_k`` is solved so that the AUC of c_k against the outcome, among steps
  that reached position k, equals the requested AUC at k. Where a head that
  knows only the step's difficulty (``g_k`` -> 0) already ranks better (curves
  near 1, where rejections gather in hard steps), that head is used and the fit
  says so (``LatentFit.floored``); an AUC above what ``g_k = 1`` reaches is an
  error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from joblib import Memory
from scipy.special import ndtr

from simulator.acceptance.curves import AcceptanceCurve

_Z_NODES, _Z_WEIGHTS = np.polynomial.hermite_e.hermegauss(32)  # probabilists' Hermite: z ~ N(0, 1)
_Z_WEIGHTS = _Z_WEIGHTS / _Z_WEIGHTS.sum()
_GRID_POINTS = 512
_GRID_HALF_WIDTH_SD = 8.0  # the grid spans +-8 standard deviations of the widest variable (V at gain 1)
_STEP_WEIGHT_ROUNDS = 8  # fixed-point rounds for the step weighting (converges to < 1e-6 in tau)
_MIN_GAIN = 1e-6
# Fits are kept on disk across runs and sweep workers (keyed by every argument and by this code), so a run
# whose curves were fitted before starts at once. SPECSCHED_CACHE_DIR moves the cache; "off" turns it off.
_CACHE_DIR = os.environ.get("SPECSCHED_CACHE_DIR",
                            os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "specsched"))
_DISK = Memory(None if _CACHE_DIR == "off" else _CACHE_DIR, verbose=0)


@dataclass(frozen=True)
class DifficultySpec:
    """Spreads (probit scale) of the latent ease; see the module docstring."""

    request_spread: float = 0.8
    step_spread: float = 0.6
    position_spread: float = 1.5

    def __post_init__(self) -> None:
        for name in ("request_spread", "step_spread", "position_spread"):
            value = getattr(self, name)
            if not (np.isfinite(value) and value >= 0.0):
                raise ValueError(f"acceptance.difficulty.{name}={value}: must be a finite number >= 0")
        if self.step_spread <= 0.0 or self.position_spread <= 0.0:
            raise ValueError("acceptance.difficulty: step_spread and position_spread must be > 0 "
                             "(the fit integrates over both)")


@dataclass(frozen=True)
class LatentFit:
    """The solved latent model of one curve: per-position means and head gains."""

    mu: np.ndarray  # [gamma] mean ease at each position
    gain: np.ndarray  # [gamma] g_k of the confidence head
    auc_range: np.ndarray  # [gamma, 2] lowest and highest reachable AUC at each position
    floored: tuple[int, ...] = ()  # positions (1-based) whose AUC was below the lowest reachable: that one is used


def _grid(difficulty: DifficultySpec) -> np.ndarray:
    d = difficulty
    half = _GRID_HALF_WIDTH_SD * np.sqrt(d.request_spread**2 + d.step_spread**2 + d.position_spread**2)
    return np.linspace(-half, half, _GRID_POINTS)


def _step_population(q: np.ndarray, difficulty: DifficultySpec, fit_positions: int,
                     x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Solve mu_k over the population of steps; returns (mu [gamma], step density of d on the grid [G])."""
    from scipy.optimize import brentq  # here, not at the top: a run whose fits are cached never pays its import

    spec = difficulty
    scale = np.sqrt(1.0 + spec.position_spread**2)
    h = x[1] - x[0]
    # Density of d given each request node z: N(request_spread * z, step_spread^2), as grid-cell masses.
    given_z = np.exp(-0.5 * ((x[None, :] - spec.request_spread * _Z_NODES[:, None]) / spec.step_spread) ** 2)
    given_z *= h / (spec.step_spread * np.sqrt(2.0 * np.pi))  # [Z, G]
    step_weight = np.ones(_Z_NODES.size)  # [Z] steps per request, relative: 1 / tau(z)
    for _ in range(_STEP_WEIGHT_ROUNDS):
        density = (_Z_WEIGHTS * step_weight) @ given_z
        density /= density.sum()
        mu, survive = np.empty(q.size), np.ones_like(x)
        for k in range(q.size):
            w = density * survive
            w /= w.sum()
            mu[k] = brentq(lambda m, w=w, target=q[k]: float(w @ ndtr((m + x) / scale)) - target, -40.0, 40.0)
            survive = survive * ndtr((mu[k] + x) / scale)
        reach = np.cumprod(ndtr((mu[:fit_positions, None] + x[None, :]) / scale), axis=0)
        tau_d = 1.0 + reach.sum(axis=0)  # [G] tau of a step with shift d under the fitting protocol
        step_weight = given_z.sum(axis=1) / (given_z @ tau_d)  # 1 / E[tau | z]
    return mu, density


def _auc(mu: float, reached: np.ndarray, x: np.ndarray, gain: float, position_spread: float) -> float:
    """AUC of c_k against acceptance among steps that reached position k (step density ``reached`` of d)."""
    h = x[1] - x[0]
    sd = np.sqrt(gain) * position_spread
    offsets = np.arange(-(x.size - 1), x.size) * h
    kernel = ndtr((offsets + h / 2) / sd) - ndtr((offsets - h / 2) / sd)  # cell masses of N(0, g s^2)
    density = np.convolve(reached, kernel)[x.size - 1: 2 * x.size - 1]  # [G] density of V_k
    accepted = density * ndtr((mu + x) / np.sqrt(1.0 + position_spread**2 * (1.0 - gain)))
    rejected = density - accepted
    below = np.cumsum(rejected) - 0.5 * rejected  # rejected mass below each grid point (ties count half)
    return float((accepted * below).sum() / (accepted.sum() * rejected.sum()))


def _solve_gains(mu: np.ndarray, density: np.ndarray, x: np.ndarray, difficulty: DifficultySpec,
                 aucs: np.ndarray, where: str) -> tuple[np.ndarray, np.ndarray]:
    from scipy.optimize import brentq  # here, not at the top: a run whose fits are cached never pays its import

    spread = difficulty.position_spread
    scale = np.sqrt(1.0 + spread**2)
    gains, bounds = np.empty(mu.size), np.empty((mu.size, 2))
    survive = np.ones_like(x)
    for k in range(mu.size):
        reached = density * survive
        reached /= reached.sum()
        low, high = (_auc(mu[k], reached, x, g, spread) for g in (_MIN_GAIN, 1.0))
        bounds[k] = low, high
        if aucs[k] >= high:
            raise ValueError(
                f"acceptance.confidence.auc={aucs[k]:.3f} at position {k + 1} cannot be reached for {where}: "
                f"a head that knows the step's difficulty reaches {low:.3f}..{high:.3f} there; choose an AUC in "
                "that range, or change acceptance.difficulty (more position_spread widens it)")
        if aucs[k] <= low:  # knowing the step's difficulty alone ranks better: the head knows only that
            gains[k] = _MIN_GAIN
        else:
            gains[k] = np.exp(brentq(lambda lg, k=k, reached=reached: _auc(mu[k], reached, x, np.exp(lg), spread)
                                     - aucs[k], np.log(_MIN_GAIN), 0.0, xtol=1e-7))
        survive = survive * ndtr((mu[k] + x) / scale)
    return gains, bounds


@lru_cache(maxsize=256)
def fit_latent(curve: AcceptanceCurve, gamma: int, difficulty: DifficultySpec, aucs: tuple[float, ...],
               fit_positions: int, where: str = "the curve") -> LatentFit:
    """Solve mu and the head gains for the first ``gamma`` positions of ``curve`` (see the module docstring);
    cached in memory and on disk."""
    return _fit_latent_on_disk(curve, gamma, difficulty, aucs, fit_positions, where)


@_DISK.cache
def _fit_latent_on_disk(curve: AcceptanceCurve, gamma: int, difficulty: DifficultySpec, aucs: tuple[float, ...],
               fit_positions: int, where: str = "the curve") -> LatentFit:
    """Solve mu and the head gains for the first ``gamma`` positions of ``curve`` (see the module docstring).

    ``aucs`` holds one AUC per position (``gamma`` of them); ``fit_positions`` is the block size the curve
    was measured at (the step weighting's protocol); ``where`` names the curve in errors.
    """
    if len(aucs) != gamma:
        raise ValueError(f"need one AUC per position (gamma={gamma}), got {len(aucs)}")
    positions = max(gamma, fit_positions)
    q = curve.conditional(positions)
    x = _grid(difficulty)
    mu, density = _step_population(q, difficulty, fit_positions, x)
    wanted = np.asarray(aucs, dtype=np.float64)
    gains, bounds = _solve_gains(mu[:gamma], density, x, difficulty, wanted, where)
    floored = tuple(int(k) + 1 for k in np.flatnonzero(wanted <= bounds[:, 0]))
    return LatentFit(mu=mu[:gamma], gain=gains, auc_range=bounds, floored=floored)
