"""Paged KV: blocks allocated as tokens and each step's lookahead are written, preemption by recompute when full.

Blocks are conserved (what the engine holds is what its requests hold, never more than the capacity, all
freed at the end); under pressure the newest requests are preempted, recomputed and still finish with exactly
their output; paged KV admits more requests than reservation on the same capacity.
"""

from __future__ import annotations

import numpy as np
import pytest

from policies import make_policy
from simulator import ClusterSpec, EngineLimits, simulate
from simulator.cluster import Cluster
from simulator.kv import blocks_for, survivors
from traces.workload import Workload


def paged(capacity_tokens: int, block_tokens: int = 16, max_concurrency: int = 64, **extra) -> EngineLimits:
    return EngineLimits(max_concurrency, capacity_tokens, kv_mode="paged", kv_block_tokens=block_tokens, **extra)


def open_workload(n: int = 60, seed: int = 4) -> Workload:
    rng = np.random.default_rng(seed)
    return Workload(arrival_at=np.sort(rng.uniform(0, 1.0, n)), prompt_tokens=rng.integers(1, 1500, n),
                    output_tokens=rng.integers(1, 400, n), domain=rng.choice(["chat", "code", "math"], n))


def test_survivors_preempts_the_newest_until_the_rest_fit():
    held, need = np.array([4, 4, 4, 4]), np.array([2, 2, 2, 2])
    assert survivors(need, held, free=8) == 4
    assert survivors(need, held, free=5) == 3  # dropping the newest frees 4 and needs 2 less
    assert survivors(need, held, free=0) == 2
    assert survivors(np.array([8, 0]), np.array([1, 8]), free=0) == 1  # the newest gives its 8 blocks to the oldest
    assert blocks_for(np.array([0, 1, 16, 17]), 16).tolist() == [0, 1, 1, 2]


def _step_and_check(cluster: Cluster) -> int:
    """Run ``cluster`` event by event, checking block conservation after each; returns the most blocks in use."""
    most = 0
    while cluster.env.peek() < float("inf"):
        cluster.env.step()
        for engine in cluster.engines:
            held = int(engine.decode.held.sum() + engine.prefill.held.sum())
            assert engine.kv.used == held <= engine.kv.capacity
            most = max(most, engine.kv.used)
    return most


@pytest.mark.parametrize("mode", ["disaggregated", "chunked"])
def test_blocks_are_conserved_and_all_freed(small_spec, mode):
    workload = open_workload()
    limits = paged(6000, max_num_batched_tokens=512 if mode == "chunked" else None)
    spec = small_spec(make_policy("mtp3"), traffic=workload, duration_s=None, warmup_s=0.0,
                      cluster=ClusterSpec(num_prefill_instances=4, limits=limits, mode=mode))
    cluster = Cluster(spec)
    most = _step_and_check(cluster)
    engine = cluster.engines[0]
    assert most > 0.9 * engine.kv.capacity  # the pressure was real
    assert engine.kv.used == 0 and engine.decode.size == engine.prefill.size == 0 and not engine.waiting
    store = cluster.store
    assert np.isfinite(store.finished_at[: store.size]).all()
    assert store.num_preemptions[: store.size].sum() > 0


@pytest.mark.parametrize("mode", ["disaggregated", "chunked"])
def test_preempted_requests_are_recomputed_and_finish_exactly(small_spec, mode):
    workload = open_workload(n=80, seed=9)
    limits = paged(8000, max_num_batched_tokens=512 if mode == "chunked" else None)
    results = simulate(small_spec(make_policy("dspark"), traffic=workload, duration_s=None, warmup_s=0.0,
                                  cluster=ClusterSpec(num_prefill_instances=4, limits=limits, mode=mode)))
    req, steps = results.requests, results.steps
    assert req["finished_at"].notna().all()
    assert len(req) + steps["num_emitted_tokens"].sum() == workload.output_tokens.sum()  # tokens conserved
    preempted = req["num_preemptions"] > 0
    assert preempted.sum() >= 3
    assert req["num_preemptions"].sum() == steps["num_preempted"].sum() == results.summary["num_preemptions"]
    # Recomputation emits no new first token: TTFT is the first prefill's.
    assert (req.loc[preempted, "first_token_at"] < req.loc[preempted, "finished_at"]).all()
    if mode == "chunked":  # the recomputed prefill runs in the engine's steps: prompt + output so far, again
        assert steps["prefill_tokens"].sum() > workload.prompt_tokens.sum()


def test_lookahead_slots_are_allocated_before_the_step(small_spec):
    """With one-token blocks a request holds exactly context + 1 + l_r slots from the start of a step that verifies
    l_r (MTP-3: 4 slots beyond its KV while the step runs), and 3 - accepted after it (the rejected lookahead stays
    allocated and is written over later)."""
    workload = Workload(arrival_at=np.zeros(4), prompt_tokens=np.full(4, 100), output_tokens=np.full(4, 300),
                        domain=np.array(["chat"] * 4))
    spec = small_spec(make_policy("mtp3"), traffic=workload, duration_s=None, warmup_s=0.0,
                      cluster=ClusterSpec(limits=paged(10**6, block_tokens=1)))
    cluster = Cluster(spec)
    seen_beyond = 0
    engine, store = cluster.engines[0], cluster.store
    while cluster.env.peek() < float("inf"):
        cluster.env.step()
        if engine.decode.size and engine.decode.num_steps.min() > 0:
            ids = engine.decode.ids
            kv_tokens = store.prompt_tokens[ids] + store.output_tokens[ids] - 1 - engine.decode.remaining
            beyond = engine.decode.held - kv_tokens
            assert ((beyond >= 0) & (beyond <= 4)).all()
            seen_beyond = max(seen_beyond, int(beyond.max()))
    assert seen_beyond == 4


def test_paged_admits_more_than_reservation(small_spec):
    """Short prompts, long answers: reservation holds every answer's KV from the start, paged KV only what exists."""
    n = 60
    workload = Workload(arrival_at=np.linspace(0, 1, n), prompt_tokens=np.full(n, 100), output_tokens=np.full(n, 1000),
                        domain=np.array(["chat"] * n))
    mean_requests = {}
    for mode in ("reserve", "paged"):
        limits = EngineLimits(64, 20_000, kv_mode=mode, kv_block_tokens=16)  # type: ignore[arg-type]
        steps = simulate(small_spec(make_policy("mtp1"), traffic=workload, duration_s=None, warmup_s=0.0,
                                    cluster=ClusterSpec(num_prefill_instances=4, limits=limits))).steps
        mean_requests[mode] = steps["num_requests"].mean()
    assert mean_requests["paged"] > 1.3 * mean_requests["reserve"]


def test_paged_kv_errors(small_spec):
    workload = Workload(arrival_at=np.array([0.0]), prompt_tokens=np.array([990]), output_tokens=np.array([10]),
                        domain=np.array(["chat"]))
    spec = small_spec(make_policy("mtp3"), traffic=workload, duration_s=None, cluster=ClusterSpec(limits=paged(992)))
    with pytest.raises(ValueError, match=r"request 0 needs 63 KV blocks \(1002 tokens with its lookahead\) but an "
                                         r"engine holds only 62"):
        simulate(spec)
    with pytest.raises(ValueError, match="not a whole number of cluster.kv_block_tokens=16 blocks"):
        paged(1000)
    with pytest.raises(ValueError, match="cluster.kv_mode must be reserve or paged"):
        EngineLimits(kv_mode="grow")  # type: ignore[arg-type]
