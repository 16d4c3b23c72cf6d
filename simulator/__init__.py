"""The SimPy serving simulator: engines, prefill, routing, acceptance and metrics."""

from simulator.acceptance import AcceptanceModel, ConfidenceSpec, DifficultySpec
from simulator.cluster import ClusterSpec, DrafterSpec, LossyPolicyWarning, SimulationSpec
from simulator.engine import EngineLimits
from simulator.profile import HardwareProfile, ProfileError, load_profile
from simulator.simulate import Results, simulate

__all__ = [
    "AcceptanceModel", "ClusterSpec", "ConfidenceSpec", "DifficultySpec", "DrafterSpec", "EngineLimits",
    "HardwareProfile", "LossyPolicyWarning", "ProfileError", "Results", "SimulationSpec", "load_profile",
    "simulate",
]
