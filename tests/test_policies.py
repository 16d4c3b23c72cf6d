"""Policies: Algorithm 1 against brute force, Appendix A, dspark's capacity and prefix rules."""

from __future__ import annotations

import itertools
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import PolicyMemory, make_policy, policy_classes
from policies.base import Decision, StepView, path_throughput, prefix_survival, sorted_candidates, top_k_lengths
from policies.dspark import DSpark
from policies.greedy import GlobalSync, Greedy, early_stop_count
from tests.conftest import curve

# DSpark paper, Appendix A: one request, gamma = 2, SPS(1..3) = (1.0, 0.5, 0.45), a_1 = 0.8.
APPENDIX_A_SPS = [1.0, 0.5, 0.45]


@pytest.mark.parametrize(
    "c2, expected_theta",
    [
        (0.9, [1.0, 0.9, 1.134]),  # x_1 = A: c_2 = 0.9 -> a_2 = 0.72
        (0.0, [1.0, 0.9, 0.81]),  # x_1 = B: c_2 = 0 -> a_2 = 0 (still priced at B = 3 by the paper)
    ],
)
def test_appendix_a_throughputs_exact(c2, expected_theta):
    cost = curve(APPENDIX_A_SPS)
    survival = np.array([0.8, 0.8 * c2])  # the paper evaluates both path entries
    theta = path_throughput(cost, 1, survival)
    np.testing.assert_allclose(theta, expected_theta, rtol=0, atol=1e-12)


@pytest.mark.parametrize("c2, greedy_len, global_len", [(0.9, 0, 2), (0.0, 0, 0)])
def test_appendix_a_decisions(c2, greedy_len, global_len):
    view = StepView(confidence=np.array([[0.8, c2]]), cost=curve(APPENDIX_A_SPS))
    assert Greedy().decide(view).lengths.tolist() == [greedy_len]  # early stop: Theta_1 < Theta_0
    assert GlobalSync().decide(view).lengths.tolist() == [global_len]  # looks at c_2: depends on x_1


def brute_force_best(confidence: np.ndarray, cost) -> float:
    """Max Theta over every allocation (l_1..l_R) in {0..gamma}^R."""
    survival = prefix_survival(confidence)
    num_requests, gamma = survival.shape
    best = -np.inf
    for lengths in itertools.product(range(gamma + 1), repeat=num_requests):
        expected = num_requests + sum(survival[r, :n].sum() for r, n in enumerate(lengths))
        batch = num_requests + sum(lengths)
        best = max(best, float(expected * cost.sps(batch)))
    return best


@st.composite
def unimodal_cases(draw):
    """Random confidences and a smooth, decreasing-returns SPS curve (Theta unimodal on the path)."""
    num_requests = draw(st.integers(1, 3))
    gamma = draw(st.integers(1, 3))
    conf = np.array(draw(st.lists(st.floats(0.05, 1.0), min_size=num_requests * gamma,
                                  max_size=num_requests * gamma))).reshape(num_requests, gamma)
    base_s = draw(st.floats(0.5, 5.0))
    per_token_s = draw(st.floats(0.0, 2.0))
    max_b = num_requests * (1 + gamma)
    # Step time affine in B: SPS convex and decreasing, so tau* x SPS is unimodal along a path of
    # non-increasing gains.
    cost = curve([1.0 / (base_s + per_token_s * b) for b in range(1, max_b + 1)])
    return conf, cost


@settings(max_examples=150, deadline=None, derandomize=True)
@given(unimodal_cases())
def test_greedy_equals_brute_force_when_unimodal(case):
    conf, cost = case
    view = StepView(confidence=conf, cost=cost)
    decision = Greedy().decide(view)
    survival = prefix_survival(conf)
    lengths = decision.lengths
    achieved = (conf.shape[0] + sum(survival[r, :n].sum() for r, n in enumerate(lengths))) * \
        cost.sps(conf.shape[0] + lengths.sum())
    assert achieved == pytest.approx(brute_force_best(conf, cost), rel=1e-12)


def test_greedy_stops_at_first_non_increase_on_jagged_curve():
    # Theta dips at B = 3 and recovers at B = 4: the early stop is trapped, the full search is not.
    cost = curve([1.0, 0.9, 0.5, 0.8, 0.8])
    view = StepView(confidence=np.array([[1.0, 1.0, 1.0, 1.0]]), cost=cost)
    assert Greedy().decide(view).lengths.tolist() == [1]
    assert GlobalSync().decide(view).lengths.tolist() == [4]  # Theta = 1, 1.8, 1.5, 3.2, 4.0


def test_ties_break_by_position_then_request():
    survival = np.array([[0.8, 0.8, 0.5], [0.9, 0.8, 0.0]])
    requests, positions, values = sorted_candidates(survival)
    assert list(zip(requests.tolist(), positions.tolist(), strict=True)) == [(1, 1), (0, 1), (0, 2), (1, 2), (0, 3)]
    np.testing.assert_array_equal(values, [0.9, 0.8, 0.8, 0.8, 0.5])


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.integers(1, 6), st.integers(1, 5), st.integers(0, 40), st.data())
def test_top_k_matches_walking_the_sorted_path(num_requests, gamma, k, data):
    # Confidences from a small set so that ties (and c = 1) are common.
    conf = np.array(data.draw(st.lists(st.sampled_from([0.0, 0.5, 0.8, 1.0]), min_size=num_requests * gamma,
                                       max_size=num_requests * gamma))).reshape(num_requests, gamma)
    survival = prefix_survival(conf)
    requests, _, _ = sorted_candidates(survival)
    expected = np.bincount(requests[:k], minlength=num_requests)
    np.testing.assert_array_equal(top_k_lengths(survival, k), expected)


def test_early_stop_count():
    assert early_stop_count(np.array([1.0, 2.0, 3.0])) == 2
    assert early_stop_count(np.array([1.0, 1.0, 3.0])) == 0
    assert early_stop_count(np.array([1.0, 2.0, 2.0, 3.0])) == 1


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.integers(1, 8), st.integers(1, 6), st.integers(1, 2), st.data())
def test_dspark_admits_prefixes_and_sizes_capacity_from_older_pool(num_requests, gamma, staleness, data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    cost = curve(list(1.0 / (1.0 + 0.05 * np.arange(max(num_requests, 8) * (1 + gamma)))))
    old_pools = tuple(rng.uniform(0, 1, (rng.integers(1, 9), gamma)).cumprod(axis=1) for _ in range(2))
    policy = DSpark(staleness_steps=staleness)
    first = policy.decide(StepView(confidence=rng.uniform(0, 1, (num_requests, gamma)), cost=cost, history=old_pools))
    second = policy.decide(StepView(confidence=rng.uniform(0, 1, (num_requests, gamma)), cost=cost, history=old_pools))
    # Capacity depends only on the old pool: new current confidences leave K unchanged.
    assert first.capacity == second.capacity
    for decision in (first, second):
        assert decision.lengths.sum() == min(decision.capacity, np.count_nonzero(decision.pool > 0))
        # A prefix: (r, j) admitted implies (r, j - 1) admitted, i.e. everything admitted has a >= the rest.
        for r, length in enumerate(decision.lengths):
            if 0 < length < gamma:
                assert decision.pool[r, length - 1] >= decision.pool[r, length]


def test_dspark_capacity_changes_with_the_old_pool_only():
    cost = curve(list(1.0 / (1.0 + 0.2 * np.arange(40))))
    conf = np.full((2, 4), 0.9)
    confident = (np.full((2, 4), 0.99).cumprod(axis=1),)
    doubtful = (np.full((2, 4), 0.05).cumprod(axis=1),)
    assert DSpark(staleness_steps=1).decide(StepView(conf, cost, history=confident)).capacity > 0
    assert DSpark(staleness_steps=1).decide(StepView(conf, cost, history=doubtful)).capacity == 0


def test_dspark_without_history_verifies_nothing():
    view = StepView(confidence=np.full((3, 4), 0.9), cost=curve([1.0] * 20))
    assert DSpark().decide(view).lengths.tolist() == [0, 0, 0]


def test_dspark_staleness_zero_is_flagged_lossy():
    assert not DSpark(staleness_steps=0).lossless
    assert DSpark(staleness_steps=1).lossless and DSpark(staleness_steps=2).lossless
    assert not GlobalSync().lossless


def test_dspark_ema_smooths_over_steps():
    policy = DSpark(staleness_steps=1, ema_decay=0.8)
    conf = np.array([[0.5, 0.5]])
    first = policy.decide(StepView(conf, curve([1.0] * 10), smoothed=np.full((1, 2), np.nan)))
    np.testing.assert_allclose(first.smoothed, conf)  # a new request starts at its confidence
    second = policy.decide(StepView(np.array([[1.0, 1.0]]), curve([1.0] * 10), smoothed=first.smoothed))
    np.testing.assert_allclose(second.smoothed, [[0.6, 0.6]])


@pytest.mark.parametrize(
    "name, conf, expected",
    [
        ("mtp3", [[0.1, 0.1, 0.1, 0.1]], [3]),  # static: confidences ignored
        ("none", [[1.0, 1.0]], [0]),
    ],
)
def test_static_policies(name, conf, expected):
    view = StepView(confidence=np.array(conf), cost=curve([1.0] * 10))
    assert make_policy(name).decide(view).lengths.tolist() == expected


@pytest.mark.parametrize(
    "variant, conf, expected",
    [
        ("prefix", [[0.9, 0.9, 0.9]], [2]),  # survivals 0.9, 0.81, 0.729 vs theta 0.8
        ("position", [[0.9, 0.9, 0.9]], [3]),  # every c >= 0.8
        ("position", [[0.9, 0.7, 0.9]], [1]),  # the prefix stops at the first c < theta
    ],
)
def test_threshold_variants(variant, conf, expected):
    view = StepView(confidence=np.array(conf), cost=curve([1.0] * 10))
    assert make_policy("threshold", theta=0.8, variant=variant).decide(view).lengths.tolist() == expected


def test_oracle_verifies_only_accepted_tokens():
    view = StepView(confidence=np.full((3, 4), 0.5), cost=curve([1.0] * 20), accepted=np.array([0, 2, 4]))
    assert make_policy("oracle").decide(view).lengths.tolist() == [0, 2, 4]  # flat SPS: verify all good ones


def test_goodput_picks_one_k_from_the_stale_pool():
    cost = curve(list(1.0 / (1.0 + 0.01 * np.arange(40))))
    sure = (np.ones((4, 5)),)
    view = StepView(confidence=np.full((4, 5), 0.1), cost=cost, history=sure)
    assert make_policy("goodput").decide(view).lengths.tolist() == [5, 5, 5, 5]


def test_registry_errors_name_the_valid_choices():
    with pytest.raises(ValueError, match="valid policies: .*dspark.*greedy"):
        make_policy("nope")
    with pytest.raises(ValueError, match="has no parameter.*staleness.*parameters are"):
        make_policy("greedy", staleness=2)
    with pytest.raises(ValueError, match="staleness_steps must be 0, 1 or 2"):
        make_policy("dspark", staleness_steps=3)
    assert make_policy("mtp7").k == 7


def test_policies_import_no_simulator_framework_torch_or_hydra():
    """policies/ decides only: importing it (every policy module included) loads no simpy, torch or hydra."""
    code = ("import sys, policies, policies.lossless.exact, policies.lossless.sampler\n"
            "policies.policy_classes()\n"
            "print(sorted(m for m in ('simpy', 'torch', 'hydra', 'omegaconf', 'matplotlib', 'pandas') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_policy_module_is_discovered():
    """Each top-level policy module registers at least one policy, and every policy declares its traits."""
    import pkgutil

    import policies
    classes = policies.policy_classes()
    modules = {m.name for m in pkgutil.iter_modules(policies.__path__) if not m.ispkg}
    not_policies = {"base", "driver", "kernels", "registry"}
    assert modules - not_policies == {cls.__module__.split(".")[-1] for cls in classes.values()}
    for name in classes:
        policy = make_policy(name)
        assert isinstance(policy.lossless, bool) and isinstance(policy.synchronous, bool), name


@pytest.mark.parametrize("cls", [StepView, Decision, PolicyMemory])
def test_hand_written_inits_take_exactly_the_fields(cls):
    """StepView, Decision and PolicyMemory fill their dict in one update (they are built every step): their __init__
    must take every field, in order, with the field's default, and the instances must stay frozen."""
    import dataclasses
    import inspect

    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    fields = dataclasses.fields(cls)
    assert [p.name for p in params] == [f.name for f in fields]
    for param, fld in zip(params, fields, strict=True):
        default = fld.default_factory() if fld.default_factory is not dataclasses.MISSING else fld.default
        assert param.default is inspect.Parameter.empty if default is dataclasses.MISSING else param.default == default
    value = cls(*[np.zeros(1)] * sum(p.default is inspect.Parameter.empty for p in params))
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, fields[0].name, None)
    copy = dataclasses.replace(value)  # replace() goes through __init__ with every field
    assert all(getattr(copy, f.name) is getattr(value, f.name) for f in fields)


class _UnreadableCost:
    """A cost curve that fails on any use: what a policy declaring ``reads_cost = False`` must never touch."""

    def __getattr__(self, name):
        raise AssertionError(f"the policy read view.cost.{name}")


@pytest.mark.parametrize("name", sorted(n for n, cls in policy_classes().items() if not cls.reads_cost))
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_a_policy_that_reads_no_cost_decides_without_it(name, data):
    """The real loop hands policies with ``reads_cost = False`` no cost curve (building one costs host time every
    step): their decisions must not depend on it."""
    policy = make_policy(name)
    num_requests, gamma = data.draw(st.integers(1, 6)), data.draw(st.integers(1, 5))
    conf = np.array(data.draw(st.lists(st.floats(0.0, 1.0), min_size=num_requests * gamma,
                                       max_size=num_requests * gamma))).reshape(num_requests, gamma)
    budget = data.draw(st.none() | st.integers(num_requests, num_requests * (1 + gamma)))
    history = (np.full((num_requests, gamma), 0.5),) * policy.history_steps
    priced = policy.decide(StepView(conf, curve([1.0] * 64), history=history, token_budget=budget))
    blind = policy.decide(StepView(conf, _UnreadableCost(), history=history, token_budget=budget))
    assert blind.lengths.tolist() == priced.lengths.tolist() and blind.capacity == priced.capacity


@pytest.mark.parametrize("name", sorted(n for n, cls in policy_classes().items() if cls.reads_cost))
def test_the_policies_that_keep_reads_cost_do_read_it(name):
    """The other side: each policy left at ``reads_cost = True`` really prices its steps, so the flag is not
    merely conservative (a policy that reads nothing should say so and save the loop the curve)."""
    policy = make_policy(name)
    conf = np.full((3, 4), 0.7)
    view = StepView(conf, _UnreadableCost(), history=(conf,) * policy.history_steps,
                    smoothed=np.full((3, 4), np.nan), accepted=np.array([1, 2, 3]))
    with pytest.raises(AssertionError, match="read view.cost"):
        policy.decide(view)
