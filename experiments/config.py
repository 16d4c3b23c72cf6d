"""Turn a Hydra ``DictConfig`` into the simulator's typed specs (Hydra stops here).

:func:`build_spec` validates the composed config against the schema
(:mod:`experiments.schema`), so a bad value is a :class:`ConfigError` naming the
key, then loads the profile and the traffic. Files are read here, never at import.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from experiments.schema import ConfigError, RunConfig, validate
from simulator import SimulationSpec, load_profile
from traces import load_trace_workload
from traces.formats import detect_format
from traces.load import SAMPLES
from traces.synthetic import TrafficSpec
from traces.workload import Workload

__all__ = ["ConfigError", "build_spec", "build_traffic"]


def _check_trace_label(traffic: Any) -> None:
    """A shipped sample's config pointed at another file still names the run after the sample: allow it only for
    a file of the sample's format (the full public trace), so that a BurstGPT run is never labelled azure_conv."""
    sample = SAMPLES.get(traffic.name)
    if sample is None or traffic.trace == traffic.name:
        return
    found = traffic.format or detect_format(Path(traffic.trace).expanduser())
    if found != sample.format:
        raise ConfigError(
            f"traffic.trace={traffic.trace}: a {found} trace, but traffic={traffic.name} replays {sample.format} "
            f"traces and would label the run {traffic.name}; use traffic={found} traffic.trace={traffic.trace}")


def build_traffic(traffic: Any, seed: int) -> TrafficSpec | Workload:
    """The traffic of a validated ``traffic`` config: a synthetic spec, or a trace read and replayed now."""
    if traffic.arrival != "trace":
        return traffic.to_spec()
    _check_trace_label(traffic)
    options = dataclasses.replace(traffic.to_spec(), seed=seed)
    return load_trace_workload(traffic.trace, format=traffic.format, options=options)


def spec_of(run: RunConfig) -> SimulationSpec:
    """The simulation a validated config describes (reads the profile and any trace file)."""
    return SimulationSpec(
        policy=run.policy.to_spec(),
        profile=load_profile(run.hardware),
        drafter=dataclasses.replace(run.drafter.to_spec(), confidence=run.acceptance.confidence.to_spec(),
                                    difficulty=run.acceptance.difficulty.to_spec()),
        cluster=run.cluster.to_spec(),
        traffic=build_traffic(run.traffic, run.seed),
        duration_s=run.duration_s,
        warmup_s=run.warmup_s,
        seed=run.seed,
    )


def build_spec(cfg: DictConfig) -> SimulationSpec:
    """Validate a composed config (:class:`ConfigError` names the key) and build its simulation spec."""
    return spec_of(validate(cfg))
