"""The context axes of a measured version-2 profile: attention, prefill chunks and drafters over context.

:func:`calibration.profiling.measure.measure` with ``format_version=2`` times, besides
the dense verify table at context 0, the points below and turns them into
:class:`simulator.costs.Version2Blocks`:

* ``attention.per_request_s[c][q]``: ``A`` requests of ``q`` query tokens each over ``c``
  cached tokens, minus the same forward at context :func:`reference_context` (0; 1 for one
  query token), divided by ``A``
  (``attention_requests``): what one request's attention over its context adds to the
  dense part. The two forwards of a difference are timed in alternation
  (:func:`~calibration.profiling.timing.time_differences`) and the median of the per-round
  differences kept, so a spell of slowness on the machine does not land on one side only.
  The verifier (:mod:`calibration.models.model`) pads every request's keys to the longest
  context in the batch, so the block says ``key_padding: "longest"``.
* ``prefill.chunk_attention.per_chunk_s[p][n]``: one request of an ``n``-token chunk over
  ``p`` computed prompt tokens, with the first drafter's context built from the chunk's
  target features (the serving loop does both for every prefilled token when its policy
  drafts), minus the dense table's forward of ``n`` batch tokens
  (so the chunk's causal attention within itself is in the table too), timed in rounds with
  it like an attention difference. Its ``draft_s[p][n]`` is that drafter's context build alone,
  timed on its own (at most ``per_chunk_s``), which a policy that drafts nothing does not pay.
* ``prefill.table.latency_s[n]``: one request's whole prefill of ``n`` prompt tokens (a chunk of
  ``n`` over 0 computed tokens: the verifier forward and the first drafter's context of it),
  at the prompt lengths ``prefill_prompts``. Prefill is convex in the prompt (attention is
  quadratic), which the version-1 line ``fixed_s + n / tokens_per_s`` cannot follow.
* ``draft.<kind>`` with a context axis: the drafter step of
  :func:`calibration.profiling.calls.draft_call` at every (context, R, gamma). Every
  included drafter keeps its own KV cache of the context (the target's features injected
  into its layers); none reads the verifier's cache. Like the verifier, a drafter pads every
  request's keys to the longest context in its batch, so the tables say ``key_padding:
  "longest"`` and the simulator reads them at the batch's longest context, not its mean.

A difference can come out below 0 when the context adds less than the timing noise; such
entries are written as 0 and counted in ``metadata.context_tables``.
CUDA graphs: every table here is eager; with ``--cuda-graphs N`` on a GPU the dense verify
table is replayed as CUDA graphs up to N and the ``cuda_graphs`` block written
(:mod:`calibration.profiling.graphs`); the metadata says which.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from calibration.models.drafters import Drafter
from calibration.models.model import Verifier
from calibration.profiling.calls import chunk_call, chunk_draft_call, draft_call, verify_call
from calibration.profiling.timing import Prepare
from simulator.costs import AttentionBlock, ChunkAttentionBlock, ContextDraftTable, PrefillTableBlock, Version2Blocks

# Context axes by device when the command is not given one (tokens): tens of thousands on a GPU, a few
# thousand on a CPU where the tiny models attend over them in milliseconds.
CPU_CONTEXTS = (0, 256, 512, 1024, 2048, 4096)
GPU_CONTEXTS = (0, 1024, 2048, 4096, 8192, 16384, 32768)
# Prompt lengths of the prefill table: on a CPU up to the longest context the long-context validation reaches
# (4,096-token prompts + 4 x 64 output tokens), on a GPU up to 32k; midpoints where the curve bends most.
CPU_PREFILL_PROMPTS = (1, 256, 512, 1024, 1536, 2048, 2560, 3072, 3584, 4096, 4352)
GPU_PREFILL_PROMPTS = (1, 512, 1024, 2048, 4096, 8192, 12288, 16384, 24576, 32768)


@dataclass(frozen=True)
class ContextAxes:
    """The grids of the version-2 tables."""

    contexts: tuple[int, ...]  # attention and drafter context axis; starts at 0
    queries: tuple[int, ...]  # query tokens per request of the attention table
    chunks: tuple[int, ...]  # prefill chunk sizes (empty: no chunk_attention)
    chunk_contexts: tuple[int, ...]  # computed prompt tokens before a chunk
    attention_requests: int  # requests per attention probe
    prefill_prompts: tuple[int, ...] = ()  # prompt lengths of prefill.table (empty: no table)
    # The drafter tables' own context axis (empty: ``contexts``). On a GPU a drafter's KV cache at (R, C) must fit
    # for every R of the grid, so a shorter axis lets the R grid reach higher.
    draft_contexts: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.contexts or self.contexts[0] != 0:
            raise ValueError(f"the context axis must start at 0 (the dense table's context), got {self.contexts}")
        if not self.queries or self.queries[0] != 1:
            raise ValueError(f"the query axis must start at 1 (a decoding request), got {self.queries}")
        if self.chunks and (not self.chunk_contexts or self.chunk_contexts[0] != 0):
            raise ValueError(f"the chunk context axis must start at 0, got {self.chunk_contexts}")
        if self.prefill_prompts and (self.prefill_prompts[0] < 1 or any(
                b <= a for a, b in zip(self.prefill_prompts, self.prefill_prompts[1:], strict=False))):
            raise ValueError(f"the prefill prompt lengths must be >= 1 and increasing, got {self.prefill_prompts}")
        if self.attention_requests < 1:
            raise ValueError(f"attention_requests must be >= 1, got {self.attention_requests}")
        if self.draft_contexts and (self.draft_contexts[0] != 0 or any(
                b <= a for a, b in zip(self.draft_contexts, self.draft_contexts[1:], strict=False))):
            raise ValueError(f"the drafter context axis must start at 0 and increase, got {self.draft_contexts}")

    @property
    def drafter_contexts(self) -> tuple[int, ...]:
        """The context axis of the drafter tables."""
        return self.draft_contexts or self.contexts

    def num_points(self, draft_rows: int, num_draft_tokens: int) -> int:
        """Timing points of these grids; ``draft_rows``: the R entries of every drafter's grid together. (The
        per-request pairs, :func:`request_pairs`, go with the R grid: ``measure.count_points`` counts them.)"""
        chunk_points = len(self.chunk_contexts) * len(self.chunks)
        return ((len(self.contexts) - 1) * len(self.queries) + chunk_points * (2 if draft_rows else 1)
                + len(self.prefill_prompts) + len(self.drafter_contexts) * draft_rows * num_draft_tokens)


def reference_context(query_tokens: int) -> int:
    """The context of an attention pair's base forward: 0, but 1 for one query token. A forward of one token over
    no cached key attends over a single key, for which SDPA takes a path of its own (0.13 ms per request slower
    than at 1,024 cached tokens on an H200, graph-replayed); every decode step has a context, so one cached key,
    whose attention costs next to nothing, is the reference that shares the path of the points."""
    return 1 if query_tokens == 1 else 0


def difference_pairs(axes: ContextAxes, model: Verifier, forward: Callable, device: torch.device,
                     gen: torch.Generator, drafters: dict[str, Drafter], dense_layout: Callable[[int], list[int]],
                     capture: Callable[[Prepare], Prepare] | None = None) -> list[tuple[str, Prepare, Prepare]]:
    """The tables that are differences, for :func:`~calibration.profiling.timing.time_differences`, in the order
    :func:`context_blocks` reads them: (label, base, point).

    Attention: the forward of A requests of q tokens at :func:`reference_context`, then at context C, for every
    C > 0 and q; with ``capture`` (a CUDA-graph capture, :func:`calibration.profiling.graphs.graph_call`) both
    forwards are replayed as graphs, so the jitter of launching every kernel from Python stays out of a difference
    of a few milliseconds. Chunk attention: the dense table's forward of n batch tokens (requests laid out by
    ``dense_layout(n)``), then the chunk of n tokens over P computed ones (eager: the chunk builds the drafter's
    context too)."""
    a = axes.attention_requests
    wrap = capture if capture is not None else (lambda prepare: prepare)
    pairs = [(f"attention C={c} q={q}",
              wrap(verify_call(model, forward, device, gen, a * q, [q] * a, reference_context(q))),
              wrap(verify_call(model, forward, device, gen, a * q, [q] * a, c)))
             for c in axes.contexts[1:] for q in axes.queries]
    first = next(iter(drafters.values()), None)
    pairs += [(f"chunk P={p} n={n}", verify_call(model, forward, device, gen, n, dense_layout(n), 0),
               chunk_call(model, forward, first, device, gen, n, p))
              for p in axes.chunk_contexts for n in axes.chunks]
    return pairs


def request_pairs(num_requests: tuple[int, ...], model: Verifier, forward: Callable, device: torch.device,
                  gen: torch.Generator, dense_layout: Callable[[int], list[int]],
                  capture: Callable[[Prepare], Prepare] | None = None,
                  max_captured_tokens: int | None = None) -> list[tuple[str, Prepare, Prepare]]:
    """Version 2's ``per_request`` table as differences (label, base, point): the dense table's forward of R tokens
    (its layout, ``dense_layout(R)``, a few requests of several tokens), then R one-token requests over one cached
    key each (:func:`reference_context`). Their difference is what R requests cost beyond the dense part before
    any context: per-request index work, padding and attention calls that the dense table's layout does not pay.
    With ``capture``, pairs of R up to ``max_captured_tokens`` are replayed as graphs, as the dense table is."""
    def wrap(r: int, prepare: Prepare) -> Prepare:
        captured = capture is not None and (max_captured_tokens is None or r <= max_captured_tokens)
        return capture(prepare) if captured else prepare  # type: ignore[misc]
    return [(f"per-request R={r}", wrap(r, verify_call(model, forward, device, gen, r, dense_layout(r), 0)),
             wrap(r, verify_call(model, forward, device, gen, r, [1] * r, reference_context(1))))
            for r in num_requests]


def read_request_pairs(differences: Iterator[float], num_requests: tuple[int, ...], notes: dict[str, Any]
                       ) -> list[float]:
    """The per-request table from the differences of :func:`request_pairs` (negative ones written as 0, counted in
    ``notes``)."""
    diffs = [next(differences) for _ in num_requests]
    notes["per_request_negative_written_as_0"] = sum(d < 0 for d in diffs)
    return [max(d, 0.0) for d in diffs]


def context_points(axes: ContextAxes, model: Verifier, forward: Callable, device: torch.device,
                   gen: torch.Generator, drafters: dict[str, Drafter], draft_grids: dict[str, tuple[int, ...]],
                   draft_tokens: tuple[int, ...]) -> list[tuple[str, Prepare]]:
    """Every other timing point of the version-2 tables, in the order :func:`context_blocks` reads their times."""
    points: list[tuple[str, Prepare]] = []
    first = next(iter(drafters.values()), None)
    for n in axes.prefill_prompts:
        points.append((f"prefill n={n}", chunk_call(model, forward, first, device, gen, n, 0)))
    if first is not None:  # the drafter's part of each chunk, which a policy that drafts nothing does not pay
        points += [(f"chunk draft P={p} n={n}", chunk_draft_call(first, device, gen, n, p))
                   for p in axes.chunk_contexts for n in axes.chunks]
    for kind, drafter in drafters.items():
        for c in axes.drafter_contexts:
            for r in draft_grids[kind]:
                for g in draft_tokens:
                    points.append((f"draft {kind} C={c} R={r} gamma={g}", draft_call(drafter, c, device, gen, r, g)))
    return points


def context_blocks(axes: ContextAxes, differences: Iterator[float], times: Iterator[float],
                   draft_grids: dict[str, tuple[int, ...]], draft_tokens: tuple[int, ...],
                   attention_replayed: bool = False) -> tuple[Version2Blocks, dict[str, Any]]:
    """The version-2 blocks from the differences of :func:`difference_pairs` and the times of
    :func:`context_points` (same orders; ``draft_grids``: each drafter's R grid). Returns the blocks and their
    metadata (``attention_replayed``: the attention pairs were CUDA-graph replays)."""
    kinds = tuple(draft_grids)
    a, clipped = axes.attention_requests, 0
    attention = [tuple(0.0 for _ in axes.queries)]  # context 0: the dense part, nothing added
    for _ in axes.contexts[1:]:
        diffs = [next(differences) / a for _ in axes.queries]
        clipped += sum(d < 0 for d in diffs)
        attention.append(tuple(max(d, 0.0) for d in diffs))
    chunk_rows = []
    for _ in axes.chunk_contexts:
        diffs = [next(differences) for _ in axes.chunks]
        clipped += sum(d < 0 for d in diffs)
        chunk_rows.append(tuple(max(d, 0.0) for d in diffs))
    prefill = tuple(next(times) for _ in axes.prefill_prompts)
    chunk_draft, capped = None, 0
    if kinds and axes.chunks:  # the drafter's part, at most the whole chunk it is part of (the two timed apart)
        measured = [[next(times) for _ in axes.chunks] for _ in axes.chunk_contexts]
        capped = sum(d > w for row, whole in zip(measured, chunk_rows, strict=True)
                     for d, w in zip(row, whole, strict=True))
        chunk_draft = tuple(tuple(min(d, w) for d, w in zip(row, whole, strict=True))
                            for row, whole in zip(measured, chunk_rows, strict=True))
    draft = {kind: ContextDraftTable(axes.drafter_contexts, grid, draft_tokens, tuple(
        tuple(tuple(next(times) for _ in draft_tokens) for _ in grid) for _ in axes.drafter_contexts),
        key_padding="longest") for kind, grid in draft_grids.items()}
    blocks = Version2Blocks(
        attention=AttentionBlock(axes.contexts, axes.queries, tuple(attention), key_padding="longest"),
        chunk_attention=(ChunkAttentionBlock(axes.chunk_contexts, axes.chunks, tuple(chunk_rows), chunk_draft)
                         if axes.chunks else None),
        prefill_table=PrefillTableBlock(axes.prefill_prompts, prefill) if prefill else None,
        draft=draft)
    meta = {
        "attention_definition": (f"t({a} requests x q tokens at context C) - t(the same at context 0; at context 1 "
                                 "for q = 1, so the base takes the points' path, not SDPA's single-key one), "
                                 f"divided by {a}: the median of the differences of rounds in which the two run "
                                 "back to back"
                                 + ("; both forwards replayed as CUDA graphs" if attention_replayed else "")
                                 + "; the verifier pads keys to the longest context in a batch (key_padding "
                                 "longest)"),
        "chunk_attention_definition": ("t(one request of an n-token chunk over P computed tokens, with the "
                                       f"{kinds[0] if kinds else 'no'} drafter's context of the chunk) - t(the "
                                       "verify table's forward of n batch tokens): the median of the differences of "
                                       "rounds in which the two run back to back"),
        "chunk_draft_definition": (f"t(the {kinds[0]} drafter's context built from an n-token chunk's target "
                                   "features over P computed tokens, alone): the median time, written as at most "
                                   "the chunk's per_chunk_s" if chunk_draft is not None else "not measured"),
        "chunk_draft_capped_at_per_chunk_s": capped,
        "prefill_table_definition": ("t(one request's prefill of n prompt tokens: a verifier forward over 0 "
                                     f"computed tokens and the {kinds[0] if kinds else 'no'} drafter's context of "
                                     "it), the whole time (no table subtracted)"),
        "draft_definition": ("drafter step (one committed token, then propose) of R requests at context C; each "
                             "drafter reads its own KV cache of the context (injected target features), none the "
                             "verifier's, padded to the longest context in the batch (key_padding longest: read at "
                             "the batch's longest context)"),
        "negative_differences_written_as_0": clipped,
        "axes": {"contexts": list(axes.contexts), "queries": list(axes.queries), "chunks": list(axes.chunks),
                 "chunk_contexts": list(axes.chunk_contexts), "attention_requests": a,
                 "prefill_prompts": list(axes.prefill_prompts), "draft_contexts": list(axes.drafter_contexts)},
    }
    return blocks, meta
