"""One point of a validation from its slices: pooled, corrected for the machine's drift, with its spread and the
cost model's own error (see :func:`point_result`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from calibration.profiling.step_prices import step_cost_ratio
from calibration.validation.report import (
    TARGET_METRICS,
    mean_context_tokens,
    point_row,
    pooled_summary,
    slice_intervals,
)
from calibration.validation.setup import ValidationConfig
from policies import make_policy
from simulator.costs import HardwareProfile


def point_result(cfg: ValidationConfig, point: tuple[str, int], sims: list[Any], reals: list[Any], drifts: np.ndarray,
         profile: HardwareProfile) -> dict[str, Any]:
    """A point's row, corrected for the machine's drift: slice k of the real loop ran ``1 + drifts[k]`` times as
    slow as the machine did while profiling (reference probe; across slices the simulator's error follows it with
    a slope near 1), so its throughput and tok/s/user are scaled by ``1 + drifts[k]`` (``*_err`` corrected,
    ``*_err_raw`` as measured). A slice beyond ``cfg.drift_tolerance`` is refused (slice k of the simulator goes
    with it); fewer than half the slices kept: the point is not reported (its errors NaN, ``spoiled``)."""
    kept = [k for k, drift in enumerate(drifts) if abs(drift) <= cfg.drift_tolerance]
    use = kept if kept else list(range(len(drifts)))
    row = point_row(*point, pooled([sims[k] for k in use]), pooled([reals[k] for k in use]),
                    float(np.mean(drifts[use])))
    real_tps = np.array([reals[k].summary["output_tokens_per_s"] for k in use])
    factor = float(np.sum(real_tps * (1 + drifts[use])) / np.sum(real_tps))
    for name in TARGET_METRICS:
        row[f"{name}_real_raw"], row[f"{name}_err_raw"] = row[f"{name}_real"], row[f"{name}_err"]
        row[f"{name}_real"] *= factor
        row[f"{name}_err"] = row[f"{name}_sim"] / row[f"{name}_real"] - 1
    row.update(slices_kept=len(kept), slices=len(drifts), max_abs_drift=float(np.abs(drifts).max()),
               spoiled=2 * len(kept) < len(drifts), drift_factor=factor)
    row.update(slice_intervals([sims[k].summary for k in use], [reals[k].summary for k in use], drifts[use]))
    policy = make_policy(point[0])
    row["step_cost_ratio"] = step_cost_ratio([reals[k].steps for k in use], profile, cfg.drafter, policy.name,
                                             policy.draft_tokens(cfg.gamma), cfg.warmup_s, policy.synchronous,
                                             [reals[k].chunks for k in use])
    if row["spoiled"]:
        row.update({key: float("nan") for key in row if key.endswith("_err")})
    return row


def pooled(slices: list[Any]) -> dict[str, Any]:
    summary = dict(slices[0].summary) if len(slices) == 1 else pooled_summary(slices)
    summary["mean_context_tokens"] = mean_context_tokens(slices)
    return summary
