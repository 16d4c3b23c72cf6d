"""The fit's report in words: per-run residuals, every parameter's range and status, and what is not identified.

Pure functions from a :class:`~calibration.fitting.pipeline.FitReport` to text;
the command prints them.
"""

from __future__ import annotations

import numpy as np

from calibration.fitting.identify import ParameterRange
from calibration.fitting.pipeline import DRAFT_BEYOND_DATA, FitReport, config_counts
from calibration.fitting.runs import StepObservation


def _time(seconds: float) -> str:
    if seconds == 0:
        return "0"
    magnitude = abs(seconds)
    if magnitude >= 1e-3:
        return f"{seconds * 1e3:.4g} ms"
    if magnitude >= 1e-6:
        return f"{seconds * 1e6:.4g} us"
    return f"{seconds * 1e9:.4g} ns"


def _value(name: str, seconds: float) -> str:
    if name == "attention_s_per_context_token":
        return f"{_time(seconds)}/ctx token"
    return _time(seconds)


# how each --step reads a run's mean step time (calibration.fitting.runs)
STEP_SOURCES = {"tpot": "TPOT x tokens per step, less the last step's overshoot", "itl": "mean ITL"}


def residual_table(report: FitReport) -> str:
    errors = report.central_errors
    predicted = [o.step_s * (1 + e) for o, e in zip(report.observations, errors, strict=True)]
    measured = STEP_SOURCES[report.step]
    lines = [f"residuals (model vs measured mean step time = {measured}):",
             f"  {'run':<34} {'config':<9} {'load':<10} {'R':>7} {'B':>7} {'ctx':>7} {'step':>10} {'model':>10} "
             f"{'error':>7}"]
    for o, p, e in zip(report.observations, predicted, errors, strict=True):
        where = f"{o.run.source.split('/')[-1]}:{o.run.row}"
        lines.append(f"  {where:<34} {o.run.config_label:<9} {o.run.load_label:<10} {o.num_requests:7.2f} "
                     f"{o.batch_tokens:7.1f} {o.context_tokens:7.0f} {_time(o.step_s):>10} {_time(p):>10} "
                     f"{100 * e:+6.2f}%")
    worst = int(np.argmax(np.abs(errors)))
    lines.append(f"  RMS {100 * np.sqrt(np.mean(errors ** 2)):.2f}%, worst {100 * errors[worst]:+.2f}% "
                 f"({report.observations[worst].run.where})")
    return "\n".join(lines)


def parameter_table(report: FitReport) -> str:
    ident = report.identification
    central = {name: float(vec @ report.central) for name, vec in report.model.quantities()}
    lines = [f"identifiability (fits within chi-square +{ident.delta_chi2:g} of the best, at "
             f"{100 * report.fit.noise:.2g}% noise per run):",
             f"  {'parameter':<32} {'value':>16} {'range of equally good fits':>34}  status"]
    for r in ident.ranges:
        span = ("-" if r.status == "extrapolated" and r.low == r.high else
                f"{_value(r.name, r.low)} .. {_value(r.name, r.high)}")
        lines.append(f"  {r.name:<32} {_value(r.name, central[r.name]):>16} {span:>34}  {r.status}")
    return "\n".join(lines)


def _split_words(ranges: dict[str, ParameterRange], direction: dict[str, float]) -> str:
    """A null direction in plain words when it is one of the known splits."""
    names = set(direction)
    dense = any(n.startswith("dense_") for n in names)
    if "draft_per_token_s" in names:
        return ("the drafter's cost per drafted token vs the target's cost per verified token (and per request): "
                "runs that verify every drafted token cannot tell them apart; static-k predictions do not depend on "
                "the split, steps that verify fewer tokens than they draft (greedy, dspark) do")
    if "per_request_s" in names and dense:
        return ("per-request vs per-token cost: without runs that change the batch tokens per request (speculation "
                "at different k), cost per request and cost per batch token explain the runs equally well")
    if "per_request_s" in names and "attention_s_per_context_token" in names:
        return "per-request vs per-context-token cost: the runs' contexts do not vary enough to separate them"
    if "draft_fixed_s" in names and "draft_per_position_s" in names:
        return "the drafter's fixed vs per-position cost: every speculative run drafts the same k"
    if "eager_s" in names:
        return "the eager (cliff) cost vs the dense curve above the cliff"
    return "a mix of " + ", ".join(sorted(names))


def _draft_beyond_lines(report: FitReport) -> list[str]:
    if report.draft_tokens_fitted is None:
        return []
    return [f"  - beyond the largest draft length any run used (k={report.draft_tokens_fitted}) the drafter's cost per "
            "position is carried on linearly (as a sequential drafter pays it); a parallel drafter may cost almost "
            f"nothing more there, so {DRAFT_BEYOND_DATA} carries it flat (the cheap end; --drafter-kind eagle3 or "
            "mtp says the drafter is sequential)"]


def unidentified_words(report: FitReport) -> str:
    ident = report.identification
    ranges = {r.name: r for r in ident.ranges}
    loose = [r for r in ident.ranges if r.status in ("not identified", "poorly identified")]
    if not loose and not ident.null_directions:
        return "\n".join(["every parameter the runs touch is identified.", *_draft_beyond_lines(report),
                          *_extremes_lines(report), *_carried_lines(report)])
    lines = ["what the runs cannot pin down:"]
    for words in dict.fromkeys(_split_words(ranges, d) for d in ident.null_directions):  # once per kind of split
        lines.append(f"  - {words}")
    for r in loose:
        if r.dense:
            continue
        lines.append(f"  - {r.name} {r.status}: {r.reason}; equally good fits range from {_value(r.name, r.low)} "
                     f"to {_value(r.name, r.high)}")
    dense = [r.name for r in loose if r.dense]
    if dense:
        lines.append(f"  - the dense curve moves with them at {len(dense)} knot(s): {', '.join(dense)}")
    extrapolated = [r.name for r in ident.ranges if r.status == "extrapolated"]
    if extrapolated:
        lines.append(f"  - set by no run (smooth continuation or given): {', '.join(extrapolated)}")
    beyond = [r for r in ident.ranges if r.status == "extrapolated" and r.low < r.high]
    if beyond:
        lines.append(f"  - beyond the largest batch any run reaches ({beyond[0].name} and up): the curve may stay flat "
                     "or grow up to in proportion to the batch; both ends are carried forward")
    return "\n".join(lines + _draft_beyond_lines(report) + _extremes_lines(report) + _carried_lines(report))


def _extremes_lines(report: FitReport) -> list[str]:
    probes = sorted({name.rsplit(".", 1)[0] for name in report.extremes})
    if not probes:
        return []
    return [f"  - jointly: for {len(probes)} probe step(s) of R requests drafting k tokens each and verifying all "
            f"or one ({', '.join(probes)}), the fits that price them cheapest and dearest, each with the "
            "extrapolations beyond the runs at the matching end (drafter and dense curve flat, or carried on)"]


def _carried_lines(report: FitReport) -> list[str]:
    alternatives = list(report.alternatives)
    if not alternatives:
        return []
    return [f"carried forward as {len(alternatives)} alternative profiles ({', '.join(alternatives)}); "
            "experiments.run simulates them too and reports *_low / *_high"]


def full_report(report: FitReport) -> str:
    model = report.model
    parts = [f"{len(report.runs)} runs from {len({r.source for r in report.runs})} file(s) "
             f"({config_counts(report.runs)}); dense curve over {model.num_dense} knots "
             f"{model.knots_tokens[0]:g}..{model.knots_tokens[-1]:g} batch tokens"
             + (f"; prior: {report.prior_label}" if report.prior_label else ""),
             residual_table(report), parameter_table(report), unidentified_words(report)]
    if report.notes:
        parts.append("notes:\n" + "\n".join(f"  - {n}" for n in report.notes))
    return "\n\n".join(parts)


def check_table(report: FitReport, observations: list[StepObservation]) -> str:
    """Runs left out of the fit against the fitted profile's prediction of their step time (hence TPOT, at their
    own measured batch and acceptance length), with the interval over the alternatives."""
    model = report.model
    arrays = [np.array([getattr(o, k) for o in observations], dtype=np.float64)
              for k in ("num_requests", "batch_tokens", "context_tokens", "num_draft_tokens")]
    fits = [(report.central, None)] + [(a.theta, a.draft_cap) for a in report.alternatives.values()]
    predicted = np.array([model.predict_s(theta, *arrays, draft_cap=cap) for theta, cap in fits])  # [fits, runs]
    lines = ["held-out runs (not fitted): time per token (step time / tokens per step) predicted at the run's own "
             "batch and acceptance length",
             f"  {'run':<34} {'config':<9} {'load':<10} {'measured':>10} {'predicted [interval]':>32} {'error':>7}"]
    errors = []
    for i, o in enumerate(observations):
        tpot = o.step_s / o.tokens_per_step
        central, low, high = (v / o.tokens_per_step for v in (predicted[0, i], predicted[:, i].min(),
                                                              predicted[:, i].max()))
        error = central / tpot - 1
        errors.append(error)
        covered = " (covered)" if low <= tpot <= high and len(fits) > 1 else ""
        where = f"{o.run.source.split('/')[-1]}:{o.run.row}"
        interval = f"{_time(central)} [{_time(low)}, {_time(high)}]"
        lines.append(f"  {where:<34} {o.run.config_label:<9} {o.run.load_label:<10} {_time(tpot):>10} "
                     f"{interval:>32} {100 * error:+6.2f}%{covered}")
    err = np.abs(np.array(errors))
    lines.append(f"  mean |error| {100 * err.mean():.2f}%, worst {100 * err.max():.2f}%")
    return "\n".join(lines)
