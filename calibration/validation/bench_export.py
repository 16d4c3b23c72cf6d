"""The real serving loop's runs written as benchmark results (vLLM JSON and CSV), as a serving team has them.

The benchmark mode of the validation: every real (policy, users) point of a
static policy (``none``, ``mtp<k>``) becomes one :class:`BenchmarkRun`, pooled
over its slices the way the validation pools them
(:func:`calibration.validation.report.pooled_summary`):

* lengths: the mean prompt and output tokens of the requests that finished in a
  window; output tok/s, requests/s over the windows laid end to end;
* TPOT (mean, median, p99) and TTFT (mean, median, p99) over the pooled requests,
  in ms; ITL as a streaming client measures it (vLLM's ``bench serve``): every
  gap between a request's successive chunks, from its first token on. The loop
  streams one chunk per step, so a gap is a step plus whatever passed between
  steps, and a step with R requests counts R times; a request's first gap also
  holds its wait to join a step already running;
* the mean acceptance length (1 + accepted / request-steps) and the mean number
  of decoding requests per step, which the loop measures exactly (written as
  ``mean_decode_requests``, so the fit need not estimate it).

Variable-length policies (greedy, dspark) have no fixed ``k`` and are left out:
they are what the fitted profile is asked to predict.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from calibration.fitting.runs import NO_SPECULATION, BenchmarkRun
from calibration.fitting.writers import write_csv, write_vllm
from calibration.validation.report import pooled_summary
from policies import make_policy
from policies.static import Mtp, NoSpeculation


def fixed_draft_tokens(policy: str, gamma: int) -> int | None:
    """k of a static policy (0 for none), None for a policy whose verification length varies."""
    made = make_policy(policy)
    if isinstance(made, NoSpeculation):
        return 0
    return made.draft_tokens(gamma) if isinstance(made, Mtp) else None


def _window_requests(slices: Sequence[Any]) -> list[pd.DataFrame]:
    """Each slice's requests that finished inside its window."""
    frames = []
    for part in slices:
        start_s, end_s = part.spec.warmup_s, part.spec.warmup_s + part.summary["window_s"]
        req = part.requests
        frames.append(req[(req["finished_at"] > start_s) & (req["finished_at"] <= end_s)])
    return frames


def _request_gaps_s(requests: pd.DataFrame, steps: pd.DataFrame) -> np.ndarray:
    """The chunk gaps of ``requests`` (one engine's, each decoded in one unbroken run of ``steps``): a request's
    chunks are the ends of the steps from its admission to its end, its first gap starts at its first token."""
    steps = steps.sort_values("start_at")
    starts, ends = steps["start_at"].to_numpy(), steps["end_at"].to_numpy()
    first = np.searchsorted(starts, requests["decode_start_at"].to_numpy(), side="left")
    stop = np.searchsorted(ends, requests["finished_at"].to_numpy(), side="right")
    if not np.array_equal(stop - first, requests["num_steps"].to_numpy()):
        raise ValueError("a request's decode steps are not one unbroken run of its engine's steps (preempted?): "
                         "its chunk gaps cannot be read from the step table")
    # step i's gap from the step before it counts once for every request in both steps
    in_both = np.zeros(len(ends) + 1, dtype=np.int64)
    np.add.at(in_both, first + 1, 1)
    np.add.at(in_both, stop, -1)
    later = np.repeat(np.diff(ends), np.cumsum(in_both)[1:len(ends)])
    return np.concatenate([ends[first] - requests["first_token_at"].to_numpy(), later])


def _window_itl_ms(slices: Sequence[Any], finished: Sequence[pd.DataFrame]) -> np.ndarray:
    """Every chunk gap of ``finished[k]``, slice k's requests that finished inside its window (a request that ended
    at its first token has none), in ms."""
    gaps = []
    for part, done in zip(slices, finished, strict=True):
        decoded = done[done["num_steps"] > 0]
        for engine, steps in part.steps.groupby("engine"):
            gaps.append(_request_gaps_s(decoded[decoded["engine"] == engine], steps))
    return 1e3 * np.concatenate(gaps)


def _ms(stat: dict[str, Any], key: str) -> float | None:
    value = stat.get(key)
    return None if value is None else 1e3 * float(value)


def real_run(policy: str, users: int, drafter: str, gamma: int, slices: Sequence[Any], source: str,
             row: int, label: str) -> BenchmarkRun:
    """The benchmark record of one real point (a static policy's pooled slices)."""
    k = fixed_draft_tokens(policy, gamma)
    if k is None:
        raise ValueError(f"policy {policy!r} verifies a varying number of tokens: no benchmark record")
    pooled = pooled_summary(slices) if len(slices) > 1 else slices[0].summary
    finished = _window_requests(slices)
    done = pd.concat(finished, ignore_index=True)
    itl_ms = _window_itl_ms(slices, finished)
    tpot, ttft = pooled["tpot_s"], pooled["ttft_s"]
    window_s = float(pooled["window_s"])
    return BenchmarkRun(
        source=source, row=row, spec_method=drafter if k else NO_SPECULATION, num_speculative_tokens=k,
        mean_prompt_tokens=float(done["prompt_tokens"].mean()), mean_output_tokens=float(done["output_tokens"].mean()),
        output_tokens_per_s=float(pooled["output_tokens_per_s"]), mean_tpot_ms=float(_ms(tpot, "mean")),
        median_tpot_ms=_ms(tpot, "p50"), p99_tpot_ms=_ms(tpot, "p99"),
        mean_itl_ms=float(itl_ms.mean()), median_itl_ms=float(np.median(itl_ms)),
        p99_itl_ms=float(np.percentile(itl_ms, 99)), mean_ttft_ms=_ms(ttft, "mean"),
        median_ttft_ms=_ms(ttft, "p50"), p99_ttft_ms=_ms(ttft, "p99"), concurrency=float(users),
        requests_per_s=len(done) / window_s, acceptance_length=float(pooled["mean_acceptance_length"]) if k else None,
        mean_decode_requests=float(pooled["mean_num_requests"]), label=label, num_completed=len(done),
        duration_s=window_s)


def write_benchmark(real: dict[tuple[str, int], Sequence[Any]], drafter: str, gamma: int, label: str,
                    out: Path) -> dict[str, Path]:
    """``vllm/<policy>_u<users>.json`` per static point and ``runs.csv`` with all of them; returns the paths."""
    (out / "vllm").mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    runs = []
    for (policy, users), slices in sorted(real.items(), key=lambda item: (item[0][0], item[0][1])):
        if fixed_draft_tokens(policy, gamma) is None:
            continue
        path = out / "vllm" / f"{policy}_u{users}.json"
        run = real_run(policy, users, drafter, gamma, slices, str(path), 1, label)
        paths[f"bench_{policy}_u{users}"] = write_vllm(run, path)
        runs.append(run)
    if runs:
        paths["bench_csv"] = write_csv(runs, out / "runs.csv")
    return paths
