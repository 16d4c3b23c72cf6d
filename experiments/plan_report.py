"""The capacity planner's outputs: the printed tables, ``plan.csv``, ``frontier.csv`` and ``plan.png|svg``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
from matplotlib.figure import Figure

from calibration.profiling.revision import code_revision
from experiments.plots import without_local_paths
from simulator import SimulationSpec

if TYPE_CHECKING:
    from experiments.plan import PolicyPlan, Slo


def _load_name(spec: SimulationSpec) -> str:
    return "users per replica" if getattr(spec.traffic, "arrival", "") == "closed" else "req/s per replica"


def describe(plans: list[PolicyPlan], frontier: pd.DataFrame, slos: list[Slo], spec: SimulationSpec,
             target_rate_per_s: float, rel_tol: float) -> str:
    """The frontier searched (every probe) and the plan (one line per policy), as text."""
    load = _load_name(spec)
    shown = frontier.rename(columns={"load": load})
    lines = [f"SLO: {'; '.join(s.label for s in slos)}. Hardware: {spec.profile.label} "
             f"({spec.profile.gpus_per_replica} GPU per replica). Search tolerance {rel_tol:.0%} on the load.",
             "", "frontier searched:", shown.to_string(index=False, float_format=lambda v: f"{v:.4g}"), "",
             f"GPUs to serve {target_rate_per_s:g} req/s:",
             f"{'policy':>12} {'max ' + load:>22} {'req/s per replica':>18} {'replicas':>9} {'GPUs':>6}  limited by"]
    for p in plans:
        cells = [f"{p.max_load:g}" if p.max_load is not None else "-",
                 f"{p.per_replica_per_s:.2f}" if p.per_replica_per_s is not None else "-",
                 str(p.num_replicas) if p.num_replicas is not None else "-",
                 str(p.num_gpus) if p.num_gpus is not None else "-"]
        note = p.limited_by + (" (NON-MONOTONE: a higher load passed)" if p.non_monotone else "")
        lines.append(f"{p.policy:>12} {cells[0]:>22} {cells[1]:>18} {cells[2]:>9} {cells[3]:>6}  {note}")
    return "\n".join(lines)


def plan_figure(plans: list[PolicyPlan], frontier: pd.DataFrame, slos: list[Slo], spec: SimulationSpec,
                target_rate_per_s: float, stamp: str) -> Figure:
    """One panel per SLO: the metric against the load for each policy (filled: passed every SLO), its bound,
    and each policy's highest passing load."""
    fig = Figure(figsize=(5.0 * len(slos) + 1.0, 4.5), layout="constrained")
    axes = fig.subplots(1, len(slos), squeeze=False)[0]
    colors = {p.policy: f"C{i}" for i, p in enumerate(plans)}
    for ax, slo in zip(axes, slos, strict=True):
        for plan in plans:
            rows = frontier[frontier["policy"] == plan.policy].sort_values("load")
            color = colors[plan.policy]
            ax.plot(rows["load"], rows[slo.label], "-", color=color, alpha=0.5)
            ok, bad = rows[rows["passed"]], rows[~rows["passed"]]
            gpus = "no" if plan.num_gpus is None else plan.num_gpus
            ax.plot(ok["load"], ok[slo.label], "o", color=color, label=f"{plan.policy} ({gpus} GPUs)")
            ax.plot(bad["load"], bad[slo.label], "o", mfc="none", color=color)
            if plan.max_load is not None:
                ax.axvline(plan.max_load, color=color, ls=":", lw=1)
        ax.axhline(slo.bound, color="k", ls="--", lw=1)
        ax.set_xlabel(_load_name(spec))
        ax.set_ylabel(f"{slo.metric} p{slo.percentile:g}")
        ax.set_title(slo.label, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, title=f"for {target_rate_per_s:g} req/s", title_fontsize=8)
    fig.get_layout_engine().set(rect=(0.0, 0.05, 1.0, 0.95))
    fig.text(0.995, 0.005, stamp, ha="right", va="bottom", fontsize=6, color="0.3", wrap=True)
    return fig


def write_outputs(out: Path, plans: list[PolicyPlan], frontier: pd.DataFrame, slos: list[Slo],
                  spec: SimulationSpec, target_rate_per_s: float, overrides: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    table = pd.DataFrame([vars(p) for p in plans])
    table.insert(1, "target_rate_per_s", target_rate_per_s)
    table.to_csv(out / "plan.csv", index=False)
    frontier.to_csv(out / "frontier.csv", index=False)
    revision = code_revision()["describe"]
    profile = spec.profile.label if f"({spec.profile.source})" in spec.profile.label else \
        f"{spec.profile.label} ({spec.profile.source})"
    stamp = without_local_paths(f"experiments.plan {' '.join(overrides) or '(default config)'} | "
                                f"profile: {profile} | rev {revision}")
    fig = plan_figure(plans, frontier, slos, spec, target_rate_per_s, stamp)
    for suffix in ("png", "svg"):
        fig.savefig(out / f"plan.{suffix}", dpi=120, metadata={"Date": None} if suffix == "svg" else None)
