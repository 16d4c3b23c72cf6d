"""One engine replica: a SimPy process doing continuous batching with speculation.

Each step: admit waiting requests (concurrency and KV permitting), draw the
drafter's confidences and the true outcomes for the decoding requests, ask the
policy for verification lengths l_r (within the token budget, when there is
one), allocate the KV the step writes (paged mode: newest requests are
preempted when it does not fit), fill what is left of the budget with prefill
chunks (chunked mode), spend

    T_step = T_draft + [T_sched if the policy is synchronous, or the profile's scheduler is inline] + T_verify

of simulated time (:mod:`simulator.costs.profile` says what T_verify holds),
then give every decoding request min(l_r, accepted_r) + 1 tokens (never more
than it still needs) and advance the chunks; a request whose prefill completes
emits its first token at the end of that step. State lives in arrays over the
requests; nothing here loops over requests or tokens in Python.

Modes (``cluster.mode``): ``disaggregated`` - requests arrive prefilled from
the cluster's prefill pool; ``chunked`` - requests arrive unprefilled and the
engine prefills them in chunks inside its own steps, after the decode and
verification tokens, as vLLM's scheduler does.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from types import MappingProxyType

import numpy as np
import simpy
from simpy.events import Event

from policies import Policy, PolicyMemory, check_decision
from simulator.acceptance import AcceptanceSource
from simulator.acceptance.online import OnlineAcceptanceEstimator
from simulator.batch import RequestColumns, StepLog, StepPlan, prefill_chunks
from simulator.costs.step_cost import StepPricer
from simulator.kv import KVAccount, survivors
from simulator.profile import HardwareProfile
from simulator.requests import RequestStore
from simulator.specs import EngineLimits, PrefillMode

__all__ = ["STEP_END_PRIORITY", "DecodeEngine", "StepLog"]

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


class DecodeEngine:
    """A replica's step loop. ``submit`` hands it a request (prefilled in disaggregated mode)."""

    def __init__(self, env: simpy.Environment, engine_id: int, store: RequestStore, policy: Policy,
                 profile: HardwareProfile, acceptance: AcceptanceSource, drafter: str, gamma: int,
                 limits: EngineLimits, rng: np.random.Generator, steps: StepLog,
                 on_finish: Callable[[np.ndarray], None], measure_from_s: float = 0.0,
                 policy_profile: HardwareProfile | None = None, mode: PrefillMode = "disaggregated",
                 on_preempt: Callable[[np.ndarray, np.ndarray], None] | None = None,
                 estimator: OnlineAcceptanceEstimator | None = None, token_budget: int | None = None) -> None:
        self.env, self.engine_id, self.store = env, engine_id, store
        self.policy, self.profile, self.acceptance = policy, profile, acceptance
        self.drafter, self.limits, self.rng, self.steps = drafter, limits, rng, steps
        self.on_finish, self.measure_from_s, self.mode = on_finish, measure_from_s, mode
        self.on_preempt = on_preempt  # disaggregated + paged: the cluster recomputes preempted requests' KV
        self.draft_tokens = policy.draft_tokens(gamma)
        if self.draft_tokens > gamma:
            raise ValueError(f"policy {policy.name} drafts {self.draft_tokens} tokens but drafter.gamma is {gamma}")
        self.budget = token_budget  # the most batch tokens of a step (ClusterSpec.token_budget), or None
        if mode == "chunked" and self.budget is None:
            raise ValueError("cluster.mode=chunked needs a token budget")
        self.pricer = StepPricer(profile, profile if policy_profile is None else policy_profile, policy, drafter,
                                 self.draft_tokens)
        self.kv = KVAccount(limits)
        self.needs_context = self.pricer.needs_context or self.kv.paged or steps.detailed
        self.waiting: deque[int] = deque()
        # Decoding requests in admission order; counters are written to the store when they leave.
        self.decode = RequestColumns("ids", "remaining", "held", "num_steps", "num_verified", "num_accepted")
        # Requests being prefilled here (chunked mode), in admission order: tokens computed and to compute.
        self.prefill = RequestColumns("ids", "done", "target", "held")
        self._resume: dict[int, int] = {}  # preempted request -> output tokens it still needs
        self.memory = PolicyMemory()  # stale pools and EMA rows the policy carries between steps
        self.estimator = estimator  # acceptance.confidence.source=online: the policy's confidences, learned
        # Histograms over request-steps of l_r and of accepted draft tokens (0..g);
        # per-position acceptance follows from their reverse cumulative sums.
        self.verified_length_counts = np.zeros(self.draft_tokens + 1, dtype=np.int64)
        self.accepted_length_counts = np.zeros(self.draft_tokens + 1, dtype=np.int64)
        self._wakeup: Event | None = None
        self.process = env.process(self._run())

    @property
    def load(self) -> int:
        """Requests held (decoding, prefilling and waiting), for the least-loaded router."""
        return self.decode.size + self.prefill.size + len(self.waiting)

    @property
    def resume_remaining(self) -> Mapping[int, int]:
        """Preempted requests not decoding yet -> output tokens they still need (read-only)."""
        return MappingProxyType(self._resume)

    @property
    def kv_used(self) -> int:
        """KV in use: tokens (reserve mode) or blocks (paged mode)."""
        return self.kv.used

    def submit(self, request_id: int) -> None:
        store = self.store
        if request_id in self._resume:
            self.waiting.appendleft(request_id)  # back from recomputation: first in line, as vLLM requeues it
        else:
            self.kv.check_fits(request_id, int(store.prompt_tokens[request_id]),
                               int(store.output_tokens[request_id]), self.draft_tokens)
            self.waiting.append(request_id)
        if self._wakeup is not None and not self._wakeup.triggered:
            self._wakeup.succeed()

    # ------------------------------------------------------------------ admission

    def _remaining_of(self, rid: int) -> int:
        return self._resume.get(rid, int(self.store.output_tokens[rid]) - 1)

    def _kv_tokens(self, rid: int) -> int:
        """KV a request holds once (re)computed: its prompt and every output token but the last emitted one."""
        store = self.store
        return int(store.prompt_tokens[rid] + store.output_tokens[rid]) - 1 - self._remaining_of(rid)

    def _admit(self, token_room: int | None = None) -> list[tuple[int, int]]:
        """FCFS admission while concurrency, KV and (chunked mode) ``token_room`` allow -> [(id, KV units)]."""
        store, admitted = self.store, []
        free_slots = self.limits.max_concurrency - self.decode.size - self.prefill.size
        while self.waiting and len(admitted) < free_slots and (token_room is None or token_room > 0):
            rid = self.waiting[0]
            units = self.kv.admission_units(int(store.prompt_tokens[rid]), int(store.output_tokens[rid]),
                                            self._kv_tokens(rid))
            if units > self.kv.free:
                break  # FCFS: the head of the queue waits for KV space
            self.waiting.popleft()
            self.kv.used += units
            admitted.append((rid, units))
            if token_room is not None:
                token_room -= self._kv_tokens(rid)
        return admitted

    def _admit_decoding(self) -> None:
        """Disaggregated mode: waiting requests arrive prefilled and start decoding."""
        admitted = self._admit()
        if admitted:
            ids = np.array([rid for rid, _ in admitted], dtype=np.int64)
            held = np.array([units for _, units in admitted], dtype=np.int64)
            remaining = np.array([self._resume.pop(int(rid), -1) for rid in ids], dtype=np.int64)
            fresh = remaining < 0
            remaining[fresh] = self.store.output_tokens[ids[fresh]] - 1
            self._start_decoding(ids, remaining, held)

    def _admit_prefilling(self, token_room: int) -> None:
        """Chunked mode: admitted requests join the prefill set with their (re)computation ahead."""
        admitted = self._admit(token_room)
        if admitted:
            ids = np.array([rid for rid, _ in admitted], dtype=np.int64)
            target = np.array([self._kv_tokens(rid) for rid, _ in admitted], dtype=np.int64)
            self.prefill.append(ids=ids, done=np.zeros(ids.size, dtype=np.int64), target=target,
                                held=np.array([units for _, units in admitted], dtype=np.int64))
            self.store.engine[ids] = self.engine_id

    def _start_decoding(self, ids: np.ndarray, remaining: np.ndarray, held: np.ndarray) -> None:
        store = self.store
        first = np.isnan(store.decode_start_at[ids])
        store.decode_start_at[ids[first]] = self.env.now
        store.engine[ids] = self.engine_id
        zeros = np.zeros(ids.size, dtype=np.int64)
        self.decode.append(ids=ids, remaining=remaining, held=held, num_steps=zeros, num_verified=zeros,
                           num_accepted=zeros)

    # ------------------------------------------------------------------ the step loop

    def _run(self):
        while True:
            if self.mode == "disaggregated":
                self._admit_decoding()
            plan = self._plan()
            if plan is None:
                self._wakeup = self.env.event()
                yield self._wakeup
                self._wakeup = None
                continue
            yield _StepEnd(self.env, plan.draft_s + plan.sched_s + plan.cost.verify_s)
            self._apply(plan)

    def _plan(self) -> StepPlan | None:
        """Decide the step: decode lengths, KV (preempting if needed), prefill chunks, and its cost."""
        plan = StepPlan(start_at=self.env.now)
        if self.decode.size:
            self._decide(plan)
        if self.mode == "chunked":
            room = self.budget - plan.decode_tokens  # type: ignore[operator]
            if room > 0:
                self._admit_prefilling(room - int((self.prefill.target - self.prefill.done).sum()))
            plan.chunks = prefill_chunks(self.prefill.target - self.prefill.done, max(room, 0))
        if plan.num_requests == 0 and not (plan.chunks.size and plan.chunks.any()):
            return None
        plan.cost = self.pricer.verify(plan.lengths, plan.decode_tokens, plan.context_tokens, self.prefill.done,
                                       plan.chunks, self.steps.detailed)
        return plan

    def _decide(self, plan: StepPlan) -> None:
        store, policy, g, decode = self.store, self.policy, self.draft_tokens, self.decode
        ids = decode.ids
        decoded_tokens = store.output_tokens[ids] - 1 - decode.remaining  # after the prefill's first token
        signal, accepted = self.acceptance.sample_step(
            self.rng, store.domain_idx[ids], store.difficulty[ids], g, decoded_tokens)
        # The online estimate has learned from earlier steps' verified outcomes only (non-anticipating).
        confidence = signal if self.estimator is None else self.estimator.estimate(signal)
        context = store.prompt_tokens[ids] + decoded_tokens if self.needs_context else None  # KV before the step
        draft_s, sched_s, cost = self.pricer.before_decision(ids.size, context)
        view = self.memory.view(ids, confidence, cost, accepted if policy.needs_outcomes else None,
                                token_budget=self.budget)
        decision = policy.decide(view)
        lengths = check_decision(policy, decision, ids.size, g, self.budget)
        plan.decided(ids, decision, lengths, accepted, context, draft_s, sched_s)
        if self.kv.paged:
            before = decode.size + self.prefill.size
            plan.keep_oldest(self._allocate_step(context, lengths))  # type: ignore[arg-type]
            plan.num_preempted = before - decode.size - self.prefill.size
        if self.estimator is not None:  # the verified outcomes of this step's requests, for later steps
            self.estimator.update(signal[: plan.num_requests], plan.lengths, plan.accepted)

    def _allocate_step(self, context: np.ndarray, lengths: np.ndarray) -> int:
        """Paged mode: blocks for the slots this step writes; preempts the newest requests (prefilling ones first,
        they are newer) until they fit. Returns how many decoding requests keep running."""
        need = self.kv.step_growth(context, lengths, self.decode.held)
        short = int(need.sum()) - self.kv.free
        if short > 0 and self.prefill.size:
            freed = np.cumsum(self.prefill.held[::-1])  # newest first
            count = min(int(np.searchsorted(freed, short)) + 1, self.prefill.size)
            self._preempt_prefilling(self.prefill.size - count)
        keep = survivors(need, self.decode.held, self.kv.free)
        if keep < self.decode.size:
            self._preempt_decoding(keep)
            need = need[:keep]
        self.decode.held += need
        self.kv.used += int(need.sum())
        return keep

    def _preempt_prefilling(self, keep: int) -> None:
        gone = self.prefill.split(keep)
        self.kv.used -= int(gone["held"].sum())
        self.store.num_preemptions[gone["ids"]] += 1
        self.waiting.extendleft(gone["ids"][::-1].tolist())  # oldest victim first in line

    def _preempt_decoding(self, keep: int) -> None:
        store = self.store
        gone = self.decode.split(keep)
        ids = gone["ids"]
        self._write_counters(ids, gone)
        self.kv.used -= int(gone["held"].sum())
        store.num_preemptions[ids] += 1
        self._resume.update(zip(ids.tolist(), gone["remaining"].tolist(), strict=True))
        if self.mode == "chunked":
            self.waiting.extendleft(ids[::-1].tolist())
        else:
            assert self.on_preempt is not None
            self.on_preempt(ids, np.array([self._kv_tokens(int(rid)) for rid in ids], dtype=np.int64))

    def write_counters(self) -> None:
        """Write the decoding requests' counters so far to the store (at the end of a run, so that unfinished
        requests show their steps, verified and accepted tokens); the engine counts on from zero."""
        decode = self.decode
        self._write_counters(decode.ids, {name: getattr(decode, name) for name in decode.names})
        zeros = np.zeros(decode.size, dtype=np.int64)
        decode.num_steps, decode.num_verified, decode.num_accepted = zeros, zeros.copy(), zeros.copy()

    def _write_counters(self, ids: np.ndarray, columns: dict[str, np.ndarray]) -> None:
        store = self.store
        store.num_steps[ids] += columns["num_steps"]
        store.num_verified_tokens[ids] += columns["num_verified"]
        store.num_accepted_tokens[ids] += columns["num_accepted"]

    # ------------------------------------------------------------------ applying a step

    def _apply(self, plan: StepPlan) -> None:
        now, decode = self.env.now, self.decode
        emitted_sum = good_sum = 0
        if plan.num_requests:
            # Accepted draft tokens among the verified ones, counted only up to the request's end (tokens accepted
            # past it are never emitted): a request-step emits its counted accepted tokens + 1.
            good = np.minimum(np.minimum(plan.lengths, plan.accepted), decode.remaining - 1)
            emitted = good + 1
            decode.remaining = decode.remaining - emitted
            decode.num_steps += 1
            decode.num_verified += plan.lengths
            decode.num_accepted += good
            if now > self.measure_from_s:
                self.verified_length_counts += np.bincount(plan.lengths, minlength=self.draft_tokens + 1)
                self.accepted_length_counts += np.bincount(good, minlength=self.draft_tokens + 1)
            emitted_sum, good_sum = int(emitted.sum()), int(good.sum())
        if plan.decision is not None:
            self.memory = self.memory.after(self.policy, plan.decided_ids, plan.decision)
        self.steps.record(self.engine_id, plan, now, emitted_sum, good_sum, self.budget)
        if plan.num_requests:
            done = decode.remaining == 0
            if done.any():
                self._finish(decode.take(done))
        if plan.chunks.size and plan.chunks.any():
            self._advance_prefill(plan)

    def _finish(self, gone: dict[str, np.ndarray]) -> None:
        finished = gone["ids"]
        self.store.finished_at[finished] = self.env.now
        self._write_counters(finished, gone)
        self.kv.used -= int(gone["held"].sum())
        self.on_finish(finished)

    def _advance_prefill(self, plan: StepPlan) -> None:
        """Chunks computed: requests whose prefill completed emit their first token (unless recomputing) and
        decode from the next step; single-token requests finish here."""
        store, now = self.store, self.env.now
        prefill, chunks = self.prefill, plan.chunks
        started = prefill.ids[(chunks > 0) & (prefill.done == 0)]
        store.prefill_start_at[started[np.isnan(store.prefill_start_at[started])]] = plan.start_at
        prefill.done += chunks
        complete = prefill.done == prefill.target
        if not complete.any():
            return
        gone = prefill.take(complete)
        ids = gone["ids"]
        remaining = np.array([self._resume.pop(int(rid), -1) for rid in ids], dtype=np.int64)
        fresh = remaining < 0
        store.first_token_at[ids[fresh]] = now
        remaining[fresh] = store.output_tokens[ids[fresh]] - 1
        single = remaining == 0
        if single.any():
            store.finished_at[ids[single]] = now
            self.kv.used -= int(gone["held"][single].sum())
            self.on_finish(ids[single])
        self._start_decoding(ids[~single], remaining[~single], gone["held"][~single])
