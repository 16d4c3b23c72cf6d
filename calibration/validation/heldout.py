"""Fitted profiles against the real loop: fit from no speculation plus mtp1/mtp3, predict mtp7, greedy and dspark.

    python -m calibration.validation.heldout --models trained --domain mixed --users 1,2,4,8 --duration-s 6 \\
        --rounds 3 --nice -15 --out outputs/heldout

The path a user takes, tested end to end on our own ground truth:

1. **real runs** of ``none, mtp1, mtp3, mtp7, greedy, dspark`` at every user count, exactly as
   ``python -m calibration.validate`` runs them (its options; rounds of slices interleaved with
   profile passes; the machine-drift probe around every slice);
2. the static points written as **benchmark results** (vLLM JSON and CSV,
   :mod:`calibration.validation.bench_export`);
3. a profile **fitted** from the ``none``, ``mtp1`` and ``mtp3`` files only
   (:mod:`calibration.fitting`), its dense curve extended to the largest batch the held-out
   policies reach (no run is there: the smooth continuation), its ``scheduler`` block copied
   from this machine's measured profile (benchmark sweeps cannot see a decision's cost);
4. every point **simulated** with the fitted profile and with each of its alternatives (the
   acceptance logs, slices, seeds and the real loop's pricing profile of the validation), and
   compared with the real loop: error of the central prediction and whether the interval over
   the alternatives covers the real value.

Writes the validation's outputs plus ``bench/`` (the benchmark files), ``heldout_config.json``,
``fitted_profile.json``, ``heldout.csv`` and ``heldout.md``. The analysis (steps 3 and 4) reads only those
files: ``--reanalyse DIR`` repeats it without serving (with the ``bench/`` files as that run wrote them). The
fit's step time is the mean ITL (the loop streams one chunk per step, so its ITL is the step as each request
sees it; it did better than TPOT x acceptance length in every run in ``docs/calibration.md``); ``--step tpot``
fits TPOT x acceptance length less the last step's overshoot, as a user with TPOT only would, and its outputs
end in ``_tpot``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from joblib import Parallel, delayed

from calibration.fitting.export import ExportOptions, profiles
from calibration.fitting.pipeline import FitConfig, FitReport, fit_runs
from calibration.fitting.readers import read_results
from calibration.fitting.report import full_report
from calibration.fitting.runs import StepEstimate
from calibration.validation.report import METRICS, point_row, pooled_summary, read_figure
from calibration.validation.setup import ValidationConfig, simulate_slice, simulator_setup
from calibration.validation.validate import parse_args, run_validation, write_outputs
from policies import make_policy
from simulator.acceptance.logs import write_log
from simulator.costs import HardwareProfile, load_profile, profile_from_dict

FIT_POLICIES = ("none", "mtp1", "mtp3")
HELD_OUT_POLICIES = ("mtp7", "greedy", "dspark")
WITHIN = 0.05  # a held-out point passes within 5% of the real value, or when the interval covers it


@dataclass(frozen=True)
class HeldOut:
    config: ValidationConfig
    report: FitReport
    profile: dict[str, Any]  # the fitted profile (alternatives in metadata.fit.alternatives)
    table: pd.DataFrame  # one row per point


def fit_from_benchmarks(bench_csv: Path, cfg: ValidationConfig, measured: HardwareProfile, created: str,
                        step: StepEstimate = "itl") -> tuple[FitReport, dict[str, Any]]:
    """Fit from the none/mtp1/mtp3 rows of the benchmark CSV; the scheduler block comes from ``measured``."""
    allowed = {make_policy(p).draft_tokens(cfg.gamma) for p in FIT_POLICIES}
    runs = [r for r in read_results([bench_csv]) if r.num_speculative_tokens in allowed]
    report = fit_runs(runs, FitConfig(step=step, max_batch_tokens=max(cfg.users) * (1 + cfg.gamma),
                                      drafter_kind=cfg.drafter, probe_draft_tokens=cfg.gamma))
    options = ExportOptions(device=str(measured.metadata.get("device", "cpu")), model=str(runs[0].label),
                            drafter_kind=cfg.drafter, max_requests=max(cfg.users) + 1, max_draft_tokens=cfg.gamma,
                            max_context_tokens=cfg.max_prompt_tokens + cfg.max_output_tokens, created=created)
    data = profiles(report, options)
    scheduler = measured.raw["scheduler"]
    data["scheduler"] = scheduler
    for alternative in data["metadata"]["fit"]["alternatives"].values():
        alternative["scheduler"] = scheduler
    data["metadata"]["scheduler_note"] = ("scheduler block copied from this machine's measured profile: "
                                          "benchmark sweeps cannot see a decision's cost")
    profile_from_dict(data, "<held-out fitted profile>")
    return report, data


def _simulate_point(cfg: ValidationConfig, point: tuple[str, int], profile: HardwareProfile,
                    logs: dict[int, Path], pricing: HardwareProfile) -> dict[str, Any]:
    """The simulator's pooled summary of one point's slices with ``profile`` (as the validation simulates: each
    slice in ``cfg.sim_replicas`` acceptance draws)."""
    num_draft = max(make_policy(point[0]).draft_tokens(cfg.gamma), 1)
    g = num_draft if num_draft in logs else max(logs)  # the log the validation replays for this policy
    setups = {g: simulator_setup(cfg, profile, logs[g], g, pricing)}
    slices = [run for k in range(cfg.rounds) for run in simulate_slice(cfg, point, setups, k)]
    return pooled_summary(slices) if len(slices) > 1 else slices[0].summary


def window_steps(cfg: ValidationConfig, steps: pd.DataFrame) -> pd.DataFrame:
    """The steps of a point's saved table (``slice`` column) that ended inside their slice's window."""
    end_s = cfg.warmup_s + (cfg.duration_s - cfg.warmup_s) / cfg.rounds
    return steps[(steps["end_at"] > cfg.warmup_s) & (steps["end_at"] <= end_s)]


def step_error(cfg: ValidationConfig, name: str, steps: pd.DataFrame, profile: HardwareProfile) -> float:
    """The cost model alone: ``profile``'s price of the real loop's own steps in the windows (their R and B, the
    policy's draft tokens, its decision when charged; no attention: the fit folds it into per-request cost) over
    their measured duration, less one. Acceptance and decisions play no part: they are the real ones."""
    policy = make_policy(name)
    g = policy.draft_tokens(cfg.gamma)
    charged = bool(g) and profile.charges_decision(policy.synchronous)
    steps = window_steps(cfg, steps)
    predicted_s = sum(profile.verify_s(r, b) + profile.draft_s(cfg.drafter, r, g)
                      + (profile.scheduler_s(r * g, name) if charged else 0.0)
                      for r, b in zip(steps["num_requests"].astype(int), steps["batch_tokens"].astype(int),
                                      strict=True))
    return predicted_s / float((steps["end_at"] - steps["start_at"]).sum()) - 1.0


def real_summary(row: dict[str, Any]) -> dict[str, Any]:
    """The real side of a validation row (``points.csv``) as the summary entries :func:`point_row` reads."""
    out: dict[str, Any] = {"num_requests_finished": row["real_requests_finished"],
                           "cpu_fraction": row["real_cpu_fraction"]}
    for name, (_, path, scale) in METRICS.items():
        target = out
        for key in path[:-1]:
            target = target.setdefault(key, {})
        target[path[-1]] = row.get(f"{name}_real", float("nan")) / scale  # NaN: a metric added since the run
    return out


def _row(point: tuple[str, int], central: dict[str, Any], alternatives: dict[str, dict[str, Any]],
         real: dict[str, Any], drift: float) -> dict[str, Any]:
    name, users = point
    row = point_row(name, users, central, real, drift)
    row["role"] = "fitted from" if name in FIT_POLICIES else "held out"
    for metric, path in (("throughput", ("output_tokens_per_s",)), ("tpu_mean", ("tokens_per_s_per_user", "mean"))):
        names = ["central", *alternatives]
        values = np.array([row[f"{metric}_sim"]] + [read_figure(a, path) for a in alternatives.values()])
        missing = bool(np.isnan(values).any())  # a run too short to finish a request has no tok/s/user
        low, high = (np.nan, np.nan) if missing else (float(values.min()), float(values.max()))
        if not missing:
            row[f"{metric}_low_by"], row[f"{metric}_high_by"] = names[values.argmin()], names[values.argmax()]
        real_value = row[f"{metric}_real"]
        row[f"{metric}_low"], row[f"{metric}_high"] = low, high
        row[f"{metric}_covered"] = bool(low <= real_value <= high)
        row[f"{metric}_pass"] = bool(abs(row[f"{metric}_err"]) <= WITHIN or row[f"{metric}_covered"])
    return row


def analyse(out: Path, step: StepEstimate, created: str, progress: Callable[[str], None],
            jobs: int = 1) -> HeldOut:
    """Fit and predict from what a validation run left in ``out`` (its config, points.csv, measured profile,
    acceptance logs, real step tables and bench/): the analysis of :func:`run_heldout`, repeatable offline. The
    fitted profile and its alternatives are simulated ``jobs`` at a time (joblib; -1: one per CPU), with the same
    results whatever ``jobs``."""
    config = json.loads((out / "heldout_config.json").read_text())
    cfg = ValidationConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in config.items()})
    measured = load_profile(out / "profile.json")
    # what the real loop's policies priced with; runs written before pricing_profile.json existed priced with
    # their first pass, which they did not keep: the combined profile stands in for it then
    pricing_path = out / "pricing_profile.json"
    if not pricing_path.is_file():
        progress(f"{pricing_path} missing (an older run): the simulated policies price with profile.json")
    pricing = load_profile(pricing_path) if pricing_path.is_file() else measured
    logs = {int(p.stem.rsplit("g", 1)[1]): p for p in sorted(out.glob("acceptance_log_g*.parquet"))}
    progress(f"fitting a profile to the none/mtp1/mtp3 benchmark results (step time from {step})")
    report, data = fit_from_benchmarks(out / "bench" / "runs.csv", cfg, measured, created, step)
    central = profile_from_dict(data, str(out / "fitted_profile.json"))
    alternatives = {n: profile_from_dict(a, f"alternative {n}")
                    for n, a in data["metadata"]["fit"]["alternatives"].items()}
    rows = []
    parallel = Parallel(n_jobs=jobs)  # one process per profile at a time; every simulation is seeded by its spec
    for point in pd.read_csv(out / "points.csv").to_dict("records"):
        name, users = str(point["policy"]), int(point["num_users"])
        progress(f"{name} users={users}: simulating with the fitted profile and its {len(alternatives)} alternatives")
        summaries = parallel(delayed(_simulate_point)(cfg, (name, users), p, logs, pricing)
                             for p in [central, *alternatives.values()])
        sims = dict(zip(alternatives, summaries[1:], strict=True))
        row = _row((name, users), summaries[0], sims, real_summary(point), float(point["machine_drift"]))
        row["step_err"] = step_error(cfg, name, pd.read_parquet(out / f"real_{name}_u{users}_steps.parquet"), central)
        rows.append(row)
    return HeldOut(cfg, report, data, pd.DataFrame(rows))


def run_heldout(cfg: ValidationConfig, out: Path, step: StepEstimate, created: str,
                progress: Callable[[str], None], jobs: int = 1) -> HeldOut:
    """Serve every point for real (the validation), write its outputs, then :func:`analyse` them."""
    cfg = replace(cfg, policies=FIT_POLICIES + HELD_OUT_POLICIES)
    validation = run_validation(cfg, progress)
    write_outputs(validation, out)  # the validation's own outputs, bench/ included
    for g, log in validation.logs.items():
        write_log(log, out / f"acceptance_log_g{g}.parquet")
    (out / "heldout_config.json").write_text(json.dumps(asdict(cfg), indent=1) + "\n")
    return analyse(out, step, created, progress, jobs)


def markdown(table: pd.DataFrame) -> str:
    header = ["policy", "users", "role", "machine drift", "tau sim / real", "step cost error",
              "throughput real", "predicted [interval]", "error", "tok/s/user real", "predicted [interval]", "error",
              "pass"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in table.to_dict("records"):
        cells = [row["policy"], str(row["num_users"]), row["role"], f"{100 * row['machine_drift']:+.1f}%",
                 f"{row['tau_sim']:.2f} / {row['tau_real']:.2f}", f"{100 * row['step_err']:+.1f}%"]
        for metric in ("throughput", "tpu_mean"):
            cells += [f"{row[f'{metric}_real']:.1f}",
                      f"{row[f'{metric}_sim']:.1f} [{row[f'{metric}_low']:.1f}, {row[f'{metric}_high']:.1f}]",
                      f"{100 * row[f'{metric}_err']:+.1f}%" + (" (covered)" if row[f"{metric}_covered"] else "")]
        cells.append("yes" if row["throughput_pass"] and row["tpu_mean_pass"] else "NO")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary_lines(table: pd.DataFrame) -> list[str]:
    held = table[table["role"] == "held out"]
    lines = []
    for metric, label in (("throughput", "throughput"), ("tpu_mean", "tok/s/user")):
        err = held[f"{metric}_err"].abs() * 100
        lines.append(f"held out, {label}: mean |error| {err.mean():.1f}%, worst {err.max():.1f}%, "
                     f"{int(held[f'{metric}_pass'].sum())}/{len(held)} points within {100 * WITHIN:.0f}% or covered")
    step = held["step_err"].abs() * 100
    lines.append(f"held out, the cost model alone (fitted profile's price of the real steps): mean |error| "
                 f"{step.mean():.1f}%, worst {step.max():.1f}%")
    wide = held[(held["throughput_err"].abs() > WITHIN) & held["throughput_covered"]]
    for row in wide.to_dict("records"):
        lines.append(f"{row['policy']} at {row['num_users']} users: the throughput interval is wide between "
                     f"{row['throughput_low_by']} and {row['throughput_high_by']}, which the none/mtp1/mtp3 runs "
                     "cannot tell apart")
    drift = table["machine_drift"].abs() * 100
    lines.append(f"machine drift (reference probe around the real slices vs during profiling): mean |drift| "
                 f"{drift.mean():.1f}%, worst {drift.max():.1f}%")
    return lines


def main(argv: list[str] | None = None) -> HeldOut:
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--step", default="itl", choices=["itl", "tpot"],
                     help="the fit's step time: the mean ITL (default; the loop streams one chunk per step), or "
                          "TPOT x acceptance length less the last step's overshoot (what every tool reports); outputs "
                          "then end in _tpot")
    own.add_argument("--reanalyse", type=Path, default=None,
                     help="fit and predict again from an earlier run's output directory (no serving)")
    own.add_argument("--jobs", type=int, default=-1,
                     help="simulations run at once in the analysis, after the serving (default -1: one per CPU)")
    known, rest = own.parse_known_args(argv)
    if known.jobs == 0 or known.jobs < -1:
        own.error(f"--jobs: a number of processes >= 1, or -1 for one per CPU; got {known.jobs}")
    created = str(np.datetime64("today"))
    progress = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    if known.reanalyse is not None:
        out = known.reanalyse
        result = analyse(out, known.step, created, progress, known.jobs)
    else:
        cfg, out = parse_args(rest)
        result = run_heldout(cfg, out, known.step, created, progress, known.jobs)
    suffix = "" if known.step == "itl" else f"_{known.step}"
    (out / f"fitted_profile{suffix}.json").write_text(json.dumps(result.profile, indent=1) + "\n")
    result.table.to_csv(out / f"heldout{suffix}.csv", index=False)
    text = "\n\n".join([full_report(result.report), markdown(result.table), "\n".join(summary_lines(result.table))])
    (out / f"heldout{suffix}.md").write_text(text + "\n")
    print(text)
    return result


if __name__ == "__main__":
    main()
