"""Pareto frontiers of a load sweep and SLA comparisons along them (pure pandas/numpy).

Terms:

* a *point* is one simulation of a sweep: its per-user speed (tok/s/user) and
  its aggregate throughput (tok/s/GPU);
* a policy's *frontier* is the set of its points that no other point of the
  same policy beats on both axes (the Pareto envelope), ordered by per-user
  speed; along it throughput falls as per-user speed rises. Between two
  frontier points values are interpolated linearly; outside them nothing is
  extrapolated;
* an *SLA* is a minimum per-user speed (paper sec. 5.4); "throughput at an
  SLA" is the best throughput among configurations that meet it;
* "per-user speed at matched throughput" is the best per-user speed among
  configurations that deliver at least a given throughput (the paper's
  "faster per user at matched throughput").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd

USER_SPEED = "tokens_per_s_per_user_mean"
THROUGHPUT = "output_tokens_per_s_per_gpu"

Status = Literal["interpolated", "peak", "sweep_edge", "not_reached"]


@dataclass(frozen=True)
class FrontierValue:
    """A value read off a policy's frontier.

    ``interpolated``: inside the frontier's range (linear between its points).
    ``peak``: beyond the frontier's end, but the sweep ran the policy that far
    (those points are dominated): ``value`` is the end point's, the best the
    policy reaches. ``sweep_edge``: beyond anything the sweep ran: ``value`` is
    the end point's, a lower bound on what the policy can do. ``not_reached``:
    no configuration of the sweep meets the query; ``value`` is None.
    """

    value: float | None
    status: Status


def pareto_frontier(points: pd.DataFrame, x: str = USER_SPEED, y: str = THROUGHPUT) -> pd.DataFrame:
    """Rows of ``points`` not dominated on (x, y), both maximised, sorted by x ascending.

    A row is dominated when another row has x' >= x and y' >= y with one of them
    strictly greater; of identical rows the first is kept. Rows with a NaN in
    x or y are dropped.
    """
    clean = points.dropna(subset=[x, y])
    order = np.lexsort((-clean[y].to_numpy(), -clean[x].to_numpy()))  # x descending, then y descending
    best_y = -np.inf
    keep = []
    for i in order:
        value = clean[y].iat[i]
        if value > best_y:
            keep.append(i)
            best_y = value
    return clean.iloc[keep[::-1]]


def best_at_least(along: np.ndarray, other: np.ndarray, query: float,
                  lowest_sampled: float | None = None) -> FrontierValue:
    """The best ``other`` over frontier configurations with ``along >= query``.

    ``along`` ascends and ``other`` descends along a frontier, so the best lies
    where ``along == query``: interpolated inside the range, ``not_reached``
    above it, and below it the first point's value: ``peak`` when some sampled
    configuration had ``along <= query`` (``lowest_sampled``, dominated ones
    included), else ``sweep_edge`` (a lower bound).
    """
    along, other = np.asarray(along, dtype=np.float64), np.asarray(other, dtype=np.float64)
    if along.size == 0:
        return FrontierValue(None, "not_reached")
    if np.any(np.diff(along) <= 0) or np.any(np.diff(other) >= 0):
        raise ValueError("best_at_least needs a frontier: 'along' strictly ascending, 'other' strictly descending")
    if query > along[-1]:
        return FrontierValue(None, "not_reached")
    if query < along[0]:
        reached = lowest_sampled is not None and lowest_sampled <= query
        return FrontierValue(float(other[0]), "peak" if reached else "sweep_edge")
    return FrontierValue(float(np.interp(query, along, other)), "interpolated")


def throughput_at_sla(points: pd.DataFrame, min_user_speed: float) -> FrontierValue:
    """Best tok/s/GPU of one policy's ``points`` with per-user speed >= ``min_user_speed``, along its frontier."""
    front = pareto_frontier(points)
    return best_at_least(front[USER_SPEED].to_numpy(), front[THROUGHPUT].to_numpy(), min_user_speed,
                         points[USER_SPEED].min())


def user_speed_at_throughput(points: pd.DataFrame, min_throughput: float) -> FrontierValue:
    """Best tok/s/user of one policy's ``points`` with throughput >= ``min_throughput`` tok/s/GPU."""
    front = pareto_frontier(points)
    return best_at_least(front[THROUGHPUT].to_numpy()[::-1], front[USER_SPEED].to_numpy()[::-1], min_throughput,
                         points[THROUGHPUT].min())


def ratio_text(policy: FrontierValue, baseline: FrontierValue) -> str:
    """``policy / baseline`` as text, marking bounds: '1.51x', '>= 2.10x', '<= 0.90x', 'not reached', ..."""
    if policy.value is None:
        return "not reached"
    if baseline.value is None:
        return "baseline not reached"
    ratio = f"{policy.value / baseline.value:.2f}x"
    lower, upper = policy.status == "sweep_edge", baseline.status == "sweep_edge"
    if lower and upper:
        return "n/a (both at sweep edge)"
    return (">= " if lower else "<= " if upper else "") + ratio


def value_text(value: FrontierValue, digits: int = 0) -> str:
    if value.value is None:
        return "not reached"
    return (">= " if value.status == "sweep_edge" else "") + f"{value.value:.{digits}f}"


def sla_table(sweep: pd.DataFrame, baseline: str, slas_tok_s_user: list[float], label: str = "policy_label"
              ) -> pd.DataFrame:
    """One row per (SLA, policy): throughput at the SLA and per-user speed at the baseline's throughput there.

    Columns: ``sla_tok_s_user``, ``policy``, ``throughput_tok_s_gpu`` (number or None),
    ``throughput_status``, ``throughput_vs_baseline`` (text ratio), ``matched_throughput_tok_s_gpu``
    (the baseline's throughput at this SLA), ``user_speed_at_matched_tok_s_user``, its status and
    ``user_speed_vs_baseline`` (text ratio).
    """
    labels = list(dict.fromkeys(sweep[label]))
    if baseline not in labels:
        raise ValueError(f"baseline {baseline!r} is not in the sweep; policies found: {', '.join(labels)}")
    points = {name: sweep[sweep[label] == name] for name in labels}
    rows = []
    for sla in slas_tok_s_user:
        base_thr = throughput_at_sla(points[baseline], sla)
        base_user = (user_speed_at_throughput(points[baseline], base_thr.value)
                     if base_thr.value is not None else FrontierValue(None, "not_reached"))
        for name in labels:
            thr = throughput_at_sla(points[name], sla)
            user = (user_speed_at_throughput(points[name], base_thr.value)
                    if base_thr.value is not None else FrontierValue(None, "not_reached"))
            rows.append({
                "sla_tok_s_user": sla, "policy": name,
                "throughput_tok_s_gpu": thr.value, "throughput_status": thr.status,
                "throughput_vs_baseline": ratio_text(thr, base_thr),
                "matched_throughput_tok_s_gpu": base_thr.value,
                "user_speed_at_matched_tok_s_user": user.value, "user_speed_status": user.status,
                "user_speed_vs_baseline": (ratio_text(user, base_user) if base_thr.value is not None
                                           else "baseline not reached"),
            })
    return pd.DataFrame(rows)


def matched_throughput(sweep: pd.DataFrame, baseline: str, label: str = "policy_label") -> pd.DataFrame:
    """Per-user speedup over the baseline at each baseline frontier point's throughput.

    Only throughputs inside the other policy's frontier range are kept (no
    bounds, no extrapolation). Columns: ``policy``, ``throughput_tok_s_gpu``,
    ``baseline_tok_s_user``, ``policy_tok_s_user``, ``speedup`` (policy / baseline).
    """
    labels = list(dict.fromkeys(sweep[label]))
    if baseline not in labels:
        raise ValueError(f"baseline {baseline!r} is not in the sweep; policies found: {', '.join(labels)}")
    base = pareto_frontier(sweep[sweep[label] == baseline])
    rows = []
    for name in labels:
        if name == baseline:
            continue
        points = sweep[sweep[label] == name]
        for throughput, base_user in zip(base[THROUGHPUT], base[USER_SPEED], strict=True):
            user = user_speed_at_throughput(points, throughput)
            if user.status == "interpolated":
                rows.append({"policy": name, "throughput_tok_s_gpu": throughput, "baseline_tok_s_user": base_user,
                             "policy_tok_s_user": user.value, "speedup": user.value / base_user})
    return pd.DataFrame(rows, columns=["policy", "throughput_tok_s_gpu", "baseline_tok_s_user",
                                       "policy_tok_s_user", "speedup"])


SLA_HEADER = ["SLA (tok/s/user)", "policy", "throughput at SLA (tok/s/GPU)", "vs baseline",
              "tok/s/user at baseline's throughput", "vs baseline"]


def sla_rows(table: pd.DataFrame) -> list[list[str]]:
    """The SLA table as text cells under :data:`SLA_HEADER` ('>=' marks a lower bound at the sweep edge)."""
    def read(value: float | None, status: Status) -> FrontierValue:
        return FrontierValue(None if value is None or pd.isna(value) else float(value), status)

    rows = []
    for row in table.itertuples(index=False):
        thr = read(row.throughput_tok_s_gpu, row.throughput_status)
        user = read(row.user_speed_at_matched_tok_s_user, row.user_speed_status)
        rows.append([f"{row.sla_tok_s_user:g}", row.policy, value_text(thr), row.throughput_vs_baseline,
                     value_text(user, 1), row.user_speed_vs_baseline])
    return rows


SLA_NOTE = ("Between frontier points values are interpolated, never extrapolated; past a frontier's end the end "
            "point counts: '>=' marks a value the sweep did not load far enough to bound (a lower bound), '<=' a "
            "ratio over such a baseline value.")


def sla_markdown(table: pd.DataFrame, matched: pd.DataFrame, baseline: str) -> str:
    """The SLA table and the matched-throughput speedup range as a Markdown text."""
    lines = [f"Baseline: {baseline}. {SLA_NOTE}", "",
             "| " + " | ".join(SLA_HEADER) + " |", "|---:|---|---:|---:|---:|---:|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in sla_rows(table)]
    if not matched.empty:
        lines += ["", f"Per-user speedup over {baseline} at matched throughput (at the baseline's frontier "
                      "points inside each policy's frontier):", "",
                  "| policy | throughput range (tok/s/GPU) | speedup min | speedup max |", "|---|---:|---:|---:|"]
        for name, group in matched.groupby("policy", sort=False):
            lines.append(f"| {name} | {group.throughput_tok_s_gpu.min():.0f}-{group.throughput_tok_s_gpu.max():.0f} "
                         f"| {group.speedup.min():.2f}x | {group.speedup.max():.2f}x |")
    return "\n".join(lines) + "\n"
