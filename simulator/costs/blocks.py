"""Typed version-2 blocks for the programs that write profiles (the roofline, the profiler, the fit).

A writer builds its version-1 part as before, then adds what it measured::

    data = Version2Blocks(attention=AttentionBlock(...), cuda_graphs=CudaGraphsBlock(1024, eager_overhead_s=1e-3),
                          token_budget=TokenBudgetBlock(8192)).apply(document_dict, origin="my_profile.json")

:meth:`Version2Blocks.apply` returns a new version-2 dictionary and checks it by
reading it back (:func:`simulator.costs.schema.profile_from_dict`), so a writer
never writes a file the simulator refuses. Each block's ``to_dict`` is the JSON
object of ``docs/profile_format.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from simulator.costs.profile import KeyPadding
from simulator.costs.schema import FIELDS, migrate, profile_from_dict


@dataclass(frozen=True)
class AttentionBlock:
    """``attention``: seconds of one request's attention (all layers) over (context, query tokens)."""

    context_tokens: tuple[int, ...]  # [NC] KV entries before the step, >= 0
    query_tokens: tuple[int, ...]  # [NQ] query tokens per request (1 + l_r; chunk sizes if it prices prefill too)
    per_request_s: tuple[tuple[float, ...], ...]  # [NC][NQ]
    key_padding: KeyPadding = "none"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"context_tokens": list(self.context_tokens), "query_tokens": list(self.query_tokens),
                               "per_request_s": [list(row) for row in self.per_request_s]}
        if self.key_padding != "none":
            out["key_padding"] = self.key_padding
        return out


@dataclass(frozen=True)
class CudaGraphsBlock:
    """``cuda_graphs``: the largest captured batch and the eager cost above it (exactly one of the two forms)."""

    max_captured_tokens: int
    eager_overhead_s: float | None = None  # seconds added to the verify table above the cliff
    eager_batch_tokens: tuple[int, ...] | None = None  # or an SPS table of eager steps
    eager_steps_per_s: tuple[float, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"max_captured_tokens": self.max_captured_tokens}
        if self.eager_overhead_s is not None:
            out["eager_overhead_s"] = self.eager_overhead_s
        if self.eager_batch_tokens is not None or self.eager_steps_per_s is not None:
            out["eager"] = {"batch_tokens": list(self.eager_batch_tokens or ()),
                            "steps_per_s": list(self.eager_steps_per_s or ())}
        return out


@dataclass(frozen=True)
class TokenBudgetBlock:
    """``token_budget``: the most batch tokens (decode, verification and prefill) one step may hold."""

    max_num_batched_tokens: int

    def to_dict(self) -> dict[str, Any]:
        return {"max_num_batched_tokens": self.max_num_batched_tokens}


@dataclass(frozen=True)
class ChunkAttentionBlock:
    """``prefill.chunk_attention``: seconds of one prefill chunk's attention over (computed context, chunk)."""

    context_tokens: tuple[int, ...]  # [NC] prompt tokens already computed, >= 0
    chunk_tokens: tuple[int, ...]  # [NK]
    per_chunk_s: tuple[tuple[float, ...], ...]  # [NC][NK]
    draft_s: tuple[tuple[float, ...], ...] | None = None  # [NC][NK] of per_chunk_s: the drafter's context build

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"context_tokens": list(self.context_tokens), "chunk_tokens": list(self.chunk_tokens),
                               "per_chunk_s": [list(row) for row in self.per_chunk_s]}
        if self.draft_s is not None:
            out["draft_s"] = [list(row) for row in self.draft_s]
        return out


@dataclass(frozen=True)
class PrefillTableBlock:
    """``prefill.table``: seconds of one disaggregated prefill over its prompt tokens (replaces the line)."""

    prompt_tokens: tuple[int, ...]  # [NP] strictly increasing, >= 1
    latency_s: tuple[float, ...]  # [NP]

    def to_dict(self) -> dict[str, Any]:
        return {"prompt_tokens": list(self.prompt_tokens), "latency_s": list(self.latency_s)}


@dataclass(frozen=True)
class ContextDraftTable:
    """``draft.<kind>`` with a context axis: latency over (the batch's mean - or longest - context, R, gamma)."""

    context_tokens: tuple[int, ...]  # [NC]
    num_requests: tuple[int, ...]  # [NR]
    draft_tokens: tuple[int, ...]  # [NG]
    latency_s: tuple[tuple[tuple[float, ...], ...], ...]  # [NC][NR][NG]
    key_padding: KeyPadding = "none"  # "longest": read at the batch's longest context, not its mean

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"num_requests": list(self.num_requests), "draft_tokens": list(self.draft_tokens),
                               "context_tokens": list(self.context_tokens)}
        if self.key_padding != "none":
            out["key_padding"] = self.key_padding
        out["latency_s"] = [[list(row) for row in plane] for plane in self.latency_s]
        return out


@dataclass(frozen=True)
class Version2Blocks:
    """The version-2 additions of one profile; absent blocks keep the version-1 behaviour."""

    attention: AttentionBlock | None = None
    cuda_graphs: CudaGraphsBlock | None = None
    token_budget: TokenBudgetBlock | None = None
    chunk_attention: ChunkAttentionBlock | None = None
    prefill_table: PrefillTableBlock | None = None
    draft: dict[str, ContextDraftTable] = field(default_factory=dict)  # replaces these drafters' tables

    def apply(self, profile: dict[str, Any], origin: str = "<memory>") -> dict[str, Any]:
        """``profile`` (a version-1 or 2 dictionary) as version 2 with these blocks, checked by reading it back."""
        out = migrate(profile)
        for key, value in (("attention", self.attention), ("cuda_graphs", self.cuda_graphs),
                           ("token_budget", self.token_budget)):
            if value is not None:
                out[key] = value.to_dict()
        if self.prefill_table is not None:
            out["prefill"] = {**out["prefill"], "table": self.prefill_table.to_dict()}
        if self.chunk_attention is not None:
            out["prefill"] = {**out["prefill"], "chunk_attention": self.chunk_attention.to_dict()}
        if self.draft:
            out["draft"] = {**out["draft"], **{kind: table.to_dict() for kind, table in self.draft.items()}}
        out = {key: out[key] for key in FIELDS if key in out}
        profile_from_dict(out, origin)
        return out
