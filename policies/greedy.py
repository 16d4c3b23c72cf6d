"""Algorithm 1 of the DSpark paper (greedy prefix scheduler) and its lossy relative."""

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
    descending_survivals,
    objective_code,
    path_throughput,
    sorted_survivals,
    survival_by_position,
    top_k_lengths,
)
from policies.registry import register


def early_stop_count(theta: np.ndarray) -> int:
    """Entries admitted when walking a path until Theta first fails to rise.

    ``theta[n]`` is the throughput after admitting n entries (``theta[0]`` is the
    plain-decoding value). Admission stops at the first n with theta[n] <= theta[n-1]
    (a NaN compares false, so the walk stops there too).
    """
    return int(kernels.early_stop_count(np.asarray(theta, dtype=np.float64)))


def best_prefix_count(theta: np.ndarray) -> int:
    """Entries admitted by a full search: the first argmax of Theta along the path."""
    return int(theta.argmax())


def search_capacity(pool: np.ndarray, cost: CostCurve, objective: Objective, limit: int | None = None,
                    ascending: np.ndarray | None = None) -> int:
    """Draft-token capacity K that a full search over ``pool`` would admit (at most ``limit``: a token budget).
    ``ascending``: the pool's values in ascending order (NaN last), when the caller has them."""
    if pool.dtype == FLOAT64 and pool.ndim == 2 and (limit is None or limit >= 0):
        num_old, size = pool.shape[0], pool.size
        entries = size if limit is None or limit > size else limit
        if ascending is not None:
            values, presorted = ascending, True
        elif size <= SMALL_TABLE_ENTRIES:  # sorted by the kernel (only values matter: any memory order)
            values, presorted = pool.ravel(order="K"), False
        else:
            values, presorted = np.sort(pool.T if pool.flags.f_contiguous else pool, axis=None), True
        count = kernels.best_prefix_on_path(values, presorted, float(num_old), cost.sps_within(num_old, entries + 1),
                                            objective_code(objective), float(cost.draft_s), entries)
        if count >= 0:
            return count
    return best_prefix_count(path_throughput(cost, pool.shape[0], sorted_survivals(pool)[:limit], objective))


@register
@dataclass(frozen=True)
class Greedy(PolicyTraits):
    """Algorithm 1: admit candidates by descending survival while Theta rises.

    The early stop makes it lossless: whether position k of a request is admitted
    is settled before any candidate that depends on draft token k is examined.
    It finds the global optimum only when Theta is unimodal along the path; a
    jagged SPS curve can trap it (DSpark paper, section 5.2). Under a token
    budget the walk ends after ``token_budget - R`` entries.
    """

    objective: Objective = "tokens_x_sps"
    name: ClassVar[str] = "greedy"
    synchronous: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_objective("greedy", self.objective)

    def decide(self, view: StepView) -> Decision:
        survival = survival_by_position(view.confidence).T  # [R, gamma], position-major in memory
        values, nan_free = descending_survivals(survival)
        values = values[:view.draft_budget]
        count = early_stop_count(path_throughput(view.cost, view.num_requests, values, self.objective))
        kth = float(values[count - 1]) if nan_free and count > 0 else None  # the path is sorted already
        return Decision(lengths=top_k_lengths(survival, count, kth), pool=survival, capacity=count)


@register
@dataclass(frozen=True)
class GlobalSync(PolicyTraits):
    """LOSSY research baseline: Algorithm 1 without the early stop.

    It takes the best prefix of the whole sorted path of the *current* step, so
    the admission of draft token k depends on survivals that were computed from
    token k itself. Appendix A of the DSpark paper shows the output distribution
    (0.85, 0.15) instead of the target (0.7, 0.3). Never use it for serving.
    """

    objective: Objective = "tokens_x_sps"
    name: ClassVar[str] = "global_sync"
    synchronous: ClassVar[bool] = True
    lossless: ClassVar[bool] = False

    def __post_init__(self) -> None:
        check_objective("global_sync", self.objective)

    def decide(self, view: StepView) -> Decision:
        survival = survival_by_position(view.confidence).T  # [R, gamma], position-major in memory
        count = search_capacity(survival, view.cost, self.objective, view.draft_budget)
        return Decision(lengths=top_k_lengths(survival, count), pool=survival, capacity=count)
