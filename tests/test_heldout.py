"""The held-out command end to end on random tiny models: serve, write benchmark results, fit, predict, reanalyse."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from calibration.fitting.readers import read_results
from calibration.fitting.runs import overshoot_tokens
from calibration.validation.heldout import FIT_POLICIES, HELD_OUT_POLICIES, main
from simulator.costs import load_profile


@pytest.mark.slow  # about a minute of real serving: CI's second step
def test_heldout_command_fits_from_static_runs_and_predicts_the_others(tmp_path) -> None:
    out = tmp_path / "heldout"
    result = main(["--models", "random", "--users", "2", "--duration-s", "1.5", "--warmup-s", "0.3",
                   "--rounds", "2", "--output-tokens", "32", "--profile-repeats", "3", "--log-requests", "16",
                   "--nice", "-10", "--seed", "0", "--out", str(out)])
    table = result.table
    assert list(table["policy"]) == [*FIT_POLICIES, *HELD_OUT_POLICIES]
    assert set(table.loc[table["policy"].isin(HELD_OUT_POLICIES), "role"]) == {"held out"}
    # only the static points became benchmark results, and the fit read nothing else
    bench = read_results([out / "bench" / "runs.csv"])
    assert sorted(r.num_speculative_tokens for r in bench) == [0, 1, 3, 7]
    assert {obs.run.num_speculative_tokens for obs in result.report.observations} == {0, 1, 3}
    # the default step time is the mean ITL: the fitted runs' step times are the gaps between the loop's chunks
    by_k = {r.num_speculative_tokens: r.mean_itl_ms / 1e3 for r in bench}
    for obs in result.report.observations:
        assert obs.step_s == pytest.approx(by_k[obs.run.num_speculative_tokens])
    fitted = load_profile(out / "fitted_profile.json")
    assert fitted.source == "fitted" and fitted.raw["scheduler"] == load_profile(out / "profile.json").raw["scheduler"]
    for metric in ("throughput", "tpu_mean"):
        held = table[table["role"] == "held out"]
        assert np.isfinite(held[f"{metric}_sim"]).all() and np.isfinite(held[f"{metric}_err"]).all()
        assert (held[f"{metric}_low"] <= held[f"{metric}_high"]).all()
        covered = (held[f"{metric}_low"] <= held[f"{metric}_real"]) & (held[f"{metric}_real"] <= held[f"{metric}_high"])
        assert (covered == held[f"{metric}_covered"]).all()
    assert (out / "heldout.md").read_text().count("| held out |") == len(HELD_OUT_POLICIES)

    # the analysis again from the files alone, with TPOT x tau: its own outputs beside the first (the first
    # simulated one process per CPU, this one in this process)
    again = main(["--reanalyse", str(out), "--step", "tpot", "--jobs", "1"])
    assert (out / "heldout_tpot.csv").is_file() and (out / "fitted_profile_tpot.json").is_file()
    by_tpot = {r.num_speculative_tokens: r.mean_tpot_ms / 1e3 * (r.acceptance_length or 1.0)
               * (r.mean_output_tokens - 1) / (r.mean_output_tokens - 1 + overshoot_tokens(r.acceptance_length or 1.0,
                                                                                         r.num_speculative_tokens))
               for r in bench}
    for obs in again.report.observations:
        assert obs.step_s == pytest.approx(by_tpot[obs.run.num_speculative_tokens])
    saved = pd.read_csv(out / "heldout.csv")
    assert np.allclose(saved["throughput_real"], again.table["throughput_real"])  # same real runs, read back
    assert json.loads((out / "heldout_config.json").read_text())["policies"] == [*FIT_POLICIES, *HELD_OUT_POLICIES]


@pytest.mark.parametrize("jobs", ["0", "-2"])
def test_jobs_must_be_a_count_or_minus_one(jobs, capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--reanalyse", "nowhere", "--jobs", jobs])
    assert f"--jobs: a number of processes >= 1, or -1 for one per CPU; got {jobs}" in capsys.readouterr().err
