"""The measuring side of a validation: rounds of one profile pass followed by one real slice of every point.

The speed of a shared machine wanders (the reference probe moves by +-8% within a minute and by more between
minutes): a profile taken once would price every point at the speed of that moment. Interleaving profile passes
with slices of the real runs makes the profile and every point sample the same spells of fast and slow, so that
what is left is the model's error; each round starts at a different point, so that no point always runs last (the
machine tends to slow down over a round).

With ``max_rounds``, a run goes on past ``rounds`` while its passes still disagree about the price of the points'
real steps (:func:`~calibration.validation.points.run_price_se` above ``target_price_se``, at most
:data:`~calibration.validation.report.STEADY_MAX_PROFILE_PRICE_SE`, the bound above which the report calls the
machine not steady), or while fewer than :data:`MIN_PASSES_TO_STOP` passes are kept: each extra round adds a pass,
whose spread shrinks as one over the square root of their number, and a slice of every point, of the same length.
With ``stop_when_unsteady`` a run stops after a round once its slices decide a ``MACHINE NOT STEADY`` report, or
once its passes disagree beyond what its remaining rounds can mend (:func:`hopeless_passes`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np
import pandas as pd

from calibration.serving.loop import ServingModels, ServingSpec, serve
from calibration.serving.speed_meter import SpeedMeter
from calibration.validation.points import drift_readings, kept_passes, round_progress, run_price_se
from calibration.validation.report import STEADY_MAX_PROFILE_PRICE_SE, MachineNotSteady
from calibration.validation.setup import Models, ValidationConfig, loop_pricing, measure_profile, speed_canary
from policies import make_policy
from simulator.costs import HardwareProfile

# One timing of the reference probe around a profiling pass or a real slice (seconds; see speed_reference), and the
# speed meter's mean canary reading inside it, its standard error and count (--drift-measure meter; else NaN, NaN, 0).
PROBE_COLUMNS = ("round", "phase", "policy", "num_users", "before_s", "after_s", "meter_s", "meter_se_s",
                 "meter_readings")

# --stop-when-unsteady also stops a run whose profile passes disagree beyond what its remaining rounds can mend:
# their price standard error shrinks as one over the square root of the number of passes, so if their spread held,
# the most passes the run may reach would still leave ``se * sqrt(passes / most)``; above this many times the steady
# bound the run stops (the factor leaves room for a spread read from two or three passes, which is itself loose).
STOP_PRICE_SE_FACTOR = 2.0

# --max-rounds stops adding rounds once the passes' price standard error meets the target, read from this many kept
# passes or more: a spread of two has one degree of freedom, and two passes that happen to agree say little (the
# long-context run of 2026-12-07 13:22 stopped on two kept passes whose prices its slices then paid 2-8% over).
MIN_PASSES_TO_STOP = 3


def measure_rounds(cfg: ValidationConfig, models: Models, points: list[tuple[str, int]],
                   reference: Callable[[], float], progress: Callable[[str], None],
                   check: Callable[[HardwareProfile], None] = lambda _: None,
                   probe_log: list[dict[str, Any]] | None = None
                   ) -> tuple[list[HardwareProfile], dict[tuple[str, int], list[Any]]]:
    """Profile and serve in ``cfg.rounds`` rounds (up to ``cfg.max_rounds``: module docstring): each round profiles
    the machine once, then serves one slice of every point. Returns the rounds' profiles (their element-wise
    combination by ``cfg.combine_passes`` prices the simulator; the first pass is what the real loop's policies
    price with) and the real slices of each point, one per round served. ``probe_log`` gets one record per profile
    pass and per slice: the reference probe timed before and after it and, with ``drift_measure`` meter, the meter's
    readings inside it (:data:`PROBE_COLUMNS`). ``check`` sees the first pass before any real run.

    The real loop's policies price their decisions with the first pass's profile, as the simulator's do
    (``SimulationSpec.policy_profile``): the step cost ``draft_s(R, g) + 1/SPS(B) + per_request(R)``, as the engine
    prices it.
    """
    passes: list[HardwareProfile] = []
    log = probe_log if probe_log is not None else []
    reals: dict[tuple[str, int], list[Any]] = {p: [] for p in points}
    meter = (SpeedMeter(speed_canary(cfg, models), time.thread_time if cfg.clock == "cpu" else time.perf_counter)
             if cfg.drift_measure == "meter" else None)

    def measured(key: tuple[str, str, int, int], work: Callable[[], Any]) -> Any:
        """``work()``, the reference probe timed before and after it and the meter reading inside it, logged under
        ``key``: (phase, policy, users, round)."""
        before_s = reference()
        with meter.phase(key) if meter is not None else nullcontext():
            done = work()
        after_s = reference()
        readings = meter.summary(key) if meter is not None else (float("nan"), float("nan"), 0)
        log.append(dict(zip(PROBE_COLUMNS, (key[3], *key[:3], before_s, after_s, *readings), strict=True)))
        return done

    planned, round_idx = cfg.rounds, 0
    while round_idx < planned:
        if cfg.profile is None or round_idx == 0:
            progress(f"profiling the served models on this machine, pass {round_idx + 1}/{planned}")
            passes.append(measured(("profile", "", 0, round_idx), lambda: measure_profile(cfg, models)))
            if round_idx == 0:
                check(passes[0])  # a profile the simulator refuses fails here, not after the real runs
        shift = round_idx * len(points) // cfg.rounds % len(points)  # each round starts elsewhere
        for name, users in points[shift:] + points[:shift]:
            progress(f"{name} users={users}: serving for real, slice {round_idx + 1}/{planned} "
                     f"({cfg.slice_duration_s:g} s)")
            policy = make_policy(name)
            serving_models = ServingModels(models.verifier, models.drafter, models.prompts,
                                           loop_pricing(passes[0], cfg.drafter, policy.draft_tokens(cfg.gamma)),
                                           models.description)
            spec = ServingSpec(policy, cfg.gamma, cfg.traffic(users), cfg.limits(), cfg.slice_duration_s,
                               cfg.warmup_s, cfg.seed + round_idx, cfg.prefill, clock=cfg.clock)  # type: ignore[arg-type]
            reals[(name, users)].append(measured(("slice", name, users, round_idx),
                                                 partial(serve, spec, serving_models)))
        round_idx += 1
        planned = _after_round(cfg, log, reals, passes, round_idx, planned, progress)
    return passes, reals


def _after_round(cfg: ValidationConfig, log: list[dict[str, Any]], reals: dict[tuple[str, int], list[Any]],
                 passes: list[HardwareProfile], round_idx: int, planned: int, progress: Callable[[str], None]) -> int:
    """Say how the slices so far drifted; stop the run (``--stop-when-unsteady``: slices that decide the verdict, or
    passes that cannot agree, :func:`hopeless_passes`) or add a round (``--max-rounds``: passes that disagree).
    Returns the rounds now planned."""
    probes = pd.DataFrame(log, columns=list(PROBE_COLUMNS))
    most = max(planned, cfg.max_rounds or planned)
    line, unsteady = round_progress(probes, replace(cfg, rounds=planned, max_rounds=None), round_idx,
                                    most_rounds=most)
    progress(line)
    extend = round_idx == planned < (cfg.max_rounds or 0)
    _, _, pass_s = drift_readings(probes, cfg.drift_measure)
    passes = [passes[k] for k in kept_passes(pass_s, cfg.drift_tolerance)]  # as the report combines them
    stop_on_price = cfg.stop_when_unsteady and round_idx < most and len(passes) >= 2
    price_se = run_price_se(cfg, reals, passes) if extend or stop_on_price else float("nan")
    enough = len(passes) >= MIN_PASSES_TO_STOP
    extend = extend and not (price_se <= cfg.target_price_se and enough)  # NaN (one pass) tells nothing: one more
    # A round is the last when none is planned after it and --max-rounds adds none: then the run reports.
    if unsteady and cfg.stop_when_unsteady and (round_idx < planned or extend):
        raise MachineNotSteady(f"stopped after round {round_idx}/{planned} (--stop-when-unsteady): {line}", probes)
    hopeless = hopeless_passes(price_se, len(passes), most) if stop_on_price else None
    if hopeless is not None:
        raise MachineNotSteady(f"stopped after round {round_idx}/{planned} (--stop-when-unsteady): {hopeless}",
                               probes)
    if extend:
        planned += 1
        spread = ("one profile pass cannot tell its own error" if len(passes) < 2 else
                  f"the {len(passes)} profile passes price the points' real steps with a mean standard error "
                  f"of {100 * price_se:.2f}% (target: at most {100 * cfg.target_price_se:.2f}%"
                  + ("" if enough or not price_se <= cfg.target_price_se else
                     f", read from at least {MIN_PASSES_TO_STOP} kept passes") + ")")
        progress(f"{spread}: one more round, {planned} of at most {cfg.max_rounds}")
    return planned


def hopeless_passes(price_se: float, num_passes: int, most_passes: int) -> str | None:
    """Why the profile passes so far cannot come to agree within the run (:data:`STOP_PRICE_SE_FACTOR`), or None.
    ``price_se``: their mean price standard error now (:func:`~calibration.validation.points.run_price_se`)."""
    reachable = price_se * float(np.sqrt(num_passes / most_passes))
    if not reachable > STOP_PRICE_SE_FACTOR * STEADY_MAX_PROFILE_PRICE_SE:  # NaN: nothing to tell
        return None
    return (f"the {num_passes} profile passes price the points' real steps with a mean standard error of "
            f"{100 * price_se:.2f}%; at the {most_passes} passes the run may reach, the same spread would still "
            f"leave {100 * reachable:.2f}%, more than {STOP_PRICE_SE_FACTOR:g} times the steady bound "
            f"({100 * STEADY_MAX_PROFILE_PRICE_SE:.2f}%): MACHINE NOT STEADY, the machine is unsteady now")
