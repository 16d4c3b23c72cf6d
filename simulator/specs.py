"""What a simulation is: the typed, validated specs of one run (policy, profile, drafter, cluster, traffic).

Frozen values only; :class:`simulator.cluster.Cluster` builds the SimPy model
from a :class:`SimulationSpec`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from policies import Policy
from simulator.acceptance import AcceptanceModel, AcceptanceSource, ConfidenceSpec, DifficultySpec, LoggedAcceptance
from simulator.acceptance.online import OnlineAcceptanceEstimator
from simulator.acceptance.parametric import acceptance_classes
from simulator.acceptance.presets import default_preset, load_preset
from simulator.costs import HardwareProfile
from traces.synthetic import TrafficSpec
from traces.workload import Workload

Router = Literal["round_robin", "least_loaded"]
PrefillMode = Literal["disaggregated", "chunked"]
KVMode = Literal["reserve", "paged"]
# The token budget of chunked mode when neither the config nor the profile sets one: vLLM's default
# max_num_batched_tokens for its API server on 70+ GB GPUs (H100, H200). Every step's budget is in steps.parquet.
CHUNKED_DEFAULT_BUDGET_TOKENS = 8192


class LossyPolicyWarning(UserWarning):
    """The configured policy does not keep the target distribution."""


@dataclass(frozen=True)
class DrafterSpec:
    """The drafter: its acceptance preset, its draft-latency table and its block size gamma.

    ``kind`` is shorthand for both: ``acceptance`` (a preset name or file, docs/acceptance.md; None: the kind's
    default preset) and ``latency`` (the profile's draft-latency table; None: ``kind``) choose them apart.
    ``benchmark_mix`` (benchmark -> weight) makes the requests of a domain follow the preset's benchmark curves
    of that domain, drawn by weight, instead of the domain's curve. With ``log`` (a path to an acceptance log,
    docs/acceptance_logs.md) confidences and outcomes are replayed from the log's blocks of drafter ``kind``
    instead of drawn from the preset; ``log_order`` says how (``walk``: each request follows a logged request's
    blocks in order; ``independent``: blocks drawn independently per step; ``auto``: walk dense logs).
    """

    kind: str = "dspark"
    gamma: int = 7
    difficulty: DifficultySpec = field(default_factory=DifficultySpec)
    confidence: ConfidenceSpec = field(default_factory=ConfidenceSpec)
    log: str | None = None
    log_order: str = "auto"
    log_confidence: str = "auto"  # the log's column replayed as confidences: auto, confidence or draft_prob
    acceptance: str | None = None
    latency: str | None = None
    benchmark_mix: dict[str, float] | None = None

    def __post_init__(self) -> None:
        if self.log_order not in ("auto", "walk", "independent"):
            raise ValueError(f"drafter.log_order must be auto, walk or independent, got {self.log_order!r}")
        if self.log_confidence not in ("auto", "confidence", "draft_prob"):
            raise ValueError("drafter.log_confidence must be auto, confidence or draft_prob, "
                             f"got {self.log_confidence!r}")
        if self.log is not None and (self.acceptance is not None or self.benchmark_mix):
            raise ValueError("drafter.log replays a log: drafter.acceptance and benchmark_mix apply to presets only")
        if self.log is None:  # read the preset now, so that a bad name, file or benchmark mix fails at start
            acceptance_classes(load_preset(self.acceptance_preset), self.benchmark_mix)

    @property
    def acceptance_preset(self) -> str:
        """The preset name or file the parametric acceptance comes from."""
        return self.acceptance if self.acceptance is not None else default_preset(self.kind)

    @property
    def latency_table(self) -> str:
        """The name of the profile's draft-latency table."""
        return self.latency if self.latency is not None else self.kind

    def acceptance_model(self) -> AcceptanceSource:
        """The acceptance source this drafter stands for: the parametric preset, or the replay of ``log``."""
        if self.log is None:
            return AcceptanceModel(self.acceptance_preset, self.gamma, self.difficulty, self.confidence,
                                   self.benchmark_mix)
        return LoggedAcceptance(self.log, drafter=self.kind, gamma=self.gamma, order=self.log_order,
                                confidence_column=self.log_confidence)

    def online_estimator(self) -> OnlineAcceptanceEstimator | None:
        """A fresh online estimator for one engine when ``confidence.source`` is online, else None."""
        return OnlineAcceptanceEstimator() if self.confidence.source == "online" else None


@dataclass(frozen=True)
class EngineLimits:
    """Admission limits of one replica.

    ``kv_mode``: ``reserve`` takes KV for prompt + full output at admission;
    ``paged`` allocates blocks of ``kv_block_tokens`` as tokens (and each
    step's verified lookahead) are written and preempts the newest requests by
    recompute when blocks run out (see :mod:`simulator.kv`).
    ``max_num_batched_tokens``: the token budget of a step (decode,
    verification and prefill-chunk tokens); ``None`` takes the profile's
    ``token_budget``; with neither there is no budget in disaggregated mode
    and :data:`CHUNKED_DEFAULT_BUDGET_TOKENS` in chunked mode
    (:meth:`ClusterSpec.token_budget`).
    """

    max_concurrency: int = 256
    kv_capacity_tokens: int = 600_000
    kv_mode: KVMode = "reserve"
    kv_block_tokens: int = 16
    max_num_batched_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.max_concurrency < 1 or self.kv_capacity_tokens < 1:
            raise ValueError("cluster: max_concurrency and kv_capacity_tokens must be >= 1")
        if self.kv_mode not in ("reserve", "paged"):
            raise ValueError(f"cluster.kv_mode must be reserve or paged, got {self.kv_mode!r}")
        if self.kv_block_tokens < 1:
            raise ValueError(f"cluster.kv_block_tokens must be >= 1, got {self.kv_block_tokens}")
        if self.kv_mode == "paged" and self.kv_capacity_tokens % self.kv_block_tokens:
            raise ValueError(f"cluster.kv_capacity_tokens={self.kv_capacity_tokens} is not a whole number of "
                             f"cluster.kv_block_tokens={self.kv_block_tokens} blocks")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError(f"cluster.max_num_batched_tokens must be >= 1 or null, got {self.max_num_batched_tokens}")


@dataclass(frozen=True)
class ClusterSpec:
    """Replicas behind a router and where prefill runs.

    ``mode``: ``disaggregated`` - a pool of ``num_prefill_instances`` workers
    prefills requests and hands them to decode replicas; ``chunked`` - no
    pool: each replica runs prefill chunks in its own steps, after the
    decode/verification tokens, within the token budget (vLLM's and SGLang's
    co-located default); ``num_prefill_instances`` is then unused.
    """

    num_decode_engines: int = 1
    num_prefill_instances: int = 1
    router: Router = "least_loaded"
    limits: EngineLimits = field(default_factory=EngineLimits)
    mode: PrefillMode = "disaggregated"

    def __post_init__(self) -> None:
        if self.router not in ("round_robin", "least_loaded"):
            raise ValueError(f"cluster.router must be round_robin or least_loaded, got {self.router!r}")
        if self.mode not in ("disaggregated", "chunked"):
            raise ValueError(f"cluster.mode must be disaggregated or chunked, got {self.mode!r}")
        if self.num_decode_engines < 1 or self.num_prefill_instances < 1:
            raise ValueError(f"cluster: num_decode_engines and num_prefill_instances must be >= 1, got "
                             f"{self.num_decode_engines} and {self.num_prefill_instances}")

    def token_budget(self, profile_budget: int | None) -> int | None:
        """The most batch tokens one step may hold: ``cluster.max_num_batched_tokens``, else the profile's
        ``token_budget``, else none (disaggregated) or :data:`CHUNKED_DEFAULT_BUDGET_TOKENS` (chunked)."""
        budget = self.limits.max_num_batched_tokens or profile_budget
        if budget is None and self.mode == "chunked":
            return CHUNKED_DEFAULT_BUDGET_TOKENS
        return budget


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
    # Another draw of the acceptance process over the same traffic: which difficulty (or logged request) each
    # request gets and the engines' acceptance draws come from (seed, acceptance_seed); arrivals, domains and
    # lengths keep ``seed``'s streams (open loop: the same requests; closed loop: the same draws, handed to users
    # as they return, which acceptance changes). None: every stream from ``seed``. Averaging a point over several
    # acceptance seeds shrinks the acceptance draws' share of its noise.
    acceptance_seed: int | None = None
