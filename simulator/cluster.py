"""A cluster: traffic sources -> [prefill pool] -> router -> engine replicas.

``cluster.mode=disaggregated``: a pool of ``num_prefill_instances`` workers
serves requests first-come first-served, each taking
``prefill_s(prompt_tokens)`` from the profile; the prefill emits the first
output token (so TTFT = prefill queue + prefill time) and hands the request to
a decode engine chosen by the router. With paged KV, a request the engine
preempts goes back through the pool to recompute its KV (prompt and the output
so far) and returns to the same engine.

``cluster.mode=chunked``: no pool; the router hands each request to an engine
when it arrives, and the engine prefills it in chunks inside its own steps
(TTFT = waiting in the engine + the steps its chunks take).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import replace
from functools import partial

import numpy as np
import simpy

from simulator.costs.coverage import RunDemand, check_budget, check_profile_covers
from simulator.engine import DecodeEngine, StepLog
from simulator.prefill_pool import PrefillPool
from simulator.requests import RequestStore
from simulator.specs import LossyPolicyWarning, SimulationSpec
from traces.synthetic import RequestSampler, TrafficSpec, synthetic_workload
from traces.workload import DOMAINS, Workload


def records_costs(spec: SimulationSpec) -> bool:
    """Whether the step log gets its cost columns: the run uses something beyond the version-1 model (a version-2
    profile, chunked prefill, paged KV or a token budget). Version-1 runs keep their tables unchanged."""
    limits = spec.cluster.limits
    return (spec.profile.version >= 2 or spec.cluster.mode != "disaggregated" or limits.kv_mode != "reserve"
            or limits.max_num_batched_tokens is not None)


class Cluster:
    """Builds the SimPy model of a :class:`SimulationSpec`; ``run`` advances it."""

    def __init__(self, spec: SimulationSpec) -> None:
        self.spec = spec
        self._check(spec)
        if not spec.policy.lossless:
            warnings.warn(f"policy {spec.policy.name} is LOSSY: its capacity search looks at the current draft "
                          "tokens, so outputs do not follow the target distribution", LossyPolicyWarning,
                          stacklevel=2)
        streams = np.random.SeedSequence(spec.seed).spawn(4 + spec.cluster.num_decode_engines)
        if spec.acceptance_seed is not None:  # difficulty and the engines' draws from their own sequence
            own = np.random.SeedSequence([spec.seed, spec.acceptance_seed]).spawn(1 + spec.cluster.num_decode_engines)
            streams[2], streams[4:] = own[0], own[1:]
        self.rng_arrivals, self.rng_lengths, self.rng_difficulty, _ = (np.random.default_rng(s) for s in streams[:4])
        self.env = simpy.Environment()
        limits = spec.cluster.limits
        self.store = RequestStore(track_preemptions=limits.kv_mode == "paged")
        self.steps = StepLog(detailed=records_costs(spec))
        self.acceptance = spec.drafter.acceptance_model()
        self.engines = [
            DecodeEngine(self.env, i, self.store, spec.policy, spec.profile, self.acceptance,
                         spec.drafter.latency_table, spec.drafter.gamma, limits, np.random.default_rng(streams[4 + i]),
                         self.steps, self._finished, measure_from_s=spec.warmup_s,
                         policy_profile=spec.policy_profile, mode=spec.cluster.mode, on_preempt=self._recompute,
                         estimator=spec.drafter.online_estimator(),
                         token_budget=spec.cluster.token_budget(spec.profile.token_budget))
            for i in range(spec.cluster.num_decode_engines)
        ]
        drafting = spec.policy.draft_tokens(spec.drafter.gamma) > 0  # else no drafter pass over the prompt
        self.prefill = PrefillPool(self.env, spec.cluster.num_prefill_instances,
                                   partial(spec.profile.prefill_s, drafting=drafting),
                                   self._prefill_started, self._prefilled)
        self._next_engine = 0
        self.num_expected: int | None = None  # open loop: requests that must finish
        self.num_finished = 0
        self.sampler: RequestSampler | None = None
        traffic = spec.traffic
        if isinstance(traffic, TrafficSpec) and traffic.arrival == "closed":
            self.sampler = RequestSampler(traffic)
            self._arrive_new(np.arange(traffic.num_users))
        else:
            workload = traffic if isinstance(traffic, Workload) else synthetic_workload(
                self.rng_arrivals, traffic, spec.duration_s)
            self.num_expected = workload.num_requests
            self.env.process(self._replay(workload))

    @staticmethod
    def _check(spec: SimulationSpec) -> None:
        if spec.acceptance_seed is not None and (not isinstance(spec.acceptance_seed, int) or spec.acceptance_seed < 0):
            raise ValueError(f"acceptance_seed must be a non-negative integer or None, got {spec.acceptance_seed!r}")
        limits = spec.cluster.limits
        budget = spec.cluster.token_budget(spec.profile.token_budget)
        traffic = spec.traffic
        if isinstance(traffic, TrafficSpec):
            low, high = 1, traffic.max_prompt_tokens + traffic.max_output_tokens - 2
        else:
            low = int(traffic.prompt_tokens.min()) if traffic.num_requests else 1
            high = int((traffic.prompt_tokens + traffic.output_tokens).max()) - 2 if traffic.num_requests else 1
        demand = RunDemand(max_concurrency=limits.max_concurrency,
                           draft_tokens=spec.policy.draft_tokens(spec.drafter.gamma), token_budget=budget,
                           chunked=spec.cluster.mode == "chunked", min_context_tokens=low, max_context_tokens=high)
        from_profile = not limits.max_num_batched_tokens and spec.profile.token_budget is not None
        key = f"token_budget.max_num_batched_tokens of {spec.profile.path}" if from_profile else \
            "cluster.max_num_batched_tokens"
        check_budget(demand, key)
        charged = spec.policy.name if spec.profile.charges_decision(spec.policy.synchronous) else None
        check_profile_covers(spec.profile, spec.drafter.latency_table, replace(demand, decision_policy=charged))
        if spec.policy_profile is not None:  # the policy's own pricing has no decision in it
            check_profile_covers(spec.policy_profile, spec.drafter.latency_table, demand)
        if (spec.profile.decode_tail_s and spec.cluster.mode == "disaggregated"
                and spec.cluster.num_decode_engines != 1):
            raise ValueError(f"profile {spec.profile.path}: prefill.decode_tail_s prices prompts prefilled on the "
                             "decode engine's own device, which needs cluster.num_decode_engines = 1 (got "
                             f"{spec.cluster.num_decode_engines}); use a profile without it")
        if spec.duration_s is None and isinstance(traffic, TrafficSpec) and traffic.arrival == "closed":
            raise ValueError("closed-loop traffic never ends: set duration_s")

    # ------------------------------------------------------------ traffic

    def _replay(self, workload: Workload):
        names, inverse = np.unique(workload.domain, return_inverse=True)
        domain_idx = np.array([DOMAINS.index(name) for name in names], dtype=np.int64)[inverse]
        difficulty = self.acceptance.request_difficulty(self.rng_difficulty, workload.num_requests)
        ids = self.store.add(workload.arrival_at, domain_idx, workload.prompt_tokens, workload.output_tokens,
                             difficulty)
        # Requests sharing an arrival time are handed over together.
        times, starts = np.unique(workload.arrival_at, return_index=True)
        bounds = np.append(starts, ids.size)
        for t, lo, hi in zip(times, bounds[:-1], bounds[1:], strict=True):
            if t > self.env.now:
                yield self.env.timeout(t - self.env.now)
            self._hand_over(ids[lo:hi])

    def _arrive_new(self, users: np.ndarray) -> None:
        """Closed loop: each user in ``users`` sends a new request now."""
        assert self.sampler is not None
        domain_idx, prompt, output = self.sampler.sample(self.rng_lengths, users.size)
        difficulty = self.acceptance.request_difficulty(self.rng_difficulty, users.size)
        ids = self.store.add(self.env.now, domain_idx, prompt, output, difficulty, users)
        self._hand_over(ids)

    def _finished(self, request_ids: np.ndarray) -> None:
        self.num_finished += request_ids.size
        if self.sampler is None:
            return
        users = self.store.user[request_ids]
        think_s = self.spec.traffic.think_time_s  # type: ignore[union-attr]
        if think_s == 0:
            self._arrive_new(users)
        else:
            self.env.timeout(think_s).callbacks.append(lambda _event, users=users: self._arrive_new(users))

    # ------------------------------------------------------------ prefill and routing

    def _hand_over(self, ids: np.ndarray) -> None:
        """New requests, in order: to the prefill pool (disaggregated) or straight to an engine (chunked)."""
        if self.spec.cluster.mode == "chunked":
            for rid in ids.tolist():
                self._route(rid).submit(rid)
        else:
            for rid, tokens in zip(ids.tolist(), self.store.prompt_tokens[ids].tolist(), strict=True):
                self.prefill.join(rid, tokens, True)
            # A profile with prefill.decode_tail_s prefills on the (single) decode engine's device as they arrive.
            self.engines[0].recent_prefills.add(ids.size)

    def _recompute(self, request_ids: np.ndarray, kv_tokens: np.ndarray) -> None:
        """Disaggregated + paged KV: preempted requests recompute ``kv_tokens`` of KV in the prefill pool and go
        back to their engine (no new first token)."""
        for rid, tokens in zip(request_ids.tolist(), kv_tokens.tolist(), strict=True):
            self.prefill.join(rid, tokens, False)

    def _prefill_started(self, rid: int) -> None:
        self.store.prefill_start_at[rid] = self.env.now

    def _prefilled(self, rid: int, first: bool) -> None:
        """A prefill ended: a first one emits the first token and goes to the router (or finishes, for a
        one-token output); a recomputation goes back to its engine."""
        store = self.store
        if not first:
            self.engines[int(store.engine[rid])].submit(rid)
            return
        store.first_token_at[rid] = self.env.now
        if store.output_tokens[rid] == 1:
            store.finished_at[rid] = self.env.now
            self._finished(np.array([rid]))
        else:
            self._route(rid).submit(rid)

    def _route(self, rid: int) -> DecodeEngine:
        if self.spec.cluster.router == "round_robin":
            engine = self.engines[self._next_engine]
            self._next_engine = (self._next_engine + 1) % len(self.engines)
            return engine
        loads = [engine.load for engine in self.engines]
        return self.engines[loads.index(min(loads))]  # the least loaded; ties to the lowest engine_id

    # ------------------------------------------------------------ running

    def run(self, progress: Callable[[float], None] | None = None, chunk_s: float = 1.0) -> float:
        """Advance to ``duration_s`` (or until nothing is left); returns the end time."""
        until = self.spec.duration_s
        while not self._complete():
            if until is not None and self.env.now >= until:
                break
            target = self.env.now + chunk_s if until is None else min(self.env.now + chunk_s, until)
            self.env.run(until=target)
            if progress is not None:
                progress(self.env.now)
        for engine in self.engines:
            engine.write_counters()
        if until is not None:
            return float(until)
        finished = self.store.finished_at[: self.store.size]
        return float(np.nanmax(finished)) if finished.size else 0.0

    def _complete(self) -> bool:
        """Open loop: every request of the workload has finished."""
        return self.num_expected is not None and self.num_finished >= self.num_expected
