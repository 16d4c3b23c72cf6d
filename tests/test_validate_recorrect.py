"""Correcting a finished validation run's real figures again (python -m calibration.validation.recorrect)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calibration.validation.recorrect import main, recorrect
from calibration.validation.setup import ValidationConfig
from calibration.validation.validate import PROBE_COLUMNS

PASS_S = [10.0, 10.0]
# round 0: mtp1 x1, x2; round 1: the same (the probe log's order); every slice within 10% of the passes
SLICE_S = {(1, 0): 10.4, (2, 0): 10.2, (1, 1): 10.6, (2, 1): 10.4}
REAL_TPS = {(1, 0): 100.0, (2, 0): 190.0, (1, 1): 98.0, (2, 1): 186.0}


def _run(tmp_path: Path, machine_drift_shift: float = 0.0) -> Path:
    run = tmp_path / "run"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(asdict(ValidationConfig(policies=("mtp1",), users=(1, 2),
                                                                        rounds=2))))
    rows = [(k, "profile", "", 0, t, t, np.nan, np.nan, 0) for k, t in enumerate(PASS_S)]
    rows += [(k, "slice", "mtp1", u, SLICE_S[u, k], SLICE_S[u, k], np.nan, np.nan, 0) for k in (0, 1) for u in (1, 2)]
    pd.DataFrame(rows, columns=list(PROBE_COLUMNS)).to_csv(run / "probes.csv", index=False)
    slices = [{"policy": "mtp1", "num_users": u, "slice": k, "machine_drift": SLICE_S[u, k] / 10.0 - 1
               + machine_drift_shift, "kept": True, "output_tokens_per_s_real": REAL_TPS[u, k]}
              for u in (1, 2) for k in (0, 1)]
    pd.DataFrame(slices).to_csv(run / "slices.csv", index=False)
    points = [{"policy": "mtp1", "num_users": u, "spoiled": False, "throughput_sim": 1.03 * real,
               "throughput_real_raw": real, "throughput_err": 0.01 * u, "tpu_mean_sim": 50.0 / u,
               "tpu_mean_real_raw": 49.0 / u, "tpu_mean_err": -0.01 * u}
              for u, real in ((1, 99.0), (2, 188.0))]
    pd.DataFrame(points).to_csv(run / "points.csv", index=False)
    return run


def _expected(reference: str, weight: float) -> dict[int, tuple[float, float]]:
    level = 10.0 if reference == "passes" else float(np.mean(list(SLICE_S.values())))
    out = {}
    for u, real, tpu_real in ((1, 99.0, 49.0), (2, 188.0, 24.5)):
        tps = np.array([REAL_TPS[u, k] for k in (0, 1)])
        drift = np.array([SLICE_S[u, k] / level - 1 for k in (0, 1)])
        factor = np.sum(tps * (1 + weight * drift)) / np.sum(tps)
        out[u] = (1.03 * real / (real * factor) - 1, (50.0 / u) / (tpu_real * factor) - 1)
    return out


@pytest.mark.parametrize("reference", ["passes", "slices"])
def test_recorrect_scales_each_kept_slice_by_its_drift_from_the_chosen_reference(tmp_path, reference) -> None:
    """Against the passes (noiseless probes, identical passes: weight 1) every slice is corrected by its whole drift
    from 10 ms; against the slices, by its departure from their mean, 10.4 ms (the run's common +4% is left alone).
    The errors the run reported pass through unchanged."""
    table = recorrect(_run(tmp_path), reference)
    weight = float(table["weight"].iloc[0])
    if reference == "passes":
        assert weight == 1.0
    else:
        kept = np.array(list(SLICE_S.values())) / 10.4
        centred = kept - 1
        assert weight == pytest.approx(1 - np.var(kept, ddof=1) / 4 / np.mean(centred ** 2))
    for row in table.itertuples(index=False):
        throughput, tpu = _expected(reference, weight)[row.num_users]
        assert row.throughput_err_now == pytest.approx(throughput, rel=1e-12)
        assert row.tpu_mean_err_now == pytest.approx(tpu, rel=1e-12)
        assert row.throughput_err == pytest.approx(0.01 * row.num_users)
        assert row.tpu_mean_err == pytest.approx(-0.01 * row.num_users)


def test_recorrect_refuses_a_slices_table_that_does_not_follow_from_the_probes(tmp_path, capsys) -> None:
    with pytest.raises(ValueError, match="mtp1 x1 in slices.csv do not follow from probes.csv"):
        recorrect(_run(tmp_path, machine_drift_shift=0.01), "slices")
    run = _run(tmp_path / "ok")
    main([str(run)])
    out = capsys.readouterr().out
    assert "correction against slices" in out and "throughput reported: mean |error| 1.50%, 2 of 2 within 5%" in out
