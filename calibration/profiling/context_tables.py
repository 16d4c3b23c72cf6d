"""The roofline over context: the version-2 blocks of an analytic profile.

Version 2 of the profile format prices a step as a dense part over batch tokens plus,
per request, attention over (its context, its query tokens) - see
``docs/profile_format.md``. This module tabulates :class:`~calibration.profiling.roofline.Roofline`
into those blocks:

* ``attention``: :meth:`Roofline.attention_s` over contexts 0 .. ``max_context_tokens`` and
  query tokens 1 .. 1 + ``max_draft_tokens`` (every integer: the query axis of verification);
* ``prefill.chunk_attention``: the same function over (prompt tokens already computed, chunk
  tokens 1 .. the largest step), what a co-located prefill chunk attends to;
* ``prefill.table``: :meth:`Roofline.prefill_s` (dense part over the prompt plus its causal
  attention over itself) over prompt tokens 1 .. ``max_context_tokens``;
* ``draft.<kind>`` with a context axis: :func:`~calibration.profiling.drafter_cost.draft_latency_s`
  at the batch's mean context (every drafter here reads its own KV of the context; the
  windowed ones stop growing at their window);
* ``cuda_graphs``: the largest captured batch and the eager overhead above it.

Between two points of a table the simulator interpolates linearly; the axes are dense
enough that the interpolated cost stays within a few per cent of the roofline's own
(``tests/test_roofline.py`` checks it at points between the grid's).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from calibration.models.shapes import DrafterShape
from calibration.profiling.drafter_cost import draft_latency_s
from calibration.profiling.roofline import Roofline
from simulator.costs import AttentionBlock, ChunkAttentionBlock, ContextDraftTable, CudaGraphsBlock, PrefillTableBlock


@dataclass(frozen=True)
class ContextGrid:
    """Extents of the version-2 tables (not assumptions about the hardware; the simulator errors outside them).

    ``max_context_tokens`` 262144 covers the longest request of the shipped Mooncake samples (a 134,773-token
    prompt) with room; it lies beyond the trained context of some models (Qwen3: 32,768 native, 131,072 with
    YaRN), where the table is the cost a kernel would have, not a claim that the model serves it.
    """

    max_context_tokens: int = 262144

    def __post_init__(self) -> None:
        if self.max_context_tokens < 128:
            raise ValueError(f"max_context_tokens must be >= 128, got {self.max_context_tokens}")

    def contexts(self) -> tuple[int, ...]:
        """0 and powers of two from 128 up to the end (the end included): the axis of every context table.

        Attention is linear in context in each regime, so it interpolates exactly; a drafter's pass is the
        larger of two lines in context (weights and GEMMs against its KV reads), and interpolating across their
        crossing overstates it by up to ~11% (dflash, 1024 requests, tests/test_roofline.py)."""
        top = self.max_context_tokens
        return (0, *(1 << k for k in range(7, 40) if (1 << k) < top), top)


def query_axis(max_draft_tokens: int) -> tuple[int, ...]:
    """1 .. 1 + max_draft_tokens: every verification length a request can have."""
    return tuple(range(1, max_draft_tokens + 2))


def chunk_axis(max_batch_tokens: int) -> tuple[int, ...]:
    """Chunk sizes: every size up to 64 (where attention turns from memory- to compute-bound), every 16 up to
    512, every 64 up to the largest step. Chunk attention is quadratic in the chunk, so the points must be close
    for linear interpolation: within 1% of the roofline from 64 tokens up."""
    points = {*range(1, 65), *range(64, 513, 16), *range(512, max_batch_tokens + 1, 64), max_batch_tokens}
    return tuple(sorted(p for p in points if p <= max_batch_tokens))


def prefill_axis(max_prompt_tokens: int) -> tuple[int, ...]:
    """Prompt lengths of the prefill table: 1, every 64 (a GEMM tile) up to 1024, then powers of two and the
    midpoints between them, up to the end. Below ~1k tokens the roofline is a staircase (graph buckets, tiles)
    and turns from memory- to compute-bound; above, the prefill becomes quadratic in the prompt and the midpoints
    keep linear interpolation within 4% of it (a chord over [x, 2x] alone overstates the quadratic part by 11%
    in its middle)."""
    points = {1, max_prompt_tokens, *range(64, 1025, 64)}
    for k in range(10, 40):
        points |= {p for p in (1 << k, 3 << (k - 1)) if p < max_prompt_tokens}
    return tuple(sorted(points))


def prefill_table_block(roof: Roofline, prompts: tuple[int, ...]) -> PrefillTableBlock:
    """``prefill.table.latency_s[prompt tokens]`` from the roofline (:meth:`Roofline.prefill_s`)."""
    return PrefillTableBlock(prompts, tuple(float(v) for v in roof.prefill_s(np.array(prompts))))


def attention_block(roof: Roofline, contexts: tuple[int, ...], queries: tuple[int, ...]) -> AttentionBlock:
    """``attention.per_request_s[context][query]`` from the roofline (variable-length kernels: no key padding)."""
    grid = roof.attention_s(np.array(contexts)[:, None], np.array(queries)[None, :])  # [NC, NQ]
    return AttentionBlock(contexts, queries, tuple(tuple(float(v) for v in row) for row in grid))


def chunk_attention_block(roof: Roofline, contexts: tuple[int, ...], chunks: tuple[int, ...]) -> ChunkAttentionBlock:
    """``prefill.chunk_attention.per_chunk_s[computed prompt tokens][chunk tokens]``: one chunk's attention."""
    grid = roof.attention_s(np.array(contexts)[:, None], np.array(chunks)[None, :])  # [NC, NK]
    return ChunkAttentionBlock(contexts, chunks, tuple(tuple(float(v) for v in row) for row in grid))


def draft_tables(roof: Roofline, drafters: dict[str, DrafterShape], contexts: tuple[int, ...],
                 num_requests: tuple[int, ...], draft_tokens: tuple[int, ...]) -> dict[str, ContextDraftTable]:
    """``draft.<kind>.latency_s[context][R][gamma]`` of every drafter."""
    return {kind: ContextDraftTable(contexts, num_requests, draft_tokens, tuple(
        tuple(tuple(draft_latency_s(roof, spec, r, g, c) for g in draft_tokens) for r in num_requests)
        for c in contexts)) for kind, spec in drafters.items()}


def cuda_graphs_block(roof: Roofline) -> CudaGraphsBlock:
    """The cliff the version-1 verify table folded in: eager steps above ``max_graph_tokens`` pay
    ``eager_overhead_s`` more."""
    return CudaGraphsBlock(roof.assume.max_graph_tokens, eager_overhead_s=roof.assume.eager_overhead_s)
