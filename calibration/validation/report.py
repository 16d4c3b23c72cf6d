"""Side-by-side tables and the frontier figure of a sim-vs-real validation (pure: DataFrames in, text/Figure out).

One *point* is one (policy, concurrency) pair run twice: by the simulator and by the real serving loop. The
relative error of a metric is ``(sim - real) / real``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from scipy import stats

from simulator.acceptance.logs import summary as log_summary
from simulator.costs import HardwareProfile
from simulator.metrics import summarize
from traces.workload import DOMAINS

# column -> (label, how to read it from a summary, unit scale for display)
METRICS: dict[str, tuple[str, tuple[str, ...], float]] = {
    "throughput": ("throughput tok/s", ("output_tokens_per_s",), 1.0),
    "tpu_mean": ("tok/s/user mean", ("tokens_per_s_per_user", "mean"), 1.0),
    "tpu_p50": ("tok/s/user p50", ("tokens_per_s_per_user", "p50"), 1.0),
    "tpu_p90": ("tok/s/user p90", ("tokens_per_s_per_user", "p90"), 1.0),
    "ttft_ms": ("TTFT mean ms", ("ttft_s", "mean"), 1e3),
    "tau": ("tau", ("mean_acceptance_length",), 1.0),
    "budget": ("verif. budget", ("verification_budget_per_request",), 1.0),
    # KV tokens a request holds before a step, averaged over request-steps (from the steps tables; the simulator
    # records it when its profile prices context)
    "context": ("mean context tokens", ("mean_context_tokens",), 1.0),
    "busy": ("decode busy share", ("device_busy_fraction",), 1.0),  # time in steps over the window (points.py)
}
TARGET_METRICS = ("throughput", "tpu_mean")  # the metrics the validation bounds

# Summary figures that count arrivals or the queue at the end of a run: windows laid end to end have neither.
ARRIVAL_FIGURES = ("num_requests_arrived", "num_requests_arrived_in_run", "num_unfinished_at_end",
                   "num_waiting_prefill_at_end", "num_prefilling_at_end", "num_waiting_decode_at_end",
                   "num_decoding_at_end", "ttft_pending_s", "request_arrival_rate_per_s",
                   "num_unfinished_at_window_start", "backlog_growth_per_s", "backlog_growth_late_per_s")


def pooled_summary(slices: Sequence[Any]) -> dict[str, Any]:
    """One summary of several runs of a point (real ``ServingResults`` run in slices, round-robin with the other
    points, or the simulator's ``Results`` of the same slices): their measurement windows laid end to end.

    Each slice keeps its steps that ended inside its window and the first-token and finish times that fall
    inside it (the others become NaN, so that shifting a slice cannot move them into a neighbour's window).
    Throughput is then total tokens over total window seconds, per-request figures pool the requests finished
    in any window, tau and the verification budget pool the steps. Per-position acceptance is left out (NaN), and
    so are the figures of arrivals and of the queue at the end (:data:`ARRIVAL_FIGURES`).
    """
    requests, steps, offset_s = [], [], 0.0
    for part in slices:
        start_s, end_s = part.spec.warmup_s, part.summary["window_s"] + part.spec.warmup_s
        shift_s = offset_s - start_s
        req = part.requests.copy()
        for col in ("first_token_at", "finished_at"):
            inside = (req[col] > start_s) & (req[col] <= end_s)
            req[col] = req[col].where(inside) + shift_s
        req["arrival_at"] = np.nan  # arrivals are not a pooled figure (see ARRIVAL_FIGURES)
        st = part.steps[(part.steps["end_at"] > start_s) & (part.steps["end_at"] <= end_s)].copy()
        st["start_at"] += shift_s
        st["end_at"] += shift_s
        requests.append(req)
        steps.append(st)
        offset_s += end_s - start_s
    no_histogram = np.zeros(1, dtype=np.int64)
    out = summarize(pd.concat(requests, ignore_index=True), pd.concat(steps, ignore_index=True), no_histogram,
                    no_histogram, start_at=0.0, end_at=offset_s, num_decode_gpus=1)
    for key in ARRIVAL_FIGURES:
        out.pop(key)
    out["acceptance_rate_per_position"] = []
    out["cpu_fraction"] = float(np.mean([part.summary.get("cpu_fraction", np.nan) for part in slices]))
    out["num_slices"] = len(slices)
    return out


def mean_context_tokens(slices: Sequence[Any]) -> float:
    """KV tokens per request-step over every step of the runs (NaN when their steps do not record contexts)."""
    steps = [part.steps for part in slices if "context_tokens" in part.steps]
    if len(steps) < len(slices) or not steps:
        return float("nan")
    both = pd.concat(steps, ignore_index=True)
    return float(both["context_tokens"].sum() / both["num_requests"].sum())


def read_figure(summary: dict[str, Any], path: tuple[str, ...]) -> float:  # NaN where absent or None (no value)
    value: Any = summary
    for key in path:
        if key not in value:
            return float("nan")
        value = value[key]
    return float("nan") if value is None else float(value)


def point_row(policy: str, num_users: int, sim: dict[str, Any], real: dict[str, Any],
              machine_drift: float = float("nan")) -> dict[str, Any]:
    """One row: every metric as sim, real and relative error (sim - real) / real. ``machine_drift`` is how much
    slower (> 0) this machine ran a fixed reference probe around the real run than while it was profiled; a
    simulator fed the profile is expected to be that much too fast on throughput-like metrics."""
    row: dict[str, Any] = {"policy": policy, "num_users": num_users,
                           "real_requests_finished": real["num_requests_finished"],
                           "sim_requests_finished": sim["num_requests_finished"],
                           "real_cpu_fraction": real.get("cpu_fraction", float("nan")),
                           "machine_drift": machine_drift}
    for name, (_, path, scale) in METRICS.items():
        s, r = read_figure(sim, path) * scale, read_figure(real, path) * scale
        row[f"{name}_sim"], row[f"{name}_real"] = s, r
        row[f"{name}_err"] = (s - r) / r if r else float("nan")
    return row


def sampling_se(draws: Sequence[float]) -> float:
    """The standard error, relative to their mean, that request sampling puts on a sim-vs-real error, from the
    simulator's figure in ``draws`` independent acceptance draws over the same requests: one draw's spread is
    what the real run (one draw of the same process) carries, and the mean of the draws carries 1/n of its
    variance -> ``sd * sqrt(1 + 1/n) / mean``. NaN with fewer than two draws."""
    values = np.asarray(draws, dtype=np.float64)
    if values.size < 2:
        return float("nan")
    return float(np.std(values, ddof=1) * np.sqrt(1 + 1 / values.size) / values.mean())


def slice_intervals(sims: Sequence[dict[str, Any]], reals: Sequence[dict[str, Any]],
                    drifts: np.ndarray | None = None, level: float = 0.95) -> dict[str, float]:
    """The spread of a point's error across its slices: for each bounded metric, the relative error of every slice
    (simulator slice k against real slice k: same seed, same requests; the real figure times ``1 + drifts[k]``
    when given) -> ``<metric>_slice_sd`` (their standard deviation) and ``<metric>_ci`` (half-width of a Student-t
    ``level`` interval of their mean; NaN with one slice). A slice without the figure (no request finished in it)
    leaves the spread to the others; the point's own figure pools every slice's requests."""
    out: dict[str, float] = {}
    scale = np.ones(len(reals)) if drifts is None else 1 + np.asarray(drifts)
    for name in TARGET_METRICS:
        path = METRICS[name][1]
        errors = np.array([read_figure(s, path) / (read_figure(r, path) * f) - 1
                           for s, r, f in zip(sims, reals, scale, strict=True)])
        errors = errors[np.isfinite(errors)]
        n = errors.size
        sd = float(np.std(errors, ddof=1)) if n > 1 else float("nan")
        out[f"{name}_slice_sd"] = sd
        out[f"{name}_ci"] = float(stats.t.ppf(0.5 + level / 2, n - 1) * sd / np.sqrt(n)) if n > 1 else float("nan")
    return out


def kept_slices(drifts: np.ndarray, tolerance: float) -> tuple[list[int], bool]:
    """The slices a point keeps (machine drift within +-``tolerance``) and whether it is spoiled: fewer than half
    of its slices kept."""
    kept = [k for k, drift in enumerate(drifts) if abs(drift) <= tolerance]
    return kept, 2 * len(kept) < len(drifts)


SLICE_FIGURES = ("output_tokens_per_s", "num_requests_finished")  # each slice's, sim and real, in slices.csv


def slice_records(point: tuple[str, int], drifts: np.ndarray, tolerance: float, sims: Sequence[Sequence[Any]],
                  reals: Sequence[Any]) -> list[dict[str, Any]]:
    """One record per slice of a point: its machine drift, whether it was kept, sim and real throughput (the
    simulator's figures: the mean over its runs of the slice, ``sims[k]``, one per acceptance draw)."""
    kept, _ = kept_slices(drifts, tolerance)
    return [{"policy": point[0], "num_users": point[1], "slice": k, "machine_drift": float(d), "kept": k in kept,
             "cpu_fraction": real.summary.get("cpu_fraction", np.nan),
             **{f"{m}_{side}": value for m in SLICE_FIGURES
                for side, value in (("sim", float(np.mean([run.summary[m] for run in sim]))),
                                    ("real", real.summary[m]))}}
            for k, (d, sim, real) in enumerate(zip(drifts, sims, reals, strict=True))]


def worst_errors(table: pd.DataFrame) -> dict[str, float]:
    """Largest absolute relative error of each bounded metric over the reported points."""
    return {name: float(table[f"{name}_err"].abs().max()) for name in TARGET_METRICS}


def mean_abs_errors(table: pd.DataFrame) -> dict[str, float]:
    """Mean absolute relative error of each bounded metric over the reported (not spoiled) points."""
    return {name: float(table[f"{name}_err"].abs().mean()) for name in TARGET_METRICS}


class MachineNotSteady(RuntimeError):
    """A validation stopped early (``--stop-when-unsteady``): its slices so far drifted too much to report.
    ``probes``: the reference probe's timings up to the stop (the rows ``probes.csv`` holds after a whole run)."""

    def __init__(self, message: str, probes: pd.DataFrame) -> None:
        super().__init__(message)
        self.probes = probes


DRIFT_MEASURES = {"probe": "reference probe", "meter": "speed meter"}  # --drift-measure -> what the report calls it
REFERENCES = {"slices": "the kept slices' mean reading", "passes": "the profile passes' reading"}  # --drift-reference


def drift_note(table: pd.DataFrame, tolerance: float, measure: str = "probe", reference: str = "slices") -> str:
    """How many slices drift refused, which points it spoiled and how much of the drift the errors are corrected
    for, and against what (empty without drift screening); ``measure``: a key of :data:`DRIFT_MEASURES`."""
    if "slices_kept" not in table:
        return ""
    spoiled = table[table["spoiled"]]
    refused = int((table["slices"] - table["slices_kept"]).sum())
    text = (f"; {refused} of {int(table['slices'].sum())} slices refused ({DRIFT_MEASURES[measure]} beyond "
            f"+-{100 * tolerance:g}% of profiling's)")
    if len(spoiled):
        text += "; not reported (spoiled by drift): " + ", ".join(f"{p} x{u}" for p, u in
                                                                   zip(spoiled["policy"], spoiled["num_users"],
                                                                       strict=True))
    if "drift_weight" in table and len(table):
        text += (f"; drift correction against {REFERENCES[reference]}, weight {table['drift_weight'].iloc[0]:.2f} "
                 f"(1 - the {DRIFT_MEASURES[measure]}'s own noise over the drifts' mean square)")
    return text


# A run whose drift guard refused more than this share of its real slices ran on a machine too unsteady for
# its errors to measure the simulator (on the idle 2-core machine: 0-1 of 60 slices; runs refusing 9 and 23 of
# 60 came out 1.5 and 3 times as far off, docs/validation.md).
STEADY_MAX_REFUSED_SHARE = 0.10


def too_many_refused(refused: int, slices: int) -> bool:
    """Whether refusing ``refused`` of ``slices`` slices for drift makes a run unsteady."""
    return refused > STEADY_MAX_REFUSED_SHARE * slices


# A run whose profile passes disagree this much about the price of its points' real steps (``profile_price_se``,
# averaged over the reported points) measured a machine too unsteady for the validation's 2% mean-error target:
# that error alone would give an exact simulator a mean |error| of sqrt(2 / pi) times it, 2% at this value
# (2.507%). On the 2-core VM six runs of 2026-12-02 that refused only 0-5 of 60 slices read 2.51-4.66% and came
# out 2.2-4.5% off on average (docs/validation_runs.md).
STEADY_MAX_PROFILE_PRICE_SE = 0.02 / float(np.sqrt(2 / np.pi))


def machine_verdict(table: pd.DataFrame) -> str | None:
    """One line saying the machine was not steady enough for the run's errors to mean much: more than
    :data:`STEADY_MAX_REFUSED_SHARE` of the slices refused for drift, a point spoiled, or profile passes that priced
    the reported points' steps with a mean standard error above :data:`STEADY_MAX_PROFILE_PRICE_SE`. None when
    steady, or when the run had no drift screening (no ``slices_kept`` column)."""
    if "slices_kept" not in table or not len(table):
        return None
    slices = int(table["slices"].sum())
    refused = slices - int(table["slices_kept"].sum())
    spoiled = int(table["spoiled"].astype(bool).sum())
    reasons = []
    if too_many_refused(refused, slices) or spoiled:
        reasons.append(f"{refused} of {slices} slices refused for drift (more than "
                       f"{100 * STEADY_MAX_REFUSED_SHARE:g}% is unsteady)"
                       + (f", {spoiled} point(s) spoiled" if spoiled else ""))
    if "profile_price_se" in table:
        price_se = table.loc[table["throughput_err"].notna(), "profile_price_se"].dropna()
        if len(price_se) and price_se.mean() > STEADY_MAX_PROFILE_PRICE_SE:
            reasons.append(f"the profile passes' prices of the points' real steps have a mean standard error of "
                           f"{100 * price_se.mean():.2f}% (above {100 * STEADY_MAX_PROFILE_PRICE_SE:.2f}% the "
                           "profile alone puts an exact simulator's mean |error| above 2%)")
    if not reasons:
        return None
    return ("MACHINE NOT STEADY: " + "; ".join(reasons)
            + "; the errors mix the machine's drift with the simulator's: rerun on a quiet machine")


def loop_costs_line(profile: HardwareProfile) -> str:
    """The report's line on the serving-loop costs the profile holds (``metadata.loop_costs``)."""
    loop, nan = profile.metadata.get("loop_costs", {}), float("nan")
    reqs, gammas = loop.get("num_requests", []), loop.get("draft_tokens", [])
    def per_r(key: str, text: Callable[[Any], str] = lambda e: f"{1e3 * e:+.2f} ms", sep: str = ", ") -> str:
        at = (loop.get("plain_num_requests") or reqs) if key.startswith("plain") else reqs  # none's: where it filled
        return sep.join(f"R={r}: {text(v)}" for r, v in zip(at, loop.get(key) or [], strict=False))
    plain = (f"; without speculation: step residual {per_r('plain_per_request_s')}, the drafter's share of a "
             f"prefill {100 * profile.prefill_draft_share:.0f}%" if loop.get("plain_per_request_s") else "")
    tail = (" + per prompt prefilled on the decode core " + "/".join(f"{1e3 * t:.3f}" for t in profile.decode_tail_s)
            + " ms on the steps after it" if profile.decode_tail_s else "")
    return (f"serving-loop costs in the profile: draft factor (gamma {'/'.join(map(str, gammas))}) "
            f"{per_r('draft_factor', lambda row: '/'.join(f'x{f:.2f}' for f in row), '; ')}; step residual "
            f"{per_r('extra_per_request_s')} + {1e6 * loop.get('extra_per_batch_token_s', nan):.1f} us/"
            f"{'decode' if profile.version >= 2 else 'batch'} token + "
            f"{1e3 * loop.get('join_s', 0.0):.3f}/{1e3 * loop.get('leave_s', 0.0):.3f} ms per request joining/"
            f"leaving + {1e3 * loop.get('wake_s', 0.0):.3f} ms per step after idle{tail}; "
            f"prefill x{loop.get('prefill_factor', nan):.3f}; of which host {1e3 * loop.get('host_fixed_s', nan):.3f} "
            f"ms/step + {1e6 * loop.get('host_per_request_s', nan):.1f} us/request + "
            f"{1e6 * loop.get('host_per_verified_token_s', nan):.1f} us/verified token{plain}")


def _largest_note(table: pd.DataFrame, column: str, error: str, missing: str,
                  describe: Callable[[pd.Series, pd.Series], str]) -> str:
    """``describe(values, largest)`` over ``column`` of the reported points (``error`` not NaN) and the row of its
    largest value; nothing when the table has no such column, ``missing`` when no reported point has a value."""
    if column not in table:
        return ""
    values = table.loc[table[error].notna(), ["policy", "num_users", column]].dropna()
    return describe(values[column], values.loc[values[column].idxmax()]) if len(values) else missing


def noise_note(table: pd.DataFrame, logs: dict[int, pd.DataFrame] | None = None, domain: str = "mixed") -> str:
    """The report's lines on what noise each point's error carries: request sampling, the profile's own error and
    the acceptance logs' text sample (with ``logs``; ``domain``: the traffic's, or ``mixed`` for every one)."""
    lines = [sampling_note(table), profile_note(table)]
    if logs:
        lines.append(log_note(logs, DOMAINS if domain == "mixed" else (domain,)))
    return "\n".join(line for line in lines if line)


def profile_note(table: pd.DataFrame) -> str:
    """The combined profile's own price error (``profile_price_se`` of the reported points), which each point's
    interval carries beside its slices' spread."""
    return _largest_note(
        table, "profile_price_se", "throughput_err",
        "profile price error: not estimated (it needs two profile passes or more)",
        lambda se, worst: (f"profile price error (the passes' prices of each point's real steps; in every "
                           "interval): standard error of their combination up to "
                           f"{100 * worst['profile_price_se']:.1f}% "
                           f"({worst['policy']} x{worst['num_users']}), {100 * se.mean():.1f}% on average"))


def sampling_note(table: pd.DataFrame) -> str:
    """The tok/s/user error that request sampling alone makes (``tpu_mean_sampling_se`` of the reported points):
    its largest standard error, and the mean |error| a simulator without any error of its own would show,
    sqrt(2 / pi) times the standard error averaged over the points."""
    return _largest_note(
        table, "tpu_mean_sampling_se", "tpu_mean_err",
        "tok/s/user sampling noise: not estimated (it needs --sim-replicas >= 2)",
        lambda se, worst: (f"tok/s/user sampling noise (which texts, hence which acceptance, the requests got; "
                           f"from the spread of the simulator's acceptance draws): standard error up to "
                           f"{100 * worst['tpu_mean_sampling_se']:.1f}% ({worst['policy']} x{worst['num_users']}); "
                           f"an exact simulator would show a mean |error| of about "
                           f"{100 * np.sqrt(2 / np.pi) * se.mean():.1f}% from it alone"))


def log_note(logs: dict[int, pd.DataFrame], domains: Sequence[str]) -> str:
    """The acceptance log's own text sample (the log of the longest block, on ``domains``): every point replays
    the same texts, and so does every rerun at the seed, so no interval holds its error; tau's standard error over
    the logged requests (:func:`simulator.acceptance.logs.tau_standard_error`) says how large it is."""
    num_draft = max(logs)
    table = log_summary(logs[num_draft]).set_index("domain")
    parts = [f"{d} {table.loc[d, 'tau']:.2f} +- {100 * table.loc[d, 'tau_se'] / table.loc[d, 'tau']:.1f}% "
             f"({table.loc[d, 'num_requests']} texts)" for d in domains if d in table.index]
    return (f"acceptance log's text sample (no interval holds it: every point and every rerun at this seed replay "
            f"the same texts): tau at {num_draft} draft tokens {', '.join(parts)} (standard error over the texts); "
            "calibration.validation.recombine RUN --log-resamples N shows what another sample does to each point")


def _or_dash(value: float, digits: int) -> str:
    return "-" if np.isnan(value) else f"{value:.{digits}f}"


def markdown_table(table: pd.DataFrame) -> str:
    """Sim | real | error for every metric, one row per point."""
    shown = [m for m in METRICS if table[f"{m}_sim"].notna().any() or table[f"{m}_real"].notna().any()]
    kept = "slices_kept" in table
    header = ["policy", "users", "machine drift"] + (["slices kept", "real step / priced"] if kept else []) + [
        METRICS[m][0] + " sim / real (err" + (" +- 95% CI: slices, profile" if kept and m in TARGET_METRICS else "")
        + ")" for m in shown]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in table.to_dict("records"):
        cells = [str(row["policy"]), str(row["num_users"]), f"{100 * row['machine_drift']:+.1f}%"]
        if kept:
            cells.append(f"{row['slices_kept']}/{row['slices']}" + (" (spoiled: not reported)" if row["spoiled"]
                                                                     else ""))
            cells.append(f"{row.get('step_cost_ratio', float('nan')):.3f}")
        for name in shown:
            s, r, e = row[f"{name}_sim"], row[f"{name}_real"], row[f"{name}_err"]
            digits = 2 if name in ("tau", "budget") else 1
            ci = f" +- {100 * row[f'{name}_ci']:.1f}" if kept and name in TARGET_METRICS else ""
            if np.isnan(s) or np.isnan(r) or np.isnan(e):  # one side lacks it, or drift spoiled the point
                cells.append(f"{_or_dash(s, digits)} / {_or_dash(r, digits)} (-)")
            else:
                cells.append(f"{s:.{digits}f} / {r:.{digits}f} ({100 * e:+.1f}%{ci})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def frontier_figure(table: pd.DataFrame, title: str) -> Figure:
    """Throughput against mean tok/s/user: simulated (dashed, hollow) and real (solid), one colour per policy."""
    fig = Figure(figsize=(7.0, 4.8), layout="constrained")
    ax = fig.add_subplot()
    palette = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]
    for i, (policy, part) in enumerate(table.groupby("policy", sort=False)):
        part = part.sort_values("num_users")
        color = palette[i % len(palette)]
        ax.plot(part["tpu_mean_real"], part["throughput_real"], "o-", color=color, label=f"{policy} real")
        ax.plot(part["tpu_mean_sim"], part["throughput_sim"], "s--", color=color, mfc="none",
                label=f"{policy} simulated")
        for users, x, y in zip(part["num_users"], part["tpu_mean_real"], part["throughput_real"], strict=True):
            ax.annotate(str(users), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7, color=color)
    ax.set_xlabel("mean tok/s/user")
    ax.set_ylabel("aggregate throughput (tok/s)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return fig


def error_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per policy: mean and worst absolute relative error of every metric (in %)."""
    rows = []
    for policy, part in table.groupby("policy", sort=False):
        row: dict[str, Any] = {"policy": policy}
        for name in METRICS:
            err = part[f"{name}_err"].abs() * 100
            row[f"{name} mean|err|%"] = float(np.mean(err))
            row[f"{name} max|err|%"] = float(np.max(err))
        rows.append(row)
    return pd.DataFrame(rows)
