"""The serving loop's non-draft step residual as a line, and how far the line misses each probe.

:func:`churn_fit` fits what the loop probe (:func:`calibration.profiling.loop_costs.measure_loop_costs`) measured
beyond the isolated tables - ``a_R + c B + join_s J + leave_s L + wake_s W`` over the probe's steps - and
:func:`probe_misfit` reports each probe's own distance from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

VARIABLE_LENGTH = "varlen-probe"  # the variable-length probe's name (loop_costs.VariableLength)


@dataclass(frozen=True)
class ResidualLine:
    """The loop's non-draft residual as ``a_R + c B + join_s J + leave_s L + wake_s W`` (see :func:`churn_fit`)."""

    per_request_s: tuple[float, ...]  # [NR] a_R
    per_batch_token_s: float  # c
    join_s: float  # per request that joined the batch since the previous step (J)
    leave_s: float  # per request the step finished (L)
    wake_s: float  # per step after a sleep (W: 1 when the loop slept before it)
    line_s: np.ndarray = field(repr=False)  # [steps] the line at each step


def churn_fit(steps: pd.DataFrame, probed: tuple[int, ...], churn: bool = True) -> ResidualLine:
    """Least squares of the steps' ``residual_s`` on one intercept per probed R (column ``users``), a common slope
    over ``batch_tokens`` and, with ``churn``, the steps' joins and leaves (``num_joined``, ``num_left``) and
    whether the loop slept before them (``wait_s`` > 0): a mean fit over every step. A slope or churn cost that
    comes out negative is noise, not work that makes a step faster: it is set to 0 and the rest fitted again."""
    columns = {f"a_{r}": (steps["users"] == r).to_numpy(float) for r in probed}
    columns["c"] = steps["batch_tokens"].to_numpy(float)
    if churn:
        columns["join"] = steps["num_joined"].to_numpy(float)
        columns["leave"] = steps["num_left"].to_numpy(float)
        columns["wake"] = (steps["wait_s"] > 0).to_numpy(float)
    y = steps["residual_s"].to_numpy()
    while True:
        design = np.column_stack(list(columns.values()))
        coef = dict(zip(columns, np.linalg.lstsq(design, y, rcond=None)[0], strict=True))
        negative = [k for k in ("c", "join", "leave", "wake") if k in coef and coef[k] < 0]
        if not negative:
            break
        del columns[negative[0]]
    return ResidualLine(tuple(float(coef[f"a_{r}"]) for r in probed), float(coef.get("c", 0.0)),
                        float(coef.get("join", 0.0)), float(coef.get("leave", 0.0)), float(coef.get("wake", 0.0)),
                        design @ np.array(list(coef.values())))


def probe_misfit(steps: pd.DataFrame, probed: tuple[int, ...]) -> dict[str, list[float]]:
    """Per probe (``mtp<g>``, the variable-length one) and probed R: its steps' mean ``residual_s`` less their mean
    ``line_s`` (the fit), over their mean ``cycle_s`` (columns users, draft_tokens, static); 0: the line fits it."""
    name = np.where(steps["static"], "mtp" + steps["draft_tokens"].astype(str), VARIABLE_LENGTH)
    means = steps.assign(probe=name).groupby(["probe", "users"])[["residual_s", "line_s", "cycle_s"]].mean()
    share = (means["residual_s"] - means["line_s"]) / means["cycle_s"]
    return {probe: [float(share.get((probe, r), np.nan)) for r in probed] for probe in sorted(set(name))}
