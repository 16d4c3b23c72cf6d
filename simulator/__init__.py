"""The SimPy serving simulator: engines, prefill, routing, acceptance and metrics.

* :mod:`simulator.specs` - what a run is (the typed specs);
* :mod:`simulator.simulate` - ``simulate(spec) -> Results``, the one entry point;
* :mod:`simulator.cluster` / :mod:`simulator.engine` - the SimPy processes (arrivals, prefill, router, decode);
* :mod:`simulator.costs` - the step-cost tables of a hardware profile;
* :mod:`simulator.acceptance` - acceptance sources (parametric presets, log replay);
* :mod:`simulator.requests` / :mod:`simulator.metrics` - the request store and the summary.
"""

from simulator.acceptance import AcceptanceModel, AcceptanceSource, ConfidenceSpec, DifficultySpec, LoggedAcceptance
from simulator.costs import HardwareProfile, ProfileError, load_profile
from simulator.simulate import Results, simulate
from simulator.specs import ClusterSpec, DrafterSpec, EngineLimits, LossyPolicyWarning, SimulationSpec

__all__ = [
    "AcceptanceModel", "AcceptanceSource", "ClusterSpec", "ConfidenceSpec", "DifficultySpec", "DrafterSpec",
    "EngineLimits", "HardwareProfile", "LoggedAcceptance", "LossyPolicyWarning", "ProfileError", "Results",
    "SimulationSpec", "load_profile", "simulate",
]
