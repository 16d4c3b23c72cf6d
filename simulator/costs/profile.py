"""A loaded hardware profile and what its parts cost (units in every name; times in seconds).

One target step over ``B`` batch tokens of ``R`` requests costs::

    dense(B)                           1 / SPS(B) from ``verify`` (or its ``step_s``), CUDA-graph mode;
      [eager above max_captured_tokens: + eager_overhead_s, or 1 / eager SPS(B) instead]
    + padded_slot_s * (R * max_r(1 + l_r) - B)      query slots a padding kernel wastes
    + per_request(R)                                per-request overhead
    + sum_r attention(c_r, 1 + l_r)                 each request's attention over its context c_r
                                                    (with key_padding "longest": every c_r is the batch's longest)
    + sum_chunks attention(c_i, n_i)                co-located prefill chunks (chunk_attention table, or attention;
                                                    less its draft_s for a policy that drafts nothing)
    + decode_token_s * sum_r (1 + l_r)              host work per decode (verification) token, none per chunk token
    + draft_token_s * sum_r l_r                     work per verified draft token that a step without speculation
                                                    does not do (rejection sampling, draft bookkeeping)
    + mixed_step(R)                                 a step with prefill chunks beside R >= 1 decoding requests:
                                                    fixed_s + per_request_s * R (prefill.mixed_step)
    + join_s * J + leave_s * L                      J requests joined the batch since the previous step (this is
                                                    their first), L finish in this one: the engine's bookkeeping
    + wake_s                                        the first step after the engine sat idle
    + sum_k decode_tail_s[k] * P_k                  P_k prompts prefilled on the decode device before the k-th
                                                    step back (k = 0: since the previous step; prefill.decode_tail_s)

A disaggregated prefill of n prompt tokens costs ``prefill.table`` at n (version 2, measured over prompt
tokens: convex, attention being quadratic in the prompt), else ``fixed_s + n / tokens_per_s``; without speculation
less its ``prefill.draft_share``, the drafter's pass over the prompt.

Version 1 profiles have no attention table (their ``per_request`` usually folds
in KV reads at a reference context), no cliff and no budget, so the cost is
``1 / SPS(B) + padding + per_request(R)`` exactly as before. The file format is
documented in ``docs/profile_format.md`` and parsed by :mod:`simulator.costs.schema`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from policies.base import CostCurve
from simulator.costs.tables import DraftTable, Table1D, Table2D

KeyPadding = Literal["none", "longest"]


@dataclass(frozen=True)
class CudaGraphs:
    """The CUDA-graph cliff: steps of more than ``max_captured_tokens`` batch tokens run eagerly.

    Above the cliff a step pays ``eager_overhead_s`` on top of the verify table, or,
    when the profile measured eager steps, ``1 / eager_sps(B)`` instead of it.
    """

    max_captured_tokens: int
    eager_overhead_s: float = 0.0
    eager_sps: Table1D | None = None


@dataclass(frozen=True)
class HardwareProfile:
    """A loaded, validated profile. Build it with :func:`load_profile` or :func:`profile_from_dict`."""

    metadata: dict[str, Any]
    gpus_per_replica: int
    verify_sps: Table1D
    per_request_s: Table1D | None
    draft: dict[str, DraftTable]
    prefill_fixed_s: float
    prefill_tokens_per_s: float
    scheduler_fixed_s: float
    scheduler_per_candidate_s: float
    padded_slot_s: float = 0.0  # verify seconds per padded query slot, R * max(1 + l_r) - B
    scheduler_inline: bool = False  # every policy's decision is on the step's critical path
    # name -> (fixed_s, per_candidate_s), or a table of seconds over candidates (scheduler.policies.<name>)
    scheduler_by_policy: dict[str, tuple[float, float] | Table1D] = field(default_factory=dict)
    raw: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)
    path: str = "<memory>"
    # Version 2 (all optional; see docs/profile_format.md).
    version: int = 1
    dense_step_s: Table1D | None = None  # the verify table given as step_s: seconds interpolated linearly
    attention: Table2D | None = None  # seconds of one request's attention over (context_tokens, query_tokens)
    key_padding: KeyPadding = "none"
    cuda_graphs: CudaGraphs | None = None
    max_num_batched_tokens: int | None = None  # the engine's token budget per step
    chunk_attention: Table2D | None = None  # seconds of one prefill chunk over (context_tokens, chunk_tokens)
    prefill_table: Table1D | None = None  # seconds of one disaggregated prefill over prompt_tokens (prefill.table)
    decode_token_s: float = 0.0  # seconds per decode (verification) token of a step, none per prefill-chunk token
    draft_token_s: float = 0.0  # seconds per verified draft token (a decode token beyond each request's first)
    join_s: float = 0.0  # seconds a step spends per request that joined the batch since the previous step
    leave_s: float = 0.0  # seconds a step spends per request it finishes
    wake_s: float = 0.0  # seconds the first step after the engine sat idle spends beyond its parts
    mixed_step: tuple[float, float] | None = None  # (fixed_s, per_request_s) of a step with chunks and decoding
    prefill_draft_share: float = 0.0  # share of a disaggregated prefill that is the drafter's (prefill.draft_share)
    chunk_draft: Table2D | None = None  # the drafter's part of chunk_attention (prefill.chunk_attention.draft_s)
    # [K] seconds the k-th decode step after a prompt prefilled on the decode device pays for it (prefill.decode_tail_s)
    decode_tail_s: tuple[float, ...] = ()
    # Cache of dense_grid(): [(batch tokens, dense seconds)], filled on first use.
    _grid: list = field(default_factory=list, init=False, repr=False, compare=False)

    @property
    def source(self) -> str:
        return str(self.metadata["source"])

    @property
    def label(self) -> str:
        """Short human label, always saying whether the numbers are measured or analytic."""
        meta = self.metadata
        return f"{meta.get('model', '?')} on {meta.get('device', '?')} ({self.source})"

    @property
    def max_batch_tokens(self) -> int:
        """The largest step (batch tokens) the dense cost covers."""
        graphs = self.cuda_graphs
        if graphs is not None and graphs.eager_sps is not None:
            return int(graphs.eager_sps.x[-1])
        return int(self.verify_sps.x[-1])

    @property
    def token_budget(self) -> int | None:
        return self.max_num_batched_tokens

    # ------------------------------------------------------------------ dense part
    def is_eager(self, batch_tokens: int) -> bool:
        """Whether a step of ``batch_tokens`` runs above the largest captured CUDA graph."""
        return self.cuda_graphs is not None and batch_tokens > self.cuda_graphs.max_captured_tokens

    def _graph_s(self, batch_tokens: int) -> float:
        if self.dense_step_s is not None:
            return float(self.dense_step_s(batch_tokens))
        return 1.0 / float(self.verify_sps(batch_tokens))

    def dense_s(self, batch_tokens: int) -> float:
        """The dense part of a step over ``batch_tokens`` tokens, the CUDA-graph cliff included."""
        graphs = self.cuda_graphs
        if graphs is None or batch_tokens <= graphs.max_captured_tokens:
            return self._graph_s(batch_tokens)
        if graphs.eager_sps is not None:
            return 1.0 / float(graphs.eager_sps(batch_tokens))
        return self._graph_s(batch_tokens) + graphs.eager_overhead_s

    def dense_grid(self) -> tuple[np.ndarray, np.ndarray]:
        """Batch tokens and dense seconds at every table point, both sides of the cliff included, so that linear
        interpolation over the grid keeps the cliff sharp (computed once)."""
        if not self._grid:
            x = self.verify_sps.x
            graphs = self.cuda_graphs
            if graphs is not None:
                cap = graphs.max_captured_tokens
                extra = [] if graphs.eager_sps is None else [graphs.eager_sps.x]
                x = np.unique(np.concatenate([x, [cap, cap + 1], *extra]))
                x = x[x <= self.max_batch_tokens]
            self._grid.append((x, np.array([self.dense_s(b) for b in x])))
        return self._grid[0]

    def verify_s(self, num_requests: int, batch_tokens: int, padded_slots: int = 0,
                 decode_tokens: int | None = None, verified_draft_tokens: int | None = None) -> float:
        """Dense part, query padding, per-request overhead and the host work per decode token and per verified
        draft token of a step (no attention; see :meth:`attention_s`): ``batch_tokens`` over ``num_requests``
        requests, ``padded_slots`` query slots of padding, ``decode_tokens`` of the batch tokens decode (verification)
        tokens (default: all of them; the rest are prefill-chunk tokens, which pay no ``decode_token_s``),
        ``verified_draft_tokens`` of those beyond each request's first (default: decode tokens less requests)."""
        step_s = self.dense_s(batch_tokens) + self.padded_slot_s * padded_slots
        if self.per_request_s is not None:
            step_s += float(self.per_request_s(num_requests))
        decode = batch_tokens if decode_tokens is None else decode_tokens
        if self.decode_token_s:
            step_s += self.decode_token_s * decode
        if self.draft_token_s:
            drafts = max(decode - num_requests, 0) if verified_draft_tokens is None else verified_draft_tokens
            step_s += self.draft_token_s * drafts
        return step_s

    # ------------------------------------------------------------------ attention
    def attention_s(self, context_tokens: np.ndarray, query_tokens: np.ndarray | int) -> float:
        """Attention of a batch: each request over its context (KV entries before the step) with its query tokens
        (``1 + l_r``), summed; 0 without an attention table (version 1)."""
        if self.attention is None:
            return 0.0
        context = np.asarray(context_tokens)
        if self.key_padding == "longest" and context.size:
            context = np.full(context.shape, context.max())
        return float(self.attention(context, query_tokens).sum())

    def mixed_step_s(self, num_requests: int) -> float:
        """What a step that computes prefill chunks beside ``num_requests`` >= 1 decoding requests costs beyond its
        parts (``prefill.mixed_step``: ``fixed_s + per_request_s * R``; 0 without the field)."""
        if self.mixed_step is None:
            return 0.0
        return self.mixed_step[0] + self.mixed_step[1] * num_requests

    def churn_s(self, num_joined: int, num_left: int, woke: bool = False) -> float:
        """The engine's work for requests joining the batch before a step and finishing in it, and for waking from
        idle before it (``verify.join_s``, ``verify.leave_s``, ``verify.wake_s``; 0 without them)."""
        return self.join_s * num_joined + self.leave_s * num_left + (self.wake_s if woke else 0.0)

    def decode_tail_at_s(self, recent_prefills: np.ndarray) -> float:
        """What a step pays for the prompts prefilled on the decode device just before it: ``recent_prefills[k]``
        prompts before the k-th step back (0: since the previous step), ``prefill.decode_tail_s`` (0 without it)."""
        tail = self.decode_tail_s
        return float(np.dot(tail, recent_prefills[: len(tail)])) if tail else 0.0

    def chunk_attention_s(self, context_tokens: np.ndarray, chunk_tokens: np.ndarray, drafting: bool = True) -> float:
        """Attention of prefill chunks: ``chunk_tokens[i]`` new prompt tokens over ``context_tokens[i]`` computed
        ones; from ``prefill.chunk_attention``, else the attention table, else 0. For a policy that drafts nothing
        (``drafting`` false) less ``prefill.chunk_attention.draft_s``, the drafter's context build over the chunks."""
        table = self.chunk_attention if self.chunk_attention is not None else self.attention
        if table is None or np.size(chunk_tokens) == 0:
            return 0.0
        seconds = table(context_tokens, chunk_tokens)
        if not drafting and self.chunk_draft is not None:  # on the chunk_attention table's axes, so it is in use
            seconds = seconds - self.chunk_draft(context_tokens, chunk_tokens)
        return float(seconds.sum())

    def attention_rows(self, context_tokens: np.ndarray, num_queries: int) -> np.ndarray:
        """Each request's attention with 1, 2, ..., ``num_queries`` query tokens -> [R, num_queries] (key padding
        applied): one pass over the batch prices every verification length a step can choose."""
        assert self.attention is not None
        context = np.asarray(context_tokens)
        if self.key_padding == "longest" and context.size:
            context = np.full(context.shape, context.max())
        return self.attention.rows(context, num_queries)

    def attention_line(self, context_tokens: np.ndarray, draft_tokens: int,
                       rows: np.ndarray | None = None) -> tuple[float, float]:
        """What a policy prices the attention of a step with: ``(fixed_s, per_token_s)``, the attention of every
        request with one query token, and the mean extra cost of one more verified token (the slope from 1 to
        ``1 + draft_tokens`` query tokens, averaged over the requests). ``rows``: :meth:`attention_rows` of these
        contexts, when already computed."""
        if self.attention is None:
            return 0.0, 0.0
        if rows is None:
            rows = self.attention_rows(context_tokens, 1 + draft_tokens)
        fixed_s = float(rows[:, 0].sum())
        if draft_tokens == 0 or rows.shape[0] == 0:
            return fixed_s, 0.0
        return fixed_s, (float(rows[:, draft_tokens].sum()) - fixed_s) / (draft_tokens * rows.shape[0])

    # ------------------------------------------------------------------ what a policy prices with
    def cost_curve(self, num_requests: int, draft_s: float = 0.0) -> CostCurve:
        """SPS over batch tokens for a step with ``num_requests`` requests (dense part with its cliff, the
        per-request overhead, ``decode_token_s`` per batch token, every one of which a policy's decision makes a
        decode token, and ``draft_token_s`` per batch token beyond one per request; no attention)."""
        if self.cuda_graphs is None and self.dense_step_s is None and not (self.decode_token_s or self.draft_token_s):
            sps = self.verify_sps.y
            if self.per_request_s is not None:
                sps = 1.0 / (1.0 / sps + float(self.per_request_s(num_requests)))
            return CostCurve(batch_tokens=self.verify_sps.x, steps_per_s=sps, draft_s=draft_s)
        tokens, dense = self.dense_grid()
        return CostCurve(batch_tokens=tokens, steps_per_s=1.0 / self._curve_s(tokens, dense, num_requests),
                         draft_s=draft_s)

    def _curve_s(self, tokens: np.ndarray, dense: np.ndarray, num_requests: int) -> np.ndarray:
        """Seconds of a step over ``tokens`` decode tokens with its ``dense`` part, besides attention."""
        step_s = dense + (float(self.per_request_s(num_requests)) if self.per_request_s is not None else 0.0)
        if self.decode_token_s:
            step_s = step_s + self.decode_token_s * tokens
        if self.draft_token_s:
            step_s = step_s + self.draft_token_s * np.maximum(tokens - num_requests, 0.0)
        return step_s

    def step_cost_curve(self, drafter: str, num_requests: int, draft_tokens: int,
                        context_tokens: np.ndarray | None = None, rows: np.ndarray | None = None) -> CostCurve:
        """What a policy prices a step with: :meth:`cost_curve` (``decode_token_s`` per batch token included), the
        drafter's time for R and g and, with an attention table and the requests' contexts, the step's attention as
        a line over batch tokens (:meth:`attention_line`): ``fixed_s + max(B - R, 0) * per_token_s``. The line is
        exact when every request verifies the same number of tokens and attention is linear in query tokens
        between 1 and 1 + g; before deciding, a policy cannot know which requests the extra tokens go to, so each is
        priced at the mean.
        ``rows``: this profile's :meth:`attention_rows` of the contexts, when already computed."""
        draft_s = self.draft_s(drafter, num_requests, draft_tokens, self.draft_context(drafter, context_tokens))
        if self.attention is None or context_tokens is None:
            return self.cost_curve(num_requests, draft_s)
        fixed_s, per_token_s = self.attention_line(context_tokens, draft_tokens, rows)
        tokens, dense = self.dense_grid()
        step_s = self._curve_s(tokens, dense, num_requests) + fixed_s
        step_s = step_s + np.maximum(tokens - num_requests, 0.0) * per_token_s
        return CostCurve(batch_tokens=tokens, steps_per_s=1.0 / step_s, draft_s=draft_s)

    # ------------------------------------------------------------------ drafter, prefill, scheduler
    def draft_uses_context(self, kind: str) -> bool:
        return kind in self.draft and self.draft[kind].context_tokens is not None

    def uses_context(self, drafter: str) -> bool:
        """Whether a step's cost depends on the requests' contexts (attention table or a context-aware drafter)."""
        return self.attention is not None or self.draft_uses_context(drafter)

    def draft_context(self, kind: str, context_tokens: np.ndarray | None) -> float | None:
        """The context a batch with these contexts reads drafter ``kind``'s table at: the mean, or the longest with
        ``draft.<kind>.key_padding`` "longest" (None without contexts or a drafter table)."""
        if context_tokens is None or np.size(context_tokens) == 0 or kind not in self.draft:
            return None
        return self.draft[kind].batch_context(np.asarray(context_tokens))

    def draft_s(self, kind: str, num_requests: int, draft_tokens: int, context_tokens: float | None = None) -> float:
        """The drafter's time for ``draft_tokens`` tokens of ``num_requests`` requests (at ``context_tokens``, the
        batch's :meth:`draft_context`, when its table has a context axis)."""
        if draft_tokens == 0:
            return 0.0
        if kind not in self.draft:
            raise ValueError(f"profile {self.path} has no draft latency for drafter {kind!r}; "
                             f"it has: {', '.join(sorted(self.draft)) or '(none)'}")
        return self.draft[kind](num_requests, draft_tokens, context_tokens)

    def prefill_s(self, prompt_tokens: np.ndarray | int, drafting: bool = True) -> np.ndarray:
        """A disaggregated prefill of ``prompt_tokens`` tokens: the measured ``prefill.table`` interpolated linearly
        (an error outside it, naming the file) when the profile has one, else ``fixed_s + n / tokens_per_s``; for a
        policy that drafts nothing (``drafting`` false) less ``prefill.draft_share`` of it, the drafter's part."""
        if self.prefill_table is not None:
            seconds = self.prefill_table(prompt_tokens)
        else:
            seconds = self.prefill_fixed_s + np.asarray(prompt_tokens, dtype=np.float64) / self.prefill_tokens_per_s
        return seconds if drafting or not self.prefill_draft_share else seconds * (1.0 - self.prefill_draft_share)

    def scheduler_s(self, num_candidates: int, policy: str | None = None) -> float:
        """Seconds of one decision over ``num_candidates`` (request, position) pairs, by ``policy``'s own entry
        when the profile has one (a line, or a measured table: interpolated, an error outside it)."""
        entry = self.scheduler_by_policy.get(policy, (self.scheduler_fixed_s, self.scheduler_per_candidate_s))
        if isinstance(entry, Table1D):
            return float(entry(num_candidates))
        fixed_s, per_candidate_s = entry
        return fixed_s + per_candidate_s * num_candidates

    def charges_decision(self, synchronous: bool) -> bool:
        """Whether a policy's decision time is on the step's critical path."""
        return synchronous or self.scheduler_inline

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.raw, indent=1) + "\n")
