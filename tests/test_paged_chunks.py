"""Paged KV in chunked mode grows chunk by chunk, as vLLM v1 allocates slots for the tokens it schedules.

Each planned step of one engine is recorded: a prefilling request holds exactly the blocks of the tokens it has
computed plus this step's chunk, a waiting request is admitted as soon as its first chunk's blocks fit (not its
whole prompt), a prefilling request whose chunk does not fit is preempted (freeing exactly its blocks) while the
older decoding requests keep theirs, and KV in use never exceeds the capacity.
"""

from __future__ import annotations

import numpy as np
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import make_policy
from simulator import ClusterSpec, DrafterSpec, EngineLimits, load_profile, simulate
from simulator.batch import StepLog
from simulator.engine import DecodeEngine
from simulator.kv import blocks_for
from simulator.requests import RequestStore
from traces.workload import Workload

PROFILE = load_profile("h200_qwen3-8b_analytic")
ACCEPTANCE = DrafterSpec("dspark", 5).acceptance_model()  # gamma 5, as small_spec
BLOCK_TOKENS = 16


class Recorded:
    """One chunked, paged engine driven directly; every planned step is checked and kept as a snapshot."""

    def __init__(self, capacity_tokens: int, budget_tokens: int, policy: str = "none", max_concurrency: int = 4,
                 seed: int = 0) -> None:
        self.env = simpy.Environment()
        self.store = RequestStore(track_preemptions=True)
        self.steps = StepLog(detailed=True)
        limits = EngineLimits(max_concurrency, capacity_tokens, kv_mode="paged", kv_block_tokens=BLOCK_TOKENS,
                              max_num_batched_tokens=budget_tokens)
        self.engine = DecodeEngine(self.env, 0, self.store, make_policy(policy), PROFILE, ACCEPTANCE, "dspark", 5,
                                   limits, np.random.default_rng(seed), self.steps, lambda ids: None, mode="chunked",
                                   token_budget=budget_tokens)
        self.plans: list[dict] = []
        plan_step = self.engine._plan

        def checked_plan():
            plan = plan_step()
            if plan is not None:
                self.plans.append(self._check(plan))
            return plan

        self.engine._plan = checked_plan  # type: ignore[method-assign]

    def arrive(self, at_s: float, prompt_tokens: int, output_tokens: int) -> int:
        rid = int(self.store.add(np.array([at_s]), np.array([0]), np.array([prompt_tokens]),
                                 np.array([output_tokens]), np.array([0.0]))[0])
        self.env.timeout(at_s).callbacks.append(lambda _event: self.engine.submit(rid))
        return rid

    def _check(self, plan) -> dict:
        """KV after planning a step: what the requests hold, within capacity; each prefilling request holds the
        blocks of its computed tokens and this step's chunk, each decoding one those of the slots it writes."""
        engine = self.engine
        kv, prefill, decode = engine.kv, engine.prefill, engine.decode
        assert kv.used == int(decode.held.sum() + prefill.held.sum()) <= kv.capacity
        assert plan.chunks.size == prefill.size
        np.testing.assert_array_equal(prefill.held, blocks_for(prefill.done + plan.chunks, BLOCK_TOKENS))
        if plan.num_requests:
            assert (decode.held >= blocks_for(plan.context_tokens + 1 + plan.lengths, BLOCK_TOKENS)).all()
        return dict(decode_ids=decode.ids.tolist(), decode_held=decode.held.tolist(),
                    prefill_ids=prefill.ids.tolist(), prefill_done=prefill.done.tolist(),
                    prefill_held=prefill.held.tolist(), chunks=plan.chunks.tolist(), used=kv.used,
                    waiting=list(engine.waiting), num_preempted=plan.num_preempted)

    def run(self) -> None:
        self.env.run()
        engine = self.engine
        assert not engine.waiting and engine.decode.size == engine.prefill.size == engine.kv.used == 0
        assert np.isfinite(self.store.finished_at[: self.store.size]).all()


def test_a_long_prompt_starts_when_its_first_chunk_fits_and_grows_by_chunk():
    """64 blocks of 16 tokens, a 128-token budget, no drafts. A (512-token prompt, 4 output tokens) prefills in 4
    chunks, then decodes 3 steps holding 33 blocks (context 512 + 1 slot). B (900-token prompt = 57 blocks) is
    admitted in A's first decode step with 31 blocks free: its first chunk (127 tokens, 8 blocks) fits, its whole
    prompt would not. From then on B holds the blocks of what it has computed plus its chunk."""
    run = Recorded(capacity_tokens=1024, budget_tokens=128)
    a, b = run.arrive(0.0, 512, 4), run.arrive(0.0, 900, 2)
    run.run()
    plans = run.plans
    assert [p["prefill_held"] for p in plans[:4]] == [[8], [16], [24], [32]]  # A alone: 128 tokens a step
    assert all(p["prefill_ids"] == [a] and p["waiting"] == [b] for p in plans[:4])
    assert plans[4]["decode_held"] == [33] and 64 - 33 < blocks_for(900, BLOCK_TOKENS)
    # B: chunks of 127 next to A's decode token, then 128 alone, then the last 7 tokens.
    assert [p["chunks"] for p in plans[4:12]] == [[127]] * 3 + [[128]] * 4 + [[7]]
    assert [p["prefill_held"] for p in plans[4:12]] == [[8], [16], [24], [32], [40], [48], [56], [57]]
    assert [p["decode_ids"] for p in plans[4:12]] == [[a]] * 3 + [[]] * 5
    assert [p["used"] for p in plans[4:12]] == [41, 49, 57, 32, 40, 48, 56, 57]
    assert plans[12] == dict(decode_ids=[b], decode_held=[57], prefill_ids=[], prefill_done=[], prefill_held=[],
                             chunks=[], used=57, waiting=[], num_preempted=0)
    assert len(plans) == 13 and run.store.num_preemptions[:2].tolist() == [0, 0]


def test_a_prefilling_request_whose_chunk_does_not_fit_is_preempted_and_frees_its_blocks():
    """64 blocks, a 256-token budget. A (512 + 6 tokens) decodes from step 3 holding 33 blocks. B (900 tokens) is
    admitted with its first chunk (255 tokens, 16 blocks); its second chunk needs 32 blocks in all, 65 with A's:
    B is the newest running request, so it is preempted (its 16 blocks freed, first in line again), A keeps
    running and nobody is admitted in that step. This repeats while A decodes; B recomputes from scratch."""
    run = Recorded(capacity_tokens=1024, budget_tokens=256)
    a, b = run.arrive(0.0, 512, 6), run.arrive(0.0, 900, 2)
    run.run()
    plans = run.plans
    assert [p["prefill_held"] for p in plans[:2]] == [[16], [32]]
    admitted = dict(decode_ids=[a], decode_held=[33], prefill_ids=[b], prefill_done=[0], prefill_held=[16],
                    chunks=[255], used=49, waiting=[], num_preempted=0)
    preempted = dict(decode_ids=[a], decode_held=[33], prefill_ids=[], prefill_done=[], prefill_held=[],
                     chunks=[], used=33, waiting=[b], num_preempted=1)
    assert plans[2:7] == [admitted, preempted, admitted, preempted, admitted]
    # A has finished; B goes on from the chunk of step 7: 255 -> 511 -> 767 -> 900 tokens.
    assert [p["prefill_held"] for p in plans[7:10]] == [[32], [48], [57]]
    assert plans[10]["decode_held"] == [57] and len(plans) == 11
    assert run.store.num_preemptions[[a, b]].tolist() == [0, 2]
    rows = [dict(zip(run.steps.columns, row, strict=True)) for row in run.steps.rows]
    assert [row["num_preempted"] for row in rows] == [0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0]
    assert sum(row["prefill_tokens"] for row in rows) == 512 + 900 + 2 * 255  # two lost first chunks, recomputed


def test_decoding_requests_preempt_prefilling_ones_first():
    """The decode side keeps its order: when a decoding request's next slot needs a block and none is free, the
    prefilling request (newer) is preempted. 18 blocks, a 17-token budget, no drafts: A (16-token prompt)
    decodes from step 2 holding 2 blocks (context 16 + 1 slot); B (270 tokens) gets 16 tokens, one block, a step
    and fills the cache at step 17; at step 18 A's context reaches 32 and its slot needs a third block."""
    run = Recorded(capacity_tokens=18 * BLOCK_TOKENS, budget_tokens=17)
    a, b = run.arrive(0.0, 16, 20), run.arrive(0.001, 270, 2)
    run.run()
    plans = run.plans
    assert plans[0]["prefill_ids"] == [a] and plans[1]["prefill_ids"] == [b]
    assert [p["prefill_held"] for p in plans[1:17]] == [[k] for k in range(1, 17)]
    assert [p["decode_held"] for p in plans[1:17]] == [[2]] * 16 and plans[16]["used"] == 18
    assert plans[17] == dict(decode_ids=[a], decode_held=[3], prefill_ids=[], prefill_done=[], prefill_held=[],
                             chunks=[], used=3, waiting=[b], num_preempted=1)
    assert plans[18]["prefill_ids"] == [b] and plans[18]["prefill_done"] == [0]  # recomputed from scratch
    assert run.store.num_preemptions[a] == 0 and run.store.num_preemptions[b] >= 1


@settings(max_examples=20, deadline=None, derandomize=True, database=None)
@given(requests=st.lists(st.tuples(st.floats(0.0, 0.05), st.integers(1, 1200), st.integers(1, 120)),
                         min_size=1, max_size=10),
       budget=st.sampled_from([32, 100, 256]), policy=st.sampled_from(["none", "mtp2", "dspark"]),
       seed=st.integers(0, 9))
def test_kv_never_exceeds_capacity_and_every_request_finishes(requests, budget, policy, seed):
    """Random arrivals next to a small cache (100 blocks, a 1200-token prompt takes 75 of them): at every planned
    step KV in use is what the requests hold and within capacity, and each request holds exactly its blocks
    (checked by Recorded); every request finishes and all blocks come back."""
    run = Recorded(capacity_tokens=1600, budget_tokens=budget, policy=policy, seed=seed)
    for at_s, prompt, output in requests:
        run.arrive(at_s, prompt, output)
    run.run()


def _paged_chunked(limits_tokens: int = 4000) -> ClusterSpec:
    limits = EngineLimits(16, limits_tokens, kv_mode="paged", kv_block_tokens=16, max_num_batched_tokens=256)
    return ClusterSpec(mode="chunked", limits=limits)


def _long_prompts(n: int = 30, seed: int = 3) -> Workload:
    rng = np.random.default_rng(seed)
    return Workload(arrival_at=np.sort(rng.uniform(0, 0.5, n)), prompt_tokens=rng.integers(500, 2500, n),
                    output_tokens=rng.integers(1, 300, n), domain=np.array(["chat"] * n))


def test_same_seed_same_result(small_spec):
    spec = small_spec(make_policy("dspark"), traffic=_long_prompts(), duration_s=None, warmup_s=0.0,
                      cluster=_paged_chunked())
    first, second = simulate(spec), simulate(spec)
    assert first.steps.equals(second.steps) and first.requests.equals(second.requests)
    assert first.requests["num_preemptions"].sum() > 0  # the pressure was real
    assert first.requests["finished_at"].notna().all()


def test_a_request_that_cannot_fit_alone_errors_at_submit(small_spec):
    workload = Workload(arrival_at=np.array([0.0]), prompt_tokens=np.array([990]), output_tokens=np.array([10]),
                        domain=np.array(["chat"]))
    limits = EngineLimits(16, 992, kv_mode="paged", kv_block_tokens=16, max_num_batched_tokens=256)
    spec = small_spec(make_policy("mtp3"), traffic=workload, duration_s=None,
                      cluster=ClusterSpec(mode="chunked", limits=limits))
    with pytest.raises(ValueError, match=r"request 0 needs 63 KV blocks \(1002 tokens with its lookahead\) but an "
                                         r"engine holds only 62"):
        simulate(spec)
