"""The read-only snapshot a policy sees, the decision it returns, and shared helpers.

Terms used throughout the project:

* *confidence* ``c[r, k]`` - the drafter's estimate that draft token k of request r
  is accepted given that tokens 1..k-1 were accepted (k is 1-based in prose,
  0-based in arrays).
* *prefix survival* ``a[r, j] = prod_{i <= j} c[r, i]`` - the probability that the
  first j draft tokens are all accepted. Non-increasing in j.
* *verification length* ``l_r`` - how many draft tokens of request r the target
  verifies this step (0 <= l_r <= gamma). The *verification budget* of a request
  is ``1 + l_r`` target tokens (the +1 is the position that yields the bonus or
  correction token).
* *batch tokens* ``B = sum_r (1 + l_r)``.
* *expected accepted tokens* ``tau* = sum_r (1 + sum_{j <= l_r} a[r, j])`` (it
  counts the bonus token, like the paper's tau).
* *expected throughput* ``Theta = tau* x SPS(B)`` (Algorithm 1 of the DSpark paper).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal, Protocol, get_args

import numpy as np

from policies import kernels

Objective = Literal["tokens_x_sps", "tokens_per_s"]

# Tables of at most this many survivals are sorted inside the kernels; larger ones by numpy's vectorised sort,
# which is faster from a few dozen entries on. Either way the sorted values are the same.
SMALL_TABLE_ENTRIES = 48
FLOAT64 = np.dtype(np.float64)  # what the kernels take (a dtype compares faster with this than with np.float64)


def objective_code(objective: str) -> int:
    """The kernels' code of an objective (anything but tokens x SPS prices tokens per second, as below)."""
    return kernels.TOKENS_X_SPS if objective == "tokens_x_sps" else kernels.TOKENS_PER_S


def check_objective(policy: str, objective: str) -> None:
    """Raise for an objective that is not an :data:`Objective` (any other string would price tokens per second)."""
    if objective not in get_args(Objective):
        raise ValueError(f"{policy}: objective must be one of {', '.join(get_args(Objective))}, got {objective!r}")


@dataclass(frozen=True)
class CostCurve:
    """Step cost of the target for the current number of requests.

    ``batch_tokens`` is strictly increasing; ``steps_per_s[i]`` is SPS at
    ``batch_tokens[i]`` (already including any per-request cost of this step's R).
    Between table points SPS is interpolated linearly; outside the table it is
    an error, never an extrapolation.
    """

    batch_tokens: np.ndarray  # [M] int
    steps_per_s: np.ndarray  # [M] float
    draft_s: float = 0.0  # drafter latency of this step, for the tokens-per-second objective
    # SPS at whole batch-token counts, filled on first use (see sps_run): an engine prices every step with R
    # requests with the same curve, so the interpolation along a sorted path is done once, not every step.
    _whole: list[tuple[int, np.ndarray]] = field(default_factory=list, init=False, repr=False, compare=False)

    def sps(self, batch_tokens: np.ndarray | int) -> np.ndarray:
        b = np.asarray(batch_tokens, dtype=np.float64)
        lo, hi = self.batch_tokens[0], self.batch_tokens[-1]
        if b.size and (b.min() < lo or b.max() > hi):
            self._outside(b.min(), b.max())
        return np.interp(b, self.batch_tokens, self.steps_per_s)

    def _outside(self, first: float, last: float) -> None:
        lo, hi = self.batch_tokens[0], self.batch_tokens[-1]
        raise ValueError(
            f"batch of {first:.0f}..{last:.0f} tokens is outside the profiled "
            f"SPS table ({lo}..{hi} tokens); profile a wider range"
        )

    def sps_run(self, first_tokens: int, count: int) -> np.ndarray:
        """SPS at ``first_tokens, first_tokens + 1, ..., first_tokens + count - 1`` batch tokens -> [count].

        The same values as :meth:`sps` on those integers (``np.interp`` is evaluated point by point), read
        from a table of whole batch-token counts computed once per curve. The result is a read-only view.
        """
        if self._whole:
            start, table = self._whole[0]
            offset = first_tokens - start
            if offset >= 0 and offset + count <= table.size:  # inside the table, so inside the profile
                return table[offset:offset + count]
        if count <= 0:
            return np.empty(0)
        last_tokens = first_tokens + count - 1
        lo, hi = self.batch_tokens[0], self.batch_tokens[-1]
        if first_tokens < lo or last_tokens > hi:
            self._outside(first_tokens, last_tokens)
        start = int(np.ceil(lo))
        size = self._whole[0][1].size if self._whole else 0
        end = min(int(np.floor(hi)), max(last_tokens, start + 2 * size))  # geometric growth: few refills
        table = np.interp(np.arange(start, end + 1, dtype=np.float64), self.batch_tokens, self.steps_per_s)
        table.setflags(write=False)
        self._whole[:] = [(start, table)]
        return table[first_tokens - start:last_tokens - start + 1]

    def sps_within(self, first_tokens: int, count: int) -> np.ndarray:
        """:meth:`sps_run` for at most ``count`` batch-token counts, fewer where the profile ends (none when
        ``first_tokens`` itself is outside it): for a caller that finds out later how many it needs."""
        if self._whole:
            start, table = self._whole[0]
            offset = first_tokens - start
            if offset >= 0 and offset + count <= table.size:
                return table[offset:offset + count]
        lo, hi = self.batch_tokens[0], self.batch_tokens[-1]
        if first_tokens < lo or first_tokens > hi:
            return np.empty(0)
        return self.sps_run(first_tokens, min(count, int(np.floor(hi)) - first_tokens + 1))

    def throughput(self, expected_tokens: np.ndarray, batch_tokens: np.ndarray,
                   objective: Objective = "tokens_x_sps") -> np.ndarray:
        """Expected tokens per second of a step for each candidate (tau*, B)."""
        sps = self.sps(batch_tokens)
        if objective == "tokens_x_sps":
            return expected_tokens * sps
        return expected_tokens / (self.draft_s + 1.0 / sps)


# StepView and Decision are built once per engine step. Their __init__ fills the instance dict in one update
# instead of the generated frozen __init__'s one object.__setattr__ per field (half the time); the dataclasses
# stay frozen, and tests/test_policies.py checks that each __init__ takes exactly the fields, in order.


@dataclass(frozen=True, init=False)
class StepView:
    """Everything a policy may read when deciding one engine step.

    ``history`` holds the survival pools of earlier steps, the most recent last
    (``history[-1]`` is one step old). Stale pools may have other requests and
    other sizes than the current one; only their values matter.
    """

    confidence: np.ndarray  # [R, gamma] float in [0, 1]
    cost: CostCurve
    history: tuple[np.ndarray, ...] = ()  # each [R_old, gamma]
    smoothed: np.ndarray | None = None  # [R, gamma] EMA state, NaN rows for new requests
    accepted: np.ndarray | None = None  # [R] true accepted draft tokens (oracle only)
    # The most batch tokens sum_r (1 + l_r) the step may hold (the engine's max_num_batched_tokens, set before any
    # draft token exists, so respecting it keeps a policy lossless); None: no budget.
    token_budget: int | None = None

    def __init__(self, confidence: np.ndarray, cost: CostCurve, history: tuple[np.ndarray, ...] = (),
                 smoothed: np.ndarray | None = None, accepted: np.ndarray | None = None,
                 token_budget: int | None = None) -> None:
        self.__dict__.update(confidence=confidence, cost=cost, history=history, smoothed=smoothed,
                             accepted=accepted, token_budget=token_budget)

    @property
    def num_requests(self) -> int:
        return int(self.confidence.shape[0])

    @property
    def gamma(self) -> int:
        return int(self.confidence.shape[1])

    @property
    def draft_budget(self) -> int | None:
        """The most draft tokens the step may verify in total, ``token_budget - R`` (None: no budget)."""
        return None if self.token_budget is None else self.token_budget - self.num_requests


@dataclass(frozen=True, init=False)
class Decision:
    """What a policy decided for one step.

    ``lengths[r]`` draft tokens of request r are verified. ``pool`` is the survival
    table this step's decision was based on; the engine keeps it so that later
    steps can size their capacity from it. ``capacity`` is the number of draft
    tokens the policy allowed in total (-1 when the policy has no such notion).
    """

    lengths: np.ndarray  # [R] int
    pool: np.ndarray  # [R, gamma] float
    capacity: int = -1
    smoothed: np.ndarray | None = None  # [R, gamma] new EMA state, if the policy keeps one

    def __init__(self, lengths: np.ndarray, pool: np.ndarray, capacity: int = -1,
                 smoothed: np.ndarray | None = None) -> None:
        self.__dict__.update(lengths=lengths, pool=pool, capacity=capacity, smoothed=smoothed)


class Policy(Protocol):
    """A verification policy: a frozen value with a pure ``decide``.

    ``synchronous`` policies put their scheduler time on the critical path of
    every step; ``lossless`` says whether the policy keeps the target
    distribution exactly (see docs/lossless.md); ``history_steps`` is how many
    earlier pools the engine must keep for it; ``needs_outcomes`` is only true
    for the oracle; ``reads_cost`` false says that ``decide`` never reads
    ``view.cost``, so a real loop need not build the step's cost curve for it
    (static rules; a real engine prices nothing for them either).
    """

    name: str
    synchronous: bool
    lossless: bool
    history_steps: int
    needs_outcomes: bool
    reads_cost: bool

    def draft_tokens(self, gamma: int) -> int:
        """How many tokens the drafter proposes per request and step."""
        ...

    def decide(self, view: StepView) -> Decision:
        ...


class PolicyTraits:
    """Default trait values as class constants; concrete policies override what differs."""

    synchronous: ClassVar[bool] = False
    lossless: ClassVar[bool] = True
    history_steps: ClassVar[int] = 0
    needs_outcomes: ClassVar[bool] = False
    reads_cost: ClassVar[bool] = True

    def draft_tokens(self, gamma: int) -> int:
        return gamma


def survival_by_position(confidence: np.ndarray) -> np.ndarray:
    """a[r, j] laid out position-major -> [gamma, R] (C order; its ``.T`` is the [R, gamma] table).

    Position-major is the tie-break order of the sorted path. Each entry is the same
    left-to-right product as :func:`prefix_survival`, so the values are identical
    (float64 tables go through :func:`policies.kernels.survival_position_major`).
    """
    if type(confidence) is np.ndarray and confidence.dtype == FLOAT64 and confidence.ndim == 2:
        by_position = np.empty((confidence.shape[1], confidence.shape[0]))
        kernels.survival_position_major(confidence, by_position)
        return by_position
    confidence = np.asarray(confidence)  # keep cumprod's own result type for other inputs
    return np.ascontiguousarray(np.cumprod(confidence, axis=1).T)


def trim_to_budget(lengths: np.ndarray, draft_budget: int | None) -> np.ndarray:
    """Lengths cut so that they sum to at most ``draft_budget``, in request order: earlier requests keep theirs,
    later ones are cut (vLLM trims the speculative tokens of the requests it schedules last). Each cap depends
    only on the lengths of the requests before it, an order without cycles, so a lossless rule stays lossless."""
    if draft_budget is None or int(lengths.sum()) <= draft_budget:
        return lengths
    before = np.cumsum(lengths) - lengths
    return np.clip(draft_budget - before, 0, lengths).astype(lengths.dtype)


def prefix_survival(confidence: np.ndarray) -> np.ndarray:
    """a[r, j] = prod_{i <= j} c[r, i]  -> [R, gamma]."""
    return np.cumprod(confidence, axis=1)


def sorted_candidates(survival: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Candidates (r, j) with a > 0, sorted by a descending.

    Ties go to the smaller position, then the smaller request index, so equal
    survivals within a request (c = 1) still form a prefix. Returns request
    indices, 1-based positions and survivals along the sorted path.
    """
    num_requests = survival.shape[0]
    flat = survival.T.ravel()  # position-major: index = (j - 1) * R + r, already in tie-break order
    order = np.argsort(-flat, kind="stable")
    values = flat[order]
    keep = values > 0.0
    order, values = order[keep], values[keep]
    positions, requests = np.divmod(order, num_requests)
    return requests, positions + 1, values


def sorted_survivals(survival: np.ndarray) -> np.ndarray:
    """The positive survivals in descending order: the values along the sorted path."""
    return descending_survivals(survival)[0]


def descending_survivals(survival: np.ndarray) -> tuple[np.ndarray, bool]:
    """:func:`sorted_survivals` and whether ``survival`` is free of NaN (then ``values[k - 1]`` is the k-th
    largest entry, as :func:`top_k_lengths` ranks them).

    Only values are sorted, so the memory layout of ``survival`` does not matter.
    """
    table = survival.T if survival.flags.f_contiguous else survival
    if table.dtype == FLOAT64:  # the kernel reads the positive values off the ascending order
        if table.size <= SMALL_TABLE_ENTRIES:
            return kernels.descending_positive(table.ravel(), False)
        return kernels.descending_positive(np.sort(table, axis=None), True)
    ascending = np.sort(table, axis=None)
    if ascending.size and ascending[-1] != ascending[-1]:  # NaN sorts last: keep the plain order (NaN dropped)
        values = -np.sort(-survival, axis=None)
        return values[: np.count_nonzero(values > 0.0)], False
    num_positive = ascending.size - int(ascending.searchsorted(0.0, side="right"))
    return ascending[::-1][:num_positive], True


def top_k_lengths(survival: np.ndarray, k: int, kth: float | None = None) -> np.ndarray:
    """Verification lengths after admitting the first k entries of the sorted path.

    Same result as walking :func:`sorted_candidates`, in O(R gamma): every entry
    above the k-th largest survival is admitted, and entries equal to it are
    admitted in tie-break order (position-major) until k are in. Each request's
    admitted entries form a prefix, so its length is their count. ``kth``, when
    the caller has it (a sorted path of a NaN-free table), is that k-th largest
    value, which spares the partial sort.
    """
    num_requests, gamma = survival.shape
    if k <= 0:
        return np.zeros(num_requests, dtype=np.int64)
    by_position = survival.T  # [gamma, R]: position-major, the tie-break order (a view when built that way)
    if by_position.dtype == FLOAT64:
        lengths = _top_k_compiled(by_position, k, kth)
        if lengths is not None:
            return lengths
    flat = by_position.ravel()
    if k < flat.size:
        if kth is None:
            kth = np.partition(flat, flat.size - k)[flat.size - k]  # k-th largest value
        if kth > 0.0:
            admitted = by_position >= kth
            if np.count_nonzero(admitted) == k:  # the common case: no tie at the k-th value left out
                return admitted.sum(axis=0, dtype=np.int64)
    positive = flat > 0.0
    if k >= np.count_nonzero(positive):
        admitted = positive
    else:  # entries equal to the k-th value: only the first ones in tie-break order fit
        admitted = flat > kth
        ties = np.flatnonzero(flat == kth)[: k - np.count_nonzero(admitted)]
        admitted[ties] = True
    return admitted.reshape(gamma, num_requests).sum(axis=0, dtype=np.int64)


def _top_k_compiled(by_position: np.ndarray, k: int, kth: float | None) -> np.ndarray | None:
    """:func:`top_k_lengths` of a float64 table (k >= 1) by the kernel, or None when a tie at the k-th value
    straddles the cut or a NaN leaves the k-th value to numpy's ordering (then numpy decides)."""
    size = by_position.size
    select = False
    if k >= size:
        kth = 0.0  # every positive entry fits
    elif kth is None:
        select = size <= SMALL_TABLE_ENTRIES  # the kernel finds it; numpy's partition is faster on large tables
        kth = 0.0 if select else np.partition(by_position, size - k, axis=None)[size - k]
    lengths = np.zeros(by_position.shape[1], dtype=np.int64)
    return lengths if kernels.lengths_from_kth(by_position, k, kth, select, lengths) else None


def path_throughput(cost: CostCurve, num_requests: int, survivals: np.ndarray,
                    objective: Objective = "tokens_x_sps") -> np.ndarray:
    """Theta after admitting 0, 1, ..., n entries of a sorted path -> [n + 1]."""
    if survivals.dtype == FLOAT64 and survivals.ndim == 1 and isinstance(num_requests, (int, np.integer)):
        sps = cost.sps_run(int(num_requests), survivals.size + 1)
        return kernels.path_throughput(survivals, float(num_requests), sps, objective_code(objective),
                                       float(cost.draft_s))
    theta = np.empty(survivals.size + 1)  # first tau*, then Theta in place
    theta[0] = 0.0
    np.add.accumulate(survivals, out=theta[1:])  # np.cumsum's own loop, without its wrapper's overhead
    theta += num_requests
    if isinstance(num_requests, (int, np.integer)):
        sps = cost.sps_run(int(num_requests), theta.size)
    else:
        sps = cost.sps(num_requests + np.arange(theta.size))
    if objective == "tokens_x_sps":
        return np.multiply(theta, sps, out=theta)
    return np.divide(theta, cost.draft_s + 1.0 / sps, out=theta)
