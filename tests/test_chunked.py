"""Co-located chunked prefill and the token budget: decode first, prefill chunks in what is left, never more.

Reads like the scheduler it models: every step's decode/verification tokens plus its prefill chunks fit the
budget; a request emits its first token at the end of the step that completes its prefill; and because the
decoding requests take their tokens first, TTFT grows with the decode load (in disaggregated mode it does not).
"""

from __future__ import annotations

import numpy as np
import pytest

from policies import check_decision, make_policy, policy_classes
from policies.base import CostCurve, Decision, StepView
from simulator import ClusterSpec, EngineLimits, simulate
from simulator.batch import prefill_chunks
from simulator.specs import CHUNKED_DEFAULT_BUDGET_TOKENS
from traces.synthetic import TrafficSpec
from traces.workload import Workload

ALL_POLICIES = sorted(set(policy_classes()) | {"mtp1", "mtp3"})
GAMMA = 5  # small_spec's drafter.gamma


def chunked_cluster(budget: int, max_concurrency: int = 32, kv_tokens: int = 600_000, **limits) -> ClusterSpec:
    return ClusterSpec(mode="chunked", limits=EngineLimits(max_concurrency, kv_tokens, max_num_batched_tokens=budget,
                                                           **limits))


def test_prefill_chunks_fill_the_room_in_admission_order():
    np.testing.assert_array_equal(prefill_chunks(np.array([30, 50, 20]), 100), [30, 50, 20])
    np.testing.assert_array_equal(prefill_chunks(np.array([30, 50, 20]), 60), [30, 30, 0])
    np.testing.assert_array_equal(prefill_chunks(np.array([30, 50]), 0), [0, 0])


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_policies_never_exceed_the_budget_they_are_shown(policy, rng):
    """Each policy keeps sum_r (1 + l_r) within StepView.token_budget; dspark's capacity K is capped by it."""
    num_requests, gamma = 12, 6
    curve = CostCurve(batch_tokens=np.arange(1, 200), steps_per_s=1000.0 / (1.0 + 0.001 * np.arange(1, 200)))
    confidence = rng.uniform(0.7, 1.0, (num_requests, gamma))
    history = (rng.uniform(0.7, 1.0, (num_requests, gamma)),) * 2
    pol = make_policy(policy)
    for budget in (12, 20, 41, 200):
        view = StepView(confidence=confidence, cost=curve, history=history, token_budget=budget,
                        accepted=np.full(num_requests, gamma))
        decision = pol.decide(view)
        lengths = check_decision(pol, decision, num_requests, pol.draft_tokens(gamma), budget)
        assert num_requests + lengths.sum() <= budget
        if policy == "dspark":
            assert decision.capacity <= budget - num_requests
    over = Decision(lengths=np.ones(num_requests, dtype=np.int64), pool=confidence)
    with pytest.raises(ValueError, match="exceed the token budget of 20 batch tokens"):
        check_decision(pol, over, num_requests, gamma, token_budget=20)


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_no_step_exceeds_the_budget(small_spec, policy):
    traffic = TrafficSpec(arrival="closed", num_users=40, domain_mix={"chat": 1.0}, max_output_tokens=64,
                          max_prompt_tokens=2000)
    results = simulate(small_spec(make_policy(policy), cluster=chunked_cluster(96), traffic=traffic, duration_s=2.0,
                                  warmup_s=0.0))
    steps = results.steps
    assert len(steps) > 50 and steps["prefill_tokens"].sum() > 0
    assert (steps["batch_tokens"] + steps["prefill_tokens"] <= 96).all() and (steps["budget_tokens"] == 96).all()
    assert steps["num_requests"].max() <= 32


def test_decode_only_budget_in_disaggregated_mode(small_spec):
    cluster = ClusterSpec(num_prefill_instances=4, limits=EngineLimits(32, 600_000, max_num_batched_tokens=80))
    steps = simulate(small_spec(make_policy("mtp5"), cluster=cluster)).steps
    assert steps["batch_tokens"].max() == 80 and (steps["prefill_tokens"] == 0).all()


def test_first_token_at_the_end_of_the_step_that_completes_the_prefill(small_spec):
    rng = np.random.default_rng(5)
    n = 40
    workload = Workload(arrival_at=np.sort(rng.uniform(0, 1.0, n)), prompt_tokens=rng.integers(1, 3000, n),
                        output_tokens=np.where(np.arange(n) % 7 == 0, 1, rng.integers(2, 200, n)),
                        domain=np.array(["chat"] * n))
    results = simulate(small_spec(make_policy("dspark"), traffic=workload, duration_s=None, warmup_s=0.0,
                                  cluster=chunked_cluster(256)))
    req, steps = results.requests, results.steps
    assert req["finished_at"].notna().all()
    assert len(req) + steps["num_emitted_tokens"].sum() == workload.output_tokens.sum()  # tokens conserved
    assert steps["prefill_tokens"].sum() == workload.prompt_tokens.sum()  # every prompt token computed once
    assert set(req["first_token_at"]) <= set(steps["end_at"])
    assert (req["prefill_start_at"] >= req["arrival_at"]).all()
    assert (req["first_token_at"] > req["prefill_start_at"]).all()
    single = req["output_tokens"] == 1
    assert (req.loc[single, "finished_at"] == req.loc[single, "first_token_at"]).all()
    assert (req.loc[~single, "decode_start_at"] == req.loc[~single, "first_token_at"]).all()


def _probe_ttft(small_spec, mode: str, num_background: int) -> np.ndarray:
    """TTFT of 5 long-prompt probes arriving at t = 1.0 .. 4.2 s next to ``num_background`` decoding requests."""
    probes = 5
    n = num_background + probes
    arrival = np.concatenate([np.zeros(num_background), 1.0 + 0.8 * np.arange(probes)])
    workload = Workload(arrival_at=arrival, prompt_tokens=np.r_[np.full(num_background, 32), np.full(probes, 2000)],
                        output_tokens=np.r_[np.full(num_background, 10**5), np.full(probes, 4)],
                        domain=np.array(["chat"] * n))
    limits = EngineLimits(256, 10**8, max_num_batched_tokens=512)
    cluster = ClusterSpec(num_prefill_instances=4, limits=limits, mode=mode)  # type: ignore[arg-type]
    req = simulate(small_spec(make_policy("mtp1"), traffic=workload, duration_s=5.5, warmup_s=0.0,
                              cluster=cluster)).requests
    ttft = req["ttft_s"].to_numpy()[num_background:]
    assert np.isfinite(ttft).all()
    return ttft


def test_chunked_ttft_responds_to_decode_load(small_spec):
    """200 decoding requests take 400 of the 512 budget tokens each step (MTP-1): a 2000-token prompt gets ~110
    tokens a step instead of 512, and the steps are longer, so its first token comes much later. With a separate
    prefill pool the same probes see the same TTFT whatever the decode load."""
    quiet, busy = _probe_ttft(small_spec, "chunked", 0), _probe_ttft(small_spec, "chunked", 200)
    assert np.median(busy) > 3 * np.median(quiet)
    np.testing.assert_allclose(_probe_ttft(small_spec, "disaggregated", 0),
                               _probe_ttft(small_spec, "disaggregated", 200))


def test_budget_errors_at_start_and_the_chunked_default(small_spec):
    steps = simulate(small_spec(make_policy("none"), cluster=ClusterSpec(mode="chunked"), duration_s=1.0)).steps
    assert (steps["budget_tokens"] == CHUNKED_DEFAULT_BUDGET_TOKENS).all()  # no budget in config or profile
    with pytest.raises(ValueError, match=r"token budget \(cluster.max_num_batched_tokens=32\) is below "
                                         r"cluster.max_concurrency=64"):
        simulate(small_spec(make_policy("none"), cluster=chunked_cluster(32, max_concurrency=64)))
    with pytest.raises(ValueError, match="cluster.mode must be disaggregated or chunked"):
        ClusterSpec(mode="colocated")  # type: ignore[arg-type]
    for engines, instances in ((0, 1), (1, 0)):  # the library API checks what the config schema checks
        with pytest.raises(ValueError, match=f"must be >= 1, got {engines} and {instances}"):
            ClusterSpec(num_decode_engines=engines, num_prefill_instances=instances)


def test_chunked_runs_are_deterministic(small_spec):
    spec = small_spec(make_policy("dspark"), cluster=chunked_cluster(128), duration_s=2.0, warmup_s=0.5)
    a, b = simulate(spec), simulate(spec)
    assert a.steps.equals(b.steps) and a.requests.equals(b.requests)
