"""How far each point's simulated figures move with the step price, measured with the run's own profile passes.

``python -m calibration.validation.price_slopes RUN... [--points]``

A validation report counts the profile's own error into each point's interval one for one: a
price off by x% is taken to move throughput and tok/s/user by x%. That holds where the decode
engine alone sets the pace. It does not hold where something else does: at one user on long
prompts the prefill takes a share of every request's time that no decode price touches (the
figures move less), and at a closed-loop point bound by prefill a dearer decode step lengthens
each request's decode and shortens its wait for the prefill queue, so fewer requests decode at
once and tok/s/user moves more than the price.

This command measures the slope instead of assuming it. Every profile pass the run kept prices
the point's real steps a little differently (their spread is what the report's interval counts);
the point is re-simulated with each pass alone, on the slices the run kept, and log(figure) is
fitted against log(price) over the passes, the price being the pass's price of the point's real
steps over their measured time. The slope's sign is turned so that 1 reads "one for one". Passes
differ by more than a common scale (each one's prices by R move on their own), so a slope from a
few passes is itself noisy: its standard error is printed beside it (none from two passes).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from calibration.profiling.step_prices import step_cost_ratio
from calibration.validation.recombine import (
    METRICS,
    kept_run_passes,
    read_config,
    reported_points,
    resimulate,
    run_logs,
)
from calibration.validation.setup import ValidationConfig
from policies import make_policy
from simulator.costs import HardwareProfile, load_profile


def fitted_slope(price: np.ndarray, figure: np.ndarray) -> tuple[float, float]:
    """(-d log figure / d log price by least squares, its standard error; NaN with two points, NaN slope when
    the prices do not differ)."""
    x, y = np.log(np.asarray(price, dtype=float)), np.log(np.asarray(figure, dtype=float))
    sxx = float(((x - x.mean()) ** 2).sum())
    if sxx == 0.0:
        return float("nan"), float("nan")
    slope = float(((x - x.mean()) * (y - y.mean())).sum() / sxx)
    if x.size < 3:
        return -slope, float("nan")
    residual = y - y.mean() - slope * (x - x.mean())
    return -slope, float(np.sqrt((residual ** 2).sum() / (x.size - 2) / sxx))


def real_step_prices(run: Path, cfg: ValidationConfig, passes: Sequence[HardwareProfile], policy: str, users: int,
                     kept: Sequence[int]) -> np.ndarray:
    """Each pass's price of the point's real steps (slices ``kept``) over their measured time."""
    path = run / f"real_{policy}_u{users}_steps.parquet"
    if not path.is_file():
        raise ValueError(f"{run}: no {path.name} (the real steps of {policy} x{users} that the passes price)")
    steps = pd.read_parquet(path)
    chunk_path = path.with_name(path.name.replace("_steps.", "_chunks."))
    chunks = pd.read_parquet(chunk_path) if chunk_path.is_file() else None
    slices = [steps[steps["slice"] == k] for k in kept]
    slice_chunks = None if chunks is None else [chunks[chunks["slice"] == k] for k in kept]
    made = make_policy(policy)
    return np.array([1.0 / step_cost_ratio(slices, p, cfg.drafter, made.name, made.draft_tokens(cfg.gamma),
                                           cfg.warmup_s, made.synchronous, slice_chunks) for p in passes])


def price_slopes(run: Path) -> pd.DataFrame:
    """One row per reported point: ``price_sd`` (the passes' relative spread in pricing its real steps) and, per
    metric of :data:`~calibration.validation.recombine.METRICS`, ``<metric>_slope`` and ``<metric>_slope_se``."""
    cfg = read_config(run)
    passes = kept_run_passes(run, cfg)
    pricing = load_profile(run / "pricing_profile.json")
    reported, slices = reported_points(run)
    points = list(zip(reported["policy"], reported["num_users"].astype(int), strict=True))
    prices = []  # priced before simulating: a missing steps table stops the command at once
    for policy, users in points:
        mine = slices[(slices["policy"] == policy) & (slices["num_users"] == users)]
        kept = mine.loc[mine["kept"].astype(bool), "slice"].tolist() or mine["slice"].tolist()
        prices.append(real_step_prices(run, cfg, passes, policy, users, [int(k) for k in kept]))
    logs = run_logs(run)
    sims = [resimulate(cfg, logs, p, pricing, reported, slices) for p in passes]
    rows = []
    for i, ((policy, users), price) in enumerate(zip(points, prices, strict=True)):
        row = {"policy": policy, "num_users": users, "price_sd": float(np.std(price, ddof=1) / price.mean())}
        for m in METRICS:
            row[f"{m}_slope"], row[f"{m}_slope_se"] = fitted_slope(price, [s[f"{m}_sim"].iloc[i] for s in sims])
        rows.append(row)
    table = pd.DataFrame(rows)
    table.attrs["num_passes"] = len(passes)
    return table


def slope_lines(run: Path, table: pd.DataFrame) -> list[str]:
    lines = [f"{run}: {len(table)} points re-simulated with each of {table.attrs['num_passes']} profile passes "
             f"alone; the passes price the points' real steps {100 * table['price_sd'].mean():.1f}% apart on average "
             "(relative SD)"]
    for m, label in METRICS.items():
        slope = table[f"{m}_slope"]
        high, low = slope.idxmax(), slope.idxmin()
        lines.append(f"  {label}: moves {slope.median():.2f} x the price (median over points), from "
                     f"{slope[low]:.2f} ({table['policy'][low]} x{table['num_users'][low]}) to {slope[high]:.2f} "
                     f"({table['policy'][high]} x{table['num_users'][high]})")
    return lines


def main(argv: list[str] | None = None) -> dict[Path, pd.DataFrame]:
    p = argparse.ArgumentParser(prog="python -m calibration.validation.price_slopes",
                                description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="output folders of calibration.validate")
    p.add_argument("--points", action="store_true", help="also print every point's slopes")
    args = p.parse_args(argv)
    tables: dict[Path, pd.DataFrame] = {}
    try:
        for run in args.runs:
            tables[run] = price_slopes(run)
            print("\n".join(slope_lines(run, tables[run])))
            if args.points:
                print(tables[run].to_string(index=False, float_format=lambda x: f"{x:.2f}",
                                            formatters={"price_sd": lambda x: f"{100 * x:.1f}%"}))
    except (ValueError, OSError) as err:
        p.error(str(err))
    return tables


if __name__ == "__main__":
    main()
