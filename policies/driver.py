"""What an engine carries for a policy from one step to the next, and who shares a step.

* *stale pools* - the ``Decision.pool`` of the last ``policy.history_steps`` steps,
  oldest first, handed to the policy as ``StepView.history`` (``history[-1]`` is
  one step old).
* *EMA rows* - ``Decision.smoothed`` of the previous step, kept per request id and
  handed back as ``StepView.smoothed``; a request without a row (new to the batch)
  gets a row of NaN.

Both the sampler (:mod:`policies.lossless.sampler`) and the exact checker
(:mod:`policies.lossless.exact`) use this module, so they feed policies identically.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from policies import kernels
from policies.base import CostCurve, Decision, Policy, StepView

_NO_ROWS: Mapping[int, np.ndarray] = MappingProxyType({})

CostSource = CostCurve | Callable[[int], CostCurve]  # one curve, or a curve per number of requests


def cost_for(cost: CostSource, num_requests: int) -> CostCurve:
    """The cost curve of a step with ``num_requests`` requests."""
    curve = cost if isinstance(cost, CostCurve) else cost(num_requests)
    if not isinstance(curve, CostCurve):
        raise TypeError(f"cost: expected a CostCurve or a function returning one, got {type(curve).__name__}")
    return curve


_FLOAT64, _INT64 = np.dtype(np.float64), np.dtype(np.int64)  # compared with a dtype object (faster than a type)


def _frozen(array: np.ndarray) -> np.ndarray:
    if type(array) is np.ndarray and array.dtype == _FLOAT64:
        if not array.flags.writeable:  # read-only, and so is the array owning its memory: kept as it is (dspark's
            base = array.base  # pools carry their sorted values this way, see policies/dspark.py)
            if base is None or (type(base) is np.ndarray and not base.flags.writeable and base.base is None):
                return array
        copy = array.copy(order="K")  # what np.array(array) makes, without its dtype resolution
    else:
        copy = np.array(array, dtype=np.float64)
    copy.setflags(write=False)
    return copy


@dataclass(frozen=True, init=False)
class PolicyMemory:
    """Immutable step-to-step state of a policy: stale pools and EMA rows by request id."""

    pools: tuple[np.ndarray, ...] = ()  # each [R_old, gamma], oldest first
    smoothed: Mapping[int, np.ndarray] = field(default_factory=lambda: _NO_ROWS)  # id -> [gamma]

    def __init__(self, pools: tuple[np.ndarray, ...] = (), smoothed: Mapping[int, np.ndarray] = _NO_ROWS) -> None:
        self.__dict__.update(pools=pools, smoothed=smoothed)  # built every step: see StepView's __init__

    def view(self, request_ids: Sequence[int], confidence: np.ndarray, cost: CostCurve,
             accepted: np.ndarray | None = None, token_budget: int | None = None) -> StepView:
        """The StepView of a step whose rows are ``request_ids`` (in that order); ``accepted`` only for policies that
        read outcomes (upper bounds); ``token_budget`` the most batch tokens the step may hold (None: no budget)."""
        smoothed = None
        if self.smoothed:
            num_draft = confidence.shape[1]
            wrong = sorted(r for r, row in self.smoothed.items() if row.shape != (num_draft,))
            if wrong:
                raise ValueError(f"EMA rows of requests {wrong} do not have {num_draft} entries (one per draft token)")
            nan_row = np.full(num_draft, np.nan)
            smoothed = np.array([self.smoothed.get(r, nan_row) for r in request_ids]).reshape(confidence.shape)
        return StepView(confidence=confidence, cost=cost, history=self.pools, smoothed=smoothed, accepted=accepted,
                        token_budget=token_budget)

    def after(self, policy: Policy, request_ids: Sequence[int], decision: Decision) -> PolicyMemory:
        """The memory for the next step once ``decision`` was taken for ``request_ids``."""
        keep = policy.history_steps
        if keep <= 0 and decision.smoothed is None and not self.pools and not self.smoothed:
            return self  # nothing to carry (an engine asks every step): the same empty memory
        pools = (self.pools + (_frozen(decision.pool),))[-keep:] if keep > 0 else ()
        smoothed = _NO_ROWS
        if decision.smoothed is not None:
            rows = np.asarray(decision.smoothed)
            smoothed = MappingProxyType({r: _frozen(rows[i]) for i, r in enumerate(request_ids)})
        return PolicyMemory(pools, smoothed)


def check_decision(policy: Policy, decision: Decision, num_requests: int, num_draft: int,
                   token_budget: int | None = None) -> np.ndarray:
    """The decision's lengths as ints -> [R], after checking 0 <= l_r <= drafted tokens and, with a token budget,
    sum_r (1 + l_r) <= budget."""
    lengths = decision.lengths
    if type(lengths) is not np.ndarray:
        lengths = np.asarray(lengths)
    if lengths.shape != (num_requests,):
        raise ValueError(f"policy {policy.name!r}: expected {num_requests} lengths, got shape {lengths.shape}")
    if lengths.dtype == _INT64:  # one compiled pass (every policy returns int64)
        low, high, total = kernels.length_summary(lengths)
        out_of_range = low < 0 or high > num_draft
    else:
        out_of_range = (lengths.min() < 0 or lengths.max() > num_draft) if lengths.size else False
        total = int(lengths.sum()) if token_budget is not None else 0
    if out_of_range:
        raise ValueError(f"policy {policy.name!r}: lengths must lie in 0..{num_draft} (tokens drafted), "
                         f"got {lengths.tolist()}")
    if token_budget is not None and num_requests + total > token_budget:
        raise ValueError(f"policy {policy.name!r}: {num_requests} requests verifying {total} draft "
                         f"tokens exceed the token budget of {token_budget} batch tokens")
    return lengths if lengths.dtype == _INT64 else lengths.astype(_INT64)  # int64 ones as they are (nobody writes)


def active_requests(step: int, num_output_tokens: Sequence[int], join_steps: Sequence[int],
                    num_tokens: int, retire: bool) -> tuple[int, ...]:
    """Ids of the requests sharing engine step ``step``.

    Request r takes part from step ``join_steps[r]`` on; with ``retire`` it leaves
    once it holds ``num_tokens`` output tokens.
    """
    if len(join_steps) != len(num_output_tokens):
        raise ValueError(f"join_steps: expected one entry per request ({len(num_output_tokens)}), "
                         f"got {len(join_steps)}")
    return tuple(r for r, (joined, count) in enumerate(zip(join_steps, num_output_tokens, strict=True))
                 if joined <= step and not (retire and count >= num_tokens))
