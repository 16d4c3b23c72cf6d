"""One benchmark run, normalised, and what the fit reads from it: one observation of the mean step time.

Every reader returns :class:`BenchmarkRun` records (same fields, same units,
whatever the file format). :func:`observe` turns a run into a
:class:`StepObservation`:

* **tokens per step per request** ``tau``: 1 without speculation; with it the mean
  acceptance length (vLLM's ``1 + accepted / drafts``, SGLang's accept length: the
  tokens a request gains per step, bonus included);
* **mean step time** ``TPOT * tau * (n - 1) / (n - 1 + w)``: a request gains
  ``tau`` tokens per engine step, so the time between its tokens is the step time
  over ``tau``, except at its end: its last step accepts ``w`` draft tokens past
  the ``n - 1`` it needed after its first (see :func:`overshoot_tokens`), which
  ``tau`` counts (vLLM's acceptance length does; SGLang's is taken to) and TPOT does not.
  A server that streams one chunk per step (vLLM, our loop) measures the step
  more directly as the mean ITL, used with ``step="itl"``: every gap between a
  request's chunks, so a step counts once per request in it;
* **decode requests per step** ``R``: given (``mean_decode_requests``), or by
  Little's law over the decode phase, ``R = TPOT * (output tok/s - requests/s)``
  (every decoding request emits one token per TPOT; the first token of each
  request comes from prefill), or the nominal concurrency (``batch="nominal"``);
* **batch tokens** ``B = R * (1 + k)`` for ``k`` speculative tokens verified per
  request (``B = R`` without speculation);
* **mean context** ``prompt + output / 2`` tokens per decoding request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy.optimize import brentq

TpotStatistic = Literal["mean", "median"]
BatchEstimate = Literal["littles", "nominal"]
StepEstimate = Literal["tpot", "itl"]
NO_SPECULATION = "none"


class ResultsError(ValueError):
    """A results file lacks what the fit needs; the message names the file, the row and the field."""


@dataclass(frozen=True)
class BenchmarkRun:
    """One benchmark run (one concurrency or request rate, one speculation config). Times in ms as the tools
    write them; ``None`` where the file does not say."""

    source: str  # file the run was read from
    row: int  # 1-based row / line / object number in that file
    spec_method: str  # "none" without speculation; otherwise e.g. "mtp", "eagle3", "dspark"
    num_speculative_tokens: int  # k, the draft tokens verified per request per step (0 without speculation)
    mean_prompt_tokens: float
    mean_output_tokens: float
    output_tokens_per_s: float
    mean_tpot_ms: float
    concurrency: float | None = None  # nominal max concurrency (closed loop)
    request_rate_per_s: float | None = None  # open loop; None for "inf" / not given
    requests_per_s: float | None = None  # completed requests per second
    median_tpot_ms: float | None = None
    p99_tpot_ms: float | None = None
    mean_itl_ms: float | None = None
    median_itl_ms: float | None = None
    p99_itl_ms: float | None = None
    mean_ttft_ms: float | None = None
    median_ttft_ms: float | None = None
    p99_ttft_ms: float | None = None
    acceptance_length: float | None = None  # tokens per request per step, bonus included (>= 1)
    mean_decode_requests: float | None = None  # measured mean batch of decoding requests, when known
    label: str = ""
    num_completed: int | None = None  # requests completed in the run
    duration_s: float | None = None  # the run's measured window

    @property
    def where(self) -> str:
        return f"{self.source} row {self.row}"

    @property
    def speculative(self) -> bool:
        return self.num_speculative_tokens > 0

    @property
    def config_label(self) -> str:
        return NO_SPECULATION if not self.speculative else f"{self.spec_method}{self.num_speculative_tokens}"

    @property
    def load_label(self) -> str:
        if self.concurrency is not None:
            return f"c={self.concurrency:g}"
        return f"rate={self.request_rate_per_s:g}/s" if self.request_rate_per_s is not None else "rate=inf"


@dataclass(frozen=True)
class StepObservation:
    """What the fit sees of one run: the mean step time at a mean batch."""

    run: BenchmarkRun
    step_s: float  # mean engine step time
    num_requests: float  # R, mean decoding requests per step
    batch_tokens: float  # B = R (1 + k)
    context_tokens: float  # mean context of a decoding request
    num_draft_tokens: int  # k
    tokens_per_step: float  # tau


def tpot_ms(run: BenchmarkRun, statistic: TpotStatistic) -> float:
    if statistic == "mean":
        return run.mean_tpot_ms
    if run.median_tpot_ms is None:
        raise ResultsError(f"{run.where}: field 'median_tpot_ms' missing; needed by --tpot median "
                           "(use --tpot mean, or add the column)")
    return run.median_tpot_ms


def overshoot_tokens(tau: float, k: int) -> float:
    """Mean draft tokens a request's last step accepts beyond its last token, when each step verifies ``k`` drafts
    and gains ``tau`` tokens on average (bonus included).

    Each draft is taken to be accepted with one probability ``a`` once the one before it was, so a step gains at
    least ``j + 1`` tokens with probability ``a**j`` and ``tau = 1 + a + ... + a**k``. The tokens a request still
    needs end at a random point of its last step's gain; by renewal theory the gain left beyond that point is at
    least ``j`` with probability ``(a**j + ... + a**k) / tau``, a mean of ``sum_j j a**j / tau``.
    """
    if k == 0 or tau <= 1.0:
        return 0.0
    powers = np.arange(k + 1)
    a = 1.0 if tau >= k + 1 else brentq(lambda x: float(np.sum(x ** powers)) - tau, 0.0, 1.0)
    return float(np.sum(powers * a ** powers) / tau)


def decode_requests(run: BenchmarkRun, tpot_s: float, batch: BatchEstimate) -> float:
    """Mean decoding requests per step (see the module docstring)."""
    if run.mean_decode_requests is not None:
        return run.mean_decode_requests
    if batch == "nominal":
        if run.concurrency is None:
            raise ResultsError(f"{run.where}: field 'max_concurrency' missing; --batch nominal needs the run's "
                               "concurrency (use --batch littles for request-rate runs)")
        return run.concurrency
    first_tokens_per_s = run.requests_per_s if run.requests_per_s is not None else 0.0
    return tpot_s * (run.output_tokens_per_s - first_tokens_per_s)


def kept_share(tau: float, k: int, output_tokens: float) -> float:
    """Of the tokens a request's steps accept after its first token, the share it keeps: ``(n - 1) / (n - 1 + w)``
    for ``n`` output tokens and the last step's overshoot ``w`` (:func:`overshoot_tokens`). ``TPOT * tau`` times
    this is the step."""
    needed = output_tokens - 1  # tokens after the first, which TPOT spreads over
    return needed / (needed + overshoot_tokens(tau, k))


def tpot_step_s(tpot_s: float, tau: float, run: BenchmarkRun) -> float:
    """The mean step time from TPOT (see the module docstring): ``TPOT * tau`` less the overshoot of the last step."""
    if run.mean_output_tokens <= 1:
        raise ResultsError(f"{run.where}: mean output of {run.mean_output_tokens:g} tokens leaves no time per output "
                           "token (needs more than 1)")
    return tpot_s * tau * kept_share(tau, run.num_speculative_tokens, run.mean_output_tokens)


def observe(run: BenchmarkRun, statistic: TpotStatistic = "mean", batch: BatchEstimate = "littles",
            step: StepEstimate = "tpot") -> StepObservation:
    """The step-time observation of one run (see the module docstring); ``step="itl"`` takes the mean ITL as the
    mean step time (a server that streams one chunk per step)."""
    tpot_s = tpot_ms(run, statistic) / 1e3
    if run.speculative:
        if run.acceptance_length is None:
            raise ResultsError(f"{run.where}: field 'acceptance_length' missing; a speculative run "
                               f"({run.config_label}) needs its mean acceptance length")
        tau = run.acceptance_length
        if tau > run.num_speculative_tokens + 1:
            raise ResultsError(f"{run.where}: acceptance length {tau:g} is above k + 1 = "
                               f"{run.num_speculative_tokens + 1} (a step gains at most its k drafts and the bonus)")
    else:
        tau = 1.0
    num_requests = decode_requests(run, tpot_s, batch)
    if not num_requests > 0:
        raise ResultsError(f"{run.where}: the run's mean decoding batch comes out as {num_requests:g}; "
                           "check output_throughput and the TPOT fields")
    if step == "itl" and run.mean_itl_ms is None:
        raise ResultsError(f"{run.where}: field 'mean_itl_ms' missing; needed by --step itl")
    return StepObservation(
        run=run,
        step_s=tpot_step_s(tpot_s, tau, run) if step == "tpot" else run.mean_itl_ms / 1e3,  # type: ignore[operator]
        num_requests=num_requests,
        batch_tokens=num_requests * (1 + run.num_speculative_tokens),
        context_tokens=run.mean_prompt_tokens + run.mean_output_tokens / 2,
        num_draft_tokens=run.num_speculative_tokens,
        tokens_per_step=tau,
    )
