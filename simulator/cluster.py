"""A cluster: traffic sources -> prefill pool -> router -> decode engine replicas.

Prefill is disaggregated: a pool of ``num_prefill_instances`` workers serves
requests first-come first-served, each taking ``prefill_s(prompt_tokens)``
from the profile; the prefill emits the first output token (so TTFT = prefill
queue + prefill time) and hands the request to a decode engine chosen by the
router.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import simpy

from simulator.engine import DecodeEngine, StepLog
from simulator.requests import RequestStore
from simulator.specs import LossyPolicyWarning, SimulationSpec
from traces.synthetic import RequestSampler, TrafficSpec, synthetic_workload
from traces.workload import DOMAINS, Workload


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
        self.rng_arrivals, self.rng_lengths, self.rng_difficulty, _ = (np.random.default_rng(s) for s in streams[:4])
        self.env = simpy.Environment()
        self.store = RequestStore()
        self.steps = StepLog()
        self.acceptance = spec.drafter.acceptance_model()
        self.engines = [
            DecodeEngine(self.env, i, self.store, spec.policy, spec.profile, self.acceptance, spec.drafter.kind,
                         spec.drafter.gamma, spec.cluster.limits, np.random.default_rng(streams[4 + i]),
                         self.steps, self._finished, measure_from_s=spec.warmup_s,
                         policy_profile=spec.policy_profile)
            for i in range(spec.cluster.num_decode_engines)
        ]
        self.prefill = simpy.Resource(self.env, capacity=spec.cluster.num_prefill_instances)
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
        limits, gamma = spec.cluster.limits, spec.drafter.gamma
        max_batch = limits.max_concurrency * (1 + spec.policy.draft_tokens(gamma))
        if max_batch > spec.profile.max_batch_tokens:
            raise ValueError(
                f"a step can hold {max_batch} batch tokens (max_concurrency {limits.max_concurrency} x "
                f"(1 + {spec.policy.draft_tokens(gamma)} draft tokens)) but profile {spec.profile.path} covers "
                f"only {spec.profile.max_batch_tokens}; lower cluster.max_concurrency or profile more")
        if spec.duration_s is None and isinstance(spec.traffic, TrafficSpec) and spec.traffic.arrival == "closed":
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
            for rid in ids[lo:hi]:
                self.env.process(self._prefill(int(rid)))

    def _arrive_new(self, users: np.ndarray) -> None:
        """Closed loop: each user in ``users`` sends a new request now."""
        assert self.sampler is not None
        domain_idx, prompt, output = self.sampler.sample(self.rng_lengths, users.size)
        difficulty = self.acceptance.request_difficulty(self.rng_difficulty, users.size)
        ids = self.store.add(np.full(users.size, self.env.now), domain_idx, prompt, output, difficulty, users)
        for rid in ids:
            self.env.process(self._prefill(int(rid)))

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

    def _prefill(self, rid: int):
        store = self.store
        with self.prefill.request() as slot:
            yield slot
            store.prefill_start_at[rid] = self.env.now
            yield self.env.timeout(float(self.spec.profile.prefill_s(store.prompt_tokens[rid])))
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
        return min(self.engines, key=lambda e: (e.load, e.engine_id))

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
        if until is not None:
            return float(until)
        finished = self.store.finished_at[: self.store.size]
        return float(np.nanmax(finished)) if finished.size else 0.0

    def _complete(self) -> bool:
        """Open loop: every request of the workload has finished."""
        return self.num_expected is not None and self.num_finished >= self.num_expected
