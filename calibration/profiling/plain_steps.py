"""What the serving loop costs without speculation: the loop probe's ``none`` steps and prefills.

The loop probe (:func:`calibration.profiling.loop_costs.measure_loop_costs`) fits the non-draft residual of a step,
``a_R + c B``, to policies that draft. A step that drafts nothing is cheaper than that line says, beyond the
drafter's own seconds: its verifier forward does not alternate with a drafter forward (the caches keep one model's
state), and the host samples no draft rows. A prefill without a drafter skips the drafter's pass over the prompt.
So the probe also serves ``none`` at every R, and:

* :func:`plain_per_request_s`: ``a_R`` of those steps under the same slope and churn terms (their residual less
  the line's shared part, averaged per R). The profile prices a step that drafts nothing with it, and the drafter's
  table pays the difference, ``a_R - plain a_R`` (:func:`gap_s`), whenever it runs (:func:`fold_plain`): the cost
  a drafting policy sees is unchanged, and ``none`` is priced by its own steps (at the probed R where it ran a
  step, :func:`plain_probed`).
* :func:`draft_share`: the share of a loop prefill that is the drafter's (``1 -`` the ``none`` prefills' factor
  over the drafting ones'), written as ``prefill.draft_share``, which the simulator leaves out of a disaggregated
  prefill when the policy drafts nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from calibration.profiling.residual_fit import ResidualLine, hat_design, knots_without_steps

PLAIN_POLICY = "none"  # the probe without speculation (draft_tokens 0)


def plain_per_request_s(steps: pd.DataFrame, line: ResidualLine, knots: tuple[int, ...]) -> tuple[float, ...]:
    """[NP] the ``none`` probe's own ``a_R`` at ``knots``: its ``steps``' ``residual_s`` less the line's slope and
    churn terms, fitted by least squares with each step at its own R (column ``num_requests``,
    :func:`~calibration.profiling.residual_fit.hat_design`), as the drafting probes' ``a_R`` is."""
    own_s = steps["residual_s"].to_numpy() - line.shared_s(steps)
    fit = np.linalg.lstsq(hat_design(steps["num_requests"].to_numpy(), knots), own_s, rcond=None)[0]
    return tuple(map(float, fit))


def plain_probed(steps: pd.DataFrame, probed: tuple[int, ...]) -> tuple[int, ...]:
    """The probed R at which the ``none`` probe ran a step (its ``steps``, column ``num_requests``). With long
    prompts its batch may reach only the smaller R: requests that draft nothing finish before the one prefill
    instance has prefilled the others, so the loop is prefill-bound; :func:`gap_s` carries the nearest measured R's
    gap there. A ValueError when it ran at none of them."""
    ran = tuple(r for r in probed if r not in knots_without_steps(steps["num_requests"].to_numpy(), probed))
    if not ran:
        raise ValueError(f"the loop probe's {PLAIN_POLICY} runs never ran a step at any of R = {probed}: requests "
                         "without speculation finish before the others are prefilled; probe fewer users or "
                         "shorter prompts")
    return ran


def gap_s(at: np.ndarray, num_requests: tuple[int, ...], per_request_s: tuple[float, ...],
          plain_num_requests: tuple[int, ...], plain_s: tuple[float, ...]) -> np.ndarray:
    """What drafting adds to a step beyond the drafter's own time, at R = ``at``: the drafting probes' ``a_R``
    (``per_request_s`` over ``num_requests``) less the ``none`` probe's (``plain_s`` over ``plain_num_requests``),
    at the R where both were measured, linear between them and the nearest one's beyond."""
    drafting = np.interp(np.array(plain_num_requests, dtype=float), np.array(num_requests, dtype=float),
                         np.array(per_request_s))
    return np.interp(np.asarray(at, dtype=float), np.array(plain_num_requests, dtype=float),
                     drafting - np.array(plain_s))


def draft_share(prefill_factor: float, plain_prefill_factor: float) -> tuple[float, float]:
    """(share, measured): the share of a loop prefill spent on the drafter, ``1 - plain / drafting`` factor, and
    the same before a negative share (the ``none`` prefills measured slower, which is noise: a prefill without the
    drafter does less work) is set to 0."""
    measured = 1.0 - plain_prefill_factor / prefill_factor
    return max(measured, 0.0), measured


def fold_plain(out: dict[str, Any], gap: Callable[[np.ndarray], np.ndarray], share: float) -> None:
    """Write what drafting adds to a step beyond the drafter's time (``gap``: seconds at given R, :func:`gap_s`)
    into every drafter table of ``out`` (a profile dictionary) at its R, for every draft length and context, and
    ``share`` as ``prefill.draft_share``. A ValueError when that would make a draft entry <= 0."""
    for kind, draft in out["draft"].items():
        latency_s = np.array(draft["latency_s"]) + gap(np.array(draft["num_requests"], dtype=float))[:, None]
        if np.any(latency_s <= 0):
            raise ValueError(f"the loop probe's steps without speculation cost more than its drafting ones by more "
                             f"than drafter {kind!r}'s time; the probe is too noisy (profile with longer probes)")
        draft["latency_s"] = latency_s.tolist()
    out["prefill"]["draft_share"] = share
