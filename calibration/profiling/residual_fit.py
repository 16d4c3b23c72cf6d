"""The loop probe's fits: the serving loop's non-draft step residual as a line, how far the line misses each
probe, and the drafter's in-loop factor.

:func:`churn_fit` fits what the loop probe (:func:`calibration.profiling.loop_costs.measure_loop_costs`) measured
beyond the isolated tables - ``a_R + c B + join_s J + leave_s L + wake_s W`` over the probe's steps - and
:func:`probe_misfit` reports each probe's own distance from it. ``a_R`` is a table over the probed R that the
profile reads by linear interpolation; each step counts at its own R under that interpolation (:func:`hat_design`),
so the steps a probe at r users runs with fewer requests (while one is prefilled again) price the R they ran at.
:func:`draft_factors` fits the drafter's in-loop over isolated seconds the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from calibration.profiling.step_prices import recent_prefills

VARIABLE_LENGTH = "varlen-probe"  # the variable-length probe's name (loop_costs.VariableLength)


@dataclass(frozen=True)
class ResidualLine:
    """The loop's non-draft residual as ``a_R + c B + join_s J + leave_s L + wake_s W`` (see :func:`churn_fit`)."""

    per_request_s: tuple[float, ...]  # [NR] a_R
    per_batch_token_s: float  # c
    join_s: float  # per request that joined the batch since the previous step (J)
    leave_s: float  # per request the step finished (L)
    wake_s: float  # per step after a sleep (W: 1 when the loop slept before it)
    num_requests: tuple[int, ...] = ()  # [NR] the R of per_request_s
    decode_tail_s: tuple[float, ...] = ()  # [K] per prompt prefilled on the decode device k steps back (P_k)

    def shared_s(self, steps: pd.DataFrame) -> np.ndarray:
        """[steps] the line's terms other than ``a_R`` at ``steps`` (columns batch_tokens, num_joined, num_left,
        wait_s and, with a tail, those of :func:`recent_prefills`): its slope, churn costs and prefill tail."""
        shared = (self.per_batch_token_s * steps["batch_tokens"].to_numpy(float)
                  + self.join_s * steps["num_joined"].to_numpy(float) + self.leave_s * steps["num_left"].to_numpy(float)
                  + self.wake_s * (steps["wait_s"] > 0).to_numpy(float))
        if self.decode_tail_s:
            shared = shared + recent_prefills(steps, len(self.decode_tail_s)) @ np.array(self.decode_tail_s)
        return shared

    def at(self, steps: pd.DataFrame) -> np.ndarray:
        """[steps] the line at ``steps`` (each at its own R, column ``num_requests``, as the profile reads it)."""
        return (hat_design(steps["num_requests"].to_numpy(), self.num_requests) @ np.array(self.per_request_s)
                + self.shared_s(steps))


def hat_design(num_requests: np.ndarray, knots: tuple[int, ...]) -> np.ndarray:
    """[steps, knots] the weights that linear interpolation between ``knots`` (ascending R) gives each knot's value
    at each step's R (the nearest knot's value beyond them): a table fitted by least squares on this design is the
    one whose interpolation best explains the steps."""
    k = np.asarray(knots, dtype=np.float64)
    x = np.clip(np.asarray(num_requests, dtype=np.float64), k[0], k[-1])
    design = np.zeros((x.size, k.size))
    if k.size == 1:
        design[:, 0] = 1.0
        return design
    i = np.clip(np.searchsorted(k, x, side="right") - 1, 0, k.size - 2)
    w = (x - k[i]) / (k[i + 1] - k[i])
    rows = np.arange(x.size)
    design[rows, i] = 1.0 - w
    design[rows, i + 1] += w
    return design


def knots_without_steps(num_requests: np.ndarray, knots: tuple[int, ...]) -> list[int]:
    """The knots at which no step ran (``num_requests``: each step's R): their value in a :func:`hat_design` fit
    would be extrapolated from the neighbours', not measured."""
    at = np.asarray(num_requests)
    return [r for r in knots if not (at == r).any()]


def _drop_negative(columns: dict[str, np.ndarray], y: np.ndarray, signed: tuple[str, ...]) -> dict[str, float]:
    """Least squares of ``y`` on ``columns``; a coefficient outside ``signed`` that comes out negative (work that
    would make a step faster: noise) is dropped, one at a time, and the rest fitted again. Dropped ones are 0."""
    columns = dict(columns)
    while True:
        coef = dict(zip(columns, np.linalg.lstsq(np.column_stack(list(columns.values())), y, rcond=None)[0],
                        strict=True))
        negative = [k for k in coef if k not in signed and coef[k] < 0]
        if not negative:
            return coef
        del columns[negative[0]]


def churn_fit(steps: pd.DataFrame, probed: tuple[int, ...], churn: bool = True, tail_steps: int = 0) -> ResidualLine:
    """Least squares of the steps' ``residual_s`` on a table ``a_R`` over the probed R (each step at its own R,
    column ``num_requests``, :func:`hat_design`; every probed R needs a step at it), a common slope over
    ``batch_tokens``, with ``churn`` the steps' joins and leaves (``num_joined``, ``num_left``) and whether the
    loop slept before them (``wait_s`` > 0), and with ``tail_steps`` the prompts prefilled on the decode device
    before each step and the ``tail_steps`` - 1 before it (:func:`recent_prefills`): a mean fit over every step.
    A slope, churn or tail cost that comes out negative is noise, not work that makes a step faster: it is set to 0
    and the rest fitted again."""
    bare = knots_without_steps(steps["num_requests"].to_numpy(), probed)
    if bare:
        raise ValueError(f"the loop probe ran no step at R = {bare} of the probed {list(probed)}")
    hats = hat_design(steps["num_requests"].to_numpy(), probed)
    columns = {f"a_{r}": hats[:, j] for j, r in enumerate(probed)}
    columns["c"] = steps["batch_tokens"].to_numpy(float)
    if churn:
        columns["join"] = steps["num_joined"].to_numpy(float)
        columns["leave"] = steps["num_left"].to_numpy(float)
        columns["wake"] = (steps["wait_s"] > 0).to_numpy(float)
    columns.update({f"tail_{k}": column for k, column in enumerate(recent_prefills(steps, tail_steps).T)})
    coef = _drop_negative(columns, steps["residual_s"].to_numpy(), tuple(f"a_{r}" for r in probed))
    return ResidualLine(tuple(float(coef[f"a_{r}"]) for r in probed), float(coef.get("c", 0.0)),
                        float(coef.get("join", 0.0)), float(coef.get("leave", 0.0)), float(coef.get("wake", 0.0)),
                        tuple(probed), tuple(float(coef.get(f"tail_{k}", 0.0)) for k in range(tail_steps)))


def draft_factors(steps: pd.DataFrame, probed: tuple[int, ...], gammas: tuple[int, ...],
                  tail_steps: int = 0) -> tuple[tuple[tuple[float, ...], ...], tuple[float, ...]]:
    """[NR][NG] in-loop over isolated drafter seconds at each probed R and draft length, from ``steps`` (columns
    num_requests, draft_tokens, draft_s, iso_draft_s): the factors whose linear interpolation in R times each step's
    isolated seconds fits its measured ones best, rows weighted by 1 / isolated seconds, so that the steps of one R
    give the ratio of their sums (a mean over the steps, as throughput is). NaN where a length has no step. With
    ``tail_steps``, fitted jointly with the drafter's seconds per prompt prefilled on the decode device before the
    step and each of the ``tail_steps`` - 1 before it ([K] seconds; negative ones dropped as noise)."""
    steps = steps[steps["draft_tokens"].isin(gammas)]
    iso_s = steps["iso_draft_s"].to_numpy(float)
    scale = 1.0 / np.sqrt(iso_s)
    hats = hat_design(steps["num_requests"].to_numpy(), probed) * (iso_s * scale)[:, None]
    lengths = steps["draft_tokens"].to_numpy()
    columns = {f"x_{j}_{i}": hats[:, i] * (lengths == k) for j, k in enumerate(gammas) if (lengths == k).any()
               for i in range(len(probed))}
    factors = tuple(columns)  # signed: only the tails are dropped when negative
    columns.update({f"tail_{k}": column * scale for k, column in enumerate(recent_prefills(steps, tail_steps).T)})
    coef = _drop_negative(columns, steps["draft_s"].to_numpy(float) * scale, factors)
    grid = [[coef.get(f"x_{j}_{i}", np.nan) for j in range(len(gammas))] for i in range(len(probed))]
    return (tuple(tuple(map(float, row)) for row in grid),
            tuple(float(coef.get(f"tail_{k}", 0.0)) for k in range(tail_steps)))


def probe_misfit(steps: pd.DataFrame, probed: tuple[int, ...]) -> dict[str, list[float]]:
    """Per probe (``mtp<g>``, the variable-length one) and probed R: its steps' mean ``residual_s`` less their mean
    ``line_s`` (the fit), over their mean ``cycle_s`` (columns users, draft_tokens, static); 0: the line fits it."""
    name = np.where(steps["static"], "mtp" + steps["draft_tokens"].astype(str), VARIABLE_LENGTH)
    means = steps.assign(probe=name).groupby(["probe", "users"])[["residual_s", "line_s", "cycle_s"]].mean()
    share = (means["residual_s"] - means["line_s"]) / means["cycle_s"]
    return {probe: [float(share.get((probe, r), np.nan)) for r in probed] for probe in sorted(set(name))}
