"""What an engine holds between and within steps: request columns, the plan of one step, the step log."""

from __future__ import annotations

import numpy as np

from policies import Decision
from simulator.costs.step_cost import VerifyCost

_EMPTY = np.empty(0, dtype=np.int64)
_EMPTY.setflags(write=False)


class RequestColumns:
    """Per-request int64 columns of a set of requests, aligned by position (oldest admitted first)."""

    def __init__(self, *names: str) -> None:
        self.names = names
        for name in names:
            setattr(self, name, _EMPTY)

    @property
    def size(self) -> int:
        return int(self.ids.size)

    def append(self, **columns: np.ndarray) -> None:
        for name in self.names:
            setattr(self, name, np.concatenate((getattr(self, name), columns[name])))

    def take(self, mask: np.ndarray) -> dict[str, np.ndarray]:
        """Remove the rows where ``mask`` is true; returns them by column."""
        gone, keep = {}, ~mask
        for name in self.names:
            column = getattr(self, name)
            gone[name] = column[mask]
            setattr(self, name, column[keep])
        return gone

    def split(self, keep: int) -> dict[str, np.ndarray]:
        """Keep the first ``keep`` rows; returns the others (the newest) by column."""
        gone = {}
        for name in self.names:
            column = getattr(self, name)
            gone[name] = column[keep:]
            setattr(self, name, column[:keep])
        return gone


def prefill_chunks(left_tokens: np.ndarray, room_tokens: int) -> np.ndarray:
    """Prompt tokens each prefilling request computes this step -> [P]: in admission order, each takes what it
    still needs while ``room_tokens`` last (the first ones complete, the next gets a partial chunk)."""
    before = np.cumsum(left_tokens) - left_tokens
    return np.clip(room_tokens - before, 0, left_tokens)


class StepPlan:
    """One step as decided before it runs: the decoding requests and their lengths, chunks, costs.

    The defaults are class attributes (a step is planned every few microseconds); every update rebinds them.
    """

    ids = lengths = accepted = decided_ids = chunks = _EMPTY
    context_tokens: np.ndarray | None = None  # [R] KV tokens before the step, when needed
    decision: Decision | None = None
    draft_s = sched_s = 0.0
    num_requests = num_verified = decode_tokens = 0  # R, sum_r l_r, sum_r (1 + l_r)
    cost: VerifyCost | None = None
    num_preempted = 0

    def __init__(self, start_at: float) -> None:
        self.start_at = start_at

    def decided(self, ids: np.ndarray, decision: Decision, lengths: np.ndarray, accepted: np.ndarray,
                context_tokens: np.ndarray | None, draft_s: float, sched_s: float) -> None:
        self.ids = self.decided_ids = ids
        self.decision, self.lengths, self.accepted = decision, lengths, accepted
        self.context_tokens, self.draft_s, self.sched_s = context_tokens, draft_s, sched_s
        self.num_requests = ids.size  # num_verified and decode_tokens: once settled (DecodeStep.settle)

    def keep_oldest(self, count: int) -> None:
        """The newest decoding requests were preempted: only the first ``count`` run this step."""
        if count < self.ids.size:
            self.ids, self.lengths, self.accepted = self.ids[:count], self.lengths[:count], self.accepted[:count]
            if self.context_tokens is not None:
                self.context_tokens = self.context_tokens[:count]
            self.num_requests, self.num_verified = count, int(self.lengths.sum())
            self.decode_tokens = self.num_requests + self.num_verified


class StepLog:
    """Per-step records of the engines, kept as Python lists of scalars until the end.

    ``batch_tokens`` counts decode and verification tokens, sum_r (1 + l_r); a
    step's prefill-chunk tokens are ``prefill_tokens``. The cost columns
    (``detailed``) are written when a run uses anything beyond the version-1
    model (a version-2 profile, chunked prefill, paged KV or a token budget), so
    version-1 runs keep their tables unchanged:

    * ``context_tokens`` - sum over the decoding requests of their KV tokens before the step;
    * ``dense_s``, ``attention_s`` - parts of ``verify_s`` (the rest is padding and per-request overhead);
    * ``prefill_tokens``, ``num_prefill_requests`` - co-located prefill chunks;
    * ``eager`` - the step ran above the largest captured CUDA graph;
    * ``budget_tokens`` - the step's token budget (-1: none);
    * ``num_preempted`` - requests preempted to make room for this step's KV.
    """

    COLUMNS = ("engine", "start_at", "end_at", "num_requests", "batch_tokens", "num_verified_tokens",
               "num_accepted_tokens", "num_emitted_tokens", "capacity", "draft_s", "sched_s", "verify_s")
    COST_COLUMNS = ("context_tokens", "dense_s", "attention_s", "prefill_tokens", "num_prefill_requests", "eager",
                    "budget_tokens", "num_preempted")

    def __init__(self, detailed: bool = False) -> None:
        self.rows: list[tuple] = []
        self.detailed = detailed

    @property
    def columns(self) -> tuple[str, ...]:
        return self.COLUMNS + self.COST_COLUMNS if self.detailed else self.COLUMNS

    def append(self, *row: float) -> None:
        self.rows.append(row)

    def record(self, engine_id: int, plan: StepPlan, end_at: float, num_emitted: int, num_accepted: int,
               budget_tokens: int | None) -> None:
        """One step's row (``plan.cost`` is set)."""
        cost = plan.cost
        assert cost is not None
        capacity = plan.decision.capacity if plan.decision is not None else -1
        row = (engine_id, plan.start_at, end_at, plan.num_requests, plan.decode_tokens, plan.num_verified,
               num_accepted, num_emitted, capacity, plan.draft_s, plan.sched_s, cost.verify_s)
        if self.detailed:
            context = int(plan.context_tokens.sum()) if plan.context_tokens is not None else 0
            row += (context, cost.dense_s, cost.attention_s, int(plan.chunks.sum()), int(np.count_nonzero(plan.chunks)),
                    cost.eager, -1 if budget_tokens is None else budget_tokens, plan.num_preempted)
        self.rows.append(row)
