"""One decode engine replica: a SimPy process doing continuous batching with speculation.

Each step: admit waiting requests (concurrency and KV capacity permitting),
draw the drafter's confidences and the true outcomes for the active requests,
ask the policy for verification lengths l_r, spend

    T_step = T_draft(R, gamma) + [T_sched if the policy is synchronous, or the profile's scheduler is inline]
             + 1 / SPS_R(B) + padded_slot_s * (R * max_r(1 + l_r) - B),   B = sum_r (1 + l_r)

of simulated time, then give every request min(l_r, accepted_r) + 1 tokens
(never more than it still needs). State lives in arrays over the active
requests; nothing here loops over requests or tokens in Python.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np
import simpy
from simpy.events import Event

from policies import CostCurve, Decision, Policy, PolicyMemory, check_decision
from simulator.acceptance import AcceptanceSource
from simulator.profile import HardwareProfile
from simulator.requests import RequestStore
from simulator.specs import EngineLimits

# A step ends after every other event scheduled for the same instant
# (simpy's NORMAL priority is 1), so requests that arrive or finish prefill at
# exactly that time join the very next step.
STEP_END_PRIORITY = 2


class _StepEnd(Event):
    """A timeout processed after same-time NORMAL events (see STEP_END_PRIORITY)."""

    def __init__(self, env: simpy.Environment, delay_s: float) -> None:
        super().__init__(env)
        self._ok = True
        self._value = None
        env.schedule(self, STEP_END_PRIORITY, delay_s)


class StepLog:
    """Per-step records of one engine, kept as Python lists of scalars until the end."""

    COLUMNS = ("engine", "start_at", "end_at", "num_requests", "batch_tokens", "num_verified_tokens",
               "num_accepted_tokens", "num_emitted_tokens", "capacity", "draft_s", "sched_s", "verify_s")

    def __init__(self) -> None:
        self.rows: list[tuple] = []

    def append(self, *row: float) -> None:
        self.rows.append(row)


class DecodeEngine:
    """A replica's decode loop. ``submit`` hands it prefilled requests."""

    def __init__(self, env: simpy.Environment, engine_id: int, store: RequestStore, policy: Policy,
                 profile: HardwareProfile, acceptance: AcceptanceSource, drafter: str, gamma: int,
                 limits: EngineLimits, rng: np.random.Generator, steps: StepLog,
                 on_finish: Callable[[np.ndarray], None], measure_from_s: float = 0.0,
                 policy_profile: HardwareProfile | None = None) -> None:
        self.env, self.engine_id, self.store = env, engine_id, store
        self.policy, self.profile, self.acceptance = policy, profile, acceptance
        self.drafter, self.limits, self.rng, self.steps = drafter, limits, rng, steps
        self.on_finish, self.measure_from_s = on_finish, measure_from_s
        self.policy_profile = profile if policy_profile is None else policy_profile  # what the policy prices with
        self.draft_tokens = policy.draft_tokens(gamma)
        if self.draft_tokens > gamma:
            raise ValueError(f"policy {policy.name} drafts {self.draft_tokens} tokens but drafter.gamma is {gamma}")
        self.waiting: deque[int] = deque()
        self.active = np.empty(0, dtype=np.int64)  # [R] request ids
        self.remaining = np.empty(0, dtype=np.int64)  # [R] output tokens still to produce
        self.memory = PolicyMemory()  # stale pools and EMA rows the policy carries between steps
        self.kv_used_tokens = 0
        # Histograms over request-steps of l_r and of accepted draft tokens (0..g);
        # per-position acceptance follows from their reverse cumulative sums.
        self.verified_length_counts = np.zeros(self.draft_tokens + 1, dtype=np.int64)
        self.accepted_length_counts = np.zeros(self.draft_tokens + 1, dtype=np.int64)
        self._step_costs: dict[int, tuple[float, float, CostCurve]] = {}  # R -> (draft_s, sched_s, curve)
        self._num_steps = np.empty(0, dtype=np.int64)  # [R] per-request counters, written back at finish
        self._num_verified = np.empty(0, dtype=np.int64)  # [R]
        self._num_accepted = np.empty(0, dtype=np.int64)  # [R]
        self._wakeup: Event | None = None
        self.process = env.process(self._run())

    @property
    def load(self) -> int:
        """Requests held (active + waiting), for the least-loaded router."""
        return int(self.active.size) + len(self.waiting)

    def submit(self, request_id: int) -> None:
        need = int(self.store.prompt_tokens[request_id] + self.store.output_tokens[request_id])
        if need > self.limits.kv_capacity_tokens:
            raise ValueError(f"request {request_id} needs {need} KV tokens but an engine holds only "
                             f"{self.limits.kv_capacity_tokens} (cluster.kv_capacity_tokens)")
        self.waiting.append(request_id)
        if self._wakeup is not None and not self._wakeup.triggered:
            self._wakeup.succeed()

    def _admit(self) -> None:
        store, admitted = self.store, []
        free_slots = self.limits.max_concurrency - self.active.size
        while self.waiting and len(admitted) < free_slots:
            rid = self.waiting[0]
            need = int(store.prompt_tokens[rid] + store.output_tokens[rid])
            if self.kv_used_tokens + need > self.limits.kv_capacity_tokens:
                break  # FCFS: the head of the queue waits for KV space
            self.waiting.popleft()
            self.kv_used_tokens += need
            admitted.append(rid)
        if not admitted:
            return
        ids = np.array(admitted, dtype=np.int64)
        store.decode_start_at[ids] = self.env.now
        store.engine[ids] = self.engine_id
        self.active = np.concatenate((self.active, ids))
        self.remaining = np.concatenate((self.remaining, store.output_tokens[ids] - 1))
        zeros = np.zeros(ids.size, dtype=np.int64)
        self._num_steps = np.concatenate((self._num_steps, zeros))
        self._num_verified = np.concatenate((self._num_verified, zeros))
        self._num_accepted = np.concatenate((self._num_accepted, zeros))

    def _step_cost(self, num_requests: int) -> tuple[float, float, CostCurve]:
        """Draft time, scheduler time and the policy's SPS curve of a step with R requests (cached: they depend on R
        only)."""
        cached = self._step_costs.get(num_requests)
        if cached is None:
            g = self.draft_tokens
            draft_s = self.profile.draft_s(self.drafter, num_requests, g)
            charged = g and self.profile.charges_decision(self.policy.synchronous)
            sched_s = self.profile.scheduler_s(num_requests * g, self.policy.name) if charged else 0.0
            cached = (draft_s, sched_s, self.policy_profile.step_cost_curve(self.drafter, num_requests, g))
            self._step_costs[num_requests] = cached
        return cached

    def _run(self):
        store, policy, g = self.store, self.policy, self.draft_tokens
        while True:
            self._admit()
            if self.active.size == 0:
                self._wakeup = self.env.event()
                yield self._wakeup
                self._wakeup = None
                continue
            active = self.active
            num_requests = active.size
            decoded_tokens = store.output_tokens[active] - 1 - self.remaining  # after the prefill's first token
            confidence, accepted = self.acceptance.sample_step(
                self.rng, store.domain_idx[active], store.difficulty[active], g, decoded_tokens)
            draft_s, sched_s, cost = self._step_cost(num_requests)
            view = self.memory.view(active, confidence, cost, accepted if policy.needs_outcomes else None)
            decision = policy.decide(view)
            lengths = check_decision(policy, decision, num_requests, g)
            batch_tokens = num_requests + int(lengths.sum())
            padded_slots = num_requests * (1 + int(lengths.max())) - batch_tokens
            verify_s = self.profile.verify_s(num_requests, batch_tokens, padded_slots)
            start_at = self.env.now
            yield _StepEnd(self.env, draft_s + sched_s + verify_s)
            self._apply(lengths, accepted, decision, start_at, batch_tokens, draft_s, sched_s, verify_s)

    def _apply(self, lengths: np.ndarray, accepted: np.ndarray, decision: Decision, start_at: float,
               batch_tokens: int, draft_s: float, sched_s: float, verify_s: float) -> None:
        store, active, now = self.store, self.active, self.env.now
        good = np.minimum(lengths, accepted)  # accepted draft tokens among the verified ones
        emitted = np.minimum(good + 1, self.remaining)
        self.remaining = self.remaining - emitted
        self._num_steps += 1
        self._num_verified += lengths
        self._num_accepted += good
        if now > self.measure_from_s:
            self.verified_length_counts += np.bincount(lengths, minlength=self.draft_tokens + 1)
            self.accepted_length_counts += np.bincount(good, minlength=self.draft_tokens + 1)
        self.memory = self.memory.after(self.policy, active, decision)
        self.steps.append(self.engine_id, start_at, now, active.size, batch_tokens, int(lengths.sum()),
                          int(good.sum()), int(emitted.sum()), decision.capacity, draft_s, sched_s, verify_s)
        done = self.remaining == 0
        if done.any():
            finished = active[done]
            store.finished_at[finished] = now
            store.num_steps[finished] = self._num_steps[done]
            store.num_verified_tokens[finished] = self._num_verified[done]
            store.num_accepted_tokens[finished] = self._num_accepted[done]
            self.kv_used_tokens -= int((store.prompt_tokens[finished] + store.output_tokens[finished]).sum())
            keep = ~done
            self.active, self.remaining = active[keep], self.remaining[keep]
            self._num_steps, self._num_verified = self._num_steps[keep], self._num_verified[keep]
            self._num_accepted = self._num_accepted[keep]
            self.on_finish(finished)
