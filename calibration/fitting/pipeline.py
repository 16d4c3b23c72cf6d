"""From benchmark runs to a fitted cost model: observations, the model's shape, the fit, what it identifies.

:func:`fit_runs` decides the model's shape from the runs (and says why in
``notes``): attention over context is fitted only when the runs' contexts differ
by at least :data:`CONTEXT_SPREAD`; the drafter is fitted when there are
speculative runs and no known drafter cost; the cliff is stated, detected
(``detect_cliff``) or absent. The profile's central parameters are the mean of
the alternative fits at the ends of the ranges along null directions (there the
best fit is an arbitrary point; the mean of the ends is as good a fit, the
objective being convex), or the best fit when there is no null direction.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

import numpy as np

from calibration.fitting.extremes import Alternative, joint_extremes
from calibration.fitting.fit import Cliff, Fit, FitOptions, detect_cliff, fit
from calibration.fitting.identify import Identification, identify
from calibration.fitting.model import CostModel, DrafterCost, Observations, default_knots
from calibration.fitting.prior import roofline_attention_s_per_context_token, roofline_prior
from calibration.fitting.runs import BatchEstimate, BenchmarkRun, StepEstimate, StepObservation, TpotStatistic, observe

CONTEXT_SPREAD = 1.25  # largest / smallest mean context across runs needed to fit attention over context


@dataclass(frozen=True)
class FitConfig:
    """Every choice of ``python -m calibration.fit_profile`` that shapes the fit."""

    tpot: TpotStatistic = "mean"
    batch: BatchEstimate = "littles"
    step: StepEstimate = "tpot"
    num_knots: int = 12
    max_batch_tokens: int | None = None  # extend the dense curve (smoothly, without data) up to here
    max_captured_tokens: int | None = None  # a stated cliff
    detect_cliff: bool = False
    drafter_cost: DrafterCost | None = None  # a known drafter cost instead of a fitted one
    prior: tuple[str, str] | None = None  # (model, gpu) of the roofline prior
    prior_std: float = 0.3
    drafter_kind: str | None = None  # the drafter the roofline prior prices; a sequential one extrapolates in k
    probe_draft_tokens: int | None = None  # K of the joint extremes' probe steps (None: the largest k run)
    noise: float = 0.01
    smoothness: float = 0.05

    def __post_init__(self) -> None:
        if self.num_knots < 2:
            raise ValueError(f"num_knots must be >= 2, got {self.num_knots}")
        if not (self.noise > 0 and self.smoothness > 0 and self.prior_std > 0):
            raise ValueError("noise, smoothness and prior_std must be > 0")
        if self.probe_draft_tokens is not None and self.probe_draft_tokens < 1:
            raise ValueError(f"probe_draft_tokens must be >= 1, got {self.probe_draft_tokens}")
        if self.max_captured_tokens is not None and self.detect_cliff:
            raise ValueError("state the cliff (max_captured_tokens) or detect it, not both")


# The alternative with the fitted drafter flat beyond the largest draft length any run used
DRAFT_BEYOND_DATA = "draft_beyond_data.flat"
# Drafters that run one pass per drafted position (``parallel=False`` in calibration.models.shapes): their cost
# grows linearly in k, so carrying the fitted per-position cost on beyond the runs is their physics, not a guess
SEQUENTIAL_DRAFTERS = ("eagle3", "mtp")


@dataclass(frozen=True)
class FitReport:
    runs: list[BenchmarkRun]
    observations: list[StepObservation]
    fit: Fit
    identification: Identification
    central: np.ndarray  # the profile's parameters
    cliff: Cliff | None
    prior_label: str | None
    notes: list[str] = field(default_factory=list)
    step: StepEstimate = "tpot"  # what the observations' step times were read from
    # the largest draft length a run used, when the drafter is fitted and not known to be sequential
    draft_tokens_fitted: int | None = None
    extremes: dict[str, Alternative] = field(default_factory=dict)  # see calibration.fitting.extremes

    @property
    def model(self) -> CostModel:
        return self.fit.model

    @property
    def alternatives(self) -> dict[str, Alternative]:
        """The identification's alternatives; when the drafter is fitted, the central fit with its drafter flat
        beyond the largest draft length a run used (the cheap end of carrying it there; the central fit carries
        it on linearly, the dear end); then the joint extremes of the probe steps."""
        return {**_single_alternatives(self.identification, self.central, self.draft_tokens_fitted),
                **self.extremes}

    @property
    def central_errors(self) -> np.ndarray:
        return self.fit.problem.relative_errors(self.central)


def _single_alternatives(identification: Identification, central: np.ndarray,
                         draft_tokens_fitted: int | None) -> dict[str, Alternative]:
    out = {name: Alternative(theta) for name, theta in identification.alternatives.items()}
    if draft_tokens_fitted is not None:
        out[DRAFT_BEYOND_DATA] = Alternative(central, float(draft_tokens_fitted))
    return out


def _attention(obs: Observations, config: FitConfig, notes: list[str]) -> tuple[bool, float]:
    """(fit attention over context?, the given value when not)."""
    spread = float(obs.context_tokens.max() / obs.context_tokens.min())
    if spread >= CONTEXT_SPREAD:
        return True, 0.0
    given = 0.0
    if config.prior is not None:
        given = roofline_attention_s_per_context_token(*config.prior)
    where = f"the roofline's {given * 1e9:.3g} ns per context token" if config.prior else "0"
    notes.append(f"attention over context not fitted: every run has a mean context of "
                 f"{obs.context_tokens.min():.0f}..{obs.context_tokens.max():.0f} tokens (less than x{CONTEXT_SPREAD} "
                 f"apart), so its cost is part of per_request_s at that context; the profile's attention is {where}. "
                 "Runs at other prompt lengths (or --prior) tell how cost grows with context")
    return False, given


def _drafter(runs: list[BenchmarkRun], config: FitConfig, notes: list[str]) -> bool:
    ks = sorted({r.num_speculative_tokens for r in runs if r.speculative})
    if not ks:
        if config.drafter_cost is None:
            notes.append("no speculative runs and no --drafter-cost: the profile has no drafter table, so "
                         "speculative policies cannot be simulated with it")
        return False
    if config.drafter_cost is not None:
        notes.append("drafter cost given (--drafter-cost), subtracted from the speculative runs' step times")
        return False
    if len(ks) == 1:
        notes.append(f"speculative runs at one draft length only (k={ks[0]}): the drafter's fixed and per-position "
                     "costs cannot be told apart, and other k are extrapolated")
    notes.append("the drafter is fitted as fixed + per-position + per-drafted-token + per-request cost, beside the "
                 "target's cost per verified draft token; runs that verify every drafted token cannot tell the two "
                 "per-token costs apart (R*k = B - R): static-k predictions do not depend on the split, steps that "
                 "verify fewer tokens than they draft (greedy, dspark) do")
    return True


def fit_runs(runs: list[BenchmarkRun], config: FitConfig = FitConfig()) -> FitReport:
    """Fit the step-cost model to ``runs`` and identify its parameters (see the module docstring)."""
    if len(runs) < 2:
        raise ValueError(f"need at least 2 runs to fit, got {len(runs)}")
    observations = [observe(r, config.tpot, config.batch, config.step) for r in runs]
    obs = Observations.of(observations)
    notes: list[str] = []
    fit_attention, attention_given = _attention(obs, config, notes)
    fit_drafter = _drafter(runs, config, notes)
    knots = default_knots(obs.batch_tokens, config.num_knots, config.max_batch_tokens, config.max_captured_tokens)
    model = CostModel(knots, config.max_captured_tokens, fit_drafter, config.drafter_cost, fit_attention,
                      attention_given)
    options = FitOptions(noise=config.noise, smoothness=config.smoothness)
    cliff = None
    if config.detect_cliff:
        cliff = detect_cliff(model, obs, options)
        if cliff is None:
            notes.append("no cliff detected: no jump in step time between neighbouring batch sizes beats the noise")
        else:
            model = replace(model, knots_tokens=np.union1d(model.knots_tokens, [float(cliff.max_captured_tokens)]),
                            max_captured_tokens=cliff.max_captured_tokens)
            notes.append(f"cliff detected: max_captured_tokens between {cliff.low_tokens} and {cliff.high_tokens} "
                         f"(no run in between; {cliff.low_tokens} used), chi-square lower by {cliff.chi2_gain:.0f}")
    prior_label = None
    if config.prior is not None:
        prior = roofline_prior(model, *config.prior, config.drafter_kind, config.prior_std)
        options = replace(options, prior=prior)
        prior_label = prior.label
    best = fit(model, obs, options)
    notes += best.notes
    identification = identify(best)
    on_null = {r.name for r in identification.ranges if r.on_null_direction}
    ends = [theta for name, theta in identification.alternatives.items() if name.rsplit(".", 1)[0] in on_null]
    central = np.mean(ends, axis=0) if ends else best.theta
    draft_tokens_fitted = None
    if fit_drafter and config.drafter_kind not in SEQUENTIAL_DRAFTERS:
        draft_tokens_fitted = max(r.num_speculative_tokens for r in runs if r.speculative)
    ks = [r.num_speculative_tokens for r in runs if r.speculative]
    probe_k = config.probe_draft_tokens or (max(ks) if ks else 0)
    extremes = joint_extremes(best, probe_k, None if draft_tokens_fitted is None else float(draft_tokens_fitted),
                              _single_alternatives(identification, central, draft_tokens_fitted))
    return FitReport(runs, observations, best, identification, central, cliff, prior_label, notes, config.step,
                     draft_tokens_fitted, extremes)


def config_counts(runs: list[BenchmarkRun]) -> str:
    counts = Counter(r.config_label for r in runs)
    return ", ".join(f"{name}: {n}" for name, n in counts.items())
