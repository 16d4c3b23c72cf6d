"""The engine's fast paths give the plain step loop's tables, byte for byte.

Fast paths: running ahead (steps whose end nobody else sees are applied
without a SimPy round trip), sampling several steps of an unchanged batch at
once (:mod:`simulator.sample_ahead`), remembered step costs and no-draft
decisions (:mod:`simulator.step_memo`), the decoding requests as one matrix
(:mod:`simulator.decode_set`) and batched length histograms. The plain loop
switches every one it can off: one SimPy event and one sampling call per step,
nothing remembered.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import ndtr

import simulator.engine as engine_module
from policies import make_policy
from simulator import ClusterSpec, DrafterSpec, EngineLimits, load_profile, simulate
from simulator.acceptance.parametric import AcceptanceModel, ConfidenceSpec
from simulator.decode_set import DecodeSet
from simulator.decode_step import DecodeStep, LengthCounts
from simulator.requests import RequestStore
from simulator.sample_ahead import NormalStream, SampleAhead
from simulator.step_memo import NoDraftDecisions, StepCostMemo
from traces.synthetic import TrafficSpec
from traces.workload import Workload


def open_workload(n: int = 80, seed: int = 3, span_s: float = 3.0) -> Workload:
    rng = np.random.default_rng(seed)
    return Workload(arrival_at=np.sort(rng.uniform(0, span_s, n)), prompt_tokens=rng.integers(1, 1500, n),
                    output_tokens=rng.integers(1, 200, n), domain=rng.choice(["chat", "code", "math"], n))


def run(spec, plain: bool, counts: dict[str, int] | None = None):
    """``simulate(spec)``, through the plain loop when ``plain``; ``counts['step_events']`` gets the SimPy step-end
    events scheduled."""
    with pytest.MonkeyPatch.context() as mp:
        if plain:
            mp.setattr(engine_module, "MAX_RUN_AHEAD_STEPS", 0)
            mp.setattr(engine_module, "SAMPLE_AHEAD", False)
            mp.setattr(NoDraftDecisions, "apply_to", staticmethod(lambda *args: False))
            mp.setattr(StepCostMemo, "verify", lambda self, plan, done: self.pricer.verify(
                plan.lengths, plan.decode_tokens, plan.context_tokens, done, plan.chunks, self.detailed))
        if counts is not None:
            original = engine_module._StepEnd.__init__

            def counted(self, env, delay_s):
                counts["step_events"] = counts.get("step_events", 0) + 1
                original(self, env, delay_s)

            mp.setattr(engine_module._StepEnd, "__init__", counted)
            repeat = engine_module.repeat_without_drafts

            def counted_repeat(*args, **kwargs):
                ends = repeat(*args, **kwargs)
                counts["repeated_steps"] = counts.get("repeated_steps", 0) + len(ends)
                return ends

            mp.setattr(engine_module, "repeat_without_drafts", counted_repeat)
        return simulate(spec)


def assert_same_results(fast, plain) -> None:
    pd.testing.assert_frame_equal(fast.steps, plain.steps, check_exact=True)
    pd.testing.assert_frame_equal(fast.requests, plain.requests, check_exact=True)
    assert repr(sorted(fast.summary.items())) == repr(sorted(plain.summary.items()))


V2 = "h200_qwen3-8b_v2_analytic"
CASES = [
    # (policy, options) - a comment per row says what it adds
    ("dspark", {}),  # the default closed loop: stale pools, sampling ahead, running ahead
    ("none", {}),  # no draft tokens: decisions remembered by R
    ("mtp3", {}),  # a static policy
    ("greedy", {}),  # a synchronous policy (scheduler time on the step)
    ("oracle", {}),  # a policy reading the outcomes
    ("dspark", {"ema_decay": 0.8}),  # EMA rows carried between steps
    ("dspark", {"open": True, "engines": 3}),  # open loop, three replicas behind the router
    ("none", {"open": True, "engines": 2, "router": "round_robin"}),
    ("dspark", {"mode": "chunked"}),  # co-located prefill chunks under the token budget
    ("dspark", {"kv_mode": "paged"}),  # paged KV, disaggregated: never runs ahead, still samples ahead
    ("mtp3", {"mode": "chunked", "kv_mode": "paged", "kv_tokens": 4800, "open": True}),  # preemption by recompute
    ("dspark", {"kv_mode": "paged", "kv_tokens": 4800, "open": True}),  # preempted into the prefill pool
    ("dspark", {"profile": V2}),  # attention over contexts: step costs not remembered
    ("none", {"profile": V2, "mode": "chunked"}),
    ("dspark", {"online": True}),  # the online acceptance estimate
    ("dspark", {"raw": True}),  # the raw (overconfident) confidence head
    ("dspark", {"mix": True}),  # a benchmark mix: several curves per domain
]


def case_spec(small_spec, policy: str, options: dict):
    params = {"ema_decay": options["ema_decay"]} if "ema_decay" in options else {}
    limits = EngineLimits(32, options.get("kv_tokens", 600_000), kv_mode=options.get("kv_mode", "reserve"))
    cluster = ClusterSpec(num_decode_engines=options.get("engines", 1), num_prefill_instances=2,
                          router=options.get("router", "least_loaded"), mode=options.get("mode", "disaggregated"),
                          limits=limits)
    confidence = ConfidenceSpec(source="online" if options.get("online") else "head",
                                calibrated=not options.get("raw"))
    mix = {"gsm8k": 1.0, "humaneval": 2.0, "mt_bench": 1.0} if options.get("mix") else None
    drafter = DrafterSpec("dspark", 5, confidence=confidence, benchmark_mix=mix)
    overrides = dict(cluster=cluster, drafter=drafter, duration_s=3.0, warmup_s=0.5)
    if "profile" in options:
        overrides["profile"] = load_profile(options["profile"])
    if options.get("open"):
        overrides.update(traffic=open_workload(), duration_s=None, warmup_s=0.0)
    else:
        overrides["traffic"] = TrafficSpec(arrival="closed", num_users=12, domain_mix={"chat": 1.0, "code": 1.0},
                                           max_output_tokens=300)
    return small_spec(make_policy(policy, **params), **overrides)


@pytest.mark.parametrize("policy, options", CASES)
def test_fast_paths_give_the_plain_loops_tables(small_spec, policy, options):
    spec = case_spec(small_spec, policy, options)
    counts: dict[str, int] = {}
    fast = run(spec, plain=False, counts=counts)
    assert_same_results(fast, run(spec, plain=True))
    if not (options.get("kv_mode") == "paged" and options.get("mode") != "chunked"):
        assert counts["step_events"] < len(fast.steps)  # the engine did run ahead
    if policy == "none" and options.get("mode") != "chunked" and "profile" not in options:
        assert counts["repeated_steps"] > 0  # and repeated steps without draft tokens


def test_requests_arriving_exactly_at_step_ends_join_the_next_step_as_in_the_plain_loop(small_spec):
    """Chunked mode hands a request to its engine when it arrives: arrivals placed exactly at step ends (taken from
    a first run) must see the same steps with and without running ahead."""
    spec = case_spec(small_spec, "dspark", {"mode": "chunked", "open": True})
    ends = run(spec, plain=True).steps["end_at"].to_numpy()
    at_ends = np.sort(np.random.default_rng(0).choice(ends[ends > 0.2], 20, replace=False))
    base = spec.traffic
    arrival_at = np.concatenate((base.arrival_at, at_ends))
    order = np.argsort(arrival_at, kind="stable")
    traffic = Workload(arrival_at=arrival_at[order],
                       prompt_tokens=np.concatenate((base.prompt_tokens, np.full(20, 300)))[order],
                       output_tokens=np.concatenate((base.output_tokens, np.full(20, 40)))[order],
                       domain=np.concatenate((base.domain, np.full(20, "chat")))[order])
    spec = dataclasses.replace(spec, traffic=traffic)
    assert_same_results(run(spec, plain=False), run(spec, plain=True))


def plain_sample_step(model: AcceptanceModel, rng, domain_idx, difficulty, g):
    """The parametric model's step written out plainly, draw by draw (the formula the fast one must match)."""
    num_requests = domain_idx.shape[0]
    cls, z = model.request_classes(domain_idx, difficulty)
    model._fit(np.unique(cls))
    mu, load0, load1, inv_psd, scale_a = model._params[:, cls, :g]
    spec = model.difficulty
    n = rng.standard_normal((2, num_requests, g))
    shift = spec.request_spread * z + spec.step_spread * rng.standard_normal(num_requests)
    base = mu + shift[:, None]
    rejected = base + scale_a * n[0] <= 0.0
    accepted = np.argmax(np.concatenate((rejected, np.ones((num_requests, 1), dtype=bool)), axis=1), axis=1)
    confidence = ndtr((base + load0 * n[0] + load1 * n[1]) * inv_psd)
    if not model.confidence_spec.calibrated:
        confidence = model.raw(confidence)
    return confidence, accepted


MODELS = [
    ("dspark", ConfidenceSpec(), None),  # calibrated head
    ("eagle3", ConfidenceSpec(calibrated=False), None),  # raw head
    ("dspark", ConfidenceSpec(), {"gsm8k": 1.0, "humaneval": 2.0, "mt_bench": 1.0, "math500": 0.5}),  # mix
]


@pytest.mark.parametrize("preset, confidence, mix", MODELS)
def test_sample_step_and_sample_steps_match_the_plain_formula(preset, confidence, mix):
    model = AcceptanceModel(preset, 7, confidence=confidence, benchmark_mix=mix)
    cases = np.random.default_rng(1)
    for _ in range(60):
        num_requests, g, num_steps = int(cases.integers(1, 30)), int(cases.integers(1, 8)), int(cases.integers(1, 6))
        domain_idx, difficulty = cases.integers(0, 3, num_requests), 2.0 * cases.standard_normal(num_requests)
        seed = int(cases.integers(1 << 30))
        plain_rng, step_rng, steps_rng = (np.random.default_rng(seed) for _ in range(3))
        confidence_k, accepted_k = model.sample_steps(steps_rng, domain_idx, difficulty, g, num_steps)
        for k in range(num_steps):
            want = plain_sample_step(model, plain_rng, domain_idx, difficulty, g)
            got = model.sample_step(step_rng, domain_idx, difficulty, g)
            for array in (got, (confidence_k[k], accepted_k[k])):
                assert np.array_equal(array[0], want[0]) and np.array_equal(array[1], want[1])
                assert array[0].dtype == want[0].dtype and array[1].dtype == want[1].dtype
        assert plain_rng.standard_normal() == steps_rng.standard_normal()  # the same draws were made


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), max_size=12))
def test_a_normal_stream_with_give_backs_serves_the_generators_stream(calls):
    stream, used = NormalStream(np.random.default_rng(5)), []
    for size, back in calls:
        served = stream.standard_normal(size)
        back = min(back, size)
        stream.give_back(back)
        used.append(served[:size - back])
    assert np.array_equal(np.concatenate([np.empty(0), *used]), np.random.default_rng(5).standard_normal(
        sum(u.size for u in used)))
    assert stream.num_served == sum(u.size for u in used)


def test_sampling_ahead_gives_every_step_what_step_by_step_sampling_gives():
    """A batch that changes at random steps (joins and leaves): each step's confidences and outcomes are those of
    one sample_step call per step on the same generator."""
    model = AcceptanceModel("dspark", 5)
    store = RequestStore()
    cases = np.random.default_rng(2)
    ids = store.add(np.zeros(40), cases.integers(0, 3, 40), np.full(40, 10), np.full(40, 10**6),
                    cases.standard_normal(40))
    decode, ahead, plain_rng = DecodeSet(), SampleAhead(model, np.random.default_rng(9), 5), np.random.default_rng(9)
    decode.add(store, ids[:6], np.full(6, 100), np.zeros(6, dtype=np.int64))
    joined = 6
    for _ in range(200):
        got = ahead.next_step(decode)
        want = model.sample_step(plain_rng, store.domain_idx[decode.ids], store.difficulty[decode.ids], 5)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
        change = cases.random()
        if change < 0.1 and joined < ids.size:
            decode.add(store, ids[joined:joined + 2], np.full(2, 100), np.zeros(2, dtype=np.int64))
            joined += 2
        elif change < 0.2 and decode.size > 1:
            leaving = cases.random(decode.size) < 0.3
            leaving[0] = False
            decode.take(leaving)


def test_decode_set_keeps_columns_aligned_and_counts_steps():
    store = RequestStore()
    difficulty = np.array([-0.0, 1.5, -2.25, 1e-300, 3.0])
    ids = store.add(np.zeros(5), np.array([0, 1, 2, 0, 1]), np.arange(10, 15), np.arange(20, 25), difficulty)
    decode = DecodeSet()
    decode.add(store, ids[:3], np.array([19, 20, 21]), np.array([5, 6, 7]))
    decode.step_done(np.array([1, 2, 3]), np.array([1, 0, 3]), np.array([17, 19, 17]))
    decode.add(store, ids[3:], np.array([22, 23]), np.array([8, 9]))
    decode.step_done(None, None, None)
    assert decode.ids.tolist() == [0, 1, 2, 3, 4] and decode.remaining.tolist() == [16, 18, 16, 21, 22]
    assert decode.num_steps.tolist() == [2, 2, 2, 1, 1] and decode.num_verified.tolist() == [1, 2, 3, 0, 0]
    assert decode.decoded_tokens().tolist() == (np.arange(20, 25) - 1 - decode.remaining).tolist()
    assert np.array_equal(decode.difficulty.view(np.int64), difficulty.view(np.int64))  # the bits, -0.0 too
    gone = decode.take(np.array([False, True, False, True, False]))
    assert gone["ids"].tolist() == [1, 3] and gone["num_steps"].tolist() == [2, 1] and gone["held"].tolist() == [6, 8]
    assert decode.ids.tolist() == [0, 2, 4] and decode.domain_idx.tolist() == [0, 2, 1]
    assert decode.prompt_tokens.tolist() == [10, 12, 14] and decode.held.tolist() == [5, 7, 9]
    newest = decode.split(1)
    assert newest["ids"].tolist() == [2, 4] and decode.ids.tolist() == [0] and decode.num_accepted.tolist() == [1]
    decode.reset_counters()
    assert decode.num_steps.tolist() == [0] and decode.num_verified.tolist() == [0]


def test_length_counts_in_batches_equal_counts_per_step():
    cases = np.random.default_rng(4)
    counts, verified, accepted = LengthCounts(7), np.zeros(8, dtype=np.int64), np.zeros(8, dtype=np.int64)
    for _ in range(1300):  # more than two batches
        lengths = cases.integers(0, 8, int(cases.integers(1, 20)))
        good = np.minimum(lengths, cases.integers(0, 8, lengths.size))
        counts.add(lengths, good)
        verified += np.bincount(lengths, minlength=8)
        accepted += np.bincount(good, minlength=8)
    counts.add_without_drafts(5)
    verified[0] += 5
    accepted[0] += 5
    assert counts.verified.tolist() == verified.tolist() and counts.accepted.tolist() == accepted.tolist()


def test_settling_and_applying_a_step_equal_the_numpy_formulas():
    """The compiled bookkeeping of a step (DecodeStep.settle, DecodeSet.step_done with histograms) against the
    numpy formulas it replaced, on random steps, requests about to finish among them."""
    cases = np.random.default_rng(8)
    store = RequestStore()
    ids = store.add(np.zeros(30), cases.integers(0, 3, 30), np.full(30, 10), np.full(30, 10**6),
                    cases.standard_normal(30))
    decode = DecodeSet()
    decode.add(store, ids, cases.integers(1, 6, 30), np.zeros(30, dtype=np.int64))
    counts, verified, accepted = LengthCounts(7), np.zeros(8, dtype=np.int64), np.zeros(8, dtype=np.int64)
    for _ in range(200):
        lengths, outcome = cases.integers(0, 8, decode.size), cases.integers(0, 8, decode.size)
        remaining, num_verified, num_accepted = (decode.remaining.copy(), decode.num_verified.copy(),
                                                 decode.num_accepted.copy())
        step = DecodeStep(0.0)
        step.decided(decode.ids, None, lengths, outcome, None, 0.0, 0.0)  # type: ignore[arg-type]
        step.settle(decode.remaining, drafts=True)
        good = np.minimum(np.minimum(lengths, outcome), remaining - 1)
        assert step.good.tolist() == good.tolist() and step.remaining_after.tolist() == (remaining - 1 - good).tolist()
        assert (step.num_verified, step.decode_tokens, step.num_good, step.longest, step.ends_request) == (
            lengths.sum(), lengths.size + lengths.sum(), good.sum(), lengths.max(), bool((remaining - 1 == good).any()))
        measured = cases.random() < 0.7
        decode.step_done(step.lengths, step.good, step.remaining_after, counts.histograms if measured else None)
        if measured:
            verified += np.bincount(lengths, minlength=8)
            accepted += np.bincount(good, minlength=8)
        assert decode.remaining.tolist() == (remaining - 1 - good).tolist()
        assert decode.num_verified.tolist() == (num_verified + lengths).tolist()
        assert decode.num_accepted.tolist() == (num_accepted + good).tolist()
        finished = decode.remaining == 0
        decode.take(finished)
        joining = int(finished.sum())
        if joining:
            decode.add(store, ids[:joining], cases.integers(1, 6, joining), np.zeros(joining, dtype=np.int64))
    assert counts.verified.tolist() == verified.tolist() and counts.accepted.tolist() == accepted.tolist()


@pytest.mark.parametrize("padded_slot_s", [0.0, 3e-6])  # without and with a charge per padded query slot
def test_remembered_step_costs_equal_the_pricers(default_profile, padded_slot_s):
    profile = dataclasses.replace(default_profile, padded_slot_s=padded_slot_s)
    memo = StepCostMemo(engine_module.StepPricer(profile, profile, make_policy("dspark"), "dspark", 7), False)
    cases = np.random.default_rng(6)
    for _ in range(300):
        step = DecodeStep(0.0)
        lengths = cases.integers(0, 8, int(cases.integers(1, 6)))
        step.decided(np.arange(lengths.size), None, lengths, lengths, None, 0.0, 0.0)  # type: ignore[arg-type]
        if cases.random() < 0.5:  # settled: the memo reads the longest length the step's kernel found
            step.settle(np.full(lengths.size, 100), drafts=True)
        else:
            step.decode_tokens = lengths.size + int(lengths.sum())
        want = memo.pricer.verify(lengths, step.decode_tokens, None, np.empty(0, np.int64), step.chunks, False)
        assert memo.verify(step, np.empty(0, np.int64)) == want


@pytest.mark.parametrize("options", [
    {"kv_mode": "paged", "kv_tokens": 4800, "open": True},  # preempted into the prefill pool and back
    {"mode": "chunked", "kv_mode": "paged", "kv_tokens": 4800, "open": True},  # preempted to waiting
    {"mode": "chunked", "open": True, "engines": 3},  # single-token requests finish when their prefill completes
])
def test_engine_load_counts_every_request_it_holds(small_spec, options):
    """The router's ``load`` is counted as requests come and go; after every event it equals what each engine
    holds (decoding, prefilling and waiting)."""
    from simulator.cluster import Cluster

    cluster = Cluster(case_spec(small_spec, "dspark", options))
    while not cluster._complete():
        cluster.env.step()
        for engine in cluster.engines:
            assert engine.load == engine.decode.size + engine.prefill.size + len(engine.waiting)
    if options.get("kv_mode") == "paged":
        assert cluster.store.num_preemptions[: cluster.store.size].sum() > 0
