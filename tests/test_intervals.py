"""Prediction intervals over a fitted profile's alternatives, run in processes (the intervals' figures:
tests/test_fit_profile.py)."""

from __future__ import annotations

import os
import threading
from typing import Any

import pandas as pd
from joblib import Parallel, delayed

from experiments.intervals import with_intervals
from policies import make_policy
from simulator import Results, SimulationSpec
from simulator.costs import load_profile, profile_from_dict

ANALYTIC = load_profile("h200_qwen3-8b_analytic")


def _pid_run(spec: SimulationSpec) -> Results:
    """A stand-in simulation whose throughput is the process it ran in and its acceptance length the thread."""
    return Results(spec, pd.DataFrame(), pd.DataFrame(), {"output_tokens_per_s": float(os.getpid()),
                                                          "mean_acceptance_length": float(threading.get_ident())})


def _intervals_in_a_worker(spec: SimulationSpec) -> tuple[float, float, dict[str, Any]]:
    summary = with_intervals(spec, _pid_run(spec), _pid_run, jobs=2).summary
    return float(os.getpid()), float(threading.get_ident()), summary


def test_alternatives_run_in_processes_but_not_inside_a_parallel_sweeps_job():
    """``jobs`` > 1 spreads the alternatives over processes unless they are quick; inside a joblib worker (Hydra's
    joblib launcher runs each sweep job in one) they run in that worker, one after another, not in processes of
    their own."""
    raw = {**ANALYTIC.raw, "metadata": {**ANALYTIC.raw["metadata"],
                                        "fit": {"alternatives": {name: ANALYTIC.raw for name in "abcd"}}}}
    spec = SimulationSpec(policy=make_policy("mtp1"), profile=profile_from_dict(raw, "<fitted>"))
    here = with_intervals(spec, _pid_run(spec), _pid_run, jobs=2).summary
    assert (here["output_tokens_per_s_low"], here["output_tokens_per_s_high"]) != (os.getpid(), os.getpid())
    # a central run of 1 s: four alternatives would take about 4 s, less than starting processes costs
    quick = with_intervals(spec, _pid_run(spec), _pid_run, jobs=2, central_s=1.0).summary
    assert quick["output_tokens_per_s_low"] == quick["output_tokens_per_s_high"] == os.getpid()
    ((worker, thread, nested),) = Parallel(n_jobs=2)(delayed(_intervals_in_a_worker)(spec) for _ in range(1))
    assert worker != os.getpid()
    assert nested["output_tokens_per_s_low"] == nested["output_tokens_per_s_high"] == worker
    assert nested["mean_acceptance_length_low"] == nested["mean_acceptance_length_high"] == thread
