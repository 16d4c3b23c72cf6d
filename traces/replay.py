"""Turning a read trace into a :class:`~traces.workload.Workload`: window, limit, lengths, domains, rate.

Steps, in this order (each one counted in the :class:`ReplayReport`):

1. **Time window** ``[start_s, end_s)`` on the trace clock (seconds since the
   file's first good request, before any rate scaling).
2. **Zero-output rows** (failed requests, as BurstGPT logs them): ``zero_output``
   says whether they raise (default), are dropped, or become 1 output token.
3. **Request limit** ``max_requests``: the first requests in arrival order.
4. **Output cap** ``max_output_tokens``: longer outputs are cut to the cap.
5. **Domains**: one ``domain`` for all; or a random ``domain_mix`` drawn with
   ``seed`` (one draw per known session, so a conversation keeps its domain);
   or the file's labels mapped by :data:`~traces.formats.DEFAULT_DOMAIN_MAP`
   updated with ``domain_map``.
6. **Rate**: every inter-arrival gap is multiplied by one factor, so the
   coefficient of variation of the gaps (burstiness) and ties between
   arrivals are kept. ``target_rate_per_s`` picks the factor that gives that
   mean rate; ``rate_scale`` multiplies the recorded rate.
7. Arrival times are shifted so the first kept request arrives at 0.

The *mean rate* of n arrivals is ``(n - 1) / (last - first)`` requests per second.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd

from traces.formats import DEFAULT_DOMAIN_MAP
from traces.table import TraceTable
from traces.workload import DOMAINS, Workload

ZeroOutput = Literal["error", "drop", "one_token"]


@dataclass(frozen=True)
class ReplayOptions:
    """How to replay a trace; the defaults replay every request as recorded (see the module docstring)."""

    start_s: float = 0.0
    end_s: float | None = None
    max_requests: int | None = None
    target_rate_per_s: float | None = None
    rate_scale: float | None = None
    max_output_tokens: int | None = None
    domain: str | None = None
    domain_mix: Mapping[str, float] | None = None
    domain_map: Mapping[str, str] | None = None
    zero_output: ZeroOutput = "error"
    skip_bad_rows: bool = False
    keep_prefix_hash_ids: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if self.start_s < 0 or (self.end_s is not None and self.end_s <= self.start_s):
            raise ValueError(f"time window needs 0 <= start_s < end_s, got start_s={self.start_s}, end_s={self.end_s}")
        for name in ("max_requests", "max_output_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {value}")
        for name in ("target_rate_per_s", "rate_scale"):
            value = getattr(self, name)
            if value is not None and not (np.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number or None, got {value}")
        if self.target_rate_per_s is not None and self.rate_scale is not None:
            raise ValueError("give target_rate_per_s or rate_scale, not both")
        if self.domain is not None and self.domain_mix is not None:
            raise ValueError("give domain or domain_mix, not both")
        named = [self.domain] if self.domain is not None else []
        named += list(self.domain_mix or {}) + list((self.domain_map or {}).values())
        unknown = sorted(set(named) - set(DOMAINS))
        if unknown:
            raise ValueError(f"unknown domain(s) {unknown}; valid: {', '.join(DOMAINS)}")
        if self.domain_mix is not None:
            weights = np.asarray(list(self.domain_mix.values()), dtype=float)
            if weights.size == 0 or np.any(weights < 0) or not weights.sum() > 0:
                raise ValueError(f"domain_mix needs non-negative weights with a positive sum, got {self.domain_mix}")
        if self.zero_output not in ("error", "drop", "one_token"):
            raise ValueError(f"zero_output must be 'error', 'drop' or 'one_token', got {self.zero_output!r}")


@dataclass(frozen=True)
class ReplayReport:
    """What reading and replaying one trace kept, left out or changed, with counts."""

    source: str  # sample name or file name
    format: str
    origin: str  # the file's own time of trace-clock 0
    num_rows: int  # data rows in the file
    skipped_rows: Mapping[str, int]  # "field: reason" -> bad rows left out (skip_bad_rows only)
    num_outside_window: int
    num_zero_output: int  # rows with 0 output tokens inside the window
    zero_output: ZeroOutput  # what was done with them
    num_over_limit: int
    num_output_capped: int
    max_output_tokens: int | None
    time_scale: float  # factor applied to every inter-arrival gap (1.0 = as recorded)
    num_requests: int  # requests in the workload

    @property
    def num_skipped(self) -> int:
        return sum(self.skipped_rows.values())

    def lines(self) -> list[str]:
        """The report as short human-readable lines (the caller decides where they go)."""
        out = [f"{self.source}: {self.format} trace, {self.num_rows} data rows, trace clock 0 = {self.origin}"]
        if self.skipped_rows:
            reasons = ", ".join(f"{k}: {v}" for k, v in sorted(self.skipped_rows.items()))
            out.append(f"skipped {self.num_skipped} bad rows ({reasons})")
        if self.num_outside_window:
            out.append(f"left out {self.num_outside_window} requests outside the time window")
        if self.num_zero_output:
            done = "dropped" if self.zero_output == "drop" else "replayed with 1 output token"
            out.append(f"{self.num_zero_output} requests with 0 output tokens (failed requests) {done}")
        if self.num_over_limit:
            out.append(f"left out {self.num_over_limit} requests over the request limit")
        if self.max_output_tokens is not None:
            out.append(f"capped {self.num_output_capped} outputs at {self.max_output_tokens} tokens")
        if self.time_scale != 1.0:
            out.append(f"inter-arrival gaps scaled by {self.time_scale:.6g} (rate x {1 / self.time_scale:.6g})")
        out.append(f"replaying {self.num_requests} requests")
        return out


@dataclass(frozen=True)
class TraceReplay:
    workload: Workload
    report: ReplayReport


class ZeroOutputError(ValueError):
    """Requests with 0 output tokens met the default ``zero_output="error"``."""


def replay(table: TraceTable, options: ReplayOptions, *, source: str) -> TraceReplay:
    """Apply ``options`` to ``table`` (see the module docstring for the steps)."""
    t = table.arrival_s
    in_window = (t >= options.start_s) & (t < (np.inf if options.end_s is None else options.end_s))
    kept = table.select(in_window)
    num_outside = table.num_requests - kept.num_requests

    zero = kept.output_tokens == 0
    num_zero = int(zero.sum())
    output = kept.output_tokens
    if num_zero and options.zero_output == "error":
        first = int(np.argmax(zero))
        raise ZeroOutputError(
            f"{table.file_name} line {kept.line[first]}, field {table.output_field!r}: 0 output tokens "
            f"(a failed request); {num_zero} such row(s) in the replayed window. Pass zero_output='drop' to "
            "leave them out or zero_output='one_token' to replay them with 1 output token (both are counted).")
    if num_zero and options.zero_output == "drop":
        kept = kept.select(~zero)
        output = kept.output_tokens
    elif num_zero:
        output = np.where(zero, 1, output)

    num_over = 0
    if options.max_requests is not None and kept.num_requests > options.max_requests:
        num_over = kept.num_requests - options.max_requests
        kept = kept.select(np.arange(options.max_requests))
        output = output[: options.max_requests]
    if kept.num_requests == 0:
        span_s = table.arrival_s[-1] if table.num_requests else 0.0
        raise ValueError(f"{source}: no requests left to replay: {table.num_rows} data rows, "
                         f"{sum(table.skipped_rows.values())} skipped as bad, {num_outside} outside the window "
                         f"[{options.start_s}, {options.end_s}) s of a {span_s:.6g} s trace, "
                         f"{num_zero if options.zero_output == 'drop' else 0} dropped with 0 output tokens")

    num_capped = 0
    if options.max_output_tokens is not None:
        num_capped = int((output > options.max_output_tokens).sum())
        output = np.minimum(output, options.max_output_tokens)

    scale = time_scale_for(kept.arrival_s, options)
    arrival_at = (kept.arrival_s - kept.arrival_s[0]) * scale
    workload = Workload(
        arrival_at=arrival_at,
        prompt_tokens=kept.prompt_tokens.copy(),
        output_tokens=output.copy(),
        domain=assign_domains(kept, options),
        session_id=None if kept.session_id is None else kept.session_id.copy(),
        prefix_hash_ids=kept.prefix_hash_ids,
        source=source,
    )
    report = ReplayReport(
        source=source, format=table.format, origin=table.origin, num_rows=table.num_rows,
        skipped_rows=dict(table.skipped_rows), num_outside_window=num_outside, num_zero_output=num_zero,
        zero_output=options.zero_output, num_over_limit=num_over, num_output_capped=num_capped,
        max_output_tokens=options.max_output_tokens, time_scale=scale, num_requests=workload.num_requests,
    )
    return TraceReplay(workload=workload, report=report)


def time_scale_for(arrival_s: np.ndarray, options: ReplayOptions) -> float:
    """The factor on inter-arrival gaps that ``target_rate_per_s`` or ``rate_scale`` asks for."""
    if options.rate_scale is not None:
        return 1.0 / options.rate_scale
    if options.target_rate_per_s is None:
        return 1.0
    span_s = float(arrival_s[-1] - arrival_s[0])
    if arrival_s.shape[0] < 2 or span_s <= 0:
        raise ValueError("target_rate_per_s needs at least two requests at different times")
    return (arrival_s.shape[0] - 1) / (span_s * options.target_rate_per_s)


def assign_domains(table: TraceTable, options: ReplayOptions) -> np.ndarray:
    """One project domain per request (step 5 of the module docstring)."""
    n = table.num_requests
    if options.domain is not None:
        return np.full(n, options.domain)
    if options.domain_mix is not None:
        names = np.asarray(list(options.domain_mix))
        weights = np.asarray(list(options.domain_mix.values()), dtype=float)
        rng = np.random.default_rng(options.seed)
        per_request = rng.choice(names.size, size=n, p=weights / weights.sum())
        if table.session_id is None:
            return names[per_request]
        sessions, inverse = np.unique(table.session_id, return_inverse=True)
        per_session = rng.choice(names.size, size=sessions.size, p=weights / weights.sum())
        return names[np.where(table.session_id >= 0, per_session[inverse], per_request)]
    mapping = {**DEFAULT_DOMAIN_MAP, **{d: d for d in DOMAINS}, **(options.domain_map or {})}
    inverse, labels = pd.factorize(table.domain_label)
    unknown = [label for label in labels.tolist() if label not in mapping]
    if unknown:
        raise ValueError(f"{table.file_name}: no domain for label(s) {unknown}; pass domain='code' (or another "
                         f"of {', '.join(DOMAINS)}), domain_map={{{unknown[0]!r}: ...}} or domain_mix")
    return np.asarray([mapping[label] for label in labels.tolist()])[inverse]
