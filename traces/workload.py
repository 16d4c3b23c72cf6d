"""A workload: the requests a simulation replays, as arrays (one entry per request)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DOMAINS = ("math", "code", "chat")


@dataclass(frozen=True)
class Workload:
    """Open-loop requests sorted by arrival.

    ``domain`` holds one of :data:`DOMAINS` per request (it selects the
    acceptance behaviour of the drafter). ``session_id`` is -1 where unknown;
    ``prefix_hash_ids`` optionally keeps per-request prefix-block hashes
    (Mooncake traces) for prefix-cache studies.
    """

    arrival_at: np.ndarray  # [N] float seconds, non-decreasing, starts anywhere >= 0
    prompt_tokens: np.ndarray  # [N] int >= 1
    output_tokens: np.ndarray  # [N] int >= 1
    domain: np.ndarray  # [N] str
    session_id: np.ndarray | None = None  # [N] int
    prefix_hash_ids: tuple[tuple[int, ...], ...] | None = None
    source: str = "synthetic"

    def __post_init__(self) -> None:
        n = self.arrival_at.shape[0]
        for name in ("prompt_tokens", "output_tokens", "domain"):
            if getattr(self, name).shape != (n,):
                raise ValueError(f"workload {self.source}: {name} has shape {getattr(self, name).shape}, "
                                 f"expected ({n},)")
        if n and np.any(np.diff(self.arrival_at) < 0):
            raise ValueError(f"workload {self.source}: arrival_at must be non-decreasing")
        if n and (self.prompt_tokens.min() < 1 or self.output_tokens.min() < 1):
            raise ValueError(f"workload {self.source}: prompt and output lengths must be >= 1 token")
        unknown = sorted(set(np.unique(self.domain).tolist()) - set(DOMAINS))
        if unknown:
            raise ValueError(f"workload {self.source}: unknown domain(s) {unknown}; valid: {', '.join(DOMAINS)}")

    @property
    def num_requests(self) -> int:
        return int(self.arrival_at.shape[0])
