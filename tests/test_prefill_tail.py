"""The tail a prompt prefilled on the decode device leaves on the decode steps after it: ``prefill.decode_tail_s``.

The serving loop's disaggregated prefill runs on the decode core between two steps, its time cut from the decode
clock; what it leaves in the caches is paid by the next steps, the first most. The field is read and checked like
every version-2 field; the engine charges ``decode_tail_s[k]`` per prompt that arrived before the k-th step back
(steps and everything else unchanged); the real loop's logged steps are priced the same way; the loop probe fits
it in the residual and in the drafter, and folds their sum into the profile.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from calibration.profiling.loop_costs import LoopCosts
from calibration.profiling.residual_fit import churn_fit, draft_factors
from calibration.profiling.step_prices import RECENT_PREFILLS, price_parts, priced_cycles
from policies import make_policy
from simulator import simulate
from simulator.costs import ProfileError, Version2Blocks, profile_from_dict, profile_to_dict
from simulator.costs.step_cost import target_cost
from simulator.specs import ClusterSpec
from tests.cost_factories import closed_spec

TAIL_S = [6e-4, 1.6e-4, 7e-5]  # the sizes the long-context loop probe's residual shows on the CPU


def _with_tail(raw: dict, tail: object) -> dict:
    data = copy.deepcopy(raw)
    data["prefill"]["decode_tail_s"] = tail
    return data


@pytest.fixture(scope="module")
def v2_raw(default_profile) -> dict:
    return Version2Blocks().apply(default_profile.raw, "test-v2.json")


def test_the_field_is_read_checked_and_round_trips(default_profile, v2_raw) -> None:
    assert profile_from_dict(v2_raw).decode_tail_s == ()
    profile = profile_from_dict(_with_tail(v2_raw, TAIL_S))
    assert profile.decode_tail_s == tuple(TAIL_S)
    assert profile.decode_tail_at_s(np.array([2.0, 0.0, 1.0, 5.0])) == pytest.approx(2 * TAIL_S[0] + TAIL_S[2])
    assert profile_from_dict(profile_to_dict(profile)).decode_tail_s == tuple(TAIL_S)
    with pytest.raises(ProfileError, match=r"^x\.json: field 'prefill\.decode_tail_s' needs version 2"):
        profile_from_dict(_with_tail(default_profile.raw, TAIL_S), "x.json")
    for bad in ([], [1e-4] * 9, 1e-4):
        with pytest.raises(ProfileError, match=r"^x\.json: field 'prefill\.decode_tail_s' must be a list of 1 to 8 "
                                               r"seconds \(one per decode step after a prefill\)"):
            profile_from_dict(_with_tail(v2_raw, bad), "x.json")
    with pytest.raises(ProfileError, match=r"^x\.json: field 'prefill\.decode_tail_s\[1\]' must be >= 0"):
        profile_from_dict(_with_tail(v2_raw, [1e-4, -1e-5]), "x.json")


def _arrivals_before_each_step(steps: pd.DataFrame, arrival_at: np.ndarray) -> np.ndarray:
    """[steps] requests that arrived after the previous step's start and by this step's start (closed loop: at a
    step's end, which is the next step's start; the engine plans that step after the arrival)."""
    first_step = np.searchsorted(steps["start_at"].to_numpy(), arrival_at, side="left")
    return np.bincount(first_step[first_step < len(steps)], minlength=len(steps)).astype(float)


@pytest.mark.parametrize(("policy", "users"), [("mtp1", 1), ("mtp1", 4), ("greedy", 3), ("none", 4)])
def test_the_engine_charges_each_step_for_the_prompts_that_arrived_before_it(v2_raw, policy, users) -> None:
    """Every logged step's target seconds beyond its price without the field are ``decode_tail_s[k]`` per request
    that arrived before the k-th step back, and only the durations move (one user: the steps are the same)."""
    base = profile_from_dict(v2_raw)
    tailed = profile_from_dict(_with_tail(v2_raw, TAIL_S))
    g = make_policy(policy).draft_tokens(3)
    spec = closed_spec(make_policy(policy), tailed, users, prompt_tokens=100, output_tokens=30, gamma=3,
                       duration_s=1.5, warmup_s=0.0)
    result = simulate(spec)
    steps = result.steps
    counts = _arrivals_before_each_step(steps, result.requests["arrival_at"].to_numpy())
    assert counts.sum() >= 10
    expected = sum(t * np.concatenate((np.zeros(k), counts[:len(counts) - k])) for k, t in enumerate(TAIL_S))
    if g <= 1:  # each request verifies g tokens: the price without the field follows from R and B alone
        plain_s = [target_cost(base, r, b, g, 0.0, np.zeros(0), np.zeros(0, dtype=np.int64)).verify_s
                   for r, b in zip(steps["num_requests"], steps["batch_tokens"], strict=True)]
        np.testing.assert_allclose(steps["verify_s"] - plain_s, expected, atol=1e-12)
    else:  # the same run without the field: compare the logged steps one by one where they are the same steps
        plain = simulate(replace(spec, profile=base)).steps
        n = min(len(plain), len(steps))
        same = (plain["batch_tokens"].to_numpy()[:n] == steps["batch_tokens"].to_numpy()[:n]).all()
        assert same or users > 1
        if same:
            np.testing.assert_allclose(steps["verify_s"][:n] - plain["verify_s"][:n], expected[:n], atol=1e-12)
        assert steps["verify_s"].sum() > plain["verify_s"][: len(steps)].sum()


def test_more_than_one_decode_engine_is_refused(v2_raw) -> None:
    spec = closed_spec(make_policy("mtp1"), profile_from_dict(_with_tail(v2_raw, TAIL_S), "tail.json"), 2)
    spec = replace(spec, cluster=ClusterSpec(num_decode_engines=2, num_prefill_instances=2,
                                             limits=spec.cluster.limits))
    with pytest.raises(ValueError, match=r"^profile tail\.json: prefill\.decode_tail_s prices prompts prefilled on "
                                         r"the decode engine's own device, which needs cluster\.num_decode_engines "
                                         r"= 1 \(got 2\)"):
        simulate(spec)


def test_logged_steps_are_priced_with_the_tail_of_their_recent_prefills(v2_raw) -> None:
    """``priced_cycles`` counts the prompts cut from the decode clock before each kept step and the steps before
    it (warm-up steps included), and ``price_parts`` charges them in the target's part."""
    n = 8
    steps = pd.DataFrame(dict(start_at=np.arange(n) * 0.01, end_at=np.arange(n) * 0.01 + 0.009, wait_s=0.0,
                              num_requests=2, batch_tokens=4, max_verified_tokens=1, context_tokens=400,
                              max_context_tokens=200, num_joined=0, num_left=0,
                              num_cut_prefills=[1, 0, 0, 2, 0, 1, 0, 0]))
    kept = priced_cycles(steps, warmup_s=0.02)  # steps 2..7
    assert kept[RECENT_PREFILLS[0]].tolist() == [0, 2, 0, 1, 0, 0]
    assert kept[RECENT_PREFILLS[1]].tolist() == [0, 0, 2, 0, 1, 0]
    assert kept[RECENT_PREFILLS[2]].tolist() == [1, 0, 0, 2, 0, 1]
    base, tailed = profile_from_dict(v2_raw), profile_from_dict(_with_tail(v2_raw, TAIL_S))
    extra = (price_parts(kept, tailed, "dspark", "mtp1", 1)["verify_s"]
             - price_parts(kept, base, "dspark", "mtp1", 1)["verify_s"])
    a, b, c = TAIL_S
    np.testing.assert_allclose(extra, [c, 2 * a, 2 * b, a + 2 * c, b, c], atol=1e-15)


def _probe_steps(rng: np.random.Generator, n: int) -> pd.DataFrame:
    reqs = rng.choice([1, 2, 4], n)
    cuts = rng.binomial(1, 0.15, n) * rng.integers(1, 3, n)
    steps = pd.DataFrame(dict(start_at=np.arange(n) * 0.01, end_at=np.arange(n) * 0.01 + 0.009, wait_s=0.0,
                              num_requests=reqs, batch_tokens=reqs * rng.integers(2, 9, n), num_joined=0,
                              num_left=0, num_cut_prefills=cuts, draft_tokens=rng.choice([1, 3], n)))
    return priced_cycles(steps, 0.0)


def test_the_probe_fits_recover_the_tail_in_the_residual_and_in_the_drafter() -> None:
    """Noise-free steps built from a known line, drafter factors and tails: the fits return them (a tail longer
    than the one in the steps comes back with zeros beyond it); a tail that comes out negative is dropped."""
    steps = _probe_steps(np.random.default_rng(1), 3000)
    lags = steps[list(RECENT_PREFILLS[:3])].to_numpy(float)
    reqs = steps["num_requests"].to_numpy()
    residual_tail, draft_tail = np.array(TAIL_S), np.array([4e-4, 1e-4, 0.0])
    steps = steps.assign(residual_s=1e-3 * np.sqrt(reqs) + 2e-5 * steps["batch_tokens"] + lags @ residual_tail,
                         iso_draft_s=1e-3 * (1 + reqs) * steps["draft_tokens"])
    factor = np.where(steps["draft_tokens"] == 1, np.interp(reqs, (1, 2, 4), (1.1, 1.2, 1.3)), 1.05)
    steps = steps.assign(draft_s=factor * steps["iso_draft_s"] + lags @ draft_tail)
    line = churn_fit(steps, (1, 2, 4), tail_steps=4)
    np.testing.assert_allclose(line.decode_tail_s, [*TAIL_S, 0.0], atol=1e-12)
    np.testing.assert_allclose(line.per_request_s, 1e-3 * np.sqrt([1, 2, 4]), rtol=1e-9)
    np.testing.assert_allclose(line.at(steps), steps["residual_s"], rtol=1e-9)
    grid, tail = draft_factors(steps, (1, 2, 4), (1, 3), tail_steps=3)
    np.testing.assert_allclose(grid, [[1.1, 1.05], [1.2, 1.05], [1.3, 1.05]], rtol=1e-9)
    np.testing.assert_allclose(tail, draft_tail, atol=1e-12)
    assert churn_fit(steps.assign(residual_s=steps["residual_s"] - 2 * TAIL_S[1] * lags[:, 1]), (1, 2, 4),
                     tail_steps=3).decode_tail_s[1] == 0.0


def test_the_fold_writes_the_sum_of_both_tails_through_the_last_step_that_pays(v2_raw, default_profile) -> None:
    costs = LoopCosts((1, 2), (1, 3), ((1.0, 1.0), (1.0, 1.0)), (0.0, 0.0), 0.0, 1.0, 0.0, 0.0, 0.0, 10,
                      residual_tail_s=(5e-4, 1e-4, 0.0, 0.0), draft_tail_s=(2e-4, 0.0, 3e-5, 0.0))
    folded = costs.fold(v2_raw)
    np.testing.assert_allclose(folded["prefill"]["decode_tail_s"], [7e-4, 1e-4, 3e-5], atol=1e-15)
    assert profile_from_dict(folded).decode_tail_s == pytest.approx((7e-4, 1e-4, 3e-5))
    assert "decode_tail_s" not in replace(costs, residual_tail_s=(0.0,) * 4, draft_tail_s=(0.0,) * 4).fold(
        v2_raw)["prefill"]
    with pytest.raises(ValueError, match=r"need a version-2 profile"):
        costs.fold(default_profile.raw)
