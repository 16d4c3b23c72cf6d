"""Synthetic traffic: per-domain request lengths, open-loop arrivals, closed-loop users.

Lengths are the ceiling of a lognormal (so always >= 1 token) with the given
median and log-space sigma, truncated at the engine's ``max_output_tokens`` /
``max_prompt_tokens`` like a real server's max-tokens limit. Open-loop arrivals
are a Poisson process or a gamma renewal process whose inter-arrival
coefficient of variation is ``burstiness_cv`` (1 = Poisson, > 1 bursty).
Closed-loop traffic is ``num_users`` users who each send their next request
``think_time_s`` after the previous one finished.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from traces.workload import DOMAINS, Workload

ArrivalKind = Literal["closed", "poisson", "gamma"]


@dataclass(frozen=True)
class LengthSpec:
    """Lognormal prompt/output lengths of one domain (medians in tokens, sigmas in log space)."""

    prompt_median_tokens: float
    prompt_sigma: float
    output_median_tokens: float
    output_sigma: float


# Assumed shapes, chosen to resemble public chat/code/maths serving mixes:
# chat has medium prompts and answers, code long prompts, maths short prompts
# with long worked answers. Users override them per experiment.
DOMAIN_LENGTHS: dict[str, LengthSpec] = {
    "chat": LengthSpec(600.0, 1.0, 300.0, 0.8),
    "code": LengthSpec(1500.0, 0.8, 350.0, 0.9),
    "math": LengthSpec(250.0, 0.6, 800.0, 0.7),
}


@dataclass(frozen=True)
class TrafficSpec:
    """What arrives. ``domain_mix`` maps domain -> weight (normalised)."""

    arrival: ArrivalKind = "closed"
    domain_mix: dict[str, float] = field(default_factory=lambda: {"chat": 1.0})
    num_users: int = 64
    think_time_s: float = 0.0
    rate_per_s: float = 10.0
    burstiness_cv: float = 1.0
    num_requests: int | None = None
    max_prompt_tokens: int = 32768
    max_output_tokens: int = 4096
    lengths: dict[str, LengthSpec] = field(default_factory=lambda: dict(DOMAIN_LENGTHS))

    def __post_init__(self) -> None:
        if self.arrival not in ("closed", "poisson", "gamma"):
            raise ValueError(f"traffic.arrival must be closed, poisson or gamma, got {self.arrival!r}")
        unknown = sorted(set(self.domain_mix) - set(DOMAINS))
        if unknown:
            raise ValueError(f"traffic.domain_mix: unknown domain(s) {unknown}; valid: {', '.join(DOMAINS)}")
        weights = np.array(list(self.domain_mix.values()), dtype=float)
        if weights.size == 0 or np.any(weights < 0) or weights.sum() <= 0:
            raise ValueError(f"traffic.domain_mix needs non-negative weights with a positive sum, "
                             f"got {self.domain_mix}")
        for name in ("num_users", "max_prompt_tokens", "max_output_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"traffic.{name} must be >= 1, got {getattr(self, name)}")
        if self.rate_per_s <= 0 or self.burstiness_cv <= 0 or self.think_time_s < 0:
            raise ValueError("traffic: rate_per_s and burstiness_cv must be > 0 and think_time_s >= 0")


class RequestSampler:
    """Draws (domain index, prompt tokens, output tokens) for new requests."""

    def __init__(self, spec: TrafficSpec) -> None:
        self.spec = spec
        names = list(spec.domain_mix)
        weights = np.array([spec.domain_mix[n] for n in names], dtype=float)
        self._domain_idx = np.array([DOMAINS.index(n) for n in names])
        self._probs = weights / weights.sum()
        # What Generator.choice(size, p=probs) computes: one uniform per draw, located in the normalised CDF.
        self._cdf = self._probs.cumsum()
        self._cdf /= self._cdf[-1]
        lengths = [spec.lengths[DOMAINS[i]] for i in range(len(DOMAINS))]
        # Row 0 prompts, row 1 outputs; a column per domain (both lengths of a request in one array operation).
        self._mu = np.log([[s.prompt_median_tokens for s in lengths], [s.output_median_tokens for s in lengths]])
        self._sigma = np.array([[s.prompt_sigma for s in lengths], [s.output_sigma for s in lengths]])
        self._max_tokens = np.array([[spec.max_prompt_tokens], [spec.max_output_tokens]], dtype=np.float64)

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        # rng.choice(self._probs.size, size=n, p=self._probs) draw for draw, without its per-call checks of p.
        domain = self._domain_idx[self._cdf.searchsorted(rng.random(n), side="right")]
        normals = rng.standard_normal((2, n))
        lengths = np.ceil(np.exp(self._mu[:, domain] + self._sigma[:, domain] * normals))
        lengths = np.minimum(lengths, self._max_tokens).astype(np.int64)
        return domain, lengths[0], lengths[1]


def arrival_times(rng: np.random.Generator, spec: TrafficSpec, duration_s: float | None) -> np.ndarray:
    """Open-loop arrival times in [0, duration_s) (or the first ``num_requests``)."""
    if spec.arrival == "closed":
        raise ValueError("closed-loop traffic has no precomputed arrival times")
    mean_gap_s = 1.0 / spec.rate_per_s
    if spec.num_requests is None and duration_s is None:
        raise ValueError("open-loop traffic needs traffic.num_requests or a simulation duration_s")
    limit = spec.num_requests
    batch = limit or max(16, int(1.5 * duration_s * spec.rate_per_s))  # type: ignore[operator]
    times, start = np.empty(0), 0.0
    while (limit is None or times.size < limit) and (duration_s is None or start < duration_s):
        if spec.arrival == "poisson":
            gaps = rng.exponential(mean_gap_s, size=batch)
        else:
            shape = 1.0 / spec.burstiness_cv**2
            gaps = rng.gamma(shape, mean_gap_s / shape, size=batch)
        times = np.concatenate((times, start + np.cumsum(gaps)))
        start = float(times[-1])
    if duration_s is not None:
        times = times[times < duration_s]
    return times[:limit] if limit is not None else times


def synthetic_workload(rng: np.random.Generator, spec: TrafficSpec, duration_s: float | None) -> Workload:
    """An open-loop workload drawn from ``spec``."""
    arrival_at = arrival_times(rng, spec, duration_s)
    domain, prompt, output = RequestSampler(spec).sample(rng, arrival_at.size)
    return Workload(arrival_at=arrival_at, prompt_tokens=prompt, output_tokens=output,
                    domain=np.array(DOMAINS)[domain], source=f"synthetic {spec.arrival}")
