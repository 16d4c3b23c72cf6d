"""Prediction intervals from a fitted profile's alternatives (``metadata.fit.alternatives``).

A profile fitted from benchmark results (``python -m calibration.fit_profile``)
carries, for every parameter the results could not pin down, the fits at both
ends of the range that explains them equally well. :func:`with_intervals`
simulates the same spec with each alternative and adds, for every headline
metric of the summary, ``<metric>_low`` and ``<metric>_high``: the smallest and
largest value over the profile and its alternatives (for a metric with
statistics, such as ``tokens_per_s_per_user``, per statistic). The point value
stays the central profile's; ``interval_profiles`` names the alternatives.
:func:`draw_intervals` puts the interval on a frontier figure as error bars.
Profiles without alternatives leave the summary as it is.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pandas as pd
from joblib import Parallel, delayed
from joblib.parallel import get_active_backend

from simulator import Results, SimulationSpec, simulate
from simulator.costs import HardwareProfile, profile_from_dict

if TYPE_CHECKING:  # matplotlib only types the collect side; a run must not pay its import
    from matplotlib.axes import Axes

METRICS = ("output_tokens_per_s", "output_tokens_per_s_per_gpu", "tokens_per_s_per_user", "ttft_s", "tpot_s",
           "e2e_s", "mean_acceptance_length", "verification_budget_per_request", "mean_batch_tokens")
# Below this many seconds of alternatives in one process, starting processes costs more than it saves: on a
# 2-core machine two workers took 3.5 s to start (importing the simulator); 19 alternatives of 0.3 s ran in 8.5 s
# in one process and in 10.3 s in two, 13 of 1.3 s in 22 s and in 18 s (whole experiments.run commands).
PROCESSES_FROM_S = 10.0
STATISTIC_METRICS = ("tokens_per_s_per_user", "ttft_s", "tpot_s", "e2e_s")  # summary dicts of statistics


def alternative_profiles(profile: HardwareProfile) -> dict[str, HardwareProfile]:
    """The alternative profiles a fitted profile carries (empty for any other profile)."""
    fit = profile.metadata.get("fit")
    alternatives = fit.get("alternatives") if isinstance(fit, dict) else None
    if not alternatives:
        return {}
    return {name: profile_from_dict(data, f"{profile.path} (metadata.fit.alternatives.{name})")
            for name, data in alternatives.items()}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _span(values: list[Any]) -> tuple[Any, Any]:
    """(low, high) of numbers; None when any value is missing (a statistic some run could not compute)."""
    if not all(_number(v) for v in values):
        return None, None
    return min(values), max(values)


def interval_keys(central: dict[str, Any], others: list[dict[str, Any]]) -> dict[str, Any]:
    """``<metric>_low`` / ``<metric>_high`` over ``central`` and ``others`` for the metrics in :data:`METRICS`."""
    out: dict[str, Any] = {}
    for key in METRICS:
        if key not in central:
            continue
        value = central[key]
        if isinstance(value, dict):
            spans = {stat: _span([value[stat], *(o[key].get(stat) for o in others)]) for stat in value
                     if stat != "num"}  # a count of requests has no interval
            out[f"{key}_low"] = {stat: low for stat, (low, _) in spans.items()}
            out[f"{key}_high"] = {stat: high for stat, (_, high) in spans.items()}
        else:
            out[f"{key}_low"], out[f"{key}_high"] = _span([value, *(o[key] for o in others)])
    return out


def _summary(spec: SimulationSpec, run: Callable[[SimulationSpec], Results]) -> dict[str, Any]:
    return run(spec).summary  # a worker sends back the summary alone, not the tables


def with_intervals(spec: SimulationSpec, results: Results, run: Callable[[SimulationSpec], Results] = simulate,
                   jobs: int = 1, central_s: float | None = None) -> Results:
    """``results`` of ``spec`` with ``*_low`` / ``*_high`` over the profile's alternatives (unchanged without),
    simulated ``jobs`` at a time (joblib processes; -1: one per CPU). They run one after another in this process
    instead when ``central_s`` (the wall seconds ``results`` took) times their number is below
    :data:`PROCESSES_FROM_S`, and inside a job of a parallel sweep (Hydra's joblib launcher: its processes already
    fill the CPUs).
    The same figures either way: each simulation is seeded by its spec."""
    alternatives = alternative_profiles(spec.profile)
    if not alternatives:
        return results
    specs = [dataclasses.replace(spec, profile=profile) for profile in alternatives.values()]
    short = central_s is not None and central_s * len(specs) < PROCESSES_FROM_S
    if jobs == 1 or short or get_active_backend()[0].nesting_level > 0:
        others = [_summary(s, run) for s in specs]
    else:
        others = Parallel(n_jobs=jobs)(delayed(_summary)(s, run) for s in specs)
    summary = {**results.summary, **interval_keys(results.summary, others),
               "interval_profiles": sorted(alternatives)}
    return dataclasses.replace(results, summary=summary)


def interval_text(summary: dict[str, Any]) -> str:
    """Lines for the printed summary: the headline metrics' intervals ("" without alternatives)."""
    if "interval_profiles" not in summary:
        return ""
    rows = [("throughput", "output_tokens_per_s", None, 1.0, "tok/s"),
            ("tok/s/user mean", "tokens_per_s_per_user", "mean", 1.0, "tok/s"),
            ("TPOT mean", "tpot_s", "mean", 1e3, "ms")]
    lines = [f"\nprediction interval over the fitted profile's {len(summary['interval_profiles'])} alternatives "
             f"({', '.join(summary['interval_profiles'])}):"]
    for label, key, stat, scale, unit in rows:
        low, high = summary.get(f"{key}_low"), summary.get(f"{key}_high")
        if stat is not None:
            low, high = (low or {}).get(stat), (high or {}).get(stat)
        if low is not None and high is not None:
            lines.append(f"  {label:<22} {scale * low:.1f} .. {scale * high:.1f} {unit}")
    return "\n".join(lines)


def draw_intervals(ax: Axes, sweep: pd.DataFrame, x: str = "tokens_per_s_per_user_mean",
                   y: str = "output_tokens_per_s_per_gpu") -> bool:
    """Error bars from ``<x>``/``<y>`` low-high columns of a sweep table (``_flatten`` names a statistic's bounds
    ``tokens_per_s_per_user_low_mean``); returns whether there were any."""
    x_low, x_high = _bound_columns(x)
    y_low, y_high = f"{y}_low", f"{y}_high"
    needed = (x_low, x_high, y_low, y_high)
    if not all(c in sweep.columns for c in needed):
        return False
    rows = sweep.dropna(subset=list(needed))
    if rows.empty:
        return False
    ax.errorbar(rows[x], rows[y], xerr=[rows[x] - rows[x_low], rows[x_high] - rows[x]],
                yerr=[rows[y] - rows[y_low], rows[y_high] - rows[y]], fmt="none", lw=0.8, color="0.35",
                capsize=2, label="prediction interval (fitted profile)")
    ax.legend(fontsize=8, loc="best")
    return True


def _bound_columns(column: str) -> tuple[str, str]:
    """``tokens_per_s_per_user_mean`` -> (``tokens_per_s_per_user_low_mean``, ``..._high_mean``)."""
    for metric in STATISTIC_METRICS:
        if column.startswith(metric + "_"):
            stat = column[len(metric) + 1:]
            return f"{metric}_low_{stat}", f"{metric}_high_{stat}"
    return f"{column}_low", f"{column}_high"
