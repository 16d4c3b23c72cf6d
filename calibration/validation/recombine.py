"""Re-simulate a finished validation run with its profile passes combined another way.

``python -m calibration.validation.recombine RUN... [--rules median,trimmed,mean] [--points]``

A run's output folder keeps what its simulator side was built from (``config.json``, every
profile pass in ``profile_passes/``, ``pricing_profile.json``, the acceptance logs) and its real
figures (``points.csv``, ``slices.csv``). This command rebuilds the simulator's profile from the
passes by each rule of :data:`calibration.validation.passes.COMBINE_RULES`, re-simulates every
reported point on the slices the run kept, and sets the result against the run's real figures
as the run corrected them for drift. Only the simulator side changes; which slices were kept
does not depend on the rule (the drift reference is the passes' probe readings, not the profile).

The run's own rule must give back the run's own simulator figures: the line for it says how far
they moved (0 unless the code changed since the run). Nothing is written.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from calibration.validation.passes import COMBINE_RULES, check_rule, combine_passes
from calibration.validation.points import pooled
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


def resimulate(run: Path, cfg: ValidationConfig, profile: HardwareProfile, pricing: HardwareProfile,
               points: pd.DataFrame, slices: pd.DataFrame) -> pd.DataFrame:
    """Each reported point's simulator figures (:data:`METRICS`) with ``profile``, on the slices the run kept."""
    logs = {int(p.stem.rsplit("_g", 1)[1]): p for p in run.glob("acceptance_log_g*.parquet")}
    if not logs:
        raise ValueError(f"{run}: no acceptance_log_g<k>.parquet (the logs the simulator replays)")
    setups = {g: simulator_setup(cfg, profile, path, g, pricing) for g, path in logs.items()}
    rows = []
    for policy, users in zip(points["policy"], points["num_users"].astype(int), strict=True):
        mine = slices[(slices["policy"] == policy) & (slices["num_users"] == users)]
        use = mine.loc[mine["kept"].astype(bool), "slice"].tolist() or mine["slice"].tolist()
        sims = [run_ for k in use for run_ in simulate_slice(cfg, (policy, users), setups, int(k))]
        row = point_row(policy, users, pooled(sims), pooled(sims))
        rows.append({"policy": policy, "num_users": users, **{f"{m}_sim": row[f"{m}_sim"] for m in METRICS}})
    return pd.DataFrame(rows)


def recombine(run: Path, cfg: ValidationConfig, rules: tuple[str, ...]) -> pd.DataFrame:
    """One row per (rule, reported point): the re-simulated figures, the run's real ones and the errors (``cfg``:
    the run's :func:`read_config`)."""
    passes = read_passes(run)
    pricing = load_profile(run / "pricing_profile.json")
    points = pd.read_csv(run / "points.csv")
    slices = pd.read_csv(run / "slices.csv")
    reported = points[~points["spoiled"].astype(bool)].reset_index(drop=True)
    if reported.empty:
        raise ValueError(f"{run / 'points.csv'}: every point is spoiled (column spoiled): nothing to compare")
    frames = []
    for rule in rules:
        sim = resimulate(run, cfg, combine_passes(passes, rule), pricing, reported, slices)
        out = sim.assign(rule=rule)
        for m in METRICS:
            out[f"{m}_real"] = reported[f"{m}_real"]
            out[f"{m}_err"] = out[f"{m}_sim"] / out[f"{m}_real"] - 1
            out[f"{m}_moved"] = out[f"{m}_sim"] / reported[f"{m}_sim"] - 1  # against the run's own simulator
        frames.append(out)
    return pd.concat(frames, ignore_index=True)


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
    args = p.parse_args(argv)
    try:
        rules = tuple(check_rule(r.strip()) for r in args.rules.split(","))
        tables: dict[Path, Any] = {}
        for run in args.runs:
            cfg = read_config(run)
            tables[run] = recombine(run, cfg, rules)
            print("\n".join(summary_lines(run, tables[run], cfg.combine_passes)))
            if args.points:
                cols = ["rule", "policy", "num_users", *(f"{m}_err" for m in METRICS)]
                print(tables[run][cols].to_string(index=False, float_format=lambda x: f"{100 * x:+.1f}%"))
    except (ValueError, OSError) as err:
        p.error(str(err))
    return tables


if __name__ == "__main__":
    main()
