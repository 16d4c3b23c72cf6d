"""Small factories for version-2 profiles and runs, shared by the cost-model, chunked and paged-KV tests."""

from __future__ import annotations

import numpy as np

from simulator import ClusterSpec, DrafterSpec, EngineLimits, SimulationSpec
from simulator.costs import (
    AttentionBlock,
    CudaGraphsBlock,
    HardwareProfile,
    TokenBudgetBlock,
    Version2Blocks,
    profile_from_dict,
)
from traces.synthetic import LengthSpec, TrafficSpec

# One request's KV read per context token: Qwen3-8B bf16 (36 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes)
# over H200 HBM at 80% of 4.8 TB/s. Memory-bound decode attention is linear in (context + query tokens).
KV_S_PER_TOKEN = 36 * 8 * 128 * 2 * 2 / (0.8 * 4.8e12)
CONTEXTS = (0, 1024, 4096, 16384, 65536, 262144)
QUERIES = (1, 2, 4, 8, 16, 64, 256, 1024, 4096)


def linear_attention(kv_s_per_token: float = KV_S_PER_TOKEN, key_padding: str = "none") -> AttentionBlock:
    """Attention priced as one read of the request's keys: ``kv_s_per_token * (context + query)``."""
    rows = tuple(tuple(kv_s_per_token * (c + q) for q in QUERIES) for c in CONTEXTS)
    return AttentionBlock(CONTEXTS, QUERIES, rows, key_padding)  # type: ignore[arg-type]


def v2_profile(base: HardwareProfile, *, attention: AttentionBlock | None = None,
               graphs: CudaGraphsBlock | None = None, budget: int | None = None,
               drop_per_request: bool = True) -> HardwareProfile:
    """``base`` as a version-2 profile with these blocks (its per-request KV reads dropped when asked)."""
    raw = dict(base.raw)
    if drop_per_request:
        raw.pop("per_request", None)
    blocks = Version2Blocks(attention=attention, cuda_graphs=graphs,
                            token_budget=None if budget is None else TokenBudgetBlock(budget))
    return profile_from_dict(blocks.apply(raw, "test-v2.json"), "test-v2.json")


def fixed_lengths(prompt_tokens: float, output_tokens: float) -> dict[str, LengthSpec]:
    """Every domain with (almost) fixed prompt and output lengths."""
    spec = LengthSpec(prompt_tokens, 0.01, output_tokens, 0.01)
    return {d: spec for d in ("chat", "code", "math")}


def closed_spec(policy, profile: HardwareProfile, num_users: int, *, prompt_tokens: float = 200.0,
                output_tokens: float = 10**6, gamma: int = 7, duration_s: float = 1.5, warmup_s: float = 0.5,
                limits: EngineLimits | None = None, mode: str = "disaggregated", seed: int = 0) -> SimulationSpec:
    """Closed-loop users with fixed lengths (long outputs keep R at ``num_users``) on one engine."""
    traffic = TrafficSpec(arrival="closed", num_users=num_users, max_output_tokens=int(output_tokens * 2),
                          max_prompt_tokens=int(prompt_tokens * 2), lengths=fixed_lengths(prompt_tokens, output_tokens))
    limits = limits or EngineLimits(max_concurrency=max(num_users, 1), kv_capacity_tokens=10**9)
    return SimulationSpec(policy=policy, profile=profile, drafter=DrafterSpec("dspark", gamma),
                          cluster=ClusterSpec(num_prefill_instances=num_users, limits=limits, mode=mode),  # type: ignore
                          traffic=traffic, duration_s=duration_s, warmup_s=warmup_s, seed=seed)


def uniform_contexts(n: int, context_tokens: int) -> np.ndarray:
    return np.full(n, context_tokens, dtype=np.int64)
