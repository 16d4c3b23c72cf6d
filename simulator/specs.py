"""What a simulation is: the typed, validated specs of one run (policy, profile, drafter, cluster, traffic).

Frozen values only; :class:`simulator.cluster.Cluster` builds the SimPy model
from a :class:`SimulationSpec`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from policies import Policy
from simulator.acceptance import AcceptanceModel, AcceptanceSource, ConfidenceSpec, DifficultySpec, LoggedAcceptance
from simulator.profile import HardwareProfile
from traces.synthetic import TrafficSpec
from traces.workload import Workload

Router = Literal["round_robin", "least_loaded"]


class LossyPolicyWarning(UserWarning):
    """The configured policy does not keep the target distribution."""


@dataclass(frozen=True)
class DrafterSpec:
    """The drafter: its kind (acceptance preset and latency table) and block size gamma.

    With ``log`` (a path to an acceptance log, docs/acceptance_logs.md) confidences
    and outcomes are replayed from the log's blocks of drafter ``kind`` instead of
    drawn from the parametric preset; ``log_order`` says how (``walk``: each request
    follows a logged request's blocks in order; ``independent``: blocks drawn
    independently per step; ``auto``: walk dense logs).
    """

    kind: str = "dspark"
    gamma: int = 7
    difficulty: DifficultySpec = field(default_factory=DifficultySpec)
    confidence: ConfidenceSpec = field(default_factory=ConfidenceSpec)
    log: str | None = None
    log_order: str = "auto"

    def __post_init__(self) -> None:
        if self.log_order not in ("auto", "walk", "independent"):
            raise ValueError(f"drafter.log_order must be auto, walk or independent, got {self.log_order!r}")

    def acceptance_model(self) -> AcceptanceSource:
        """The acceptance source this drafter stands for: the parametric preset, or the replay of ``log``."""
        if self.log is None:
            return AcceptanceModel(self.kind, self.gamma, self.difficulty, self.confidence)
        return LoggedAcceptance(self.log, drafter=self.kind, gamma=self.gamma, order=self.log_order)


@dataclass(frozen=True)
class EngineLimits:
    """Admission limits of one replica. KV is reserved for prompt + full output at admission."""

    max_concurrency: int = 256
    kv_capacity_tokens: int = 600_000


@dataclass(frozen=True)
class ClusterSpec:
    num_decode_engines: int = 1
    num_prefill_instances: int = 1
    router: Router = "least_loaded"
    limits: EngineLimits = field(default_factory=EngineLimits)

    def __post_init__(self) -> None:
        if self.router not in ("round_robin", "least_loaded"):
            raise ValueError(f"cluster.router must be round_robin or least_loaded, got {self.router!r}")
        if self.num_decode_engines < 1 or self.num_prefill_instances < 1:
            raise ValueError("cluster: num_decode_engines and num_prefill_instances must be >= 1")


@dataclass(frozen=True)
class SimulationSpec:
    """Everything one simulation needs. ``duration_s=None`` runs an open-loop workload to completion."""

    policy: Policy
    profile: HardwareProfile
    drafter: DrafterSpec = field(default_factory=DrafterSpec)
    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    traffic: TrafficSpec | Workload = field(default_factory=TrafficSpec)
    duration_s: float | None = 60.0
    warmup_s: float = 0.0
    seed: int = 0
    # The profile the policy prices its decisions with (default: ``profile``, the hardware's own). Another one
    # models a scheduler whose cost model is stale or was measured elsewhere.
    policy_profile: HardwareProfile | None = None
