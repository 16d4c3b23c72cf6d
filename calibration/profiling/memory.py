"""Which request counts a profile can time: every R-dependent point's KV caches must fit the device's memory.

On a GPU a point of R requests at context C allocates R caches of C tokens; the R grid
is cut where the largest such point would not fit the budget (``--kv-budget-gb``,
default 60% of free memory; no limit on a CPU), and the profile's metadata says so.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from calibration.models.drafters import drafter_num_layers
from calibration.models.model import Verifier

if TYPE_CHECKING:
    from calibration.profiling.measure import ProfileConfig


def kv_slots_that_fit(cfg: ProfileConfig, model: Verifier, device: torch.device, context: int) -> int | None:
    """How many requests' KV caches at ``context`` fit the budget (None: no budget, e.g. on CPU)."""
    budget = cfg.kv_budget_bytes
    if budget is None and device.type == "cuda":
        budget = 0.6 * torch.cuda.mem_get_info(device)[0]
    if budget is None:
        return None
    tokens = context + max(cfg.query_tokens, max(cfg.draft_tokens)) + 1
    return int(budget // (tokens * model.s.kv_bytes_per_token / 2 * model.embed.weight.element_size()))


def request_slots(cfg: ProfileConfig, model: Verifier, device: torch.device) -> int | None:
    """How many requests every R-dependent point can hold. Version 1: the verifier's caches at the largest context.
    Version 2: the verifier's at the probe context and each drafter's own cache at its tables' longest context."""
    if cfg.context_axes is None:
        return kv_slots_that_fit(cfg, model, device, max(cfg.context_tokens))
    slots = kv_slots_that_fit(cfg, model, device, cfg.probe_context_tokens)
    if not cfg.drafters or slots is None:
        return slots
    layers = max(drafter_num_layers(kind, model.s, max(cfg.draft_tokens)) for kind in cfg.drafters)
    draft_slots = kv_slots_that_fit(cfg, model, device, max(cfg.context_axes.drafter_contexts))
    return min(slots, int(draft_slots * model.s.num_layers / layers))  # type: ignore[operator]


def _cut_requests(cfg: ProfileConfig, max_slots: int | None) -> tuple[ProfileConfig, int | None]:
    """Drop the request counts above ``max_slots``."""
    if max_slots is None or cfg.num_requests[-1] <= max_slots:
        return cfg, None
    fits = tuple(r for r in cfg.num_requests if r <= max_slots)
    if not fits:
        raise SystemExit(f"not even {cfg.num_requests[0]} request's KV caches fit the memory budget at the "
                         f"profiled contexts; lower --context-tokens (or --probe-context, --draft-contexts) or raise "
                         f"--kv-budget-gb")
    return dataclasses.replace(cfg, num_requests=fits), cfg.num_requests[-1]


def fit_requests(cfg: ProfileConfig, model: Verifier, device: torch.device) -> tuple[ProfileConfig, int | None]:
    """``cfg`` with the R grid cut to what fits (see :func:`request_slots`), and the R it was cut from (None: uncut)."""
    return _cut_requests(cfg, request_slots(cfg, model, device))
