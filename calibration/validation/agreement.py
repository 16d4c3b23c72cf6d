"""Do reruns of a validation agree? ``python -m calibration.validation.agreement RUN_DIR...``

Reads each run's ``points.csv`` (written by ``python -m calibration.validate``) and prints,
per run, the mean and worst absolute error of throughput and mean tok/s/user over the
reported points (a point refused for drift is left out and named), and, per point, every
run's error with its interval (95% CI: the spread over the point's slices and the error of the
profile's combination of its passes, combined). Two runs *agree* at a point
when their errors differ by no more than the two intervals combined (sqrt(ci1^2 + ci2^2)).
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import numpy as np
import pandas as pd

from calibration.validation.report import TARGET_METRICS, machine_verdict


def read_runs(dirs: list[Path]) -> list[pd.DataFrame]:
    tables = []
    for d in dirs:
        path = d / "points.csv"
        if not path.exists():
            raise SystemExit(f"{path}: no such file (give directories written by python -m calibration.validate)")
        tables.append(pd.read_csv(path))
    return tables


def run_lines(name: str, table: pd.DataFrame) -> list[str]:
    spoiled = table[table["spoiled"]] if "spoiled" in table else table.iloc[:0]
    lines = []
    for metric in TARGET_METRICS:
        err = table[f"{metric}_err"]
        worst = err.abs().idxmax()
        lines.append(f"{name} {metric}: mean |err| {100 * err.abs().mean():.1f}%, worst {100 * err[worst]:+.1f}% "
                     f"({table.loc[worst, 'policy']} x{table.loc[worst, 'num_users']}), "
                     f"{int((err.abs() <= 0.05).sum())}/{int(err.notna().sum())} points within 5%")
    if len(spoiled):
        lines.append(f"{name}: not reported (drift): " + ", ".join(
            f"{p} x{u}" for p, u in zip(spoiled["policy"], spoiled["num_users"], strict=True)))
    verdict = machine_verdict(table)
    if verdict:
        lines.append(f"{name}: {verdict}")
    return lines


def agreement_lines(names: list[str], tables: list[pd.DataFrame]) -> list[str]:
    lines = []
    for metric in TARGET_METRICS:
        agree, total = 0, 0
        lines.append(f"{metric}: error per run (+- 95% CI: slices, profile)")
        keys = tables[0][["policy", "num_users"]].itertuples(index=False)
        for policy, users in keys:
            rows = [t[(t["policy"] == policy) & (t["num_users"] == users)].iloc[0] for t in tables]
            errs = np.array([r[f"{metric}_err"] for r in rows])
            cis = np.array([r.get(f"{metric}_ci", np.nan) for r in rows])
            pairs = [(i, j) for i, j in itertools.combinations(range(len(rows)), 2)
                     if np.isfinite(errs[i]) and np.isfinite(errs[j])]
            ok = [abs(errs[i] - errs[j]) <= np.hypot(cis[i], cis[j]) for i, j in pairs]
            agree, total = agree + sum(ok), total + len(ok)
            cells = "  ".join(f"{100 * e:+5.1f} +- {100 * c:.1f}" if np.isfinite(e) else "  spoiled   "
                              for e, c in zip(errs, cis, strict=True))
            finite = errs[np.isfinite(errs)]  # a point spoiled in every run has no spread
            spread = f"{100 * (finite.max() - finite.min()):.1f} pp" if finite.size else "-"
            lines.append(f"  {policy:7s} x{users}: {cells}   spread {spread}"
                         f"   {'-' if not ok else 'agree' if all(ok) else 'DISAGREE'}")
        lines.append(f"  {metric}: {agree}/{total} run pairs agree within their intervals")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m calibration.validation.agreement", description=__doc__)
    parser.add_argument("runs", nargs="+", type=Path, help="output directories of python -m calibration.validate")
    args = parser.parse_args(argv)
    tables = read_runs(args.runs)
    names = [f"run{i + 1} ({d})" for i, d in enumerate(args.runs)]
    for name, table in zip(names, tables, strict=True):
        print("\n".join(run_lines(name, table)))
    print("\n".join(agreement_lines(names, tables)))


if __name__ == "__main__":
    main()
