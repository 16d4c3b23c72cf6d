"""The production DSpark scheduler (paper section 5.2).

It sizes the step from an *older* candidate pool: the capacity is fixed before
the current draft tokens exist, so a full search (no early stop) is safe there.
The live ranking of the current candidates keeps each request's admitted set a
prefix because survivals are non-increasing along a request.

Speed (same values as the general helpers of :mod:`policies.base`): a small
table (a handful of requests) is decided in one kernel call
(:func:`policies.kernels.stale_top_k`), whose cost is the call itself. A large
table is sorted once, when it is made: its sorted values give this step's K-th
largest survival (no partial sort) and travel with the pool, in the same
read-only buffer, to the step that sizes its capacity from it (no second
sort). Such a pool is recognised by identity: the policy memory keeps
read-only pools as they are (:meth:`policies.driver.PolicyMemory.after`); any
other pool is sorted when used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from policies import kernels
from policies.base import (
    FLOAT64,
    SMALL_TABLE_ENTRIES,
    CostCurve,
    Decision,
    Objective,
    PolicyTraits,
    StepView,
    check_objective,
    objective_code,
    survival_by_position,
    top_k_lengths,
)
from policies.greedy import search_capacity
from policies.registry import register


def smooth_confidence(confidence: np.ndarray, previous: np.ndarray | None, decay: float) -> np.ndarray:
    """EMA over steps: decay * previous + (1 - decay) * current; new requests start at current."""
    if previous is None:
        return confidence
    blended = decay * previous + (1.0 - decay) * confidence
    return np.where(np.isnan(previous), confidence, blended)


@register
@dataclass(frozen=True)
class DSpark(PolicyTraits):
    """Asynchronous top-K scheduler with capacity from a stale pool.

    ``staleness_steps``: how old the pool that sizes the capacity K is (2 in the
    paper's zero-overhead pipeline, 1 in vLLM's adaptive verification). 0 sizes
    K by a full search over the current pool, which is ``global_sync`` again and
    LOSSY; it exists only so users can measure what it would gain.
    ``ema_decay``: smooth confidences over steps before ranking (None = off).
    Until enough history exists (an engine's first steps) K is 0. The search
    prices the old pool with the current step's cost curve: K sizes this step.
    Under a token budget K is at most ``token_budget - R`` (the search stops
    there); the budget is known before the draft tokens, so this stays lossless.
    """

    staleness_steps: int = 2
    objective: Objective = "tokens_x_sps"
    ema_decay: float | None = None
    name: ClassVar[str] = "dspark"

    def __post_init__(self) -> None:
        check_objective("dspark", self.objective)
        if self.staleness_steps not in (0, 1, 2):
            raise ValueError(f"dspark: staleness_steps must be 0, 1 or 2, got {self.staleness_steps}")
        if self.ema_decay is not None and not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"dspark: ema_decay must lie in [0, 1) or be null, got {self.ema_decay}")

    @property
    def lossless(self) -> bool:  # type: ignore[override]
        return self.staleness_steps > 0

    @property
    def history_steps(self) -> int:  # type: ignore[override]
        return self.staleness_steps

    def decide(self, view: StepView) -> Decision:
        smoothed = None
        confidence = view.confidence
        if self.ema_decay is not None:
            smoothed = smooth_confidence(confidence, view.smoothed, self.ema_decay)
            confidence = smoothed
        stale = view.history[-self.staleness_steps] if 0 < self.staleness_steps <= len(view.history) else None
        if stale is not None and _is_small(confidence) and _is_small(stale):
            budget = view.token_budget
            small = _decide_small(confidence, stale, view.cost, self.objective,
                                  None if budget is None else budget - confidence.shape[0])  # view.draft_budget
            if small is not None:
                survival, capacity, lengths = small
                return Decision(lengths=lengths, pool=survival, capacity=capacity, smoothed=smoothed)
        ascending = None
        if type(confidence) is np.ndarray and confidence.dtype == FLOAT64 and confidence.ndim == 2:
            survival, ascending = _sorted_survival(confidence)  # [R, gamma], position-major in memory
        else:
            survival = survival_by_position(confidence).T
        if self.staleness_steps == 0:
            capacity = search_capacity(survival, view.cost, self.objective, view.draft_budget, ascending)
        elif stale is not None:
            capacity = search_capacity(stale, view.cost, self.objective, view.draft_budget,
                                       _sorted_values(stale))
        else:
            capacity = 0
        kth = None if ascending is None else _kth_largest(ascending, capacity)
        return Decision(lengths=top_k_lengths(survival, capacity, kth), pool=survival, capacity=capacity,
                        smoothed=smoothed)


ONE_CALL_ENTRIES = SMALL_TABLE_ENTRIES  # tables of at most this many survivals: decided in one kernel call

# Pools made by _sorted_survival, by id, the newest last; each one's buffer holds the pool, then its sorted values.
# Held here (so an id cannot be reused while listed), the oldest dropped past SORTED_POOLS_KEPT: a pool is used two
# steps after it was made, so this serves every engine of a cluster of ~100 replicas; an older one is sorted again.
_SORTED_POOLS: dict[int, np.ndarray] = {}
SORTED_POOLS_KEPT = 256


def _is_small(table: np.ndarray) -> bool:
    return type(table) is np.ndarray and table.dtype == FLOAT64 and table.ndim == 2 and (
        table.size <= ONE_CALL_ENTRIES)


def _decide_small(confidence: np.ndarray, pool: np.ndarray, cost: CostCurve, objective: Objective,
                  limit: int | None) -> tuple[np.ndarray, int, np.ndarray] | None:
    """(survival [R, gamma], capacity, lengths [R]) from small tables of confidences and a stale pool (see
    :func:`_is_small`) in one kernel call; None when the profile does not reach the stale path's end (the
    general path raises the profile's error) or the draft budget ``limit`` is negative."""
    if limit is not None and limit < 0:
        return None  # a budget below R: the general path's rules
    num_requests, gamma = confidence.shape
    num_old, size = pool.shape[0], pool.size
    entries = size if limit is None or limit > size else limit
    by_position = np.empty((gamma, num_requests))
    lengths = np.zeros(num_requests, dtype=np.int64)
    capacity, done = kernels.stale_top_k(confidence, by_position, pool.ravel(order="K"), False, float(num_old),
                                         cost.sps_within(num_old, entries + 1), objective_code(objective),
                                         float(cost.draft_s), entries, lengths)
    if capacity < 0:
        return None
    by_position.setflags(write=False)  # the policy memory keeps it without a copy
    survival = by_position.T
    return survival, capacity, lengths if done else top_k_lengths(survival, capacity)


def _sorted_survival(confidence: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Survivals of a float64 table [R, gamma] (position-major in memory, as
    :func:`policies.base.survival_by_position` lays them out) and their values in ascending order (NaN last), in
    one read-only buffer; later steps find the sorted values of the pool with :func:`_sorted_values`."""
    num_requests, gamma = confidence.shape
    size = num_requests * gamma
    buffer = np.empty(2 * size)
    kernels.survival_twice(confidence, buffer)
    buffer[size:].sort()
    buffer.setflags(write=False)  # and so is every view made of it from here on
    survival = buffer[:size].reshape(gamma, num_requests).T
    _SORTED_POOLS[id(survival)] = survival
    if len(_SORTED_POOLS) > SORTED_POOLS_KEPT:
        del _SORTED_POOLS[next(iter(_SORTED_POOLS))]
    return survival, buffer[size:]


def _sorted_values(pool: np.ndarray) -> np.ndarray | None:
    """The ascending values of a pool made by :func:`_sorted_survival`, or None for any other array."""
    if _SORTED_POOLS.get(id(pool)) is not pool:
        return None
    return pool.base[pool.size:]  # type: ignore[index]


def _kth_largest(ascending: np.ndarray, k: int) -> float | None:
    """The k-th largest value of a table from its ascending values (1 <= k <= size), or None when the table holds
    a NaN (numpy's order then decides, see :func:`policies.base.top_k_lengths`)."""
    if not 1 <= k <= ascending.size or ascending[-1] != ascending[-1]:
        return None
    return float(ascending[ascending.size - k])
