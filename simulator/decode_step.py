"""One decode step as an engine plans it, with its outcome; and the histograms of verified and accepted lengths."""

from __future__ import annotations

import numpy as np

from simulator.batch import StepPlan
from simulator.costs.step_cost import VerifyCost

_BATCH_STEPS = 512  # measured steps whose lengths are counted in one go


class DecodeStep(StepPlan):
    """A planned step and its outcome, both known before it runs.

    ``good`` [R]: accepted draft tokens among the verified ones, counted only up
    to each request's end (tokens accepted past it are never emitted), so a
    request-step emits ``good + 1`` tokens; ``remaining_after`` [R]: the output
    tokens each request still needs afterwards. Both stay None in a step without
    draft tokens, where every request emits one token. ``ends_request``: some
    request finishes with this step; ``completes_prefill``: some prefill chunk
    completes its request's prefill.
    """

    def __init__(self, start_at: float) -> None:
        super().__init__(start_at)
        self.good: np.ndarray | None = None
        self.remaining_after: np.ndarray | None = None
        self.ends_request = self.completes_prefill = False
        self.duration_s = self.end_at = 0.0

    def priced(self, cost: VerifyCost) -> None:
        """The target's time is known: the step lasts T_draft + T_sched + T_verify from ``start_at``."""
        self.cost = cost
        self.duration_s = self.draft_s + self.sched_s + cost.verify_s
        self.end_at = self.start_at + self.duration_s

    def settle(self, remaining: np.ndarray, drafts: bool) -> None:
        """The outcome of the decided lengths and true outcomes for requests needing ``remaining`` [R] tokens."""
        if not self.num_requests:
            return
        if not drafts:
            self.ends_request = int(remaining.min()) == 1
            return
        remaining_after = remaining - 1
        good = np.minimum(self.lengths, self.accepted)
        np.minimum(good, remaining_after, out=good)
        remaining_after -= good
        self.good, self.remaining_after = good, remaining_after
        self.ends_request = not remaining_after.all()


class LengthCounts:
    """Request-steps by verified draft tokens l_r and by accepted draft tokens (0..g), over measured steps.

    Per-position acceptance follows from their reverse cumulative sums. Steps
    are kept as they come and counted in batches (one bincount per many steps).
    """

    def __init__(self, draft_tokens: int) -> None:
        self._verified = np.zeros(draft_tokens + 1, dtype=np.int64)
        self._accepted = np.zeros(draft_tokens + 1, dtype=np.int64)
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []

    def add(self, lengths: np.ndarray, good: np.ndarray) -> None:
        """A step's lengths [R] and counted accepted tokens [R] (arrays nobody changes afterwards)."""
        self._pending.append((lengths, good))
        if len(self._pending) >= _BATCH_STEPS:
            self._count()

    def add_without_drafts(self, num_requests: int) -> None:
        """A step without draft tokens: every request verified and accepted none."""
        self._verified[0] += num_requests
        self._accepted[0] += num_requests

    @property
    def verified(self) -> np.ndarray:
        self._count()
        return self._verified

    @property
    def accepted(self) -> np.ndarray:
        self._count()
        return self._accepted

    def _count(self) -> None:
        if self._pending:
            size = self._verified.size
            self._verified += np.bincount(np.concatenate([v for v, _ in self._pending]), minlength=size)
            self._accepted += np.bincount(np.concatenate([a for _, a in self._pending]), minlength=size)
            self._pending.clear()
