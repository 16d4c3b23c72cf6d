"""One decode step as an engine plans it, with its outcome; and the histograms of verified and accepted lengths."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from simulator.batch import StepPlan
from simulator.costs.step_cost import VerifyCost
from simulator.step_kernels import settle_lengths

_BATCH_STEPS = 512  # measured steps whose lengths are counted in one go


class DecodeStep(StepPlan):
    """A planned step and its outcome, both known before it runs.

    ``good`` [R]: accepted draft tokens among the verified ones, counted only up
    to each request's end (tokens accepted past it are never emitted), so a
    request-step emits ``good + 1`` tokens; ``remaining_after`` [R]: the output
    tokens each request still needs afterwards. Both stay None in a step without
    draft tokens, where every request emits one token; ``num_good`` is the sum
    of ``good``, ``num_accepted`` the sum of min(l_r, accepted_r): the draft
    tokens the verifier accepted, those past a request's end included (what the
    step log counts, as vLLM does); ``longest`` the longest l_r (-1 until settled). ``ends_request``: some
    request finishes with this step; ``completes_prefill``: some prefill chunk
    completes its request's prefill.
    """

    good: np.ndarray | None = None
    remaining_after: np.ndarray | None = None
    num_good = num_accepted = 0
    longest = -1  # the longest l_r, once settled
    ends_request = completes_prefill = False
    duration_s = end_at = churn_s = 0.0

    def priced(self, cost: VerifyCost, churn_s: float = 0.0) -> None:
        """The target's time is known: the step lasts T_draft + T_sched + T_verify from ``start_at``, plus
        ``churn_s`` for the requests joining before it and finishing in it (in the log's verify_s)."""
        self.churn_s = churn_s
        if churn_s:
            cost = replace(cost, verify_s=cost.verify_s + churn_s)
        self.cost = cost
        self.duration_s = self.draft_s + self.sched_s + cost.verify_s
        self.end_at = self.start_at + self.duration_s

    def settle(self, remaining: np.ndarray, drafts: bool) -> None:
        """The outcome of the decided lengths and true outcomes for requests needing ``remaining`` [R] tokens; the
        step's ``num_verified`` and ``decode_tokens`` too."""
        if not self.num_requests:
            return
        if not drafts:  # no draft token: every l_r is 0 (num_verified stays 0)
            self.longest, self.decode_tokens = 0, self.num_requests
            self.ends_request = int(remaining.min()) == 1
            return
        block = np.empty((2, self.num_requests), dtype=np.int64)  # one allocation for both
        good, remaining_after = block[0], block[1]
        num_verified, self.num_good, self.num_accepted, self.longest, self.ends_request = settle_lengths(
            self.lengths, self.accepted, remaining, good, remaining_after)
        self.num_verified, self.decode_tokens = num_verified, self.num_requests + num_verified
        self.good, self.remaining_after = good, remaining_after


class LengthCounts:
    """Request-steps by verified draft tokens l_r and by accepted draft tokens (0..g), over measured steps.

    Per-position acceptance follows from their reverse cumulative sums. Steps
    given to :meth:`add` are kept as they come and counted in batches (one
    bincount per many steps); the engine counts into :attr:`histograms` in place
    instead, as it applies a step (:meth:`simulator.decode_set.DecodeSet.step_done`).
    """

    def __init__(self, draft_tokens: int) -> None:
        self._verified = np.zeros(draft_tokens + 1, dtype=np.int64)
        self._accepted = np.zeros(draft_tokens + 1, dtype=np.int64)
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []

    def add(self, lengths: np.ndarray, accepted: np.ndarray) -> None:
        """A step's lengths [R] and accepted draft tokens min(l_r, accepted_r) [R] (arrays nobody changes
        afterwards)."""
        self._pending.append((lengths, accepted))
        if len(self._pending) >= _BATCH_STEPS:
            self._count()

    def add_without_drafts(self, num_requests: int) -> None:
        """A step without draft tokens: every request verified and accepted none."""
        self._verified[0] += num_requests
        self._accepted[0] += num_requests

    @property
    def histograms(self) -> tuple[np.ndarray, np.ndarray]:
        """The counts by verified and by accepted length [g + 1] (steps given to :meth:`add` not counted yet), to
        count into in place."""
        return self._verified, self._accepted

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
