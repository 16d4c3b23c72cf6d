"""Figures of a sweep (pure: DataFrames in, matplotlib Figures out; the caller saves them).

Every figure carries, in its lower-right corner, the hardware profile it was
simulated on (its label says "measured" or "analytic") and the code revision
its runs recorded in their summaries (all of them when the runs disagree).
Titles and stamps never show a local absolute path: a path is shown by its
file name.
"""

from __future__ import annotations

import json
import re

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

from experiments.frontier import THROUGHPUT, USER_SPEED, pareto_frontier

BUDGET = "verification_budget_per_request"
CONCURRENCY = "mean_num_requests"
REVISION = "code_revision_describe"  # the sweep column of each run's recorded code revision
CDF_POINTS = 501  # quantiles drawn per CDF line (0.2% steps): exact shape, small SVGs
_LOCAL_PATH = re.compile(r"(?<![^\s(\[=])(?:[A-Za-z]:[\\/]|~/|/)[^\s:;,()]*")  # starts a word: not tok/s


def without_local_paths(text: str) -> str:
    """``text`` with every absolute (or home-relative) path replaced by its file name."""
    return _LOCAL_PATH.sub(lambda m: re.split(r"[\\/]", m.group(0).rstrip("/\\"))[-1] or m.group(0), text)


def revision_text(sweep: pd.DataFrame) -> str:
    """'rev <describe>' of the runs, 'revs differ: a, b' when they disagree, or 'rev not recorded'."""
    if REVISION not in sweep:
        return "rev not recorded"
    revisions = sorted(set(sweep[REVISION].dropna().astype(str)))
    unrecorded = " + unrecorded" if sweep[REVISION].isna().any() and revisions else ""
    if not revisions:
        return "rev not recorded"
    if len(revisions) == 1:
        return f"rev {revisions[0]}{unrecorded}"
    return f"revs differ: {', '.join(revisions)}{unrecorded}"


def provenance(sweep: pd.DataFrame) -> str:
    """'profile: <label> | rev <revision>'; the label names the source (measured/analytic), added when it does not."""
    pairs = sweep[["profile", "profile_source"]].drop_duplicates().itertuples(index=False)
    profiles = "; ".join(label if f"({source})" in label else f"{label} ({source})" for label, source in pairs)
    return without_local_paths(f"profile: {profiles} | {revision_text(sweep)}")


def _stamp(fig: Figure, text: str) -> None:
    """Provenance in the lower-right corner, in a strip the layout keeps free."""
    fig.get_layout_engine().set(rect=(0.0, 0.035, 1.0, 0.965))
    fig.text(0.995, 0.005, text, ha="right", va="bottom", fontsize=7, color="0.3")


def _colors(labels: list[str]) -> dict[str, tuple]:
    palette = matplotlib.colormaps["tab10"]
    return {label: palette(i % 10) for i, label in enumerate(labels)}


def _log_x_if_wide(ax: Axes, values: pd.Series, min_ratio: float) -> None:
    """Log x scale with plain-number ticks when the positive ``values`` span at least ``min_ratio``."""
    clean = values[values > 0].dropna()
    if len(clean) and clean.max() / clean.min() >= min_ratio:
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.xaxis.set_minor_formatter(NullFormatter())


def frontier_figure(sweep: pd.DataFrame, slas_tok_s_user: list[float], label: str = "policy_label") -> Figure:
    """Throughput (tok/s/GPU) against per-user speed (tok/s/user): every point and each policy's Pareto envelope."""
    fig = Figure(figsize=(8.0, 5.5), layout="constrained")
    ax = fig.add_subplot()
    labels = list(dict.fromkeys(sweep[label]))
    colors = _colors(labels)
    for name in labels:
        points = sweep[sweep[label] == name]
        ax.scatter(points[USER_SPEED], points[THROUGHPUT], s=14, alpha=0.45, color=colors[name])
        front = pareto_frontier(points)
        ax.plot(front[USER_SPEED], front[THROUGHPUT], "-", lw=2, color=colors[name], label=f"{name} (frontier)")
    for i, sla in enumerate(sorted(slas_tok_s_user)):
        ax.axvline(sla, ls="--", lw=1, color="0.4")
        ax.annotate(f"SLA {sla:g} tok/s/user", (sla, 0.99 - 0.2 * (i % 3)), xycoords=("data", "axes fraction"),
                    rotation=90, va="top", ha="right", fontsize=8, color="0.3")
    _log_x_if_wide(ax, sweep[USER_SPEED], 5.0)
    ax.set_xlabel("per-user speed (tok/s/user, mean over finished requests)")
    ax.set_ylabel("aggregate output throughput (tok/s/GPU, decode GPUs)")
    ax.set_title("Throughput vs per-user speed: points and Pareto frontier per policy")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    _stamp(fig, provenance(sweep))
    return fig


def load_figure(sweep: pd.DataFrame, label: str = "policy_label") -> Figure:
    """Throughput and mean verification budget per request against concurrency (the paper's Figure 8)."""
    fig = Figure(figsize=(8.0, 7.0), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    labels = list(dict.fromkeys(sweep[label]))
    colors = _colors(labels)
    for name in labels:
        rows = sweep[sweep[label] == name]
        mean = rows.groupby("offered_load")[[CONCURRENCY, THROUGHPUT, BUDGET]].mean().sort_values(CONCURRENCY)
        top.plot(mean[CONCURRENCY], mean[THROUGHPUT], "o-", ms=3, color=colors[name], label=name)
        bottom.plot(mean[CONCURRENCY], mean[BUDGET], "o-", ms=3, color=colors[name], label=name)
    gpus = sorted(set(sweep["gpus_per_replica"]))
    per = f"{gpus[0]} GPU{'s' if gpus[0] > 1 else ''} per replica" if len(gpus) == 1 else "GPUs per replica vary"
    _log_x_if_wide(bottom, sweep[CONCURRENCY], 16.0)
    if len(gpus) == 1 and gpus[0] > 1:
        g = float(gpus[0])
        per_gpu = top.secondary_xaxis("top", functions=(lambda x: x / g, lambda x: x * g))
        per_gpu.set_xlabel("concurrent requests per GPU")
        per_gpu.xaxis.set_major_formatter(FormatStrFormatter("%g"))
    top.set_ylabel("throughput (tok/s/GPU)")
    top.set_ylim(bottom=0)
    top.set_title(f"Throughput and verification budget vs concurrency ({per})")
    top.legend(fontsize=8, loc="best")
    bottom.set_ylabel("verification budget\n(target tokens per request per step)")
    bottom.set_xlabel("concurrent requests per replica (mean over decode steps)")
    bottom.set_ylim(bottom=0)
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    _stamp(fig, provenance(sweep))
    return fig


def threshold_figure(sweep: pd.DataFrame) -> Figure:
    """Accepted and rejected draft tokens per request-step (bars) and acceptance rate (lines) vs theta (Figure 5).

    One panel per traffic name; uses the rows of the ``threshold`` policy. The
    solid line is the paper's rate, which counts the target's bonus token
    (footnote 3 of the DSpark paper: (accepted + 1) / (verified + 1) summed over
    request-steps); the dashed line is vLLM's draft-only rate.
    """
    rows = sweep[sweep["policy"] == "threshold"].copy()
    if rows.empty:
        raise ValueError("threshold figure: the sweep has no rows of policy 'threshold'")
    rows["theta"] = [float(json.loads(params)["theta"]) for params in rows["policy_params"]]
    traffics = list(dict.fromkeys(rows["traffic_name"]))
    fig = Figure(figsize=(4.0 * len(traffics) + 1.0, 4.5), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(traffics), sharey=True))
    rate_axes = []
    cols = ["accepted_draft_tokens_per_request_step", "rejected_draft_tokens_per_request_step",
            "acceptance_rate_with_bonus", "acceptance_rate_draft_only"]
    for ax, traffic in zip(axes, traffics, strict=True):
        data = rows[rows["traffic_name"] == traffic].groupby("theta")[cols].mean().sort_index()
        pos = np.arange(len(data))
        ax.bar(pos, data[cols[0]], color="tab:blue", label="accepted draft tokens")
        ax.bar(pos, data[cols[1]], bottom=data[cols[0]], color="white", edgecolor="tab:red", hatch="//",
               label="rejected draft tokens")
        ax.set_xticks(pos, [f"{t:g}" for t in data.index])
        ax.set_xlabel("confidence threshold theta")
        ax.set_title(without_local_paths(f"traffic: {traffic}"))
        rate = ax.twinx()
        rate_axes.append(rate)
        rate.plot(pos, 100 * data[cols[2]], "ko-", ms=4, label="acceptance rate, bonus token counted (paper)")
        rate.plot(pos, 100 * data[cols[3]], "k^--", ms=3, lw=0.8, alpha=0.6, label="draft-only rate (vLLM)")
        rate.set_ylim(0, 105)
        for p, value in zip(pos, 100 * data[cols[2]], strict=True):
            rate.annotate(f"{value:.1f}%", (p, value), textcoords="offset points", xytext=(0, 5), ha="center",
                          fontsize=7)
        if ax is axes[-1]:
            rate.set_ylabel("acceptance rate (%)")
        else:
            rate.set_yticklabels([])
    axes[0].set_ylabel("draft tokens verified per request per step")
    handles = axes[0].get_legend_handles_labels()[0] + rate_axes[0].get_legend_handles_labels()[0]
    fig.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=8)
    fig.suptitle("Confidence threshold sweep: verified draft tokens and acceptance rate")
    _stamp(fig, provenance(rows))
    return fig


def table_figure(rows: list[list[str]], header: list[str], title: str, note: str, sweep: pd.DataFrame) -> Figure:
    """A table of text cells rendered as a figure (the SLA table), with a note under it."""
    fig = Figure(figsize=(11.0, 0.3 * (len(rows) + 5)), layout="constrained")
    ax = fig.add_subplot()
    ax.axis("off")
    table = ax.table(cellText=rows, colLabels=header, loc="center", cellLoc="center")
    table.auto_set_font_size(False)
    table.set_fontsize(8)
    table.auto_set_column_width(list(range(len(header))))
    fig.suptitle(without_local_paths(title), fontsize=10)
    ax.set_title(without_local_paths(note), fontsize=7)
    _stamp(fig, provenance(sweep))
    return fig


def latency_cdf_figure(latencies: pd.DataFrame, sweep: pd.DataFrame, label: str = "policy_label") -> Figure:
    """Empirical CDFs of TTFT and TPOT per policy, each policy's runs pooled.

    ``latencies`` has one row per request of the runs that wrote their request
    table: ``label``, ``job``, ``ttft_s`` (NaN unless the first token came in
    its run's window) and ``tpot_s`` (NaN unless it finished in the window),
    as in the runs' summaries. Each line is drawn through ``CDF_POINTS``
    quantiles of its values.
    """
    fig = Figure(figsize=(11.0, 4.8), layout="constrained")
    axes = fig.subplots(1, 2)
    labels = [name for name in dict.fromkeys(sweep[label]) if name in set(latencies[label])]
    colors = _colors(list(dict.fromkeys(sweep[label])))  # the colours of the other figures
    levels = np.linspace(0.0, 1.0, CDF_POINTS)
    panels = (("ttft_s", "TTFT (ms)", "requests with their first token in the window"),
              ("tpot_s", "TPOT (ms per output token after the first)", "requests finished in the window"))
    for ax, (column, xlabel, which) in zip(axes, panels, strict=True):
        drawn = []
        for name in labels:
            rows = latencies[latencies[label] == name]
            values = 1e3 * rows[column].dropna().to_numpy(dtype=np.float64)
            if values.size == 0:
                continue
            x = np.quantile(values, levels)
            drawn.append(pd.Series(x))
            ax.plot(x, levels, "-", lw=1.5, color=colors[name],
                    label=f"{name} ({values.size:,} requests, {rows['job'].nunique()} runs)")
        if drawn:
            _log_x_if_wide(ax, pd.concat(drawn), 20.0)
            ax.legend(fontsize=7, loc="lower right")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1)
        ax.set_title(f"{xlabel.split(' ')[0]} CDF: {which}", fontsize=9)
        ax.grid(alpha=0.3)
    fig.suptitle("Latency CDFs per policy (each policy's runs pooled)")
    _stamp(fig, provenance(sweep))
    return fig
