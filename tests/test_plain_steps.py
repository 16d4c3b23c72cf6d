"""Pricing a policy that drafts nothing: the loop probe's ``none`` steps and prefills
(calibration.profiling.plain_steps), and the profile's ``prefill.draft_share`` in the simulator."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from calibration.profiling import loop_costs, plain_steps, policy_steps
from calibration.profiling.loop_costs import LoopCosts
from calibration.profiling.step_prices import static_attention_s
from policies import make_policy
from simulator import simulate
from simulator.costs import ProfileError, profile_from_dict
from traces.synthetic import LengthSpec

GAMMA, USERS = 3, 4
LENGTHS = LengthSpec(prompt_median_tokens=256, prompt_sigma=0.0, output_median_tokens=64, output_sigma=0.0)
EXTRA_S = {True: 3e-3, False: 1e-3}  # what a step spends beyond its isolated price: drafting, and not
PREFILL_S = {True: 0.10, False: 0.08}  # a prefill in the loop: with the drafter's pass over the prompt, and without


def _loop_run(profile, plain_full_upto: int = 64, varlen_extra_s: float = 0.0):
    """A stand-in for the probe's loop runs: every step costs its isolated price plus EXTRA_S (the drafter's own
    2 ms per drafted token on top when it drafts; the variable-length probe's ``varlen_extra_s`` more), every
    prefill PREFILL_S; the batch is full but for the none runs at more than ``plain_full_upto`` users, which keep
    one request short (a prefill-bound loop)."""
    def serve(spec, models):
        k, users = spec.policy.draft_tokens(GAMMA), spec.traffic.num_users
        running = users - 1 if k == 0 and users > plain_full_upto else users
        batch_tokens, context = running * (1 + k), 300
        iso_s = profile.verify_s(running, batch_tokens) + static_attention_s(profile, running, k,
                                                                                   running * context, context)
        draft_s = 2e-3 * k
        count = policy_steps.MIN_FULL_BATCH_STEPS + 1
        extra_s = EXTRA_S[k > 0] + (varlen_extra_s if isinstance(spec.policy, loop_costs.VariableLength) else 0.0)
        end_s = 10.0 + np.cumsum(np.full(count, iso_s + draft_s + extra_s))
        steps = pd.DataFrame({"start_at": end_s - 1e-4, "end_at": end_s, "wait_s": 0.0, "num_requests": running,
                              "batch_tokens": batch_tokens, "max_verified_tokens": k,
                              "num_verified_tokens": batch_tokens, "context_tokens": running * context,
                              "max_context_tokens": context, "draft_s": draft_s, "verify_s": iso_s,
                              "num_joined": 0, "num_left": 0})
        requests = pd.DataFrame({"first_token_at": [PREFILL_S[k > 0]], "prefill_start_at": [0.0],
                                 "prompt_tokens": [256]})
        return SimpleNamespace(steps=steps, requests=requests)
    return serve


def _measure(monkeypatch, profile, probed: tuple[int, ...], plain_full_upto: int = 64,
             varlen_extra_s: float = 0.0) -> LoopCosts:
    monkeypatch.setattr(policy_steps, "serve", _loop_run(profile, plain_full_upto, varlen_extra_s))
    return loop_costs.measure_loop_costs(SimpleNamespace(s=SimpleNamespace(vocab_size=256)),
                                         SimpleNamespace(kind="dspark"), GAMMA, probed, profile, LENGTHS,
                                         duration_s=0.8, warmup_s=0.2)


@pytest.fixture
def measured(monkeypatch, default_profile) -> LoopCosts:
    return _measure(monkeypatch, default_profile, (USERS,))


def test_the_folded_profile_prices_steps_without_speculation_by_their_own_probe(measured, default_profile) -> None:
    """The none probe's steps cost 2 ms less beyond their isolated price than the drafting probes' do: the folded
    profile prices a none step at its measured cycle, a drafting step as the fold without the none probe does (the
    2 ms move from the per-request overhead into the drafter's table), and a prefill without the drafter at 0.8 of
    one with it."""
    assert measured.plain_per_request_s == pytest.approx((EXTRA_S[False],), abs=1e-12)
    assert measured.extra_per_request_s == pytest.approx((EXTRA_S[True],), abs=1e-12)
    assert measured.plain_prefill_factor == pytest.approx(0.8 * measured.prefill_factor, rel=1e-12)
    folded = profile_from_dict(measured.fold(default_profile.raw))
    before = profile_from_dict(replace(measured, plain_per_request_s=(), plain_prefill_factor=None).fold(
        default_profile.raw))
    none_step_s = folded.verify_s(USERS, USERS) + static_attention_s(folded, USERS, 0, USERS * 300, 300)
    iso_none_s = default_profile.verify_s(USERS, USERS)
    assert none_step_s == pytest.approx(iso_none_s + EXTRA_S[False], rel=1e-9)
    assert before.verify_s(USERS, USERS) == pytest.approx(iso_none_s + EXTRA_S[True], rel=1e-9)  # what it was
    for k in (1, GAMMA):
        prices = [p.draft_s("dspark", USERS, k) + p.verify_s(USERS, USERS * (1 + k)) for p in (folded, before)]
        assert prices[0] == pytest.approx(prices[1], rel=1e-9)
    assert folded.prefill_draft_share == pytest.approx(0.2, rel=1e-9) and before.prefill_draft_share == 0.0
    assert folded.prefill_s(256, drafting=False) == pytest.approx(0.8 * folded.prefill_s(256), rel=1e-12)
    # the isolated tables stay in the metadata as measured (the fold once scaled the drafter's there too)
    assert folded.metadata["forward_only"]["draft"] == default_profile.raw["draft"]
    loop = folded.metadata["loop_costs"]
    assert loop["draft_share_measured"] == pytest.approx(0.2) and "plain_per_request_s" in loop["folded"]


def test_where_the_none_probe_never_fills_its_batch_the_nearest_measured_gap_is_used(monkeypatch,
                                                                                       default_profile) -> None:
    """With long prompts requests that draft nothing finish before the others are prefilled: a none probe full only
    at R = 1 of (1, 4) prices R = 4 with R = 1's gap (2 ms), and one that fills nowhere is an error naming it."""
    costs = _measure(monkeypatch, default_profile, (1, USERS), plain_full_upto=1)
    assert costs.plain_num_requests == (1,) and costs.plain_per_request_s == pytest.approx((EXTRA_S[False],))
    folded = profile_from_dict(costs.fold(default_profile.raw))
    before = profile_from_dict(replace(costs, plain_per_request_s=(), plain_num_requests=(),
                                       plain_prefill_factor=None).fold(default_profile.raw))
    gap_s = EXTRA_S[True] - EXTRA_S[False]
    for r in (1, USERS):
        assert folded.verify_s(r, r) == pytest.approx(before.verify_s(r, r) - gap_s, rel=1e-9)
        assert folded.draft_s("dspark", r, GAMMA) == pytest.approx(before.draft_s("dspark", r, GAMMA) + gap_s,
                                                                   rel=1e-9)
    with pytest.raises(ValueError, match=r"the loop probe's none runs never ran a step at any of R = \(4,\)"):
        _measure(monkeypatch, default_profile, (USERS,), plain_full_upto=1)


def test_a_negative_share_is_noise_and_becomes_zero() -> None:
    assert plain_steps.draft_share(1.0, 0.75) == pytest.approx((0.25, 0.25))
    assert plain_steps.draft_share(1.0, 1.1) == pytest.approx((0.0, -0.1))


def test_a_gap_larger_than_the_drafters_time_is_an_error(default_profile) -> None:
    raw = default_profile.raw
    with pytest.raises(ValueError, match="cost more than its drafting ones by more than drafter 'dspark'"):
        plain_steps.fold_plain({**raw, "draft": {"dspark": dict(raw["draft"]["dspark"])}, "prefill": {}},
                               lambda reqs: np.full(len(reqs), -1.0), 0.0)


def test_draft_share_is_checked_and_leaves_drafting_policies_alone(default_profile, small_spec) -> None:
    raw = default_profile.raw
    for bad, valid in ((1.0, "must be < 1"), (-0.1, "must be >= 0"), ("x", "must be a number")):
        with pytest.raises(ProfileError, match=rf"field 'prefill.draft_share' {valid}"):
            profile_from_dict({**raw, "prefill": {**raw["prefill"], "draft_share": bad}}, "p.json")
    halved = profile_from_dict({**raw, "prefill": {**raw["prefill"], "draft_share": 0.5}})

    def prefill_s(policy: str, profile) -> tuple[np.ndarray, np.ndarray]:  # (in the run, as the profile prices)
        done = simulate(small_spec(make_policy(policy), profile=profile, duration_s=2.0, warmup_s=0.0)).requests.dropna(
            subset=["first_token_at"])
        return ((done["first_token_at"] - done["prefill_start_at"]).to_numpy(),
                default_profile.prefill_s(done["prompt_tokens"].to_numpy()))
    run_s, full_s = prefill_s("none", halved)
    assert len(run_s) > 10 and run_s == pytest.approx(0.5 * full_s, rel=1e-9)
    for policy, profile in (("none", default_profile), ("mtp3", halved)):
        run_s, full_s = prefill_s(policy, profile)
        assert run_s == pytest.approx(full_s, rel=1e-9)


def test_the_shared_line_is_the_static_probes_and_the_variable_length_one_is_reported(monkeypatch,
                                                                                     default_profile) -> None:
    """Steps of the variable-length probe 1 ms dearer than the static probes' leave the line (what mtp-k is priced
    by) on the static probes' own residual, and show as that probe's misfit: 1 ms over its mean cycle."""
    costs = _measure(monkeypatch, default_profile, (1, USERS), varlen_extra_s=1e-3)
    assert costs.extra_per_request_s == pytest.approx((EXTRA_S[True],) * 2, abs=1e-12)
    assert costs.probe_misfit["mtp1"] == pytest.approx([0.0, 0.0], abs=1e-9)
    assert all(0.01 < share < 0.5 for share in costs.probe_misfit["varlen-probe"])
