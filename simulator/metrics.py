"""Run-level metrics from the per-request and per-step tables.

Names follow vLLM's speculative-decoding metrics where one exists:
``mean_acceptance_length`` = 1 + accepted draft tokens / drafts (a *draft* is
one request-step), ``draft_acceptance_rate`` = accepted / verified draft tokens,
``acceptance_rate_per_position[k]`` = drafts with >= k+1 accepted tokens /
drafts that verified >= k+1 tokens (the paper's conditional acceptance is
``accepted_per_position[k] / accepted_per_position[k-1]``). Both acceptance rates
are reported by name: ``acceptance_rate_with_bonus`` = (accepted + drafts) /
(verified + drafts), the paper's (its footnote 3: the bonus token counted, tau / (1 + l)),
and ``acceptance_rate_draft_only``, vLLM's (= ``draft_acceptance_rate``).

Terms used below (``docs/outputs.md`` lists every key with its unit):

* the *window* is ``[start_at, end_at]``: a request *arrived in the window*
  when ``start_at <= arrival_at < end_at``; a first token or a finish is in the
  window when ``start_at < t <= end_at`` (as a step is, by its end time);
* the *backlog* at time t is the number of requests that arrived by t and
  had not finished by t (waiting for prefill, in prefill, waiting for a decode
  slot, or decoding);
* the run is *overloaded* when the backlog grows through the whole window
  (see :func:`backlog_trend`): arrivals outpace service and the queue grows
  without bound, so per-request latencies describe only the requests served.

Every figure that has no value (no request finished, no step ran) is None,
never NaN, so that a summary is strict JSON.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

# Overload: the backlog must grow by at least this fraction of the in-window arrival rate, over the whole
# window and over its second half (a ramp-up that levels off is not overload), and by this many requests.
OVERLOAD_GROWTH_FRACTION = 0.05
OVERLOAD_MIN_REQUESTS = 10
BACKLOG_SAMPLES = 101  # evenly spaced instants of the window at which the backlog is counted


def _reverse_cumsum(counts: np.ndarray) -> np.ndarray:
    """counts[j] = request-steps with value j  ->  out[k] = request-steps with value >= k+1."""
    return np.cumsum(counts[::-1])[::-1][1:]


def _number(value: float) -> float | None:
    """A finite float, or None for NaN and infinities (strict JSON has neither)."""
    return float(value) if np.isfinite(value) else None


def _ratio(numerator: float, denominator: float) -> float | None:
    return _number(numerator / denominator) if denominator else None


def distribution(values: pd.Series | np.ndarray) -> dict[str, Any]:
    """``{num, mean, p50, p90, p99, max}`` of the non-NaN ``values`` (linear-interpolated percentiles)."""
    clean = np.asarray(values, dtype=np.float64)
    clean = clean[~np.isnan(clean)]
    if clean.size == 0:
        return {"num": 0, "mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    p50, p90, p99 = np.percentile(clean, [50, 90, 99])
    return {"num": int(clean.size), "mean": _number(clean.mean()), "p50": _number(p50), "p90": _number(p90),
            "p99": _number(p99), "max": _number(clean.max())}


def add_request_metrics(requests: pd.DataFrame) -> pd.DataFrame:
    """Per-request TTFT, e2e latency, TPOT and tok/s/user (NaN until the first token, resp. the finish)."""
    out = requests.copy()
    out["ttft_s"] = out["first_token_at"] - out["arrival_at"]
    out["e2e_s"] = out["finished_at"] - out["arrival_at"]
    decode_s = out["finished_at"] - out["first_token_at"]
    decoded = (out["output_tokens"] - 1).where(out["output_tokens"] > 1)
    out["tpot_s"] = decode_s / decoded
    out["tokens_per_s_per_user"] = decoded / decode_s
    return out


def requests_in_run(requests: pd.DataFrame, start_at: float, end_at: float | None) -> pd.DataFrame:
    """The requests that arrived before ``end_at`` (all when None: a run to completion), with ``in_window``:
    arrived in the measurement window ``[start_at, end_at)``. Rows keep their ``request_id``."""
    arrived = requests if end_at is None else requests[requests["arrival_at"] < end_at]
    out = arrived.reset_index(drop=True)
    out["in_window"] = out["arrival_at"] >= start_at
    if end_at is not None:
        out["in_window"] &= out["arrival_at"] < end_at
    return out


def queue_at_end(requests: pd.DataFrame, end_at: float) -> dict[str, Any]:
    """Where the requests that arrived by ``end_at`` stand then: unfinished ones by stage, and how long those
    still without a first token have waited so far (a lower bound on their TTFT)."""
    arrived = requests[requests["arrival_at"] <= end_at]
    unfinished = arrived[~(arrived["finished_at"] <= end_at)]
    no_prefill = ~(unfinished["prefill_start_at"] <= end_at)
    no_first_token = ~(unfinished["first_token_at"] <= end_at)
    no_decode = ~(unfinished["decode_start_at"] <= end_at)
    return {
        "num_unfinished_at_end": int(len(unfinished)),
        "num_waiting_prefill_at_end": int(no_prefill.sum()),
        "num_prefilling_at_end": int((no_first_token & ~no_prefill).sum()),
        "num_waiting_decode_at_end": int((no_decode & ~no_first_token).sum()),
        "num_decoding_at_end": int((~no_decode).sum()),
        "ttft_pending_s": distribution(end_at - unfinished.loc[no_first_token, "arrival_at"]),
    }


def _slope(times: np.ndarray, values: np.ndarray) -> float:
    """Least-squares slope of ``values`` over ``times``."""
    centred = times - times.mean()
    return float((centred * (values - values.mean())).sum() / (centred**2).sum())


def backlog_trend(arrival_at: np.ndarray, finished_at: np.ndarray, start_at: float,
                  end_at: float) -> dict[str, Any]:
    """The backlog over the window and whether it grows without bound.

    The backlog is counted at ``BACKLOG_SAMPLES`` evenly spaced instants of
    ``[start_at, end_at]``; its growth rate is the least-squares slope through
    them. The run is *overloaded* when all three hold:

    1. the slope over the whole window is at least ``OVERLOAD_GROWTH_FRACTION``
       of the in-window arrival rate (arrivals outpace finishes by that margin);
    2. the slope over the window's second half is too (still growing at the
       end: a system filling up to a steady backlog levels off);
    3. the fitted growth over the window (slope x window) is at least
       ``OVERLOAD_MIN_REQUESTS`` (not a few requests of noise).
    """
    window_s = end_at - start_at
    arrived_sorted = np.sort(arrival_at[~np.isnan(arrival_at)])
    finished_sorted = np.sort(finished_at[~np.isnan(finished_at)])
    times = np.linspace(start_at, end_at, BACKLOG_SAMPLES)
    backlog = (np.searchsorted(arrived_sorted, times, side="right")
               - np.searchsorted(finished_sorted, times, side="right")).astype(np.float64)
    num_arrived = int(((arrival_at >= start_at) & (arrival_at < end_at)).sum())
    num_finished = int(((finished_at > start_at) & (finished_at <= end_at)).sum())
    arrival_rate = num_arrived / window_s if window_s > 0 else float("nan")
    growth = _slope(times, backlog) if window_s > 0 else float("nan")
    half = BACKLOG_SAMPLES // 2
    late_growth = _slope(times[half:], backlog[half:]) if window_s > 0 else float("nan")
    margin = OVERLOAD_GROWTH_FRACTION * arrival_rate
    overloaded = bool(growth >= margin and late_growth >= margin and growth * window_s >= OVERLOAD_MIN_REQUESTS)
    return {
        "request_arrival_rate_per_s": _number(arrival_rate),
        "request_finish_rate_per_s": _ratio(num_finished, window_s),
        "num_unfinished_at_window_start": int(backlog[0]),
        "backlog_growth_per_s": _number(growth),
        "backlog_growth_late_per_s": _number(late_growth),
        "overloaded": overloaded,
    }


def overload_warning(summary: dict[str, Any]) -> str | None:
    """The summary's one-line overload warning (None when the run is not overloaded)."""
    if not summary["overloaded"]:
        return None
    return (f"OVERLOADED: the backlog grew from {summary['num_unfinished_at_window_start']} to "
            f"{summary['num_unfinished_at_end']} requests over the window (+{summary['backlog_growth_per_s']:.1f}/s; "
            f"{summary['request_arrival_rate_per_s']:.1f} arrived/s, {summary['request_finish_rate_per_s']:.1f} "
            "finished/s): the queue grows without bound and latencies cover only the requests served "
            "(or the warm-up is shorter than the time to fill the system)")


def summarize(requests: pd.DataFrame, steps: pd.DataFrame, verified_length_counts: np.ndarray,
              accepted_length_counts: np.ndarray, *, start_at: float, end_at: float,
              num_decode_gpus: int) -> dict[str, Any]:
    """Aggregate a run over the measurement window [start_at, end_at].

    Throughput counts output tokens produced inside the window (first tokens
    from prefill plus decode-step tokens, by the step's end time). TTFT covers
    every request whose first token came in the window; TPOT, e2e latency and
    tok/s/user the requests that finished in it; ``ttft_pending_s`` the
    requests still without a first token at the end. The length histograms
    must cover the same window (engines count steps that end after the warm-up).
    """
    window_s = end_at - start_at
    in_window = steps[(steps["end_at"] > start_at) & (steps["end_at"] <= end_at)]
    first = requests[(requests["first_token_at"] > start_at) & (requests["first_token_at"] <= end_at)]
    output_tokens = int(in_window["num_emitted_tokens"].sum()) + len(first)
    done = requests[(requests["finished_at"] > start_at) & (requests["finished_at"] <= end_at)]
    arrival_at = requests["arrival_at"].to_numpy(dtype=np.float64)

    request_steps = int(in_window["num_requests"].sum())  # vLLM's num_drafts
    verified = int(in_window["num_verified_tokens"].sum())
    accepted = int(in_window["num_accepted_tokens"].sum())
    verified_per_position = _reverse_cumsum(verified_length_counts)
    accepted_per_position = _reverse_cumsum(accepted_length_counts)
    throughput = _ratio(output_tokens, window_s)
    summary: dict[str, Any] = {
        "window_s": window_s,
        "window_start_at": start_at,
        "window_end_at": end_at,
        "num_requests_arrived": int(((arrival_at >= start_at) & (arrival_at < end_at)).sum()),
        "num_requests_arrived_in_run": int((arrival_at <= end_at).sum()),
        "num_requests_finished": int(len(done)),
        "num_steps": int(len(in_window)),
        "output_tokens": output_tokens,
        "output_tokens_per_s": throughput,
        "output_tokens_per_s_per_gpu": None if throughput is None else throughput / num_decode_gpus,
        "tokens_per_s_per_user": distribution(done["tokens_per_s_per_user"]),
        "ttft_s": distribution(first["ttft_s"]),
        "tpot_s": distribution(done["tpot_s"]),
        "e2e_s": distribution(done["e2e_s"]),
        **queue_at_end(requests, end_at),
        **backlog_trend(arrival_at, requests["finished_at"].to_numpy(dtype=np.float64), start_at, end_at),
        "mean_acceptance_length": None if not request_steps else 1.0 + accepted / request_steps,
        "draft_acceptance_rate": _ratio(accepted, verified),
        "acceptance_rate_with_bonus": _ratio(accepted + request_steps, verified + request_steps),  # the paper's
        "acceptance_rate_draft_only": _ratio(accepted, verified),  # vLLM's draft acceptance rate, by name
        "acceptance_rate_per_position": [_ratio(a, v) for a, v in
                                         zip(accepted_per_position, verified_per_position, strict=True)],
        "verification_budget_per_request": _ratio(float(in_window["batch_tokens"].sum()), request_steps),
        "mean_batch_tokens": _number(in_window["batch_tokens"].mean()) if len(in_window) else None,
        "mean_num_requests": _number(in_window["num_requests"].mean()) if len(in_window) else None,
    }
    summary["overload_warning"] = overload_warning(summary)
    if "num_preempted" in steps:  # paged KV: requests preempted (by recompute) by the steps in the window
        summary["num_preemptions"] = int(in_window["num_preempted"].sum())
    return summary
