"""The vectorised policy helpers against plain-Python references, decision for decision.

The helpers in ``policies/base.py`` and the ``decide`` bodies of ``dspark``,
``greedy``, ``global_sync``, ``threshold`` and ``goodput`` are written for speed
(position-major survivals, partial sorts, a memo of SPS at whole batch-token
counts). The references below walk the definitions one candidate at a time:
the sorted path with its tie-break (survival descending, then position, then
request), Theta at every prefix with the same left-to-right sums, and the
policy rules of the DSpark paper. Every float is produced by the same IEEE
operations in the same order, so results must be equal exactly, not close.
Confidences come from a small set of values half of the time, so ties (within
a request when c = 1, and across requests) are common.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.base import (
    CostCurve,
    StepView,
    path_throughput,
    prefix_survival,
    sorted_survivals,
    survival_by_position,
    top_k_lengths,
)
from policies.dspark import DSpark, smooth_confidence
from policies.goodput import Goodput
from policies.greedy import GlobalSync, Greedy, search_capacity
from policies.threshold import Threshold

EXACT = settings(max_examples=75, deadline=None, derandomize=True, database=None)
TIE_VALUES = [0.0, 0.25, 0.5, 0.8, 0.9, 1.0]


# ---------------------------------------------------------------- references (one candidate at a time)


def ref_survival(confidence: np.ndarray) -> np.ndarray:
    survival = np.empty_like(confidence, dtype=np.float64)
    for r in range(confidence.shape[0]):
        running = 1.0
        for j in range(confidence.shape[1]):
            running = running * float(confidence[r, j]) if j else float(confidence[r, j])
            survival[r, j] = running
    return survival


def ref_path(survival: np.ndarray) -> list[tuple[float, int, int]]:
    """(value, position, request) of every positive entry, in the order Algorithm 1 walks them."""
    entries = [(float(survival[r, j]), j, r) for r in range(survival.shape[0]) for j in range(survival.shape[1])
               if survival[r, j] > 0.0]
    return sorted(entries, key=lambda e: (-e[0], e[1], e[2]))


def ref_theta(cost: CostCurve, num_requests: int, values: list[float], objective: str) -> list[float]:
    theta, running = [], 0.0
    for n in range(len(values) + 1):
        if n:
            running = running + values[n - 1] if n > 1 else values[0]
        expected = num_requests + running
        sps = float(np.interp(float(num_requests + n), cost.batch_tokens, cost.steps_per_s))
        theta.append(expected * sps if objective == "tokens_x_sps" else expected / (cost.draft_s + 1.0 / sps))
    return theta


def ref_lengths(path: list[tuple[float, int, int]], count: int, num_requests: int) -> list[int]:
    lengths = [0] * num_requests
    for _, _, r in path[:count]:
        lengths[r] += 1
    return lengths


def ref_first_argmax(theta: list[float]) -> int:
    best = 0
    for n, value in enumerate(theta):
        if value > theta[best]:
            best = n
    return best


def ref_early_stop(theta: list[float]) -> int:
    for n in range(1, len(theta)):
        if not theta[n] > theta[n - 1]:
            return n - 1
    return len(theta) - 1


def ref_capacity(pool: np.ndarray, cost: CostCurve, objective: str) -> int:
    values = [v for v, _, _ in ref_path(pool)]
    return ref_first_argmax(ref_theta(cost, pool.shape[0], values, objective))


# ---------------------------------------------------------------- strategies


@st.composite
def confidences(draw, num_requests: int, gamma: int) -> np.ndarray:
    size = num_requests * gamma
    if draw(st.booleans()):
        values = draw(st.lists(st.sampled_from(TIE_VALUES), min_size=size, max_size=size))
    else:
        values = draw(st.lists(st.floats(0.0, 1.0), min_size=size, max_size=size))
    return np.array(values, dtype=np.float64).reshape(num_requests, gamma)


@st.composite
def cost_curves(draw, max_batch_tokens: int) -> CostCurve:
    """A jagged SPS table with gaps between its points (so SPS is interpolated), covering 1..max_batch_tokens."""
    gaps = draw(st.lists(st.integers(1, 4), min_size=max_batch_tokens, max_size=max_batch_tokens))
    batch = np.concatenate(([1], 1 + np.cumsum(gaps)))
    batch = batch[: np.searchsorted(batch, max_batch_tokens) + 1]
    sps = np.array(draw(st.lists(st.floats(0.05, 50.0), min_size=batch.size, max_size=batch.size)))
    draft_s = draw(st.sampled_from([0.0, 0.013, 0.2]))
    return CostCurve(batch_tokens=batch, steps_per_s=sps, draft_s=draft_s)


@st.composite
def steps(draw) -> tuple[np.ndarray, CostCurve, tuple[np.ndarray, ...], np.ndarray]:
    """Current confidences, a cost curve, two stale pools (other sizes) and an EMA state with new-request rows."""
    num_requests, gamma = draw(st.integers(1, 10)), draw(st.integers(1, 8))
    confidence = draw(confidences(num_requests, gamma))
    old_sizes = [draw(st.integers(1, 12)) for _ in range(2)]
    cost = draw(cost_curves(max(num_requests, *old_sizes) * (1 + gamma)))
    pools = tuple(ref_survival(draw(confidences(size, gamma))) for size in old_sizes)
    smoothed = draw(confidences(num_requests, gamma))
    smoothed[draw(st.lists(st.integers(0, num_requests - 1), max_size=3))] = np.nan  # requests new to the batch
    return confidence, cost, pools, smoothed


# ---------------------------------------------------------------- helpers


@EXACT
@given(st.integers(1, 12), st.integers(1, 9), st.data())
def test_survival_matches_left_to_right_products(num_requests, gamma, data):
    conf = data.draw(confidences(num_requests, gamma))
    expected = ref_survival(conf)
    np.testing.assert_array_equal(survival_by_position(conf), expected.T)
    np.testing.assert_array_equal(prefix_survival(conf), expected)


@EXACT
@given(st.integers(1, 12), st.integers(1, 6), st.booleans(), st.data())
def test_sorted_survivals_and_top_k_match_the_walked_path(num_requests, gamma, position_major, data):
    survival = ref_survival(data.draw(confidences(num_requests, gamma)))
    if position_major:  # the layout the fast policies hand over: a transposed view of a [gamma, R] table
        survival = np.ascontiguousarray(survival.T).T
    path = ref_path(survival)
    values = sorted_survivals(survival)
    assert values.tolist() == [v for v, _, _ in path]
    for k in range(-1, survival.size + 2):
        expected = ref_lengths(path, max(k, 0), num_requests)
        assert top_k_lengths(survival, k).tolist() == expected, k
        if 0 < k <= len(path):
            assert top_k_lengths(survival, k, kth=path[k - 1][0]).tolist() == expected, k


def test_top_k_keeps_tie_order_when_ties_straddle_the_kth_entry():
    survival = np.array([[0.8, 0.8, 0.5], [0.9, 0.8, 0.0]])  # path: (1,1) 0.9, (0,1), (0,2), (1,2) 0.8, (0,3)
    assert top_k_lengths(survival, 2).tolist() == [1, 1]
    assert top_k_lengths(survival, 3).tolist() == [2, 1]
    assert top_k_lengths(survival, 3, kth=0.8).tolist() == [2, 1]
    assert top_k_lengths(survival, 4).tolist() == [2, 2]


@EXACT
@given(st.integers(1, 40), st.data())
def test_path_throughput_matches_entry_by_entry(num_requests, data):
    values = sorted(data.draw(st.lists(st.floats(1e-6, 1.0), max_size=60)), reverse=True)
    cost = data.draw(cost_curves(num_requests + len(values)))
    for objective in ("tokens_x_sps", "tokens_per_s"):
        theta = path_throughput(cost, num_requests, np.array(values), objective)
        assert theta.tolist() == ref_theta(cost, num_requests, values, objective)


def test_sps_run_equals_sps_and_refuses_batches_outside_the_table():
    cost = CostCurve(batch_tokens=np.array([2, 5, 9, 40]), steps_per_s=np.array([10.0, 7.5, 3.25, 1.0]))
    # Growing requests refill the memo; every answer equals the interpolation at those points.
    for first, count in [(2, 3), (3, 10), (2, 39), (30, 11), (2, 1)]:
        expected = cost.sps(np.arange(first, first + count))
        np.testing.assert_array_equal(cost.sps_run(first, count), expected)
    with pytest.raises(ValueError, match=r"batch of 1\.\.3 tokens is outside the profiled SPS table"):
        cost.sps_run(1, 3)
    with pytest.raises(ValueError, match=r"batch of 35\.\.41 tokens is outside"):
        cost.sps_run(35, 7)
    with pytest.raises(ValueError):
        cost.sps_run(35, 7)[0] = 1.0  # the memo is read-only


# ---------------------------------------------------------------- decisions


@EXACT
@given(steps(), st.sampled_from(["tokens_x_sps", "tokens_per_s"]))
def test_greedy_and_global_sync_match_the_reference(step, objective):
    confidence, cost, _, _ = step
    survival = ref_survival(confidence)
    path = ref_path(survival)
    theta = ref_theta(cost, confidence.shape[0], [v for v, _, _ in path], objective)
    for policy, count in [(Greedy(objective), ref_early_stop(theta)), (GlobalSync(objective), ref_first_argmax(theta))]:
        decision = policy.decide(StepView(confidence=confidence, cost=cost))
        assert decision.capacity == count, policy.name
        assert decision.lengths.tolist() == ref_lengths(path, count, confidence.shape[0]), policy.name
        np.testing.assert_array_equal(decision.pool, survival)


@EXACT
@given(steps(), st.sampled_from([0, 1, 2]), st.sampled_from([None, 0.0, 0.8]),
       st.sampled_from(["tokens_x_sps", "tokens_per_s"]), st.integers(0, 2))
def test_dspark_matches_the_reference(step, staleness, ema_decay, objective, num_old):
    confidence, cost, pools, smoothed = step
    history = pools[:num_old]
    view = StepView(confidence=confidence, cost=cost, history=history,
                    smoothed=smoothed if ema_decay is not None else None)
    decision = DSpark(staleness_steps=staleness, objective=objective, ema_decay=ema_decay).decide(view)
    ranked = confidence
    if ema_decay is not None:
        ranked = smooth_confidence(confidence, smoothed, ema_decay)
        np.testing.assert_array_equal(decision.smoothed, ranked)
    survival = ref_survival(ranked)
    if staleness == 0:
        capacity = ref_capacity(survival, cost, objective)
    elif len(history) >= staleness:
        capacity = ref_capacity(history[-staleness], cost, objective)
    else:
        capacity = 0
    assert decision.capacity == capacity
    assert decision.lengths.tolist() == ref_lengths(ref_path(survival), capacity, confidence.shape[0])
    np.testing.assert_array_equal(decision.pool, survival)


@EXACT
@given(steps(), st.sampled_from(TIE_VALUES + [0.3, 0.64]), st.sampled_from(["prefix", "position"]))
def test_threshold_matches_the_reference(step, theta, variant):
    confidence, cost, _, _ = step
    survival = ref_survival(confidence)
    expected = []
    for r in range(confidence.shape[0]):
        length = 0
        while length < confidence.shape[1] and (survival[r, length] if variant == "prefix"
                                                 else confidence[r, length]) >= theta:
            length += 1
        expected.append(length)
    decision = Threshold(theta=theta, variant=variant).decide(StepView(confidence=confidence, cost=cost))
    assert decision.lengths.tolist() == expected
    assert decision.capacity == sum(expected)
    np.testing.assert_array_equal(decision.pool, survival)


@EXACT
@given(steps(), st.sampled_from([1, 2]), st.sampled_from(["tokens_x_sps", "tokens_per_s"]))
def test_goodput_matches_the_reference(step, staleness, objective):
    confidence, cost, pools, _ = step
    decision = Goodput(staleness_steps=staleness, objective=objective).decide(
        StepView(confidence=confidence, cost=cost, history=pools))
    pool = pools[-staleness]
    num_old, gamma = pool.shape
    column_sums = pool.sum(axis=0)  # the policy's own definition: expected accepted tokens per position
    theta, running = [], 0.0
    for k in range(gamma + 1):
        if k:
            running = running + float(column_sums[k - 1]) if k > 1 else float(column_sums[0])
        sps = float(np.interp(float(num_old * (1 + k)), cost.batch_tokens, cost.steps_per_s))
        expected = num_old + running
        theta.append(expected * sps if objective == "tokens_x_sps" else expected / (cost.draft_s + 1.0 / sps))
    k = ref_first_argmax(theta)
    assert decision.lengths.tolist() == [min(k, confidence.shape[1])] * confidence.shape[0]
    np.testing.assert_array_equal(decision.pool, ref_survival(confidence))


# ---------------------------------------------------------------- larger tables, token budgets, NaN

# Tables up to 40 x 16 cross policies.base.SMALL_TABLE_ENTRIES, so both the kernels' own sort and numpy's
# vectorised sort (then the kernels) are compared. Tables are built from a drawn seed (fast to draw).


@st.composite
def budget_steps(draw) -> tuple[np.ndarray, CostCurve, tuple[np.ndarray, ...], int | None]:
    """Confidences (ties half of the time), a jagged interpolated cost curve, two stale pools of other sizes
    (survivals, so non-increasing rows) and a token budget (None, or anywhere from R to past every token).

    Ties of Theta itself come from flat stretches of SPS (half of the curves take only three values) and
    from survivals too small to change tau* (1e-17 is absorbed by R + ...), so that the early stop and the
    first argmax meet equal values."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    num_requests, gamma = draw(st.integers(1, 40)), draw(st.integers(1, 16))
    old_sizes = [draw(st.integers(1, 40)) for _ in range(2)]
    tied, flat = draw(st.booleans()), draw(st.booleans())

    def table(rows: int) -> np.ndarray:
        return rng.choice(TIE_VALUES + [1e-17], (rows, gamma)) if tied else rng.uniform(0.0, 1.0, (rows, gamma))

    max_tokens = max(num_requests, *old_sizes) * (1 + gamma)
    batch = np.concatenate(([1], 1 + np.cumsum(rng.integers(1, 5, max_tokens))))
    batch = batch[: np.searchsorted(batch, max_tokens) + 1]
    sps = rng.choice([0.5, 1.0, 2.0], batch.size) if flat else rng.uniform(0.05, 50.0, batch.size)
    cost = CostCurve(batch_tokens=batch, steps_per_s=sps, draft_s=draw(st.sampled_from([0.0, 0.013])))
    pools = tuple(ref_survival(table(size)) for size in old_sizes)
    budget = draw(st.one_of(st.none(), st.integers(num_requests, num_requests * (gamma + 1) + 2)))
    return table(num_requests), cost, pools, budget


def ref_counts(cost: CostCurve, num_requests: int, path: list, objective: str, draft_budget: int | None):
    """(early-stop count, full-search count) over the path cut after ``draft_budget`` entries."""
    values = [v for v, _, _ in path][:draft_budget]
    theta = ref_theta(cost, num_requests, values, objective)
    return ref_early_stop(theta), ref_first_argmax(theta)


@EXACT
@given(budget_steps(), st.sampled_from(["tokens_x_sps", "tokens_per_s"]))
def test_greedy_and_global_sync_match_the_reference_under_a_budget(step, objective):
    confidence, cost, _, budget = step
    survival = ref_survival(confidence)
    path = ref_path(survival)
    view = StepView(confidence=confidence, cost=cost, token_budget=budget)
    early, full = ref_counts(cost, confidence.shape[0], path, objective, view.draft_budget)
    for policy, count in [(Greedy(objective), early), (GlobalSync(objective), full)]:
        decision = policy.decide(view)
        assert decision.capacity == count, policy.name
        assert decision.lengths.tolist() == ref_lengths(path, count, confidence.shape[0]), policy.name
        np.testing.assert_array_equal(decision.pool, survival)


@EXACT
@given(budget_steps(), st.sampled_from([0, 1, 2]), st.sampled_from(["tokens_x_sps", "tokens_per_s"]))
def test_dspark_matches_the_reference_under_a_budget(step, staleness, objective):
    confidence, cost, pools, budget = step
    view = StepView(confidence=confidence, cost=cost, history=pools, token_budget=budget)
    decision = DSpark(staleness_steps=staleness, objective=objective).decide(view)
    survival = ref_survival(confidence)
    pool = survival if staleness == 0 else pools[-staleness]
    capacity = ref_counts(cost, pool.shape[0], ref_path(pool), objective, view.draft_budget)[1]
    assert decision.capacity == capacity
    assert decision.lengths.tolist() == ref_lengths(ref_path(survival), capacity, confidence.shape[0])


@EXACT
@given(budget_steps(), st.sampled_from(TIE_VALUES + [0.3, 0.64]), st.sampled_from(["prefix", "position"]))
def test_threshold_matches_the_reference_under_a_budget(step, theta, variant):
    confidence, cost, _, budget = step
    survival = ref_survival(confidence)
    room = None if budget is None else budget - confidence.shape[0]
    untrimmed = [sum(1 for j in range(confidence.shape[1]) if survival[r, j] >= theta) if variant == "prefix"
                 else next((j for j in range(confidence.shape[1]) if not confidence[r, j] >= theta),
                           confidence.shape[1]) for r in range(confidence.shape[0])]
    expected, before = [], 0
    for length in untrimmed:  # requests scheduled last are cut first
        expected.append(length if room is None or sum(untrimmed) <= room else min(max(room - before, 0), length))
        before += length
    decision = Threshold(theta=theta, variant=variant).decide(
        StepView(confidence=confidence, cost=cost, token_budget=budget))
    assert decision.lengths.tolist() == expected
    assert decision.capacity == sum(expected)


# The numpy formulation of the previous revision, for what the one-candidate references do not define: NaN.
def numpy_top_k(survival: np.ndarray, k: int, kth: float | None = None) -> list[int]:
    num_requests, gamma = survival.shape
    if k <= 0:
        return [0] * num_requests
    flat = np.ascontiguousarray(survival.T).ravel()
    if k < flat.size:
        kth = np.partition(flat, flat.size - k)[flat.size - k] if kth is None else kth
        if kth > 0.0 and np.count_nonzero(flat >= kth) == k:
            return (flat >= kth).reshape(gamma, num_requests).sum(axis=0).tolist()
    positive = flat > 0.0
    if k >= np.count_nonzero(positive):
        admitted = positive
    else:
        admitted = flat > kth
        admitted[np.flatnonzero(flat == kth)[: k - np.count_nonzero(admitted)]] = True
    return admitted.reshape(gamma, num_requests).sum(axis=0).tolist()


def numpy_descending(survival: np.ndarray) -> np.ndarray:
    values = -np.sort(-survival, axis=None)
    return values[: np.count_nonzero(values > 0.0)]


@EXACT
@given(budget_steps(), st.data())
def test_decisions_with_nan_confidences_match_the_numpy_formulation(step, data):
    confidence, cost, pools, budget = step
    holes = data.draw(st.lists(st.tuples(st.integers(0, confidence.shape[0] - 1),
                                         st.integers(0, confidence.shape[1] - 1)), min_size=1, max_size=6))
    for r, j in holes:
        confidence[r, j] = np.nan
    survival = np.cumprod(confidence, axis=1)
    view = StepView(confidence=confidence, cost=cost, history=pools, token_budget=budget)
    values = numpy_descending(survival)[:view.draft_budget]
    theta = ref_theta(cost, confidence.shape[0], values.tolist(), "tokens_x_sps")
    count = ref_early_stop(theta)
    greedy = Greedy().decide(view)
    assert greedy.capacity == count
    assert greedy.lengths.tolist() == numpy_top_k(survival, count)  # NaN: no k-th value handed over
    assert GlobalSync().decide(view).lengths.tolist() == numpy_top_k(survival, ref_first_argmax(theta))
    dspark = DSpark().decide(view)
    assert dspark.lengths.tolist() == numpy_top_k(survival, dspark.capacity)
    np.testing.assert_array_equal(dspark.pool, survival)
    for k in range(survival.size + 1):
        assert top_k_lengths(survival, k).tolist() == numpy_top_k(survival, k), k


@EXACT
@given(budget_steps())
def test_a_stale_pool_with_nan_sizes_capacity_from_its_positive_entries(step):
    _, cost, pools, _ = step
    pool = pools[0].copy()
    pool[0, -1] = np.nan
    values = [v for v in numpy_descending(pool).tolist()]
    expected = ref_first_argmax(ref_theta(cost, pool.shape[0], values, "tokens_x_sps"))
    assert search_capacity(pool, cost, "tokens_x_sps") == expected
    assert search_capacity(np.asfortranarray(pool), cost, "tokens_x_sps") == expected  # a transposed layout


def test_sps_within_stops_where_the_profile_ends():
    cost = CostCurve(batch_tokens=np.array([2, 5, 9, 40]), steps_per_s=np.array([10.0, 7.5, 3.25, 1.0]))
    np.testing.assert_array_equal(cost.sps_within(3, 10), cost.sps(np.arange(3, 13)))
    np.testing.assert_array_equal(cost.sps_within(35, 10), cost.sps(np.arange(35, 41)))  # 35..40 only
    assert cost.sps_within(1, 5).size == 0 and cost.sps_within(41, 2).size == 0


def test_a_path_past_the_profile_raises_the_profile_error():
    cost = CostCurve(batch_tokens=np.array([1, 4]), steps_per_s=np.array([2.0, 1.0]))
    view = StepView(confidence=np.full((2, 3), 0.9), cost=cost, history=(np.full((2, 3), 0.9),) * 2)
    for policy in (Greedy(), GlobalSync(), DSpark()):
        with pytest.raises(ValueError, match=r"batch of 2\.\.8 tokens is outside the profiled SPS table"):
            policy.decide(view)
