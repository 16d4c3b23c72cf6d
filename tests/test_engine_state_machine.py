"""One engine as a state machine: arrivals and steps in any order, invariants after every transition.

Hypothesis drives a :class:`DecodeEngine` directly (no cluster): requests arrive with random lengths, time
advances, and after each transition every request is in exactly one place (waiting, prefilling, decoding,
recomputing or finished), tokens are conserved (first tokens + step tokens = what the requests hold),
concurrency, KV (reserve: tokens, paged: blocks) and the token budget hold.
"""

from __future__ import annotations

import numpy as np
import simpy
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from policies import make_policy
from simulator import DrafterSpec, EngineLimits, load_profile
from simulator.batch import StepLog
from simulator.engine import DecodeEngine
from simulator.requests import RequestStore

PROFILE = load_profile("h200_qwen3-8b_analytic")
ACCEPTANCE = DrafterSpec("dspark", 5).acceptance_model()  # gamma 5, as small_spec (built once per process)
MAX_CONCURRENCY, KV_TOKENS, BLOCK_TOKENS, BUDGET = 4, 1600, 16, 40


class EngineMachine(RuleBasedStateMachine):
    @initialize(mode=st.sampled_from(["disaggregated", "chunked"]), kv_mode=st.sampled_from(["reserve", "paged"]),
                policy=st.sampled_from(["none", "mtp2", "dspark", "greedy", "threshold"]), seed=st.integers(0, 99),
                budget=st.booleans())
    def setup(self, mode: str, kv_mode: str, policy: str, seed: int, budget: bool) -> None:
        self.env = simpy.Environment()
        self.store = RequestStore(track_preemptions=True)
        self.steps = StepLog(detailed=True)
        self.mode, self.finished = mode, 0
        self.budget = BUDGET if (budget or mode == "chunked") else None
        limits = EngineLimits(MAX_CONCURRENCY, KV_TOKENS, kv_mode=kv_mode, kv_block_tokens=BLOCK_TOKENS,  # type: ignore
                              max_num_batched_tokens=self.budget)
        self.recomputing: set[int] = set()
        self.engine = DecodeEngine(self.env, 0, self.store, make_policy(policy), PROFILE, ACCEPTANCE, "dspark", 5,
                                   limits, np.random.default_rng(seed), self.steps, self._on_finish, mode=mode,  # type: ignore
                                   on_preempt=self._on_preempt, token_budget=self.budget)

    def _on_finish(self, ids: np.ndarray) -> None:
        self.finished += ids.size

    def _on_preempt(self, ids: np.ndarray, kv_tokens: np.ndarray) -> None:
        """Disaggregated mode: the cluster would recompute in its prefill pool; here it takes 10 ms."""
        for rid in ids.tolist():
            self.recomputing.add(rid)
            self.env.timeout(0.01).callbacks.append(lambda _e, rid=rid: self._back(rid))

    def _back(self, rid: int) -> None:
        self.recomputing.discard(rid)
        self.engine.submit(rid)

    @rule(prompt=st.integers(1, 700), output=st.integers(1, 300), domain=st.integers(0, 2))
    def arrive(self, prompt: int, output: int, domain: int) -> None:
        store, now = self.store, self.env.now
        rid = int(store.add(np.array([now]), np.array([domain]), np.array([prompt]), np.array([output]),
                            np.array([0.0]))[0])
        if self.mode == "chunked":
            self.engine.submit(rid)
            return
        store.prefill_start_at[rid] = store.first_token_at[rid] = now  # an instant prefill pool
        if output == 1:
            store.finished_at[rid] = now
            self.finished += 1
        else:
            self.engine.submit(rid)

    @rule(seconds=st.sampled_from([0.001, 0.02, 0.1]))
    def advance(self, seconds: float) -> None:
        self.env.run(until=self.env.now + seconds)

    @invariant()
    def limits_hold(self) -> None:
        engine = self.engine
        assert engine.decode.size + engine.prefill.size <= MAX_CONCURRENCY
        assert engine.kv.used == int(engine.decode.held.sum() + engine.prefill.held.sum()) <= engine.kv.capacity
        columns = self.steps.columns
        for row in self.steps.rows:
            step = dict(zip(columns, row, strict=True))
            if self.budget is not None:
                assert step["batch_tokens"] + step["prefill_tokens"] <= self.budget

    @invariant()
    def every_request_in_one_place_and_tokens_conserved(self) -> None:
        engine, store = self.engine, self.store
        n = store.size
        output = store.output_tokens[:n]
        done = np.isfinite(store.finished_at[:n])
        places = [engine.decode.ids, engine.prefill.ids, np.array(list(engine.waiting), dtype=np.int64),
                  np.array(sorted(self.recomputing), dtype=np.int64), np.flatnonzero(done)]
        where = np.concatenate(places)
        assert np.array_equal(np.sort(where), np.arange(n))  # each request exactly once
        held = np.zeros(n, dtype=np.int64)  # output tokens each request holds now
        held[done] = output[done]
        held[engine.decode.ids] = output[engine.decode.ids] - engine.decode.remaining
        for rid, remaining in engine.resume_remaining.items():
            held[rid] = output[rid] - remaining
        fresh = ~done & np.isfinite(store.first_token_at[:n]) & (held == 0)
        held[fresh] = 1  # prefilled, not decoding yet
        emitted = sum(dict(zip(self.steps.columns, row, strict=True))["num_emitted_tokens"] for row in self.steps.rows)
        assert held.sum() == np.isfinite(store.first_token_at[:n]).sum() + emitted
        assert self.finished == done.sum()


EngineMachine.TestCase.settings = settings(max_examples=30, stateful_step_count=40, deadline=None)
TestEngineMachine = EngineMachine.TestCase
