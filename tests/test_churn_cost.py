"""The engine's work for requests joining and leaving the batch and for waking from idle: ``verify.join_s``,
``verify.leave_s`` and ``verify.wake_s`` (v2).

A real loop moves a request's caches into the batch when it joins and takes them out when it finishes; that work
lands in the first and the last step of every request. The first step after the loop sat idle runs slower too
(caches and clocks have gone cold). The fields are read and checked like every version-2 number, the engine charges
them in exactly those steps (the steps and everything else stay as they were), the loop probe fits them beside its
per-R line, and the real loop's logged steps are priced with them.
"""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest

from calibration.profiling.loop_costs import LoopCosts
from calibration.profiling.residual_fit import churn_fit, draft_factors
from calibration.profiling.step_prices import price_parts
from policies import make_policy
from simulator import simulate
from simulator.costs import ProfileError, Version2Blocks, profile_from_dict, profile_to_dict
from simulator.costs.step_cost import target_cost
from tests.cost_factories import closed_spec

JOIN_S, LEAVE_S, WAKE_S = 1e-4, 1.5e-4, 4e-4  # the sizes the validation's real steps show on the CPU


def _with(raw: dict, **fields: float) -> dict:
    data = copy.deepcopy(raw)
    data["verify"].update(fields)
    return data


@pytest.fixture(scope="module")
def v2_raw(default_profile) -> dict:
    return Version2Blocks().apply(default_profile.raw, "test-v2.json")


def test_the_fields_are_read_checked_and_round_trip(default_profile, v2_raw) -> None:
    assert profile_from_dict(v2_raw).churn_s(3, 2) == 0.0  # absent: nothing charged
    profile = profile_from_dict(_with(v2_raw, join_s=JOIN_S, leave_s=LEAVE_S, wake_s=WAKE_S))
    assert profile.churn_s(3, 2) == pytest.approx(3 * JOIN_S + 2 * LEAVE_S)
    assert profile.churn_s(0, 0, woke=True) == WAKE_S
    assert profile_from_dict(profile_to_dict(profile)).churn_s(1, 1) == pytest.approx(JOIN_S + LEAVE_S)
    with pytest.raises(ProfileError, match=r"^x\.json: field 'verify\.join_s' needs version 2 \(this file says "
                                           r"version 1\)$"):
        profile_from_dict(_with(default_profile.raw, join_s=JOIN_S), "x.json")
    with pytest.raises(ProfileError, match=r"^x\.json: field 'verify\.leave_s' must be >= 0, got -1e-05$"):
        profile_from_dict(_with(v2_raw, leave_s=-1e-5), "x.json")


@pytest.mark.parametrize("policy", ["mtp3", "greedy"])
def test_the_engine_charges_each_request_once_in_its_first_and_last_step(v2_raw, policy) -> None:
    """One user: every request runs alone, so the steps are the same with and without the fields and only their
    durations move - by join_s in each request's first step and leave_s in its last, and by wake_s in the first,
    because the engine sat idle while the request's prefill ran on the prefill instance."""
    base = profile_from_dict(v2_raw)
    churned = profile_from_dict(_with(v2_raw, join_s=JOIN_S, leave_s=LEAVE_S, wake_s=WAKE_S))
    spec = closed_spec(make_policy(policy), base, 1, prompt_tokens=100, output_tokens=40, gamma=3,
                       duration_s=2.0, warmup_s=0.0)
    plain = simulate(spec)
    charged = simulate(spec.__class__(**{**vars(spec), "profile": churned}))
    n = min(len(plain.steps), len(charged.steps)) - 1
    a, b = plain.steps.iloc[:n], charged.steps.iloc[:n]
    np.testing.assert_array_equal(a["num_verified_tokens"], b["num_verified_tokens"])  # the same steps
    np.testing.assert_array_equal(a["num_emitted_tokens"], b["num_emitted_tokens"])
    reqs = plain.requests
    first = np.isin(a["start_at"], reqs["decode_start_at"]).astype(float)
    last = np.isin(a["end_at"], reqs["finished_at"]).astype(float)
    assert first.sum() > 10 and last.sum() > 10
    extra_s = (JOIN_S + WAKE_S) * first + LEAVE_S * last
    np.testing.assert_allclose((b["end_at"] - b["start_at"]) - (a["end_at"] - a["start_at"]), extra_s, atol=1e-12)
    np.testing.assert_allclose(b["verify_s"] - a["verify_s"], extra_s, atol=1e-12)


def test_many_users_pay_for_every_join_and_leave(v2_raw) -> None:
    """Eight users with short outputs, mtp1 (each request verifies one token, so a step's price without the fields
    follows from its R and B alone): over the run, the logged target time beyond that price is join_s for every
    request that started decoding and leave_s for every one that finished."""
    base = profile_from_dict(v2_raw)
    churned = profile_from_dict(_with(v2_raw, join_s=JOIN_S, leave_s=LEAVE_S))
    spec = closed_spec(make_policy("mtp1"), churned, 8, prompt_tokens=50, output_tokens=12, gamma=1,
                       duration_s=1.0, warmup_s=0.0)
    result = simulate(spec)
    steps, reqs = result.steps, result.requests
    plain_s = [target_cost(base, r, b, 1, 0.0, np.zeros(0), np.zeros(0, dtype=np.int64)).verify_s
               for r, b in zip(steps["num_requests"], steps["batch_tokens"], strict=True)]
    joined = int((reqs["decode_start_at"] <= steps["start_at"].iloc[-1]).sum())
    left = int((reqs["finished_at"] <= steps["end_at"].iloc[-1]).sum())
    assert joined > 100 and left > 100
    assert (steps["verify_s"] - plain_s).sum() == pytest.approx(JOIN_S * joined + LEAVE_S * left, rel=1e-9)


def test_the_probe_fit_recovers_join_and_leave_costs() -> None:
    rng = np.random.default_rng(0)
    n = 4000
    users = rng.choice([1, 2, 4], n)
    joined, left = rng.binomial(users, 0.1), rng.binomial(users, 0.1)
    slept = np.where(users == 1, joined, rng.binomial(1, 0.02, n))  # one user: every join follows a sleep
    tokens = users * rng.integers(2, 9, n)
    residual = (1e-3 * users ** 0.5 + 2e-5 * tokens + JOIN_S * joined + LEAVE_S * left + WAKE_S * slept
                + rng.normal(0, 5e-5, n))
    steps = pd.DataFrame(dict(num_requests=users, batch_tokens=tokens, num_joined=joined, num_left=left,
                              wait_s=1e-3 * slept, residual_s=residual))
    fit = churn_fit(steps, (1, 2, 4))
    assert fit.join_s == pytest.approx(JOIN_S, abs=1e-5) and fit.leave_s == pytest.approx(LEAVE_S, abs=1e-5)
    assert fit.wake_s == pytest.approx(WAKE_S, abs=2e-5)
    assert fit.per_batch_token_s == pytest.approx(2e-5, rel=0.02)
    np.testing.assert_allclose(fit.per_request_s, 1e-3 * np.array([1, 2, 4]) ** 0.5, atol=1e-5)
    # a negative estimate is noise, not work that makes a step faster: that column is dropped and the rest refitted
    steps["residual_s"] = residual - 2 * LEAVE_S * left
    assert churn_fit(steps, (1, 2, 4)).leave_s == 0.0


def test_steps_between_the_probed_r_count_under_the_tables_interpolation() -> None:
    """A probe at r users also runs steps with fewer requests (one away for its prefill): each counts at its own R.
    A per-request residual that is linear between the probed R (1, 2, 4, 8), read at steps of every R from 1 to 8,
    comes back exactly at the knots; a knot with no step at it is an error that names it."""
    knots, table_s = (1, 2, 4, 8), np.array([1.0e-3, 1.4e-3, 2.6e-3, 3.0e-3])
    reqs = np.repeat(np.arange(1, 9), 25)
    tokens = reqs * (1 + np.tile(np.arange(25) % 4, 8))
    steps = pd.DataFrame(dict(num_requests=reqs, batch_tokens=tokens, num_joined=0, num_left=0, wait_s=0.0,
                              residual_s=np.interp(reqs, knots, table_s) + 3e-5 * tokens))
    fit = churn_fit(steps, knots)
    np.testing.assert_allclose(fit.per_request_s, table_s, rtol=1e-9)
    assert fit.per_batch_token_s == pytest.approx(3e-5, rel=1e-9)
    with pytest.raises(ValueError, match=r"the loop probe ran no step at R = \[8\] of the probed \[1, 2, 4, 8\]"):
        churn_fit(steps[steps["num_requests"] < 8], knots)


def test_the_drafter_factor_is_the_ratio_of_sums_at_one_r_and_interpolates_between() -> None:
    """At one probed R the factor is the steps' measured over isolated seconds, summed (a mean over steps, as
    throughput is); steps between probed R recover a factor that is linear between them; a draft length no step
    ran at is NaN."""
    iso_s, real_s = np.array([1e-3, 2e-3, 4e-3]), np.array([1.5e-3, 2.0e-3, 7.5e-3])
    one = pd.DataFrame(dict(num_requests=4, draft_tokens=3, iso_draft_s=iso_s, draft_s=real_s))
    np.testing.assert_allclose(draft_factors(one, (4,), (1, 3))[0], [[np.nan, real_s.sum() / iso_s.sum()]], rtol=1e-12)
    reqs = np.arange(1, 9)
    iso = 1e-3 * (1 + reqs)
    factor = np.interp(reqs, (1, 4, 8), (1.2, 1.5, 1.1))
    steps = pd.DataFrame(dict(num_requests=reqs, draft_tokens=1, iso_draft_s=iso, draft_s=factor * iso))
    np.testing.assert_allclose(np.array(draft_factors(steps, (1, 4, 8), (1,))[0])[:, 0], [1.2, 1.5, 1.1], rtol=1e-9)


def test_logged_steps_are_priced_with_their_joins_and_leaves(v2_raw) -> None:
    churned = profile_from_dict(_with(v2_raw, join_s=JOIN_S, leave_s=LEAVE_S, wake_s=WAKE_S))
    steps = pd.DataFrame(dict(num_requests=[2, 2], batch_tokens=[6, 6], max_verified_tokens=[2, 2],
                              context_tokens=[300, 300], max_context_tokens=[200, 200], num_joined=[1, 0],
                              num_left=[0, 2], wait_s=[0.004, 0.0]))
    plain = price_parts(steps, profile_from_dict(v2_raw), "dspark", "mtp3", 3)
    priced = price_parts(steps, churned, "dspark", "mtp3", 3)
    np.testing.assert_allclose(priced["verify_s"] - plain["verify_s"], [JOIN_S + WAKE_S, 2 * LEAVE_S], rtol=1e-12)
    # a steps table logged before the loop counted joins and leaves: priced without them, as recorded
    older = price_parts(steps.drop(columns=["num_joined", "num_left"]), churned, "dspark", "mtp3", 3)
    np.testing.assert_allclose(older["verify_s"], plain["verify_s"], rtol=1e-12)


def test_the_loop_costs_write_them_into_version2_profiles_only(default_profile, v2_raw) -> None:
    costs = LoopCosts(num_requests=(1, 4), draft_tokens=(1, 7), draft_factor=((1.0, 1.0), (1.0, 1.0)),
                      extra_per_request_s=(0.0, 0.0), extra_per_batch_token_s=0.0, prefill_factor=1.0,
                      host_fixed_s=0.0, host_per_request_s=0.0, host_per_verified_token_s=0.0, num_steps=10,
                      join_s=JOIN_S, leave_s=LEAVE_S, wake_s=WAKE_S)
    folded = profile_from_dict(costs.fold(v2_raw))
    assert folded.churn_s(1, 1, woke=True) == pytest.approx(JOIN_S + LEAVE_S + WAKE_S)
    assert "verify.join_s, leave_s, wake_s" in folded.metadata["loop_costs"]["folded"]
    # version 1 has no such fields (the probe fits them only for version 2): refused, never dropped
    with pytest.raises(ValueError, match="join_s, leave_s, wake_s and the prefill tail need a version-2 profile"):
        costs.fold(default_profile.raw)
