"""Run-level metrics from the per-request and per-step tables.

Names follow vLLM's speculative-decoding metrics where one exists:
``mean_acceptance_length`` = 1 + accepted draft tokens / drafts (a *draft* is
one request-step), ``draft_acceptance_rate`` = accepted / verified draft tokens,
``acceptance_rate_per_position[k]`` = drafts with >= k+1 accepted tokens /
drafts that verified >= k+1 tokens (the paper's conditional acceptance is
``accepted_per_position[k] / accepted_per_position[k-1]``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd


def _reverse_cumsum(counts: np.ndarray) -> np.ndarray:
    """counts[j] = request-steps with value j  ->  out[k] = request-steps with value >= k+1."""
    return np.cumsum(counts[::-1])[::-1][1:]


def _percentiles(values: pd.Series) -> dict[str, float]:
    clean = values.dropna()
    if clean.empty:
        return {"mean": float("nan"), "p50": float("nan"), "p90": float("nan")}
    return {"mean": float(clean.mean()), "p50": float(clean.quantile(0.5)), "p90": float(clean.quantile(0.9))}


def add_request_metrics(requests: pd.DataFrame) -> pd.DataFrame:
    """Per-request TTFT, decode time, TPOT and tok/s/user (NaN until finished)."""
    out = requests.copy()
    out["ttft_s"] = out["first_token_at"] - out["arrival_at"]
    out["e2e_s"] = out["finished_at"] - out["arrival_at"]
    decode_s = out["finished_at"] - out["first_token_at"]
    decoded = (out["output_tokens"] - 1).where(out["output_tokens"] > 1)
    out["tpot_s"] = decode_s / decoded
    out["tokens_per_s_per_user"] = decoded / decode_s
    return out


def summarize(requests: pd.DataFrame, steps: pd.DataFrame, verified_length_counts: np.ndarray,
              accepted_length_counts: np.ndarray, *, start_at: float, end_at: float,
              num_decode_gpus: int) -> dict[str, Any]:
    """Aggregate a run over the measurement window [start_at, end_at].

    Throughput counts output tokens produced inside the window (first tokens
    from prefill plus decode-step tokens, by the step's end time). Per-request
    statistics use the requests that finished inside the window. The length
    histograms must cover the same window (engines count steps that end after
    the warm-up).
    """
    window_s = end_at - start_at
    in_window = steps[(steps["end_at"] > start_at) & (steps["end_at"] <= end_at)]
    first_tokens = int(((requests["first_token_at"] > start_at) & (requests["first_token_at"] <= end_at)).sum())
    output_tokens = int(in_window["num_emitted_tokens"].sum()) + first_tokens
    done = requests[(requests["finished_at"] > start_at) & (requests["finished_at"] <= end_at)]

    request_steps = int(in_window["num_requests"].sum())  # vLLM's num_drafts
    verified = int(in_window["num_verified_tokens"].sum())
    accepted = int(in_window["num_accepted_tokens"].sum())
    verified_per_position = _reverse_cumsum(verified_length_counts)
    accepted_per_position = _reverse_cumsum(accepted_length_counts)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_position = accepted_per_position / verified_per_position
    throughput = output_tokens / window_s if window_s > 0 else float("nan")
    return {
        "window_s": window_s,
        "num_requests_arrived": int((requests["arrival_at"] <= end_at).sum()),
        "num_requests_finished": int(len(done)),
        "num_steps": int(len(in_window)),
        "output_tokens": output_tokens,
        "output_tokens_per_s": throughput,
        "output_tokens_per_s_per_gpu": throughput / num_decode_gpus,
        "tokens_per_s_per_user": _percentiles(done["tokens_per_s_per_user"]),
        "ttft_s": _percentiles(done["ttft_s"]),
        "tpot_s": _percentiles(done["tpot_s"]),
        "e2e_s": _percentiles(done["e2e_s"]),
        "mean_acceptance_length": 1.0 + accepted / request_steps if request_steps else float("nan"),
        "draft_acceptance_rate": accepted / verified if verified else float("nan"),
        "acceptance_rate_per_position": [float(x) for x in per_position],
        "verification_budget_per_request": (float(in_window["batch_tokens"].sum()) / request_steps
                                            if request_steps else float("nan")),
        "mean_batch_tokens": float(in_window["batch_tokens"].mean()) if len(in_window) else float("nan"),
        "mean_num_requests": float(in_window["num_requests"].mean()) if len(in_window) else float("nan"),
    }
