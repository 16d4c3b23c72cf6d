"""The fitted profile as a file: version 2 of ``docs/profile_format.md``, ``metadata.source = "fitted"``.

The central parameters become the profile's tables; ``metadata.fit`` records
how it was fitted: the runs and their residuals, every parameter with its range
and status, the notes, and under ``alternatives`` one complete profile per end
of every unidentified range. ``experiments.run`` simulates those too and
reports ``*_low`` / ``*_high`` (:mod:`experiments.intervals`).

Tables and their extents (linear models, so two points carry them exactly):

* ``verify.step_s`` over the dense knots (batch tokens); nothing beyond the last
  knot, so a simulation past it is an error (extend with ``--max-batch-tokens``);
* ``per_request`` over 1..``max_requests``; ``attention`` over contexts
  0..``max_context_tokens`` and 1..``1 + max_draft_tokens`` query tokens, when its
  cost is not zero; ``cuda_graphs`` when the model has a cliff;
* ``draft.<kind>`` over 1..``max_requests`` and 1..``max_draft_tokens``, when the
  drafter was fitted or given;
* ``prefill`` from the runs' TTFT (:func:`estimate_prefill`) or as given;
  ``scheduler`` as given (benchmark sweeps cannot see a scheduler's cost).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import lsq_linear

from calibration.fitting.model import CostModel
from calibration.fitting.pipeline import FitReport
from calibration.fitting.runs import ResultsError, StepObservation
from simulator.costs import profile_from_dict

FORMAT = "specsched-hardware-profile"
VERSION = 2
TOOL = "specsched 0.1.0 calibration.fit_profile"
MIN_DRAFT_S = 1e-9  # the format needs draft latencies > 0; a fitted 0 is written as 1 ns (and noted)


@dataclass(frozen=True)
class ExportOptions:
    device: str
    model: str
    gpus_per_replica: int = 1
    drafter_kind: str = "mtp"
    max_requests: int = 4096
    max_draft_tokens: int = 16
    max_context_tokens: int = 131072
    prefill: tuple[float, float] | None = None  # (fixed_s, tokens_per_s); None: from the runs' TTFT
    scheduler: tuple[float, float] = (0.0, 0.0)  # (fixed_s, per_candidate_s)
    created: str = field(default_factory=lambda: datetime.date.today().isoformat())


def estimate_prefill(observations: list[StepObservation]) -> tuple[float, float, str]:
    """(fixed_s, tokens_per_s, how): TTFT = fixed + prompt / tokens_per_s over the least loaded run of each prompt
    length (its TTFT has the least queueing); with one prompt length the split is unknown and all of it is
    charged per token."""
    with_ttft = [o for o in observations if o.run.mean_ttft_ms is not None]
    if not with_ttft:
        raise ResultsError("no run has 'mean_ttft_ms' (TTFT): pass --prefill FIXED_S,TOKENS_PER_S")
    by_prompt: dict[int, StepObservation] = {}
    for o in with_ttft:
        key = int(round(o.run.mean_prompt_tokens))
        if key not in by_prompt or o.num_requests < by_prompt[key].num_requests:
            by_prompt[key] = o
    prompts = np.array(sorted(by_prompt), dtype=np.float64)
    ttft_s = np.array([by_prompt[int(p)].run.mean_ttft_ms / 1e3 for p in prompts])
    if prompts.size < 2 or prompts[-1] / prompts[0] < 1.25:
        p, t = float(prompts.mean()), float(ttft_s.mean())
        return 0.0, p / t, (f"one prompt length (~{p:.0f} tokens): TTFT {1e3 * t:.3g} ms of the least loaded run "
                            "charged per prompt token (fixed part not identified)")
    result = lsq_linear(np.stack([np.ones_like(prompts), prompts], axis=1), ttft_s, bounds=(0.0, np.inf))
    fixed_s, per_token_s = (float(v) for v in result.x)
    if per_token_s <= 0:
        raise ResultsError("TTFT does not grow with prompt length across the runs; pass --prefill "
                           "FIXED_S,TOKENS_PER_S")
    return fixed_s, 1.0 / per_token_s, f"TTFT of the least loaded run at {prompts.size} prompt lengths"


def _draft_block(model: CostModel, theta: np.ndarray, opts: ExportOptions,
                 draft_cap: float | None = None) -> tuple[dict[str, Any], bool]:
    """``draft`` (empty without a drafter cost) and whether the 1 ns floor was applied; with ``draft_cap`` the
    fitted drafter's cost stays flat beyond that draft length."""
    if not model.fit_drafter and model.known_drafter is None:
        return {}, False
    reqs = np.array([1.0, float(opts.max_requests)])
    gammas = np.arange(1, opts.max_draft_tokens + 1, dtype=np.float64)
    r, g = np.meshgrid(reqs, gammas, indexing="ij")
    priced = g if draft_cap is None else np.minimum(g, draft_cap)
    latency = (model.value(theta, "draft_fixed_s") + model.value(theta, "draft_per_position_s") * priced
               + model.value(theta, "draft_per_token_s") * r * priced + model.value(theta, "draft_per_request_s") * r
               + model.known_s(r.ravel(), np.zeros(r.size), g.ravel()).reshape(r.shape))
    floored = bool(np.any(latency < MIN_DRAFT_S))
    latency = np.maximum(latency, MIN_DRAFT_S)
    table = {"num_requests": [int(x) for x in reqs], "draft_tokens": [int(x) for x in gammas],
             "latency_s": latency.tolist()}
    return {opts.drafter_kind: table}, floored


def _attention_block(model: CostModel, theta: np.ndarray, opts: ExportOptions) -> dict[str, Any] | None:
    per_token = (model.value(theta, "attention_s_per_context_token") if model.fit_attention
                 else model.known_attention_s_per_context_token)
    if per_token <= 0:
        return None
    top = per_token * opts.max_context_tokens
    return {"context_tokens": [0, opts.max_context_tokens], "query_tokens": [1, 1 + opts.max_draft_tokens],
            "per_request_s": [[0.0, 0.0], [top, top]]}


def profile_dict(model: CostModel, theta: np.ndarray, opts: ExportOptions, prefill: tuple[float, float],
                 metadata_extra: dict[str, Any], draft_cap: float | None = None) -> dict[str, Any]:
    """One profile (version 2) from one parameter vector (the drafter flat beyond ``draft_cap``, when given)."""
    # Every parameter is >= 0; a bounded solver may return -1e-36 for one held at its bound, which the format
    # would refuse as a negative cost.
    theta = np.maximum(theta, 0.0)
    per_request = model.value(theta, "per_request_s")
    draft, floored = _draft_block(model, theta, opts, draft_cap)
    metadata = {"source": "fitted", "device": opts.device, "model": opts.model, "created": opts.created,
                "tool": TOOL, **metadata_extra}
    if floored:
        metadata["draft_floor_note"] = "a fitted drafter latency of 0 is written as 1 ns (the format needs > 0)"
    out: dict[str, Any] = {
        "format": FORMAT, "version": VERSION, "metadata": metadata, "gpus_per_replica": opts.gpus_per_replica,
        "verify": {"batch_tokens": [int(round(k)) for k in model.knots_tokens],
                   "step_s": model.dense_values(theta).tolist(),
                   **({"draft_token_s": model.value(theta, "verify_draft_token_s")} if model.fit_drafter else {})},
        "per_request": {"num_requests": [1, opts.max_requests],
                        "step_s": [per_request, per_request * opts.max_requests]},
    }
    attention = _attention_block(model, theta, opts)
    if attention is not None:
        out["attention"] = attention
    if model.max_captured_tokens is not None:
        out["cuda_graphs"] = {"max_captured_tokens": int(model.max_captured_tokens),
                              "eager_overhead_s": model.value(theta, "eager_s")}
    out["draft"] = draft
    out["prefill"] = {"fixed_s": prefill[0], "tokens_per_s": prefill[1]}
    out["scheduler"] = {"fixed_s": opts.scheduler[0], "per_candidate_s": opts.scheduler[1]}
    return out


def _residuals(report: FitReport) -> list[dict[str, Any]]:
    predicted = report.model.predict_s(report.central, *(
        np.array([getattr(o, k) for o in report.observations], dtype=np.float64)
        for k in ("num_requests", "batch_tokens", "context_tokens", "num_draft_tokens")))
    return [{"source": o.run.source, "row": o.run.row, "config": o.run.config_label, "load": o.run.load_label,
             "num_requests": round(o.num_requests, 3), "batch_tokens": round(o.batch_tokens, 3),
             "context_tokens": round(o.context_tokens, 1), "step_s": o.step_s, "predicted_s": float(p),
             "error_pct": round(100 * (float(p) / o.step_s - 1), 3)}
            for o, p in zip(report.observations, predicted, strict=True)]


def fit_metadata(report: FitReport, prefill_how: str) -> dict[str, Any]:
    """``metadata.fit`` without the alternatives."""
    ident = report.identification
    central = dict(zip([n for n, _ in report.model.quantities()],
                       (float(v @ report.central) for _, v in report.model.quantities()), strict=True))
    return {
        "runs": len(report.runs), "files": sorted({r.source for r in report.runs}),
        "noise": report.fit.noise, "delta_chi2": ident.delta_chi2, "prior": report.prior_label,
        "rms_error_pct": round(100 * float(np.sqrt(np.mean(report.central_errors ** 2))), 3),
        "cliff": None if report.cliff is None else {"max_captured_tokens": report.cliff.max_captured_tokens,
                                                    "between_tokens": [report.cliff.low_tokens,
                                                                       report.cliff.high_tokens]},
        "parameters": [{"name": r.name, "value": central[r.name], "best_fit": r.best, "low": r.low, "high": r.high,
                        "status": r.status, "reason": r.reason} for r in ident.ranges],
        "null_directions": ident.null_directions, "prefill": prefill_how, "notes": report.notes,
        "residuals": _residuals(report),
    }


def profiles(report: FitReport, opts: ExportOptions) -> dict[str, Any]:
    """The central profile with its alternatives in ``metadata.fit.alternatives``."""
    if opts.prefill is not None:
        prefill, how = opts.prefill, "given (--prefill)"
    else:
        fixed_s, tokens_per_s, how = estimate_prefill(report.observations)
        prefill = (fixed_s, tokens_per_s)
    meta = fit_metadata(report, how)
    meta["alternatives"] = {}
    for name, alt in report.alternatives.items():
        cap = alt.draft_cap if alt.draft_cap is not None and opts.max_draft_tokens > alt.draft_cap else None
        if cap is None and np.array_equal(alt.theta, report.central):
            continue  # the central profile again (the drafter held flat where the tables have ended already)
        meta["alternatives"][name] = profile_dict(report.model, alt.theta, opts, prefill,
                                                  {"fit": {"alternative": name}}, cap)
    for name, alternative in meta["alternatives"].items():
        profile_from_dict(alternative, f"<fitted alternative {name}>")  # never write what the simulator refuses
    central = profile_dict(report.model, report.central, opts, prefill, {"fit": meta})
    profile_from_dict(central, "<fitted profile>")
    return central
