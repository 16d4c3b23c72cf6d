"""Which request counts a profile can time: every R-dependent point's KV caches must fit the device's memory.

On a GPU a point of R requests at context C allocates R caches of C tokens; an R grid
is cut where the largest such point would not fit the budget (``--kv-budget-gb``,
default 60% of free memory; no limit on a CPU), and the profile's metadata says so.
Version 2 cuts the verifier's grid and each drafter's own grid separately: an mtp
chain's cache is many layers deep and should not cut the other drafters' tables.
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
    """How many requests the verifier's R-dependent points can hold: its caches at the largest context (version 1,
    where the drafters' tables share this grid) or at the probe context (version 2)."""
    context = max(cfg.context_tokens) if cfg.context_axes is None else cfg.probe_context_tokens
    return kv_slots_that_fit(cfg, model, device, context)


def drafter_slots(cfg: ProfileConfig, model: Verifier, device: torch.device, kind: str) -> int | None:
    """Version 2: how many requests a ``kind`` drafter's own cache holds at its tables' longest context (an mtp
    chain of max(gamma) modules holds max(gamma) layers per token)."""
    assert cfg.context_axes is not None
    slots = kv_slots_that_fit(cfg, model, device, max(cfg.context_axes.drafter_contexts))
    if slots is None:
        return None
    return int(slots * model.s.num_layers / drafter_num_layers(kind, model.s, max(cfg.draft_tokens)))


def _cut(grid: tuple[int, ...], max_slots: int | None, what: str) -> tuple[tuple[int, ...], str | None]:
    """``grid`` without the request counts above ``max_slots``, and a note when some were dropped."""
    if max_slots is None or grid[-1] <= max_slots:
        return grid, None
    fits = tuple(r for r in grid if r <= max_slots)
    if not fits:
        raise SystemExit(f"not even {grid[0]} request's KV caches fit the memory budget for {what}; lower "
                         f"--context-tokens (or --probe-context, --draft-contexts) or raise --kv-budget-gb")
    return fits, f"{what}: R grid cut from {grid[-1]} to {fits[-1]}"


def fit_requests(cfg: ProfileConfig, model: Verifier, device: torch.device) -> tuple[ProfileConfig, str | None]:
    """``cfg`` with each R grid cut to what fits in memory, and what was cut (None: nothing). Version 1: one grid,
    the verifier's caches at the largest context. Version 2: the verifier's grid by its caches at the probe
    context, and each drafter's own grid by its own cache at the drafter tables' longest context."""
    grid, note = _cut(cfg.num_requests, request_slots(cfg, model, device), "the verifier's caches")
    notes = [note]
    grids = []
    if cfg.context_axes is not None:
        for kind in cfg.drafters:
            kind_grid, kind_note = _cut(cfg.num_requests, drafter_slots(cfg, model, device, kind), f"the {kind} "
                                        f"drafter's caches")
            grids.append(kind_grid)
            notes.append(kind_note)
    said = [n for n in notes if n is not None]
    return (dataclasses.replace(cfg, num_requests=grid, draft_requests=tuple(grids)),
            "; ".join(said) + " (more requests' KV caches do not fit the memory budget)" if said else None)
