"""Re-simulate a finished validation run with its profile passes combined another way, or with its logged texts
drawn again.

``python -m calibration.validation.recombine RUN... [--rules median,trimmed,mean] [--points] [--log-resamples N]``

A run's output folder keeps what its simulator side was built from (``config.json``, every
profile pass in ``profile_passes/``, ``pricing_profile.json``, the acceptance logs) and its real
figures (``points.csv``, ``slices.csv``). This command rebuilds the simulator's profile from the
passes by each rule of :data:`calibration.validation.passes.COMBINE_RULES`, re-simulates every
reported point on the slices the run kept, and sets the result against the run's real figures
as the run corrected them for drift. Only the simulator side changes; which slices were kept
does not depend on the rule (the drift reference is the passes' probe readings, not the profile).

The run's own rule must give back the run's own simulator figures: the line for it says how far
they moved (0 unless the code changed since the run).

``--log-resamples N`` asks how much the run's acceptance logs, a sample of ``log_requests`` texts per domain,
move its figures. Every point of a run replays the same logged texts, and so does every rerun with the same seed,
so an unlucky sample shifts them all alike and no interval of the run holds it. N times, the logged requests of
each domain are drawn again with replacement (the same draw for every block size's log, which were recorded on
the same prompts) and every point re-simulated with the run's own rule; the spread of the results over the
draws estimates what another sample of texts would have given. Nothing is written outside a temporary folder.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from calibration.validation.passes import COMBINE_RULES, check_rule, combine_passes
from calibration.validation.points import drift_readings, kept_passes, pooled
from calibration.validation.report import point_row
from calibration.validation.setup import ValidationConfig, simulate_slice, simulator_setup
from simulator.costs import HardwareProfile, load_profile

METRICS = {"throughput": "throughput", "tpu_mean": "tok/s/user"}  # points.csv prefix -> label


def read_config(run: Path) -> ValidationConfig:
    """The run's ``config.json`` as a :class:`ValidationConfig` (lists as tuples; a key this version does not know
    is an error that names it)."""
    path = run / "config.json"
    if not path.is_file():
        raise ValueError(f"{run}: no config.json (not the output folder of calibration.validate)")
    raw = json.loads(path.read_text())
    known = {f.name for f in dataclasses.fields(ValidationConfig)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {', '.join(unknown)} (written by another version)")
    return ValidationConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()})


def read_passes(run: Path) -> list[HardwareProfile]:
    found = [p for p in (run / "profile_passes").glob("pass*.json") if p.stem[4:].isdigit()]
    paths = sorted(found, key=lambda p: int(p.stem[4:]))
    if len(paths) < 2:
        raise ValueError(f"{run}: needs profile_passes/pass<k>.json from two profile passes or more (runs of two "
                         f"rounds or more write them), found {len(paths)}")
    return [load_profile(p) for p in paths]


def kept_run_passes(run: Path, cfg: ValidationConfig) -> list[HardwareProfile]:
    """The run's profile passes that its drift guard kept (:func:`calibration.validation.points.kept_passes`, from
    ``probes.csv``): the ones its profile combined."""
    passes = read_passes(run)
    if not (run / "probes.csv").is_file():
        raise ValueError(f"{run}: no probes.csv (the drift readings that say which profile passes the run kept)")
    _, _, pass_s = drift_readings(pd.read_csv(run / "probes.csv"), cfg.drift_measure)
    if len(pass_s) != len(passes):
        raise ValueError(f"{run}: probes.csv has {len(pass_s)} profile-pass readings for {len(passes)} passes in "
                         "profile_passes/")
    return [passes[k] for k in kept_passes(pass_s, cfg.drift_tolerance)]


def run_logs(run: Path) -> dict[int, Path]:
    """The run's acceptance logs by the block size they draft."""
    logs = {int(p.stem.rsplit("_g", 1)[1]): p for p in run.glob("acceptance_log_g*.parquet")}
    if not logs:
        raise ValueError(f"{run}: no acceptance_log_g<k>.parquet (the logs the simulator replays)")
    return logs


def resimulate(cfg: ValidationConfig, logs: dict[int, Path], profile: HardwareProfile, pricing: HardwareProfile,
               points: pd.DataFrame, slices: pd.DataFrame) -> pd.DataFrame:
    """Each reported point's simulator figures (:data:`METRICS`) with ``profile`` and the acceptance ``logs``, on the
    slices the run kept."""
    setups = {g: simulator_setup(cfg, profile, path, g, pricing) for g, path in logs.items()}
    rows = []
    for policy, users in zip(points["policy"], points["num_users"].astype(int), strict=True):
        mine = slices[(slices["policy"] == policy) & (slices["num_users"] == users)]
        use = mine.loc[mine["kept"].astype(bool), "slice"].tolist() or mine["slice"].tolist()
        sims = [run_ for k in use for run_ in simulate_slice(cfg, (policy, users), setups, int(k))]
        row = point_row(policy, users, pooled(sims), pooled(sims))
        rows.append({"policy": policy, "num_users": users, **{f"{m}_sim": row[f"{m}_sim"] for m in METRICS}})
    return pd.DataFrame(rows)


def reported_points(run: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the run's points not spoiled, its slices)."""
    points = pd.read_csv(run / "points.csv")
    reported = points[~points["spoiled"].astype(bool)].reset_index(drop=True)
    if reported.empty:
        raise ValueError(f"{run / 'points.csv'}: every point is spoiled (column spoiled): nothing to compare")
    return reported, pd.read_csv(run / "slices.csv")


def recombine(run: Path, cfg: ValidationConfig, rules: tuple[str, ...]) -> pd.DataFrame:
    """One row per (rule, reported point): the re-simulated figures, the run's real ones and the errors (``cfg``:
    the run's :func:`read_config`)."""
    passes = kept_run_passes(run, cfg)
    pricing = load_profile(run / "pricing_profile.json")
    reported, slices = reported_points(run)
    logs = run_logs(run)
    frames = []
    for rule in rules:
        sim = resimulate(cfg, logs, combine_passes(passes, rule), pricing, reported, slices)
        out = sim.assign(rule=rule)
        for m in METRICS:
            out[f"{m}_real"] = reported[f"{m}_real"]
            out[f"{m}_err"] = out[f"{m}_sim"] / out[f"{m}_real"] - 1
            out[f"{m}_moved"] = out[f"{m}_sim"] / reported[f"{m}_sim"] - 1  # against the run's own simulator
        frames.append(out)
    return pd.concat(frames, ignore_index=True)


def resampled_logs(logs: dict[int, pd.DataFrame], rng: np.random.Generator) -> dict[int, pd.DataFrame]:
    """The logs with each domain's requests drawn again with replacement, as many as the domain holds; drawn once
    for all the logs (they hold the same prompts). Request ``j`` of a domain in the result is the ``j``-th draw."""
    first = next(iter(logs.values()))
    draws = {d: rng.choice(np.sort(ids.unique()), size=ids.nunique(), replace=True)
             for d, ids in first.groupby("domain", observed=True)["request_id"]}
    out = {}
    for g, log in logs.items():
        parts = []
        for domain, picked in draws.items():
            mine = log[log["domain"] == domain]
            by_id = dict(tuple(mine.groupby("request_id")))
            missing = sorted(set(picked.tolist()) - set(by_id))
            if missing:
                raise ValueError(f"acceptance log g{g}: domain {domain} lacks request(s) {missing[:5]} that the g"
                                 f"{next(iter(logs))} log holds (the logs were not recorded on the same prompts)")
            parts += [by_id[int(r)].assign(request_id=j) for j, r in enumerate(picked)]
        out[g] = pd.concat(parts, ignore_index=True)
    return out


def check_resamples(resamples: int) -> None:
    if resamples < 2:
        raise ValueError(f"--log-resamples must be >= 2 (a spread needs two draws), got {resamples}")


def log_sample_spread(run: Path, cfg: ValidationConfig, resamples: int, seed: int = 0) -> pd.DataFrame:
    """Per reported point, the simulator's figures over ``resamples`` draws of the run's logged texts
    (:func:`resampled_logs`; the run's own rule): columns ``<metric>_sd`` (relative standard deviation over the
    draws) and ``<metric>_err_mean`` (the mean error against the run's real figure)."""
    check_resamples(resamples)
    profile = combine_passes(kept_run_passes(run, cfg), cfg.combine_passes)
    pricing = load_profile(run / "pricing_profile.json")
    reported, slices = reported_points(run)
    logs = {g: pd.read_parquet(p) for g, p in run_logs(run).items()}
    rng = np.random.default_rng(seed)
    sims = []
    with tempfile.TemporaryDirectory() as tmp:
        for b in range(resamples):
            paths = {}
            for g, log in resampled_logs(logs, rng).items():
                paths[g] = Path(tmp) / f"resample{b}_g{g}.parquet"
                log.to_parquet(paths[g])
            sims.append(resimulate(cfg, paths, profile, pricing, reported, slices))
    out = reported[["policy", "num_users"]].copy()
    for m in METRICS:
        values = np.stack([s[f"{m}_sim"].to_numpy(dtype=float) for s in sims])
        out[f"{m}_sd"] = values.std(axis=0, ddof=1) / values.mean(axis=0)
        out[f"{m}_err_mean"] = values.mean(axis=0) / reported[f"{m}_real"].to_numpy(dtype=float) - 1
    return out


def spread_lines(run: Path, spread: pd.DataFrame, resamples: int) -> list[str]:
    lines = [f"{run}: {resamples} draws of the logged texts (each domain's logged requests drawn again)"]
    for m, label in METRICS.items():
        sd = spread[f"{m}_sd"]
        worst = sd.idxmax()
        lines.append(f"  {label}: moves by {100 * sd.mean():.1f}% on average (relative SD over the draws), at most "
                     f"{100 * sd[worst]:.1f}% ({spread['policy'][worst]} x{spread['num_users'][worst]}); mean error "
                     f"over the draws {100 * spread[f'{m}_err_mean'].mean():+.2f}%")
    return lines


def summary_lines(run: Path, table: pd.DataFrame, own_rule: str) -> list[str]:
    lines = [f"{run}: {table['policy'].nunique()} policies, {len(table) // table['rule'].nunique()} reported "
             f"points; the run combined its passes by {own_rule}"]
    for rule, part in table.groupby("rule", sort=False):
        parts = []
        for m, label in METRICS.items():
            err = part[f"{m}_err"]
            worst = err.abs().idxmax()
            parts.append(f"{label} mean |error| {100 * err.abs().mean():.2f}%, mean {100 * err.mean():+.2f}%, "
                         f"{int((err.abs() <= 0.05).sum())} of {len(err)} within 5%, worst {100 * err[worst]:+.1f}% "
                         f"({part['policy'][worst]} x{part['num_users'][worst]})")
        own = ""
        if rule == own_rule:
            moved = float(np.nanmax(np.abs(part[[f"{m}_moved" for m in METRICS]].to_numpy())))
            own = f" [the run's own rule: its simulator figures moved by at most {100 * moved:.2g}%]"
        lines.append(f"  {rule:8s} " + "; ".join(parts) + own)
    return lines


def main(argv: list[str] | None = None) -> dict[Path, pd.DataFrame]:
    p = argparse.ArgumentParser(prog="python -m calibration.validation.recombine", description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="output folders of calibration.validate")
    p.add_argument("--rules", default=",".join(COMBINE_RULES),
                   help="comma-separated rules to combine the passes by (default: %(default)s)")
    p.add_argument("--points", action="store_true", help="also print every point's errors under each rule")
    p.add_argument("--log-resamples", type=int, default=0, metavar="N",
                   help="also re-simulate with N draws of the logged texts and print the spread (default: none)")
    args = p.parse_args(argv)
    try:
        rules = tuple(check_rule(r.strip()) for r in args.rules.split(","))
        if args.log_resamples:
            check_resamples(args.log_resamples)
        tables: dict[Path, Any] = {}
        for run in args.runs:
            cfg = read_config(run)
            tables[run] = recombine(run, cfg, rules)
            print("\n".join(summary_lines(run, tables[run], cfg.combine_passes)))
            if args.points:
                cols = ["rule", "policy", "num_users", *(f"{m}_err" for m in METRICS)]
                print(tables[run][cols].to_string(index=False, float_format=lambda x: f"{100 * x:+.1f}%"))
            if args.log_resamples:
                spread = log_sample_spread(run, cfg, args.log_resamples)
                print("\n".join(spread_lines(run, spread, args.log_resamples)))
                if args.points:
                    print(spread.to_string(index=False, float_format=lambda x: f"{100 * x:+.1f}%"))
    except (ValueError, OSError) as err:
        p.error(str(err))
    return tables


if __name__ == "__main__":
    main()
