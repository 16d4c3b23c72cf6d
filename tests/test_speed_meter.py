"""The speed meter (``calibration.serving.speed_meter``): canary readings go to the stretch they were taken in,
the serving loop reads it before each step and keeps the readings off its decode clock, the profile's grid
timings do not read it."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest
import torch

from calibration.models.drafters import build_drafter
from calibration.profiling.timing import run_times_s
from calibration.serving.loop import ServingModels, ServingSpec, random_prompts, serve
from calibration.serving.speed_meter import ERROR_BATCHES, SpeedMeter, tick
from calibration.validation.points import drift_readings
from calibration.validation.setup import ValidationConfig
from calibration.validation.validate import PROBE_COLUMNS, parse_args
from policies import make_policy
from policies.base import CostCurve
from simulator import EngineLimits
from traces.workload import Workload

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def scripted_meter(durations: list[float]) -> SpeedMeter:
    """A meter on a fake clock whose canary takes ``durations`` in turn."""
    now = [0.0]
    left = list(durations)

    def canary() -> None:
        now[0] += left.pop(0)
    return SpeedMeter(canary, lambda: now[0])


def test_readings_are_booked_to_the_stretch_they_were_taken_in() -> None:
    meter = scripted_meter([1.0, 2.0, 3.0, 10.0, 6.0])
    tick()  # no stretch open: nothing read
    with meter.phase("a"):
        tick(), tick(), tick()
    with meter.phase("b"):
        tick()
    tick()
    with meter.phase("a"):  # the same key again adds to it
        tick()
    assert meter.readings == {"a": [1.0, 2.0, 3.0, 6.0], "b": [10.0]}
    mean_s, se_s, n = meter.summary("a")
    assert (mean_s, n) == (3.0, 4) and np.isnan(se_s)  # too few readings for batch means
    assert np.isnan(meter.summary("nothing")[0]) and meter.summary("nothing")[2] == 0


def test_standard_error_comes_from_contiguous_batches() -> None:
    # Readings in two spells (slow, then fast): neighbours are alike, as on a machine whose speed flickers in
    # spells; the batch means see the spells, the readings' own spread over sqrt(n) would not.
    values = [2.0] * 50 + [1.0] * 50
    meter = scripted_meter(values)
    with meter.phase("s"):
        for _ in values:
            tick()
    batches = np.array([b.mean() for b in np.array_split(np.array(values), ERROR_BATCHES)])
    mean_s, se_s, n = meter.summary("s")
    assert (mean_s, n) == (1.5, 100)
    assert se_s == pytest.approx(batches.std(ddof=1) / np.sqrt(ERROR_BATCHES))
    assert se_s > np.std(values, ddof=1) / np.sqrt(len(values))


def test_profile_timings_do_not_read_the_meter() -> None:
    # Only serving-loop steps read it: a canary between two grid timings runs in another cache state than one
    # between two serving steps, and the validation compares the passes' readings with the slices'.
    meter = scripted_meter([0.5] * 5)
    with meter.phase("pass"):
        times = run_times_s(lambda: (lambda: None), warmup=3, repeats=5)
    assert len(times) == 5 and meter.readings["pass"] == []


def test_serving_loop_reads_the_meter_before_each_step_off_its_clock(tiny_verifier_v8) -> None:
    verifier = tiny_verifier_v8
    drafter = build_drafter("dspark", verifier, torch.Generator().manual_seed(5), num_layers=1, std=0.1)
    rng = np.random.default_rng(3)
    n = 12
    workload = Workload(arrival_at=np.zeros(n), prompt_tokens=rng.integers(2, 10, n),
                        output_tokens=rng.integers(5, 15, n), domain=np.array(["chat"] * n))
    spec = ServingSpec(make_policy("mtp2"), gamma=2, traffic=workload, limits=EngineLimits(4, 200),
                       duration_s=None, seed=1, prefill="colocated", clock="wall")
    cost = CostCurve(batch_tokens=np.arange(1, 101), steps_per_s=np.full(100, 100.0))
    canary_s = 0.03  # far longer than a step of these models
    meter = SpeedMeter(lambda: time.sleep(canary_s), time.perf_counter)
    with meter.phase("slice"):
        steps = serve(spec, ServingModels(verifier, drafter, random_prompts(8), cost, "v8")).steps
    assert len(meter.readings["slice"]) == len(steps) > 10
    assert steps["canary_s"].tolist() == meter.readings["slice"]  # each step's own reading, in order
    assert min(meter.readings["slice"]) >= canary_s
    # On the decode clock a step follows the previous one at once: the canary's sleep is not in the gaps.
    gaps_s = steps["start_at"].to_numpy()[1:] - steps["end_at"].to_numpy()[:-1]
    assert np.median(gaps_s) < canary_s / 3


def test_validation_reads_the_drift_from_the_measure_asked_for() -> None:
    probes = pd.DataFrame([
        (0, "profile", "", 0, 1.0, 3.0, 10.0, 0.5, 900),
        (0, "slice", "mtp1", 2, 2.0, 4.0, 12.0, 1.0, 200),
        (1, "profile", "", 0, 2.0, 2.0, 11.0, 0.5, 900),
    ], columns=list(PROBE_COLUMNS))
    before, after, passes = drift_readings(probes, "meter")
    assert before.tolist() == [11.0] and after.tolist() == [13.0] and passes.tolist() == [10.0, 11.0]
    before, after, passes = drift_readings(probes, "probe")
    assert before.tolist() == [2.0] and after.tolist() == [4.0] and passes.tolist() == [2.0, 2.0]
    assert parse_args(["--drift-measure", "meter"])[0].drift_measure == "meter"
    with pytest.raises(ValueError, match="drift_measure must be one of probe, meter"):
        ValidationConfig(drift_measure="canary")
    with pytest.raises(ValueError, match="cannot with a given profile"):
        ValidationConfig(drift_measure="meter", profile="profile.json")


def test_a_stretch_the_meter_barely_read_is_an_error_not_a_silent_weight() -> None:
    probes = pd.DataFrame([
        (0, "profile", "", 0, 1.0, 3.0, 10.0, 0.5, 900),
        (0, "slice", "mtp1", 2, 2.0, 4.0, 12.0, float("nan"), 7),  # 7 readings: no standard error
    ], columns=list(PROBE_COLUMNS))
    with pytest.raises(ValueError, match=r"slice of round 0 \(mtp1, 2 users\) only 7 times"):
        drift_readings(probes, "meter")
    assert drift_readings(probes, "probe")[0].tolist() == [2.0]  # the probe needs no meter readings
