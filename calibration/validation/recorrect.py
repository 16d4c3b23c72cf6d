"""Correct a finished validation run's real figures for drift again, against another reference.

``python -m calibration.validation.recorrect RUN... [--drift-reference slices|passes]``

A run's output folder keeps every slice's drift readings (``probes.csv``), each slice's real throughput and
whether the drift guard kept it (``slices.csv``) and each point's figures as measured (``points.csv``: the
``*_real_raw`` columns). This command corrects the real figures again as :func:`calibration.validation.points.
point_result` does, with the drift measured against ``--drift-reference`` (``ValidationConfig.drift_reference``),
and prints each point's throughput and tok/s/user errors as the run reported them and as corrected now, with the
mean absolute error, the points within 5% and the signed mean of each. Only the real side's correction changes:
the simulator's figures and which slices were kept stay as the run wrote them. Nothing is run or written.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from calibration.validation.points import drift_correction, drift_factor, drift_readings, slice_drifts
from calibration.validation.recombine import read_config, reported_points
from calibration.validation.report import TARGET_METRICS
from calibration.validation.setup import ValidationConfig

BOUND = 0.05  # the per-point bound the validation targets


def recorrect(run: Path, reference: str) -> pd.DataFrame:
    """One row per reported point of ``run``: its errors as reported (``<metric>_err``) and corrected against
    ``reference`` (``<metric>_err_now``), with the correction's weight."""
    cfg = read_config(run)
    points, slices = reported_points(run)
    probes = pd.read_csv(run / "probes.csv")
    before_s, after_s, pass_s = drift_readings(probes, cfg.drift_measure)
    drifts = slice_drifts(before_s, after_s, pass_s)
    logged = probes[probes["phase"] == "slice"]
    if len(logged) != len(slices):
        raise ValueError(f"{run}: probes.csv has {len(logged)} slice rows, slices.csv {len(slices)}: not one run's")
    corrections, weight = drift_correction(drifts, before_s, after_s, pass_s, cfg.drift_tolerance, reference)
    rows = []
    for point in points.itertuples(index=False):
        mine = ((logged["policy"] == point.policy) & (logged["num_users"] == point.num_users)).to_numpy()
        table = slices[(slices["policy"] == point.policy) & (slices["num_users"] == point.num_users)]
        table = table.sort_values("slice")
        if not np.allclose(table["machine_drift"].to_numpy(), drifts[mine], rtol=0, atol=1e-9):
            raise ValueError(f"{run}: the drifts of {point.policy} x{point.num_users} in slices.csv do not follow "
                             f"from probes.csv (column machine_drift)")
        kept = table["kept"].astype(bool).to_numpy()
        real_tps = table["output_tokens_per_s_real"].to_numpy()[kept]
        factor = drift_factor(real_tps, weight * corrections[mine][kept])
        row = {"policy": point.policy, "num_users": int(point.num_users), "weight": weight}
        for name in TARGET_METRICS:
            row[f"{name}_err"] = getattr(point, f"{name}_err")
            row[f"{name}_err_now"] = getattr(point, f"{name}_sim") / (getattr(point, f"{name}_real_raw") * factor) - 1
        rows.append(row)
    return pd.DataFrame(rows)


def summary_lines(name: str, table: pd.DataFrame, reference: str) -> list[str]:
    lines = [f"{name}: correction against {reference}, weight {table['weight'].iloc[0]:.2f}",
             f"  {'point':<12} {'throughput reported':>20} {'now':>8} {'tok/s/user reported':>20} {'now':>8}"]
    for row in table.itertuples(index=False):
        lines.append(f"  {row.policy + ' x' + str(row.num_users):<12} {100 * row.throughput_err:>+19.2f}% "
                     f"{100 * row.throughput_err_now:>+7.2f}% {100 * row.tpu_mean_err:>+19.2f}% "
                     f"{100 * row.tpu_mean_err_now:>+7.2f}%")
    for name in TARGET_METRICS:
        for column, label in ((f"{name}_err", "reported"), (f"{name}_err_now", "now")):
            err = table[column]
            lines.append(f"  {name} {label}: mean |error| {100 * err.abs().mean():.2f}%, "
                         f"{int((err.abs() <= BOUND).sum())} of {len(err)} within {100 * BOUND:g}%, "
                         f"signed mean {100 * err.mean():+.2f}%")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m calibration.validation.recorrect", description=__doc__)
    parser.add_argument("runs", nargs="+", type=Path, help="output directories of python -m calibration.validate")
    parser.add_argument("--drift-reference", default=ValidationConfig.drift_reference, choices=["slices", "passes"],
                        help="what each slice's drift is measured from (default: %(default)s)")
    args = parser.parse_args(argv)
    for run in args.runs:
        print("\n".join(summary_lines(str(run), recorrect(run, args.drift_reference), args.drift_reference)))


if __name__ == "__main__":
    main()
