"""Turn a Hydra ``DictConfig`` into the simulator's typed specs (Hydra stops here).

:func:`build_spec` validates the composed config against the schema
(:mod:`experiments.schema`), so a bad value is a :class:`ConfigError` naming the
key, then loads the profile and the traffic. Files are read here, never at import.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from experiments.schema import ConfigError, RunConfig, validate
from simulator import DrafterSpec, HardwareProfile, SimulationSpec, load_profile
from simulator.acceptance.presets import load_preset
from traces import load_trace_workload
from traces.formats import detect_format
from traces.load import SAMPLES
from traces.synthetic import TrafficSpec
from traces.workload import Workload

__all__ = ["ConfigError", "build_spec", "build_traffic"]
log = logging.getLogger(__name__)


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


def drafter_spec(run: RunConfig, traffic: TrafficSpec | Workload) -> DrafterSpec:
    """The drafter spec, with ``traffic.benchmark_mix``: each benchmark must belong to a domain the traffic has."""
    mix = run.traffic.benchmark_mix
    numbers = isinstance(mix, Mapping) and all(isinstance(w, (int, float)) and not isinstance(w, bool)
                                               for w in mix.values())
    if mix is not None and not numbers:
        raise ConfigError(f"traffic.benchmark_mix={mix}: must map benchmark names to weights, e.g. "
                          "traffic.benchmark_mix={gsm8k: 2, alpaca: 1}")
    try:
        drafter = dataclasses.replace(run.drafter.to_spec(), confidence=run.acceptance.confidence.to_spec(),
                                      difficulty=run.acceptance.difficulty.to_spec(), benchmark_mix=mix)
    except ValueError as err:
        raise ConfigError(f"traffic.benchmark_mix: {err}" if mix else str(err)) from err
    if mix:
        domains = ({d for d, w in traffic.domain_mix.items() if w > 0} if isinstance(traffic, TrafficSpec)
                   else set(traffic.domain.tolist()))
        preset = load_preset(drafter.acceptance_preset)
        unused = {b: preset.benchmark(b)[0] for b in mix if preset.benchmark(b)[0] not in domains}
        if unused:
            raise ConfigError(f"traffic.benchmark_mix: {', '.join(f'{b} ({d})' for b, d in unused.items())} would "
                              f"never be drawn: the traffic's requests are {', '.join(sorted(domains))}; set "
                              "traffic.domain_mix to include their domains")
    return drafter


def warn_other_target(drafter: DrafterSpec, profile: HardwareProfile) -> None:
    """Say loudly when the acceptance preset was measured on another target than the profile models."""
    if drafter.log is not None:
        return
    preset = load_preset(drafter.acceptance_preset)
    model = str(profile.metadata.get("model", "?"))
    if preset.target.lower() != model.lower():
        measured = "states no target" if preset.target == "unspecified" else f"was measured on {preset.target}"
        log.warning("ACCEPTANCE FROM ANOTHER TARGET: preset %s %s, the hardware profile models %s",
                    preset.name, measured, model)


def spec_of(run: RunConfig) -> SimulationSpec:
    """The simulation a validated config describes (reads the profile and any trace file)."""
    traffic = build_traffic(run.traffic, run.seed)
    drafter, profile = drafter_spec(run, traffic), load_profile(run.hardware)
    warn_other_target(drafter, profile)
    return SimulationSpec(
        policy=run.policy.to_spec(),
        profile=profile,
        drafter=drafter,
        cluster=run.cluster.to_spec(),
        traffic=traffic,
        duration_s=run.duration_s,
        warmup_s=run.warmup_s,
        seed=run.seed,
    )


def build_spec(cfg: DictConfig) -> SimulationSpec:
    """Validate a composed config (:class:`ConfigError` names the key) and build its simulation spec."""
    return spec_of(validate(cfg))
