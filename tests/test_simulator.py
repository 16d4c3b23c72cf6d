"""Simulator invariants: token conservation, exact output lengths, determinism, limits, ordering."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import simpy

from policies import make_policy, policy_classes
from simulator import ClusterSpec, DrafterSpec, EngineLimits, LossyPolicyWarning, simulate
from simulator.cluster import Cluster
from simulator.engine import STEP_END_PRIORITY, _StepEnd
from traces.synthetic import TrafficSpec
from traces.workload import Workload

# Every registered policy (a new module in policies/ is covered with no edit here), plus MTP-k at two depths.
ALL_POLICIES = sorted(set(policy_classes()) | {"mtp1", "mtp3"})


def open_workload(n: int = 60, seed: int = 3) -> Workload:
    rng = np.random.default_rng(seed)
    return Workload(arrival_at=np.sort(rng.uniform(0, 2.0, n)), prompt_tokens=rng.integers(1, 2000, n),
                    output_tokens=rng.integers(1, 300, n), domain=rng.choice(["chat", "code", "math"], n))


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_every_request_finishes_with_exactly_its_output_length(small_spec, policy):
    workload = open_workload()
    results = simulate(small_spec(make_policy(policy), traffic=workload, duration_s=None, warmup_s=0.0))
    req = results.requests
    assert len(req) == workload.num_requests
    assert req["finished_at"].notna().all()
    # Tokens conserved: first tokens from prefill + decode-step tokens == requested outputs.
    assert len(req) + results.steps["num_emitted_tokens"].sum() == workload.output_tokens.sum()
    # Each request: one token per step plus its accepted drafts, less those accepted past its end, which are
    # counted (as vLLM counts them) but never emitted: only its last step can have any, at most gamma (5).
    decoded = req["output_tokens"] - 1
    past_end = req["num_steps"] + req["num_accepted_tokens"] - decoded
    assert ((past_end >= 0) & (past_end <= 5)).all()
    if policy not in ("none", "mtp1"):
        assert (past_end > 0).any()
    assert (req.loc[decoded > 0, "num_steps"] >= 1).all()
    assert (req["num_accepted_tokens"] <= req["num_verified_tokens"]).all()
    assert (req["first_token_at"] >= req["arrival_at"]).all()
    assert (req["finished_at"] >= req["first_token_at"]).all()


def test_requests_still_decoding_at_the_end_show_their_counters(small_spec):
    """A run that stops with requests mid-answer writes their steps and tokens so far: every request-step and
    accepted draft token of the step log belongs to some request's counters."""
    results = simulate(small_spec(make_policy("dspark"), warmup_s=0.0,
                                  traffic=TrafficSpec(arrival="closed", num_users=16, max_output_tokens=4096)))
    req, steps = results.requests, results.steps
    live = req["decode_start_at"].notna() & req["finished_at"].isna()
    assert live.sum() > 5 and (req.loc[live, "num_steps"] > 0).all()
    assert (req["num_accepted_tokens"] <= req["num_verified_tokens"]).all()
    assert req["num_accepted_tokens"].sum() == steps["num_accepted_tokens"].sum()
    assert req["num_steps"].sum() == steps["num_requests"].sum()
    assert steps["num_emitted_tokens"].sum() <= (steps["num_requests"] + steps["num_accepted_tokens"]).sum()


def test_same_seed_same_tables_and_other_seed_differs(small_spec):
    spec = small_spec(make_policy("dspark"))
    a, b = simulate(spec), simulate(spec)
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.steps, b.steps)
    c = simulate(small_spec(make_policy("dspark"), seed=8))
    assert not a.steps["num_accepted_tokens"].equals(c.steps["num_accepted_tokens"])


def test_acceptance_seed_redraws_acceptance_over_the_same_requests(small_spec):
    """An acceptance seed keeps the seed's arrivals, domains and lengths and draws difficulty and acceptance anew:
    the same (seed, acceptance seed) gives the same tables, another acceptance seed other acceptance."""
    workload = open_workload(n=80)
    runs = {a: simulate(small_spec(make_policy("dspark"), traffic=workload, duration_s=None, warmup_s=0.0,
                                   acceptance_seed=a)) for a in (None, 1, 2)}
    same = ["arrival_at", "domain", "prompt_tokens", "output_tokens"]
    for a in (1, 2):
        pd.testing.assert_frame_equal(runs[a].requests[same], runs[None].requests[same])
        assert not np.allclose(runs[a].requests["difficulty"], runs[None].requests["difficulty"])
    assert not runs[1].requests["num_accepted_tokens"].equals(runs[2].requests["num_accepted_tokens"])
    again = simulate(small_spec(make_policy("dspark"), traffic=workload, duration_s=None, warmup_s=0.0,
                                acceptance_seed=1))
    pd.testing.assert_frame_equal(again.steps, runs[1].steps)
    with pytest.raises(ValueError, match="acceptance_seed must be a non-negative integer"):
        simulate(small_spec(make_policy("dspark"), acceptance_seed=-1))


def test_concurrency_and_kv_limits_hold(small_spec):
    limits = EngineLimits(max_concurrency=5, kv_capacity_tokens=4000)
    traffic = TrafficSpec(arrival="closed", num_users=16, max_prompt_tokens=500, max_output_tokens=256)
    results = simulate(small_spec(make_policy("mtp1"), cluster=ClusterSpec(limits=limits), traffic=traffic))
    assert results.steps["num_requests"].max() <= 5
    # KV in use at every step start never exceeds the capacity (and the capacity binds).
    req = results.requests.dropna(subset=["decode_start_at"])
    need = (req["prompt_tokens"] + req["output_tokens"]).to_numpy()  # [N] reserved at admission
    starts = results.steps["start_at"].to_numpy()[:, None]  # [S, 1]
    live = (req["decode_start_at"].to_numpy() <= starts) & ~(req["finished_at"].to_numpy() <= starts)  # [S, N]
    in_use = live.astype(np.int64) @ need  # [S]
    assert in_use.max() <= 4000 and in_use.max() > 3000


def test_request_bigger_than_kv_is_an_error(small_spec):
    workload = Workload(arrival_at=np.array([0.0]), prompt_tokens=np.array([5000]), output_tokens=np.array([10]),
                        domain=np.array(["chat"]))
    spec = small_spec(make_policy("none"), traffic=workload, duration_s=None,
                      cluster=ClusterSpec(limits=EngineLimits(8, 1000)))
    with pytest.raises(ValueError, match="request 0 needs 5010 KV tokens"):
        simulate(spec)


def test_profile_too_small_for_the_batch_is_an_error(small_spec):
    spec = small_spec(make_policy("mtp5"), cluster=ClusterSpec(limits=EngineLimits(4096, 10**9)))
    with pytest.raises(ValueError, match="lower cluster.max_concurrency or profile more"):
        simulate(spec)


def test_lossy_policy_warns(small_spec):
    with pytest.warns(LossyPolicyWarning, match="global_sync is LOSSY"):
        results = simulate(small_spec(make_policy("global_sync")))
    assert results.summary["lossless"] is False
    with pytest.warns(LossyPolicyWarning):
        simulate(small_spec(make_policy("dspark", staleness_steps=0)))


def test_step_end_runs_after_same_time_events():
    env = simpy.Environment()
    order: list[str] = []

    def engine():
        yield _StepEnd(env, 1.0)
        order.append("step end")

    def arrival():
        yield env.timeout(1.0)
        order.append("arrival")

    env.process(engine())  # scheduled first, yet processed last at t = 1
    env.process(arrival())
    env.run()
    assert order == ["arrival", "step end"]
    assert STEP_END_PRIORITY > simpy.events.NORMAL


def test_arrival_at_step_end_joins_the_next_step(small_spec):
    # Request 1 arrives exactly when request 0's prefill ends; with instant-ish prefill both
    # must be in the first decode step that starts at or after that instant.
    workload = Workload(arrival_at=np.array([0.0, 0.0]), prompt_tokens=np.array([100, 100]),
                        output_tokens=np.array([50, 50]), domain=np.array(["chat", "chat"]))
    results = simulate(small_spec(make_policy("mtp1"), traffic=workload, duration_s=None, warmup_s=0.0))
    assert results.steps["num_requests"].iloc[0] == 2


def test_closed_loop_keeps_users_busy(small_spec):
    spec = small_spec(make_policy("mtp1"), traffic=TrafficSpec(arrival="closed", num_users=8,
                                                               max_output_tokens=64))
    results = simulate(spec)
    req = results.requests
    assert (req["user"].value_counts() >= 2).all()  # every user came back
    per_user_live = req.groupby("user")["finished_at"].apply(lambda s: s.isna().sum())
    assert (per_user_live <= 1).all()  # one request in flight per user


def test_difficulty_persists_within_a_request(small_spec):
    # Hard requests stay hard: per-request acceptance correlates with the drawn difficulty.
    spec = small_spec(make_policy("mtp3"), duration_s=20.0)
    req = simulate(spec).requests.dropna(subset=["finished_at"])
    req = req[req["num_verified_tokens"] > 30]
    rate = req["num_accepted_tokens"] / req["num_verified_tokens"]
    assert np.corrcoef(req["difficulty"], rate)[0, 1] > 0.5


@pytest.mark.parametrize("router", ["round_robin", "least_loaded"])
def test_routers_spread_requests(small_spec, router):
    spec = small_spec(make_policy("mtp1"), cluster=ClusterSpec(num_decode_engines=3, router=router))
    req = simulate(spec).requests
    counts = req["engine"][req["engine"] >= 0].value_counts()
    assert len(counts) == 3 and counts.min() > 0.2 * counts.max()


def test_round_robin_is_exact_rotation(small_spec):
    workload = open_workload(n=9)
    spec = small_spec(make_policy("none"), traffic=workload, duration_s=None, warmup_s=0.0,
                      cluster=ClusterSpec(num_decode_engines=3, router="round_robin"))
    req = simulate(spec).requests
    handed = req[req["output_tokens"] > 1].sort_values("first_token_at")
    assert handed["engine"].tolist() == [i % 3 for i in range(len(handed))]


def test_summary_metrics_are_consistent(small_spec):
    results = simulate(small_spec(make_policy("mtp3")))
    s = results.summary
    assert s["verification_budget_per_request"] == pytest.approx(4.0)  # 1 + 3, every step
    assert 1.0 <= s["mean_acceptance_length"] <= 4.0
    assert s["output_tokens_per_s"] > 0 and s["tokens_per_s_per_user"]["p90"] >= s["tokens_per_s_per_user"]["p50"]
    rates = s["acceptance_rate_per_position"]
    assert len(rates) == 3 and all(0 <= r <= 1 for r in rates) and rates[0] >= rates[-1]


def test_policy_drafting_more_than_gamma_is_an_error(small_spec):
    with pytest.raises(ValueError, match="drafts 9 tokens but drafter.gamma is 5"):
        Cluster(small_spec(make_policy("mtp9")))


def test_drafter_kinds_change_acceptance(small_spec):
    taus = {}
    for kind in ("eagle3", "dspark"):
        s = simulate(small_spec(make_policy("mtp5"), drafter=DrafterSpec(kind, 5))).summary
        taus[kind] = s["mean_acceptance_length"]
    assert taus["dspark"] > taus["eagle3"]


@pytest.mark.parametrize("sample", ["azure_code", "mooncake_conversation"])
def test_trace_replay_keeps_every_request(small_spec, sample):
    from traces import load_trace_workload

    workload = load_trace_workload(sample, max_requests=150)
    spec = small_spec(make_policy("dspark"), traffic=workload, duration_s=None, warmup_s=0.0,
                      cluster=ClusterSpec(num_prefill_instances=8, limits=EngineLimits(64, 10**7)))
    req = simulate(spec).requests
    assert len(req) == 150 and req["finished_at"].notna().all()
    np.testing.assert_array_equal(req["output_tokens"], workload.output_tokens)
    np.testing.assert_allclose(req["arrival_at"], workload.arrival_at)


def test_policy_prices_with_its_own_profile_and_the_hardware_keeps_time(small_spec, default_profile):
    """policy_profile changes what the policy believes a step costs, never what a step takes."""
    import copy

    from simulator.costs import profile_from_dict

    base = simulate(small_spec(make_policy("greedy")))
    same = simulate(small_spec(make_policy("greedy"), policy_profile=default_profile))
    pd.testing.assert_frame_equal(base.steps, same.steps)
    raw = copy.deepcopy(default_profile.raw)
    sps = np.array(raw["verify"]["steps_per_s"])
    tokens = np.array(raw["verify"]["batch_tokens"])
    raw["verify"]["steps_per_s"] = (sps * 16 / np.maximum(tokens, 16)).tolist()  # believes big batches are slow
    believed = simulate(small_spec(make_policy("greedy"), policy_profile=profile_from_dict(raw))).steps
    assert believed["batch_tokens"].mean() < 0.9 * base.steps["batch_tokens"].mean()
    expected = [default_profile.verify_s(r, b) for r, b in zip(believed["num_requests"], believed["batch_tokens"],
                                                               strict=True)]
    np.testing.assert_allclose(believed["verify_s"], expected)  # the built-in profile charges no padding
