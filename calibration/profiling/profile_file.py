"""The one writer of hardware-profile files: typed tables in, the simulator's JSON format out.

Every producer - the analytic roofline (:mod:`calibration.profiling.analytic`) and the
measured profiler (:mod:`calibration.profiling.measure`) - builds a
:class:`ProfileDocument` from the pieces below. The reader, :mod:`simulator.costs`,
owns the format (``docs/profile_format.md`` documents every field): the format name
comes from it, and the version written is checked against the versions it reads.

The pieces here are the version-1 fields. A document without ``version2`` blocks is
stamped version 1, which every reader version reads unchanged (the built-in version-1
profiles are written so, byte for byte). A document with them (attention over
context and query tokens, the CUDA-graph cliff, a token budget, prefill chunk
attention, context-aware drafter tables: :class:`simulator.costs.Version2Blocks`) is
stamped version 2 by the simulator's own writer blocks, which read the result back, so
a producer cannot write a file the simulator refuses. The order of the fields in the
file is fixed (``simulator.costs.FIELDS``)::

    format, version, metadata, gpus_per_replica, verify, per_request, attention, cuda_graphs, token_budget,
    draft, prefill, scheduler

Tables keep the value types they are given (Python ints and floats) and are written as
lists, one row per request count in ``draft.<kind>.latency_s``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from simulator.costs import PROFILE_FORMAT, READABLE_VERSIONS, Version2Blocks

ProfileSource = Literal["analytic", "measured"]
DOCUMENT_VERSION = 1  # the version whose fields the pieces below are (see the module docstring)


@dataclass(frozen=True)
class ProfileMetadata:
    """Where a profile comes from. ``details`` holds the source's own fields, written after the common ones."""

    source: ProfileSource
    device: str
    model: str
    created: str  # ISO date
    tool: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "device": self.device, "model": self.model, "created": self.created,
                "tool": self.tool, **self.details}


@dataclass(frozen=True)
class VerifyTable:
    """Steps per second of one verifier forward over B batch tokens."""

    batch_tokens: tuple[int, ...]  # [NB]
    steps_per_s: tuple[float, ...]  # [NB]
    padded_slot_s: float | None = None  # seconds per padded query slot (measured profiles); None: not written

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"batch_tokens": list(self.batch_tokens), "steps_per_s": list(self.steps_per_s)}
        if self.padded_slot_s is not None:
            out["padded_slot_s"] = self.padded_slot_s
        return out


@dataclass(frozen=True)
class PerRequestTable:
    """Seconds a step spends per request on top of the verify table, over R requests (version-1 producers put
    KV-cache reads at a reference context here; with an attention table it holds only per-request overhead)."""

    num_requests: tuple[int, ...]  # [NR]
    step_s: tuple[float, ...]  # [NR]

    def to_dict(self) -> dict[str, Any]:
        return {"num_requests": list(self.num_requests), "step_s": list(self.step_s)}


@dataclass(frozen=True)
class DraftTable:
    """Seconds one drafter needs to propose gamma tokens for each of R requests."""

    num_requests: tuple[int, ...]  # [NR]
    draft_tokens: tuple[int, ...]  # [NG]
    latency_s: tuple[tuple[float, ...], ...]  # [NR][NG]

    def to_dict(self) -> dict[str, Any]:
        return {"num_requests": list(self.num_requests), "draft_tokens": list(self.draft_tokens),
                "latency_s": [list(row) for row in self.latency_s]}


@dataclass(frozen=True)
class PrefillCost:
    """One prefill of n tokens costs ``fixed_s + n / tokens_per_s``."""

    fixed_s: float
    tokens_per_s: float

    def to_dict(self) -> dict[str, Any]:
        return {"fixed_s": self.fixed_s, "tokens_per_s": self.tokens_per_s}


@dataclass(frozen=True)
class SchedulerCost:
    """One decision over R requests and gamma draft tokens costs ``fixed_s + per_candidate_s * R * gamma``."""

    fixed_s: float
    per_candidate_s: float

    def to_dict(self) -> dict[str, Any]:
        return {"fixed_s": self.fixed_s, "per_candidate_s": self.per_candidate_s}


@dataclass(frozen=True)
class ProfileDocument:
    """A whole profile, ready to be written (or handed on as the dictionary the simulator reads).

    ``per_request`` may be None (no per-request overhead: a version-2 document whose attention table holds what a
    version-1 per-request table folded in). ``version2`` holds the version-2 blocks; its drafter tables replace
    those of ``draft`` of the same kind.
    """

    metadata: ProfileMetadata
    gpus_per_replica: int
    verify: VerifyTable
    per_request: PerRequestTable | None
    draft: dict[str, DraftTable]  # drafter kind -> its table
    prefill: PrefillCost
    scheduler: SchedulerCost
    version2: Version2Blocks | None = None

    def to_dict(self) -> dict[str, Any]:
        """The profile dictionary in the simulator's format (``simulator.costs.profile_from_dict`` reads it)."""
        if DOCUMENT_VERSION not in READABLE_VERSIONS:
            raise ValueError(f"the reader no longer reads version {DOCUMENT_VERSION} profiles "
                             f"(it reads {READABLE_VERSIONS}); the pieces here need updating")
        out: dict[str, Any] = {
            "format": PROFILE_FORMAT,
            "version": DOCUMENT_VERSION,
            "metadata": self.metadata.to_dict(),
            "gpus_per_replica": self.gpus_per_replica,
            "verify": self.verify.to_dict(),
        }
        if self.per_request is not None:
            out["per_request"] = self.per_request.to_dict()
        out["draft"] = {kind: table.to_dict() for kind, table in self.draft.items()}
        out["prefill"] = self.prefill.to_dict()
        out["scheduler"] = self.scheduler.to_dict()
        if self.version2 is None:
            return out
        return self.version2.apply(out, origin=f"<{self.metadata.source} profile of {self.metadata.model}>")

    @property
    def version(self) -> int:
        return DOCUMENT_VERSION if self.version2 is None else 2

    def write(self, path: Path) -> Path:
        return write_profile(self.to_dict(), path)


def write_profile(data: dict[str, Any], path: Path) -> Path:
    """Write a profile dictionary (:meth:`ProfileDocument.to_dict`, possibly extended since) as the JSON file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path
