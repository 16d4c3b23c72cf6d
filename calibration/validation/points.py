"""One point of a validation from its slices: pooled, corrected for the machine's drift, with its spread and the
cost model's own error (see :func:`point_result`)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from calibration.profiling.step_prices import step_cost_ratio
from calibration.validation.passes import profile_price_se
from calibration.validation.report import (
    STEADY_MAX_REFUSED_SHARE,
    TARGET_METRICS,
    kept_slices,
    mean_context_tokens,
    point_row,
    pooled_summary,
    sampling_se,
    slice_intervals,
    too_many_refused,
)
from calibration.validation.setup import ValidationConfig
from policies import make_policy
from simulator.costs import HardwareProfile


def drift_weight(drifts: np.ndarray, before_s: np.ndarray, after_s: np.ndarray,
                 reference_s: np.ndarray | None = None) -> float:
    """How much of the measured drift a run corrects for: ``1 - noise / mean(drifts**2)``, at least 0, where
    ``noise`` is what the reference probe's own error adds to a slice's drift: the mean square of each slice's
    half-difference between its probe before and after, over their mean (``before_s``, ``after_s``: every slice's
    timings), plus the variance of the profiling-time reference itself - the spread of the profile passes' probe
    means (``reference_s``) over their number, or the slices' figure when there is one pass. The probe reads the
    machine with an error of its own (the state left by what ran before it: 1-2% on the idle 2-core machine,
    about as much as the machine drifted there), and scaling a slice by that error adds it to the point's error;
    on a loaded machine the drift dwarfs it and the weight comes near 1. 0 without drift."""
    drifts, before_s, after_s = (np.asarray(a, dtype=np.float64) for a in (drifts, before_s, after_s))
    signal = float(np.mean(drifts ** 2)) if drifts.size else 0.0
    if signal == 0.0:
        return 0.0
    noise = float(np.mean(((after_s - before_s) / (after_s + before_s)) ** 2)) if before_s.size else 0.0
    refs = np.asarray(reference_s if reference_s is not None else [], dtype=np.float64)
    reference_var = (float(np.var(refs / refs.mean(), ddof=1)) / refs.size if refs.size > 1 else noise)
    return max(0.0, 1.0 - (noise + reference_var) / signal)


def drift_readings(probes: pd.DataFrame, measure: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What :func:`drift_weight` reads from a run's probe log (``calibration.validation.validate.PROBE_COLUMNS``):
    each slice's two readings and the profile passes' means. ``probe``: the probe timed before and after; ``meter``:
    the meter's mean -+ its standard error (so that their half-difference is the mean's error)."""
    slices, passes = probes[probes["phase"] == "slice"], probes[probes["phase"] == "profile"]
    if measure == "meter":
        unread = probes[probes["meter_s"].isna() | probes["meter_se_s"].isna()]
        if len(unread):
            row = unread.iloc[0]
            raise ValueError(f"the speed meter read the {row['phase']} of round {row['round']} "
                             f"({row['policy'] or 'profile pass'}, {row['num_users']} users) only "
                             f"{row['meter_readings']} times (needs 20 for its error): lengthen --duration-s")
        mean_s, se_s = slices["meter_s"].to_numpy(), slices["meter_se_s"].to_numpy()
        return mean_s - se_s, mean_s + se_s, passes["meter_s"].to_numpy()
    return (slices["before_s"].to_numpy(), slices["after_s"].to_numpy(),
            0.5 * (passes["before_s"] + passes["after_s"]).to_numpy())


def slice_drifts(before_s: np.ndarray, after_s: np.ndarray, pass_s: np.ndarray) -> np.ndarray:
    """Each slice's drift: the mean of its two readings against the median of the profile passes' readings."""
    return 0.5 * (np.asarray(before_s) + np.asarray(after_s)) / np.median(pass_s) - 1


def kept_passes(pass_s: np.ndarray, tolerance: float) -> list[int]:
    """The profile passes the machine's drift did not spoil (0-based, in order): those whose reading (``pass_s``,
    :func:`drift_readings`) lies within ``tolerance`` of the passes' median - the reference the slices are screened
    against - as a slice must to be kept. A pass measured while the machine ran slow prices every point's steps
    dear. Every pass when fewer than two would be left: their spread then tells how unsteady the machine was."""
    drifts = np.asarray(pass_s, dtype=np.float64) / np.median(pass_s) - 1
    kept = [k for k, d in enumerate(drifts) if abs(d) <= tolerance]
    return kept if len(kept) >= 2 else list(range(drifts.size))


def drift_factor(real_tps: np.ndarray, corrected: np.ndarray) -> float:
    """What a point's real figures are scaled by: each kept slice's ``1 + corrected`` (its weighted drift),
    weighted by the slice's real throughput ``real_tps``, as the point pools its slices."""
    real_tps = np.asarray(real_tps, dtype=np.float64)
    return float(np.sum(real_tps * (1 + np.asarray(corrected))) / np.sum(real_tps))


def drift_correction(drifts: np.ndarray, before_s: np.ndarray, after_s: np.ndarray, pass_s: np.ndarray,
                     tolerance: float, reference: str) -> tuple[np.ndarray, float]:
    """Each slice's drift to correct its real figures for, and the share of it corrected (:func:`drift_weight`).

    ``passes``: the drifts the refusal screens (:func:`slice_drifts`: against the profile passes' median reading).
    ``slices``: against the mean reading of the slices within ``tolerance`` of the passes, so that only a slice's
    departure from the run's own level is corrected. A run profiles and serves in alternating rounds, so a change
    of the machine's speed that lasts reaches the passes' price as it reaches the slices; what the probe reads
    between the two phases on average is mostly its own context (what ran just before it: a profile pass or a
    serving slice), and on the 2-core machines it did not carry to the served steps (``docs/validation.md``)."""
    if reference == "passes":
        return drifts, drift_weight(drifts, before_s, after_s, pass_s)
    readings = 0.5 * (np.asarray(before_s, dtype=np.float64) + np.asarray(after_s, dtype=np.float64))
    kept = np.abs(drifts) <= tolerance
    level = readings[kept] if kept.any() else readings
    centred = readings / level.mean() - 1
    return centred, drift_weight(centred, before_s, after_s, level)


def reference_range(pass_s: np.ndarray, total_passes: int) -> tuple[float, float]:
    """The values the final drift reference (the median of every profile pass's reading) can still take when only
    ``pass_s`` of ``total_passes`` passes have run: lowest with every later pass reading 0, highest with every
    later one reading without bound (the median moves continuously between them). One value once all have run."""
    later = total_passes - len(pass_s)
    return (float(np.median(np.concatenate([pass_s, np.zeros(later)]))),
            float(np.median(np.concatenate([pass_s, np.full(later, np.inf)]))))


def least_refused(slice_s: np.ndarray, point_ids: np.ndarray, pass_s: np.ndarray, total_passes: int,
                  tolerance: float, rounds: int) -> tuple[int, bool, bool]:
    """What the slices served so far (their readings ``slice_s``, ``point_ids`` naming each one's point) already
    decide, whatever the later profile passes read: the fewest slices any reachable reference refuses, whether
    every reachable reference leaves some point below half its ``rounds`` slices, and whether every reachable
    reference makes the run unsteady (more than :data:`STEADY_MAX_REFUSED_SHARE` of the whole run refused, or such
    a point; every later slice assumed kept). A slice's kept set in the reference is a closed interval, so
    checking the range's ends and every interval end inside it is exact."""
    low, high = reference_range(pass_s, total_passes)
    ends = np.concatenate([slice_s / (1 + tolerance), slice_s / (1 - tolerance) if tolerance < 1 else []])
    refs = np.unique(np.concatenate([[low, high], ends[(ends >= low) & (ends <= high)]]))
    with np.errstate(divide="ignore"):
        drifts = slice_s[None, :] / refs[:, None] - 1  # [reference, slice]
    refused = np.abs(drifts) > tolerance * (1 + 1e-9)  # an interval's own end keeps its slice despite rounding
    per_point = np.stack([refused[:, point_ids == p].sum(axis=1) for p in np.unique(point_ids)], axis=1)
    whole_run = len(np.unique(point_ids)) * rounds
    point_lost = 2 * (rounds - per_point.max(axis=1)) < rounds  # kept_slices' spoiled rule
    unsteady = np.array([too_many_refused(int(n), whole_run) for n in refused.sum(axis=1)]) | point_lost
    return int(refused.sum(axis=1).min()), bool(point_lost.all()), bool(unsteady.all())


def round_progress(probes: pd.DataFrame, cfg: ValidationConfig, rounds_done: int,
                   most_rounds: int | None = None) -> tuple[str, bool]:
    """A progress line after a round of a validation, and whether the slices so far already decide a ``MACHINE
    NOT STEADY`` report. The line says how many of the slices served so far drifted beyond ``cfg.drift_tolerance``
    from the profile passes so far (provisional: the final screening measures against every pass), and, once
    that share exceeds :data:`STEADY_MAX_REFUSED_SHARE`, that the run is heading for the verdict, so that the user
    can stop early instead of waiting for a table of spoiled points. The verdict is decided when it follows
    whatever the later profile passes read (:func:`least_refused`); ``cfg.stop_when_unsteady`` stops the run
    then. After one pass the reference can still move anywhere, so only slices that disagree with each other
    decide it. ``most_rounds`` (default ``cfg.rounds``): the most rounds the run may still reach (``--max-rounds``
    can add some); the verdict is decided only if it holds at that many, since every added round adds a pass and a
    slice to each point."""
    before_s, after_s, pass_s = drift_readings(probes, cfg.drift_measure)
    if not before_s.size or not pass_s.size:
        return f"round {rounds_done}/{cfg.rounds}: no slice served yet", False
    drifts = slice_drifts(before_s, after_s, pass_s)
    kept, _ = kept_slices(drifts, cfg.drift_tolerance)
    beyond = drifts.size - len(kept)
    text = (f"round {rounds_done}/{cfg.rounds}: {beyond} of {drifts.size} slices so far beyond "
            f"+-{100 * cfg.drift_tolerance:g}% of the profile passes' speed "
            f"(drift {100 * drifts.min():+.0f}% .. {100 * drifts.max():+.0f}%)")
    slices = probes[probes["phase"] == "slice"]
    point_ids = pd.factorize(pd.MultiIndex.from_frame(slices[["policy", "num_users"]]))[0]
    most = most_rounds if most_rounds is not None else cfg.rounds
    whole_run = drifts.size // rounds_done * most
    least, point_lost, decided = least_refused(0.5 * (before_s + after_s), point_ids, pass_s,
                                                1 if cfg.profile is not None else most, cfg.drift_tolerance, most)
    if too_many_refused(beyond, drifts.size) or decided:
        text += (f"; more than {100 * STEADY_MAX_REFUSED_SHARE:g}% refused makes the report MACHINE NOT STEADY: "
                 "the machine is unsteady now" + (", stopping and rerunning on a quiet machine saves the wait"
                                                  if rounds_done < cfg.rounds else ""))
    if decided:
        text += (f" (already decided, whatever the later profile passes read: at least {least} of the run's "
                 f"{whole_run} slices refused"
                 + (", a point left with fewer than half its slices" if point_lost else "") + ")")
    return text, decided


def point_result(cfg: ValidationConfig, point: tuple[str, int], sims: list[list[Any]], reals: list[Any],
                 drifts: np.ndarray, profile: HardwareProfile, weight: float = 1.0,
                 passes: Sequence[HardwareProfile] = (), corrections: np.ndarray | None = None) -> dict[str, Any]:
    """A point's row, corrected for the machine's drift: slice k of the real loop ran ``1 + corrections[k]`` times
    as slow as the machine's reference speed (default ``drifts``; see :func:`drift_correction`; across slices the
    simulator's error follows it with a slope near 1), so its throughput and tok/s/user are scaled by
    ``1 + weight * corrections[k]`` (``weight``: the share of the drift the probe can tell from its own noise,
    :func:`drift_weight`; ``*_err`` corrected, ``*_err_raw`` as measured). ``sims[k]``: the simulator's runs of
    slice k (its acceptance draws), pooled. A slice whose ``drifts[k]`` (against the profile passes) is beyond
    ``cfg.drift_tolerance`` is refused (slice k of the simulator goes
    with it); fewer than half the slices kept: the point is not reported (its errors NaN, ``spoiled``).

    Every slice of the simulator prices with the same combined profile, so the spread over slices
    (``<metric>_slice_ci``) leaves out the profile's own error, which each rerun draws anew: ``<metric>_ci`` adds
    it in quadrature, a Student-t interval on :func:`profile_price_se` over the profile ``passes`` (a price off by
    x% moves the simulator's throughput and tok/s/user by about x%)."""
    kept, spoiled = kept_slices(drifts, cfg.drift_tolerance)
    use = kept if kept else list(range(len(drifts)))
    row = point_row(*point, pooled([run for k in use for run in sims[k]]), pooled([reals[k] for k in use]),
                    float(np.mean(drifts[use])))
    real_tps = np.array([reals[k].summary["output_tokens_per_s"] for k in use])
    corrected = weight * (drifts if corrections is None else corrections)[use]
    factor = drift_factor(real_tps, corrected)
    for name in TARGET_METRICS:
        row[f"{name}_real_raw"], row[f"{name}_err_raw"] = row[f"{name}_real"], row[f"{name}_err"]
        row[f"{name}_real"] *= factor
        row[f"{name}_err"] = row[f"{name}_sim"] / row[f"{name}_real"] - 1
    row.update(slices_kept=len(kept), slices=len(drifts), max_abs_drift=float(np.abs(drifts).max()),
               spoiled=spoiled, drift_factor=factor, drift_weight=weight)
    row.update(slice_intervals([slice_summary(sims[k]) for k in use], [reals[k].summary for k in use], corrected))
    # the error's standard error from request sampling alone (acceptance differs from request to request, and
    # sim and real serve different texts), from the spread of the simulator's acceptance draws
    draws = [pooled_summary([sims[k][r] for k in use])["tokens_per_s_per_user"]["mean"]
             for r in range(len(sims[use[0]]))]
    row["tpu_mean_sampling_se"] = sampling_se([np.nan if d is None else d for d in draws])
    ratio = _step_cost_ratio(cfg, point[0], [reals[k] for k in use])
    row["step_cost_ratio"] = ratio(profile=profile)
    pass_ratios = np.array([ratio(profile=p) for p in passes])
    row["profile_price_se"] = profile_price_se(pass_ratios, cfg.combine_passes)
    # measured over the passes' mean price (a median leaves out slow spells that the real slices pay)
    row["step_cost_ratio_passes_mean"] = float(1.0 / np.mean(1.0 / pass_ratios)) if pass_ratios.size else np.nan
    for name in TARGET_METRICS:
        row[f"{name}_slice_ci"] = row[f"{name}_ci"]
        if np.isfinite(row["profile_price_se"]):
            profile_ci = stats.t.ppf(0.975, len(passes) - 1) * row["profile_price_se"]
            row[f"{name}_ci"] = float(np.hypot(row[f"{name}_slice_ci"], profile_ci))
    if row["spoiled"]:
        row.update({key: float("nan") for key in row if key.endswith("_err")})
    return row


def _step_cost_ratio(cfg: ValidationConfig, policy_name: str, reals: Sequence[Any]) -> partial[float]:
    """``ratio(profile=p)``: the real steps of ``reals`` (a point's slices) measured over their price under ``p``."""
    policy = make_policy(policy_name)
    return partial(step_cost_ratio, [real.steps for real in reals], drafter=cfg.drafter, policy=policy.name,
                   draft_tokens=policy.draft_tokens(cfg.gamma), warmup_s=cfg.warmup_s,
                   synchronous=policy.synchronous, chunks=[real.chunks for real in reals])


def run_price_se(cfg: ValidationConfig, reals: dict[tuple[str, int], list[Any]],
                 passes: Sequence[HardwareProfile]) -> float:
    """The mean over points of :func:`~calibration.validation.passes.profile_price_se`: how far the combination of
    ``passes`` can be off in pricing each point's real slices so far (every slice, none refused yet: the final
    table screens them; NaN with fewer than two passes). What ``cfg.max_rounds`` reads after each round."""
    ses = [profile_price_se([ratio(profile=p) for p in passes], cfg.combine_passes)
           for ratio in (_step_cost_ratio(cfg, name, slices) for (name, _), slices in reals.items() if slices)]
    finite = [se for se in ses if np.isfinite(se)]
    return float(np.mean(finite)) if finite else float("nan")


def slice_summary(runs: list[Any]) -> dict[str, Any]:
    """One slice's summary from the simulator's runs of it (its acceptance draws), pooled when there are several."""
    return runs[0].summary if len(runs) == 1 else pooled_summary(runs)


def pooled(slices: list[Any]) -> dict[str, Any]:
    summary = dict(slices[0].summary) if len(slices) == 1 else pooled_summary(slices)
    summary["mean_context_tokens"] = mean_context_tokens(slices)
    summary["device_busy_fraction"] = device_busy_fraction(slices)
    return summary


def device_busy_fraction(slices: Sequence[Any]) -> float:
    """The share of the runs' measurement windows that the decode device spent in steps (the steps that end in a
    window, from the window's start on, over the windows' total length). The rest is waiting: for prefills, and in
    the real loop also the work between one request's last step and the next one's first, which the simulator does
    not price."""
    busy_s = window_s = 0.0
    for part in slices:
        start_at, end_at = part.summary["window_start_at"], part.summary["window_end_at"]
        steps = part.steps[(part.steps["end_at"] > start_at) & (part.steps["end_at"] <= end_at)]
        busy_s += float((steps["end_at"] - steps["start_at"].clip(lower=start_at)).sum())
        window_s += end_at - start_at
    return busy_s / window_s if window_s > 0 else float("nan")
