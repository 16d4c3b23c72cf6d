"""Descriptive statistics of a workload's arrivals and lengths (what ``python -m traces.summary`` shows).

*Burstiness* is the coefficient of variation (standard deviation / mean) of
the inter-arrival gaps: 1 for a Poisson process, above 1 for bursty traffic.
Traces that log arrivals in batches (many requests at one instant) have many
zero gaps, so the CV of the gaps between distinct arrival instants is given
too. The *mean rate* of n arrivals is ``(n - 1) / span_s``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from traces.workload import Workload

# Histogram bin widths tried for arrivals-per-second plots, smallest first.
NICE_BINS_S = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 21600.0, 86400.0)


@dataclass(frozen=True)
class LengthStats:
    """Distribution of one length (tokens) over the requests."""

    mean: float
    p50: float
    p90: float
    p99: float
    min: int
    max: int
    total: int

    @staticmethod
    def of(tokens: np.ndarray) -> LengthStats:
        p50, p90, p99 = np.percentile(tokens, [50, 90, 99])
        return LengthStats(float(tokens.mean()), float(p50), float(p90), float(p99), int(tokens.min()),
                           int(tokens.max()), int(tokens.sum()))


@dataclass(frozen=True)
class TraceStats:
    num_requests: int
    span_s: float
    mean_rate_per_s: float  # NaN with fewer than two arrival instants
    interarrival_cv: float  # NaN with fewer than two gaps or all gaps 0
    num_arrival_instants: int  # distinct arrival times
    instant_gap_cv: float  # CV of the gaps between distinct arrival instants
    max_requests_per_instant: int
    rate_bin_s: float
    rate_bin_start_at: np.ndarray  # [B] s, start of each time bin
    rate_per_s: np.ndarray  # [B] arrivals per second in each bin
    prompt_tokens: LengthStats
    output_tokens: LengthStats


def coefficient_of_variation(values: np.ndarray) -> float:
    """std / mean (population std); NaN for fewer than two values or a zero mean."""
    if values.shape[0] < 2 or values.mean() == 0:
        return float("nan")
    return float(values.std() / values.mean())


def interarrival_cv(arrival_at: np.ndarray) -> float:
    """Burstiness: the coefficient of variation of the gaps between consecutive arrivals."""
    return coefficient_of_variation(np.diff(arrival_at))


def nice_bin_s(span_s: float, max_bins: int) -> float:
    """The smallest width in :data:`NICE_BINS_S` that covers ``span_s`` in at most ``max_bins`` bins."""
    for width in NICE_BINS_S:
        if span_s / width <= max_bins:
            return width
    return float(np.ceil(span_s / max_bins))


def arrivals_per_s(arrival_at: np.ndarray, bin_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Bin starts (s) and arrivals per second in bins of ``bin_s`` from the first arrival."""
    start = arrival_at[0]
    num_bins = max(1, int(np.ceil((arrival_at[-1] - start) / bin_s)))
    edges = start + bin_s * np.arange(num_bins + 1)
    counts, _ = np.histogram(arrival_at, bins=edges)  # the last bin includes its right edge
    return edges[:-1], counts / bin_s


def compute_stats(workload: Workload, *, num_rate_bins: int = 12) -> TraceStats:
    """Statistics of ``workload``; at most ``num_rate_bins`` time bins (of a round width) for the rate rows."""
    at = workload.arrival_at
    if at.shape[0] == 0:
        raise ValueError(f"workload {workload.source} has no requests")
    span_s = float(at[-1] - at[0])
    instants, per_instant = np.unique(at, return_counts=True)
    rate = (at.shape[0] - 1) / span_s if span_s > 0 else float("nan")
    bin_s = nice_bin_s(span_s, num_rate_bins)
    bin_starts, rates = arrivals_per_s(at, bin_s)
    return TraceStats(
        num_requests=int(at.shape[0]),
        rate_bin_s=bin_s,
        span_s=span_s,
        mean_rate_per_s=rate,
        interarrival_cv=interarrival_cv(at),
        num_arrival_instants=int(instants.shape[0]),
        instant_gap_cv=interarrival_cv(instants),
        max_requests_per_instant=int(per_instant.max()),
        rate_bin_start_at=bin_starts,
        rate_per_s=rates,
        prompt_tokens=LengthStats.of(workload.prompt_tokens),
        output_tokens=LengthStats.of(workload.output_tokens),
    )


def format_stats(stats: TraceStats, name: str) -> list[str]:
    """The statistics as the lines of a plain-text table."""
    rows = [
        ("trace", name),
        ("requests", f"{stats.num_requests:,}"),
        ("span", f"{stats.span_s:,.3f} s"),
        ("mean rate", f"{stats.mean_rate_per_s:.4g} req/s"),
        ("burstiness (CV of inter-arrival gaps)", f"{stats.interarrival_cv:.4g}"),
        ("distinct arrival instants", f"{stats.num_arrival_instants:,} (most requests at one instant: "
                                      f"{stats.max_requests_per_instant})"),
        ("CV of gaps between distinct instants", f"{stats.instant_gap_cv:.4g}"),
    ]
    for label, lengths in (("prompt", stats.prompt_tokens), ("output", stats.output_tokens)):
        rows.append((f"{label} tokens mean / p50 / p90 / p99",
                     f"{lengths.mean:,.1f} / {lengths.p50:,.0f} / {lengths.p90:,.0f} / {lengths.p99:,.0f}"))
        rows.append((f"{label} tokens min / max / total", f"{lengths.min:,} / {lengths.max:,} / {lengths.total:,}"))
    width = max(len(label) for label, _ in rows)
    lines = [f"{label:<{width}}  {value}" for label, value in rows]
    lines.append(f"arrivals per second over time ({stats.rate_bin_s:g} s bins from the first arrival; "
                 "the last bin may be partial):")
    for start, rate in zip(stats.rate_bin_start_at, stats.rate_per_s, strict=True):
        lines.append(f"  {start:>12,.1f} s  {rate:8.3f} req/s")
    return lines
