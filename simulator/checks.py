"""Checks at start for what would otherwise stop a run minutes in.

Everything here is known from the spec before the first simulated second: a
profile table too short for the concurrency, the block size or the traffic's
context lengths or its prompts (a measured prefill table), a policy that
drafts more tokens than the drafter makes, a request that can never fit an
engine's KV cache. :func:`check_spec` raises a :class:`SpecError` naming the
config key or the profile file (config keys as in ``experiments/conf``).
"""

from __future__ import annotations

import numpy as np

from simulator.costs import HardwareProfile
from simulator.specs import SimulationSpec
from traces.synthetic import TrafficSpec
from traces.workload import Workload


class SpecError(ValueError):
    """A simulation spec cannot run to its end; the message names the config key or the file."""


def _covers(axis: np.ndarray, low: float, high: float) -> bool:
    return bool(axis[0] <= low and high <= axis[-1])


def check_profile(profile: HardwareProfile, drafter: str, draft_tokens: int, max_concurrency: int,
                  token_budget: int | None = None) -> None:
    """Every table lookup a step can make with 1..``max_concurrency`` requests (and at most ``token_budget``
    batch tokens, when there is one) is inside ``profile``'s tables."""
    where = f"profile {profile.path}"
    max_batch = max_concurrency * (1 + draft_tokens)
    if max_batch > profile.max_batch_tokens and (token_budget is None or token_budget > profile.max_batch_tokens):
        held = (f"{max_batch} batch tokens (cluster.max_concurrency={max_concurrency} x (1 + {draft_tokens} draft "
                "tokens))")
        if token_budget is not None:
            held = f"{token_budget} batch tokens (its token budget, cluster.max_num_batched_tokens)"
        raise SpecError(f"{where}: verify.batch_tokens ends at {profile.max_batch_tokens}, but a step can hold "
                        f"{held}; lower cluster.max_concurrency or drafter.gamma, or profile more batch tokens")
    if profile.per_request_s is not None and not _covers(profile.per_request_s.x, 1, max_concurrency):
        x = profile.per_request_s.x
        raise SpecError(f"{where}: per_request.num_requests covers {x[0]:g}..{x[-1]:g}, but steps hold "
                        f"1..{max_concurrency} requests (cluster.max_concurrency); lower it or profile more requests")
    if draft_tokens == 0:
        return
    if drafter not in profile.draft:
        raise SpecError(f"{where}: no draft latency for drafter.kind={drafter} (or drafter.latency); it has: "
                        f"{', '.join(sorted(profile.draft)) or '(none)'}")
    table = profile.draft[drafter]
    if not _covers(table.num_requests, 1, max_concurrency):
        x = table.num_requests
        raise SpecError(f"{where}: draft.{drafter}.num_requests covers {x[0]:g}..{x[-1]:g}, but steps hold "
                        f"1..{max_concurrency} requests (cluster.max_concurrency); lower it or profile more requests")
    if not _covers(table.draft_tokens, draft_tokens, draft_tokens):
        x = table.draft_tokens
        raise SpecError(f"{where}: draft.{drafter}.draft_tokens covers {x[0]:g}..{x[-1]:g}, but every step drafts "
                        f"{draft_tokens} tokens (drafter.gamma); pick a gamma inside it or profile more draft tokens")


def context_range(traffic: TrafficSpec | Workload) -> tuple[int, int]:
    """The fewest and most KV entries a request can hold before a step (prompt + tokens emitted so far)."""
    if isinstance(traffic, TrafficSpec):
        return 1, traffic.max_prompt_tokens + traffic.max_output_tokens - 1
    if traffic.num_requests == 0:
        return 1, 1
    return int(traffic.prompt_tokens.min()), int((traffic.prompt_tokens + traffic.output_tokens).max()) - 1


def check_context_tables(profile: HardwareProfile, drafter: str, draft_tokens: int,
                         traffic: TrafficSpec | Workload) -> None:
    """Tables over context length (a version-2 profile's attention, a drafter's context axis) cover every
    request the traffic can send."""
    low, high = context_range(traffic)
    what = "traffic.max_prompt_tokens + traffic.max_output_tokens" if isinstance(traffic, TrafficSpec) else (
        f"the requests of traffic {traffic.source}")
    attention = profile.attention
    axes = [] if attention is None else [("attention.context_tokens", attention.x)]
    draft = profile.draft.get(drafter) if draft_tokens else None
    if draft is not None and draft.context_tokens is not None:
        axes.append((f"draft.{drafter}.context_tokens", draft.context_tokens))
    for name, axis in axes:
        if not _covers(axis, low, high):
            raise SpecError(f"profile {profile.path}: {name} covers {axis[0]:g}..{axis[-1]:g}, but {what} give "
                            f"contexts of {low}..{high} tokens; profile longer contexts or lower the maxima")
    if attention is not None and not _covers(attention.y, 1, 1 + draft_tokens):
        raise SpecError(f"profile {profile.path}: attention.query_tokens covers {attention.y[0]:g}.."
                        f"{attention.y[-1]:g}, but a request verifies up to {1 + draft_tokens} tokens per step "
                        "(1 + drafter.gamma); pick a smaller gamma or profile more query tokens")


def prefill_range(spec: SimulationSpec) -> tuple[int, int]:
    """The fewest and most tokens one disaggregated prefill can compute: the traffic's prompts, and with paged KV a
    preempted request's recompute (prompt + output so far, at most its whole KV before the last step)."""
    traffic, paged = spec.traffic, spec.cluster.limits.kv_mode == "paged"
    if isinstance(traffic, TrafficSpec):
        return 1, traffic.max_prompt_tokens + (traffic.max_output_tokens - 1 if paged else 0)
    if traffic.num_requests == 0:
        return 1, 1
    high = traffic.prompt_tokens + (traffic.output_tokens - 1 if paged else 0)
    return int(traffic.prompt_tokens.min()), int(high.max())


def check_prefill_table(profile: HardwareProfile, spec: SimulationSpec) -> None:
    """A measured ``prefill.table`` covers every prefill of a disaggregated run (chunked mode prices chunks)."""
    table = profile.prefill_table
    if table is None or spec.cluster.mode == "chunked":
        return
    low, high = prefill_range(spec)
    if not _covers(table.x, low, high):
        what = ("traffic.max_prompt_tokens" if isinstance(spec.traffic, TrafficSpec) else
                f"the prompts of traffic {spec.traffic.source}")
        paged = " (+ outputs: paged KV recomputes preempted requests)" if spec.cluster.limits.kv_mode == "paged" \
            else ""
        raise SpecError(f"profile {profile.path}: prefill.table.prompt_tokens covers {table.x[0]:g}..{table.x[-1]:g}, "
                        f"but {what}{paged} give prefills of {low}..{high} tokens; profile longer prompts or lower "
                        "the maxima")


def check_kv_capacity(spec: SimulationSpec) -> None:
    """The longest possible request fits one engine's KV cache (prompt + full output are reserved)."""
    capacity = spec.cluster.limits.kv_capacity_tokens
    traffic = spec.traffic
    if isinstance(traffic, TrafficSpec):
        need = traffic.max_prompt_tokens + traffic.max_output_tokens
        if need > capacity:
            raise SpecError(
                f"a request can need traffic.max_prompt_tokens + traffic.max_output_tokens = {need} KV tokens, "
                f"but cluster.kv_capacity_tokens={capacity}: it would never be admitted; raise the capacity "
                "or lower the maxima")
        return
    need_per_request = traffic.prompt_tokens + traffic.output_tokens  # [N]
    if need_per_request.size and need_per_request.max() > capacity:
        i = int(np.argmax(need_per_request))
        raise SpecError(
            f"traffic {traffic.source}: request {i} (in arrival order) needs {int(need_per_request[i])} KV tokens "
            f"({int(traffic.prompt_tokens[i])} prompt + {int(traffic.output_tokens[i])} output), but "
            f"cluster.kv_capacity_tokens={capacity}: it would never be admitted; raise the capacity or cap outputs "
            "with traffic.max_output_tokens")


def check_spec(spec: SimulationSpec) -> None:
    """Raise :class:`SpecError` for anything in ``spec`` that is bound to fail during the run."""
    gamma = spec.drafter.gamma
    draft_tokens = spec.policy.draft_tokens(gamma)
    if draft_tokens > gamma:
        raise SpecError(f"policy {spec.policy.name} drafts {draft_tokens} tokens per step but drafter.gamma={gamma}; "
                        "raise drafter.gamma or lower the policy's k")
    if spec.duration_s is None and isinstance(spec.traffic, TrafficSpec) and spec.traffic.arrival == "closed":
        raise SpecError("duration_s=null: closed-loop traffic never ends; set duration_s")
    profiles = [spec.profile] + ([spec.policy_profile] if spec.policy_profile is not None else [])
    limits = spec.cluster.limits
    for profile in profiles:
        budget = spec.cluster.token_budget(spec.profile.token_budget)  # as the engine takes it
        check_profile(profile, spec.drafter.latency_table, draft_tokens, limits.max_concurrency, budget)
        check_context_tables(profile, spec.drafter.latency_table, draft_tokens, spec.traffic)
        check_prefill_table(profile, spec)
    check_kv_capacity(spec)
