"""The parametric acceptance source: outcomes and confidences drawn from a preset's curves.

Each request follows one curve of its preset: its domain's, or, with a
benchmark mix, one of its domain's benchmarks drawn with the mix's weights
(the same for the request's whole life). The latent model, the confidence
head and the fit are in :mod:`simulator.acceptance.latent`: outcomes hit the
curve q_k over steps exactly; the calibrated confidence c_k is the exact
probability of acceptance given what the head sees, so c_k is calibrated per
position and its products ``a_k`` are calibrated for prefix survival.

The raw head (``calibrated=False``) is the calibrated one seen through a
per-position temperature, ``sigmoid(overconfidence_k * logit(c_k) + bias)``:
overconfidence_k > 1 pushes confidences towards 0 and 1, the miscalibration
the paper's sequential temperature scaling (STS) removes; ``bias`` shifts
every logit, a miscalibration no temperature can remove (0 by default).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy.special import expit, ndtr, ndtri

from simulator.acceptance.curves import AcceptanceCurve
from simulator.acceptance.kernels import latent_steps, ndtr_address
from simulator.acceptance.latent import DifficultySpec, fit_latent
from simulator.acceptance.preset_file import AcceptancePreset, PresetError
from simulator.acceptance.presets import load_preset
from traces.workload import DOMAINS

log = logging.getLogger(__name__)

# The default head, derived from the paper's Figure 6 by ``python -m calibration.acceptance.confidence --solve``
# (Qwen3-4B DSpark on Alpaca; docs/acceptance.md). Conditional AUC of c_k (among steps that reached k): one value
# fits best - the AUC of the prefix survival a_k then rises with k by itself (0.813, 0.827, 0.865, 0.898 at
# positions 1, 3, 5, 7; the paper: 0.818, 0.812, 0.864, 0.907).
DEFAULT_AUC = 0.814
# Raw head: logit temperature per position (past 7: the last), raw ECE of a_k 6.0, 8.1, 5.8, 3.5 % at positions
# 1, 3, 5, 7 (the paper: 5.7, 8.2, 5.8, 3.3 %).
DEFAULT_OVERCONFIDENCE: tuple[float, ...] = (1.55, 1.49, 1.42, 1.36, 1.29, 1.23, 1.17)
LONG_FIT_POSITIONS = 48  # announce a fit of more (curve, position) pairs than this in the log
ConfidenceSource = Literal["head", "online"]


def _per_position(value: float | tuple[float, ...], gamma: int) -> tuple[float, ...]:
    """A scalar for every position, or a list whose last value carries on past its end."""
    values = (value,) if np.isscalar(value) else tuple(value)  # type: ignore[arg-type]
    return tuple(float(values[min(k, len(values) - 1)]) for k in range(gamma))


@dataclass(frozen=True)
class ConfidenceSpec:
    """How informative and how well calibrated the drafter's confidences are.

    ``auc``: AUC of c_k against the outcome among steps that reached position k, per position (a list; past
    its end the last value holds) or one value for all; None takes the preset's measured AUC, else
    :data:`DEFAULT_AUC` (the paper's Figure 6). ``calibrated``: True gives calibrated confidences (after STS),
    False the raw head (``overconfidence`` per position or one value, ``bias``; see the module docstring).
    ``source``: ``head`` hands the policies the drafter's confidences; ``online`` an online logistic estimate
    of acceptance learned from earlier steps' verified outcomes (:mod:`simulator.acceptance.online`).
    """

    auc: float | tuple[float, ...] | None = None
    calibrated: bool = True
    overconfidence: float | tuple[float, ...] = DEFAULT_OVERCONFIDENCE
    bias: float = 0.0
    source: ConfidenceSource = "head"

    def __post_init__(self) -> None:
        for name in ("auc", "overconfidence"):
            value = getattr(self, name)
            if value is not None and not np.isscalar(value):
                object.__setattr__(self, name, tuple(float(v) for v in value))  # lists from configs: hashable
        values = () if self.auc is None else np.atleast_1d(np.asarray(self.auc, dtype=float))
        if self.auc is not None and (len(values) == 0 or not np.all((values > 0.5) & (values < 1.0))):
            raise ValueError(f"acceptance.confidence.auc={self.auc}: every AUC must lie strictly between 0.5 and 1")
        temps = np.atleast_1d(np.asarray(self.overconfidence, dtype=float))
        if len(temps) == 0 or not np.all(np.isfinite(temps) & (temps > 0.0)):
            raise ValueError(f"acceptance.confidence.overconfidence={self.overconfidence}: every value must be a "
                             "finite number > 0 (1 = calibrated, > 1 overconfident)")
        if not np.isfinite(self.bias):
            raise ValueError(f"acceptance.confidence.bias={self.bias}: must be finite")
        if self.source not in ("head", "online"):
            raise ValueError(f"acceptance.confidence.source={self.source}: must be head or online")

    def aucs(self, gamma: int, preset_auc: tuple[float, ...] | None = None) -> tuple[float, ...]:
        """The AUC at positions 1..gamma."""
        auc = self.auc if self.auc is not None else (preset_auc if preset_auc is not None else DEFAULT_AUC)
        return _per_position(auc, gamma)

    def temperatures(self, gamma: int) -> np.ndarray:
        return np.asarray(_per_position(self.overconfidence, gamma))


@dataclass(frozen=True)
class _Class:
    """One curve requests can follow: a domain's or a benchmark's."""

    name: str
    domain: str
    curve: AcceptanceCurve


def acceptance_classes(preset: AcceptancePreset, benchmark_mix: Mapping[str, float] | None
                       ) -> tuple[list[_Class], dict[int, tuple[np.ndarray, np.ndarray]]]:
    """The curves of ``preset`` requests follow, and per domain index (classes [m], cumulative weights [m]).

    A domain with benchmarks in the mix draws among them by weight; any other domain follows its own curve.
    """
    mix = dict(benchmark_mix or {})
    bad = {b: w for b, w in mix.items() if not (np.isfinite(w) and w >= 0.0)}
    if bad or (mix and sum(mix.values()) <= 0.0):
        raise PresetError(f"benchmark_mix needs non-negative weights with a positive sum, got {mix}")
    classes, by_domain = [], {}
    for d_idx, domain in enumerate(DOMAINS):
        chosen = [(b, w) for b, w in mix.items() if w > 0.0 and preset.benchmark(b)[0] == domain]
        if chosen:
            weights = np.array([w for _, w in chosen])
            ids = [len(classes) + i for i in range(len(chosen))]
            classes += [_Class(b, domain, preset.benchmark(b)[1]) for b, _ in chosen]
            by_domain[d_idx] = (np.array(ids), np.cumsum(weights) / weights.sum())
        elif domain in preset.domains:
            by_domain[d_idx] = (np.array([len(classes)]), np.ones(1))
            classes.append(_Class(domain, domain, preset.domains[domain]))
    return classes, by_domain


class AcceptanceModel:
    """Samples, per engine step, the confidences and true accepted draft counts of a preset's drafter."""

    def __init__(self, preset: str | AcceptancePreset, gamma: int, difficulty: DifficultySpec | None = None,
                 confidence: ConfidenceSpec | None = None, benchmark_mix: Mapping[str, float] | None = None) -> None:
        self.preset = preset if isinstance(preset, AcceptancePreset) else load_preset(preset)
        self.gamma = gamma
        self.difficulty = difficulty or DifficultySpec()
        spec = self.difficulty
        self._request_spread, self._step_spread = float(spec.request_spread), float(spec.step_spread)
        self.confidence_spec = confidence or ConfidenceSpec()
        self.classes, self._by_domain = acceptance_classes(self.preset, benchmark_mix)
        self._aucs = self.confidence_spec.aucs(gamma, self.preset.confidence_auc)
        self._temperatures = self.confidence_spec.temperatures(gamma)  # [gamma]
        num = len(self.classes)
        self._params = np.full((5, num, gamma), np.nan)  # mu, loading of W on n0, on n1, 1/psd, per class
        self._fitted = np.zeros(num, dtype=bool)
        self._rows = np.full((num, 5, gamma), np.nan)  # _params by class [C, 5, gamma], rebuilt by _fit
        self._single = np.full(len(DOMAINS), -1)  # class of a domain with one class, else -1
        for d_idx, (ids, _) in self._by_domain.items():
            if ids.size == 1:
                self._single[d_idx] = ids[0]
        self._domain_ready = np.zeros(len(DOMAINS), dtype=bool)  # a domain with one curve, fitted (rebuilt by _fit)
        self._domain_rows = np.full((len(DOMAINS), 5, gamma), np.nan)  # its _rows

    @property
    def drafter(self) -> str:
        return self.preset.name

    def describe(self) -> dict[str, object]:
        """What the run's acceptance came from, for the summary."""
        conf = self.confidence_spec
        return {"source": "preset", "preset": self.preset.name, "preset_file": self.preset.path,
                "preset_source": self.preset.metadata.get("source"), "confidence_calibrated": conf.calibrated}

    def _fit(self, class_ids: np.ndarray) -> None:
        """Fit the latent model of the classes not fitted yet (cached across models with the same inputs)."""
        todo = [int(c) for c in class_ids if not self._fitted[c]]
        if not todo:
            return
        if len(todo) * self.gamma > LONG_FIT_POSITIONS:
            log.info("fitting the acceptance model of preset %s: %d curve(s) x %d positions", self.preset.name,
                     len(todo), self.gamma)
        started = time.perf_counter()
        spread = self.difficulty.position_spread
        scale_a = np.sqrt(spread**2 + 1.0)
        for c in todo:
            cls = self.classes[c]
            fit = fit_latent(cls.curve, self.gamma, self.difficulty, self._aucs, self.preset.fit_positions,
                             f"preset {self.preset.name}, {cls.name}")
            if fit.floored:
                lowest = ", ".join(f"{fit.auc_range[k - 1, 0]:.3f}" for k in fit.floored)
                log.warning("preset %s, %s: a confidence AUC of %s at position(s) %s is below what knowing the "
                            "step's difficulty alone gives (%s): the head uses that (acceptance.confidence.auc)",
                            self.preset.name, cls.name, ", ".join(f"{self._aucs[k - 1]:.3f}" for k in fit.floored),
                            ", ".join(map(str, fit.floored)), lowest)
            cov = fit.gain * spread**2  # Cov(A, W) = Var(W): A = s eps + u, W = g (s eps + n eta)
            self._params[:, c] = (fit.mu, cov / scale_a, np.sqrt(np.maximum(cov - cov**2 / scale_a**2, 0.0)),
                                  1.0 / np.sqrt(1.0 + spread**2 * (1.0 - fit.gain)), np.full(self.gamma, scale_a))
            self._fitted[c] = True
        self._rows = np.ascontiguousarray(self._params.transpose(1, 0, 2))
        self._domain_ready = (self._single >= 0) & self._fitted[self._single]
        self._domain_rows[self._domain_ready] = self._rows[self._single[self._domain_ready]]
        log.debug("acceptance model %s: %d curve(s) fitted in %.2f s", self.preset.name, len(todo),
                  time.perf_counter() - started)

    def request_difficulty(self, rng: np.random.Generator, num_requests: int) -> np.ndarray:
        """Persistent per-request difficulty z_r ~ N(0, 1) -> [N] (with a benchmark mix it also picks the curve)."""
        return rng.standard_normal(num_requests)

    def request_classes(self, domain_idx: np.ndarray, difficulty: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The curve (class index) [R] each request follows, and its ease z [R] on that curve.

        In a domain with several curves, u = Phi(z) picks the curve by the cumulative weights and the position
        of u inside the curve's interval gives back a standard normal z, independent of the pick.
        """
        cls = self._single[domain_idx]
        if np.any(cls < 0):
            missing = sorted({DOMAINS[d] for d in np.unique(domain_idx[cls < 0]) if d not in self._by_domain})
            if missing:
                raise PresetError(f"acceptance preset {self.preset.name} ({self.preset.path}) has no curve for "
                                  f"domain(s) {missing}; it has {', '.join(self.preset.domains)}")
        mixed = cls < 0
        z = difficulty
        if mixed.any():
            z, cls = difficulty.copy(), cls.copy()
            for d_idx in np.unique(domain_idx[mixed]):
                rows = np.flatnonzero(domain_idx == d_idx)
                ids, cum = self._by_domain[int(d_idx)]
                u = ndtr(difficulty[rows])
                pick = np.minimum(np.searchsorted(cum, u, side="right"), ids.size - 1)
                low = np.concatenate(([0.0], cum[:-1]))[pick]
                # |z| > 8 (probability 1e-15) would give an infinite ease: keep inside the float range.
                z[rows] = ndtri(np.clip((u - low) / (cum[pick] - low), 1e-16, 1.0 - 1e-16))
                cls[rows] = ids[pick]
        return cls, z

    def sample_step(self, rng: np.random.Generator, domain_idx: np.ndarray, difficulty: np.ndarray,
                    num_draft_tokens: int, decoded_tokens: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Confidences [R, g] and accepted draft counts [R] for one step (g = num_draft_tokens).

        ``decoded_tokens`` [R] is accepted for the interface's sake; this model does not depend on it.
        """
        num_requests = domain_idx.shape[0]
        if num_draft_tokens == 0 or num_requests == 0:
            return np.zeros((num_requests, num_draft_tokens)), np.zeros(num_requests, dtype=np.int64)
        confidence, accepted = self.sample_steps(rng, domain_idx, difficulty, num_draft_tokens, 1)
        return confidence[0], accepted[0]

    def sample_steps(self, rng: np.random.Generator, domain_idx: np.ndarray, difficulty: np.ndarray,
                     num_draft_tokens: int, num_steps: int) -> tuple[np.ndarray, np.ndarray]:
        """Confidences [K, R, g] and accepted draft counts [K, R] of K = ``num_steps`` consecutive steps of the same
        requests: the values and the draws of K calls of :meth:`sample_step`, in one pass (an engine whose batch
        does not change samples ahead). The draws, per step and in this order: 2 R g standard normals (n0 [R, g],
        then n1 [R, g]), then R (the step's shift) - only ``rng.standard_normal`` is called, with a count.
        """
        g, num_requests = num_draft_tokens, domain_idx.shape[0]
        self.check_draft_tokens(g)
        if g == 0 or num_requests == 0:
            return np.zeros((num_steps, num_requests, g)), np.zeros((num_steps, num_requests), dtype=np.int64)
        return self.draw_steps(rng, self.batch_rows(domain_idx, difficulty), g, num_steps)

    def check_draft_tokens(self, num_draft_tokens: int) -> None:
        if num_draft_tokens > self.gamma:
            raise ValueError(f"{num_draft_tokens} draft tokens requested but the acceptance model was built for "
                             f"gamma={self.gamma}")

    def batch_rows(self, domain_idx: np.ndarray, difficulty: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """What :meth:`draw_steps` needs of a batch of requests: the parameter table [C, 5, gamma], each request's
        row of it [R] and its ease z [R] (curves not fitted yet are fitted here)."""
        z = difficulty
        if self._domain_ready[domain_idx].all():  # every request's domain has one curve, fitted
            return self._domain_rows, domain_idx, np.asarray(z, dtype=np.float64)
        rows = self._single[domain_idx]
        if rows.min() < 0:  # a domain with several curves, or none
            rows, z = self.request_classes(domain_idx, difficulty)
        if not self._fitted[rows].all():
            self._fit(np.unique(rows))
        return self._rows, rows, np.asarray(z, dtype=np.float64)

    def draw_steps(self, rng: np.random.Generator, batch: tuple[np.ndarray, np.ndarray, np.ndarray],
                   num_draft_tokens: int, num_steps: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`sample_steps` of a non-empty batch as :meth:`batch_rows` describes it (g >= 1)."""
        table, rows, z = batch
        g, num_requests = num_draft_tokens, rows.shape[0]
        # (A, W) of the latent model is bivariate normal: two draws per token suffice. One call draws the stream
        # that per-step calls would (numpy draws standard normals one after the other, whatever the size).
        draws = rng.standard_normal(num_steps * (2 * num_requests * g + num_requests)).reshape(num_steps, -1)
        confidence = np.empty((num_steps, num_requests, g))
        accepted = np.empty((num_steps, num_requests), dtype=np.int64)
        cdf = ndtr_address()  # scipy's ndtr inside the kernel, or (0) the ufunc afterwards
        latent_steps(draws, table, rows, z, self._request_spread, self._step_spread, g, confidence, accepted, cdf)
        if not cdf:
            ndtr(confidence, out=confidence)
        if not self.confidence_spec.calibrated:
            confidence = self.raw(confidence.reshape(-1, g)).reshape(num_steps, num_requests, g)
        return confidence, accepted

    def raw(self, calibrated: np.ndarray) -> np.ndarray:
        """The raw head's confidences [R, g] for calibrated ones (see the module docstring)."""
        c = np.clip(calibrated, 1e-12, 1.0 - 1e-12)
        temps = self._temperatures[: c.shape[1]]
        return expit(temps * np.log(c / (1.0 - c)) + self.confidence_spec.bias)
