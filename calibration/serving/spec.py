"""What a real serving run is given and gives back: its spec, the served models, the results' schema.

:func:`calibration.serving.loop.serve` takes a :class:`ServingSpec` (the fields mean what
the same fields of :class:`simulator.SimulationSpec` mean) and :class:`ServingModels`,
and returns :class:`ServingResults` whose tables have the simulator's schema plus the
loop's own step columns (:data:`STEP_COLUMNS`) and, in chunked mode, its prefill chunks (:data:`CHUNK_COLUMNS`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pandas as pd

from calibration.models.drafters import Drafter
from calibration.models.model import Verifier
from calibration.serving.specdec import ContextCost
from policies.base import Policy
from policies.driver import CostSource
from simulator.engine import StepLog
from simulator.specs import EngineLimits
from traces.synthetic import TrafficSpec
from traces.workload import Workload

PrefillMode = Literal["disaggregated", "colocated", "chunked"]
ClockKind = Literal["wall", "cpu"]
PromptSource = Callable[[str, int, np.random.Generator], list[int]]  # (domain, tokens, rng) -> token ids
# The simulator's step columns, host time, the contexts the step attended over (the sum over the batch of the KV
# tokens each request held before the step - the simulator's context_tokens - and the longest of them, to which the
# verifier pads every request's keys), the step's prefill chunks (chunked mode; the simulator's names), the longest
# verification of the step (the verifier pads every request's queries to 1 + it) and the seconds the loop slept for an
# arrival or a prefill between the previous step and this one (idle decode device, not step cost), and the loop
# thread's CPU seconds at the step's end (since the start: a cycle's wall time beyond its CPU time and its sleep is
# time other jobs took), the requests that joined the batch since the previous step (their first step is this one)
# and those this step finished, and the prompts the loop prefilled on the decode core since the previous step with
# their time cut from the decode clock (disaggregated mode; their time is not the step's, the cache they leave behind
# is: docs/validation.md, "The static residual at low R").
STEP_COLUMNS = (*StepLog.COLUMNS, "host_s", "context_tokens", "max_context_tokens", "prefill_tokens",
                "num_prefill_requests", "max_verified_tokens", "wait_s",
                "cpu_at", "canary_s", "num_joined", "num_left", "num_cut_prefills")
# The prefill chunks of a chunked run, one row per chunk computed (ServingResults.chunks): the step it ran in (its
# row in the run's steps table, counted from 0), its request, the prompt tokens computed before it (what it attends
# over besides itself, the simulator's chunk context) and its prompt tokens. A step's chunk_tokens sum to its
# prefill_tokens and its rows count num_prefill_requests; a request's chunks follow one another and sum to its prompt.
CHUNK_COLUMNS = ("step", "request_id", "context_tokens", "chunk_tokens")


@dataclass(frozen=True)
class ServingModels:
    """What the loop serves: the verifier, the drafter, prompts per domain, and the policy's step-cost curves."""

    verifier: Verifier
    drafter: Drafter
    prompts: PromptSource
    cost: CostSource | ContextCost  # what the policy prices a step with, e.g. HardwareProfile.cost_curve
    description: str = ""


@dataclass(frozen=True)
class ServingSpec:
    """One real run; the fields mean what the same fields of :class:`simulator.SimulationSpec` mean."""

    policy: Policy
    gamma: int
    traffic: TrafficSpec | Workload = field(default_factory=TrafficSpec)
    limits: EngineLimits = field(default_factory=EngineLimits)
    duration_s: float | None = 10.0
    warmup_s: float = 0.0
    seed: int = 0
    prefill: PrefillMode = "disaggregated"
    temperature: float = 1.0
    # "wall": the decode clock is the wall clock; "cpu": the loop thread's CPU seconds plus its sleeps, so that time
    # other jobs on a shared machine take from the loop is not booked to the decode device (see serving.loop)
    clock: ClockKind = "wall"

    def __post_init__(self) -> None:
        if self.clock not in ("wall", "cpu"):
            raise ValueError(f"clock must be 'wall' or 'cpu', got {self.clock!r}")
        if self.prefill not in ("disaggregated", "colocated", "chunked"):
            raise ValueError(f"prefill must be 'disaggregated', 'colocated' or 'chunked', got {self.prefill!r}")
        if self.prefill == "chunked" and self.limits.max_num_batched_tokens is None:
            raise ValueError("prefill='chunked' needs a token budget (limits.max_num_batched_tokens)")
        if self.policy.needs_outcomes:
            raise ValueError(f"policy {self.policy.name!r} reads true outcomes; a real loop cannot run it")
        if self.gamma < 1 or self.policy.draft_tokens(self.gamma) > self.gamma:
            raise ValueError(f"policy {self.policy.name} drafts {self.policy.draft_tokens(self.gamma)} tokens "
                             f"but gamma is {self.gamma}")
        closed = isinstance(self.traffic, TrafficSpec) and self.traffic.arrival == "closed"
        if self.duration_s is None and closed:
            raise ValueError("closed-loop traffic never ends: set duration_s")
        if self.duration_s is not None and not 0 <= self.warmup_s < self.duration_s:
            raise ValueError(f"warmup_s must lie in [0, duration_s), got {self.warmup_s} and {self.duration_s}")


@dataclass(frozen=True)
class ServingResults:
    """Tables of one real run plus its summary (the simulator's schema, wall-clock seconds)."""

    spec: ServingSpec
    requests: pd.DataFrame
    steps: pd.DataFrame
    summary: dict[str, Any]
    outputs: dict[int, list[int]]  # request id -> its output tokens (finished requests)
    chunks: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=list(CHUNK_COLUMNS), dtype="int64"))


def random_prompts(vocab_size: int) -> PromptSource:
    """Prompts of uniformly random token ids (for models with random weights)."""
    def draw(domain: str, num_tokens: int, rng: np.random.Generator) -> list[int]:
        return rng.integers(0, vocab_size, size=num_tokens).tolist()
    return draw
