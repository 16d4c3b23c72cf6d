"""One engine replica: a SimPy process doing continuous batching with speculation.

Each step: admit waiting requests (concurrency and KV permitting), draw the
drafter's confidences and the true outcomes for the decoding requests, ask the
policy for verification lengths l_r (within the token budget, when there is
one), allocate the KV the step writes (paged mode: newest requests are
preempted when it does not fit), fill what is left of the budget with prefill
chunks (chunked mode; paged KV grows by each step's chunks and only a
request whose first chunk fits is admitted, :mod:`simulator.preemption`), spend

    T_step = T_draft + [T_sched if the policy is synchronous, or the profile's scheduler is inline] + T_verify

of simulated time (:mod:`simulator.costs.profile` says what T_verify holds),
then give every decoding request min(l_r, accepted_r) + 1 tokens (never more
than it still needs; the counters count accepted drafts past a request's end, as
vLLM does) and advance the chunks; a request whose prefill completes
emits its first token at the end of that step. State lives in arrays over the
requests (:mod:`simulator.decode_set`); nothing here loops over requests or tokens in Python.

Running ahead: a step that ends before any other scheduled event, and whose
end nobody else sees (it finishes no request, completes no prefill and cannot
preempt into the cluster's prefill pool), is applied without a SimPy round
trip; the engine's clock ``now`` runs ahead of ``env.now`` until it schedules
a step at exactly the time the plain loop would. Same steps, times and order.

Modes (``cluster.mode``): ``disaggregated`` - requests arrive prefilled from the cluster's prefill pool;
``chunked`` - requests arrive unprefilled and the engine prefills them in chunks inside its own steps, after the
decode and verification tokens, as vLLM's scheduler does.
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
from simulator.acceptance.parametric import AcceptanceModel
from simulator.batch import RequestColumns, StepLog, prefill_chunks
from simulator.costs import HardwareProfile
from simulator.costs.step_cost import StepPricer
from simulator.decode_set import DecodeSet, add_counters
from simulator.decode_step import DecodeStep, LengthCounts
from simulator.kv import KVAccount
from simulator.preemption import Preemption
from simulator.recent_prefills import RecentPrefills
from simulator.requests import RequestStore
from simulator.sample_ahead import SampleAhead
from simulator.specs import EngineLimits, PrefillMode
from simulator.step_memo import NoDraftDecisions, StepCostMemo, repeat_without_drafts

__all__ = ["STEP_END_PRIORITY", "DecodeEngine", "StepLog"]

# A step ends after every other event scheduled for the same instant
# (simpy's NORMAL priority is 1), so requests that arrive or finish prefill at
# exactly that time join the very next step.
STEP_END_PRIORITY = 2
MAX_RUN_AHEAD_STEPS = 64  # steps an engine applies in a row without a SimPy round trip (0: never runs ahead)
SAMPLE_AHEAD = True  # the parametric model samples several steps of an unchanged batch at once


class _StepEnd(Event):
    """A timeout processed after same-time NORMAL events (see STEP_END_PRIORITY)."""

    def __init__(self, env: simpy.Environment, delay_s: float) -> None:
        super().__init__(env)
        self._ok = True
        self._value = None
        env.schedule(self, STEP_END_PRIORITY, delay_s)


class DecodeEngine(Preemption):
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
        self.decode = DecodeSet()  # decoding requests in admission order; counters go to the store when they leave
        # Requests being prefilled here (chunked mode), in admission order: tokens computed and to compute.
        self.prefill = RequestColumns("ids", "done", "target", "held")
        self._resume: dict[int, int] = {}  # preempted request -> output tokens it still needs
        self.memory = PolicyMemory()  # stale pools and EMA rows the policy carries between steps
        self.estimator = estimator  # acceptance.confidence.source=online: the policy's confidences, learned
        self.now = env.now  # the engine's clock: env.now, or ahead of it while running ahead (see _run)
        self._runs_ahead = not (self.kv.paged and mode == "disaggregated")  # preempting hands requests over now
        # The parametric model does not read the requests' positions in their outputs, and samples ahead.
        parametric = (type(acceptance).sample_step is AcceptanceModel.sample_step
                      and type(acceptance).sample_steps is AcceptanceModel.sample_steps)
        self._reads_position = not parametric
        self._ahead = SampleAhead(acceptance, rng, self.draft_tokens) if (
            SAMPLE_AHEAD and parametric and self.draft_tokens) else None
        self.costs = StepCostMemo(self.pricer, steps.detailed)
        self._no_drafts = NoDraftDecisions(policy, self.budget) if NoDraftDecisions.apply_to(
            policy, self.draft_tokens, estimator is not None, self.pricer) else None
        # ... and then, priced by R alone, such steps repeat exactly until something happens (see _repeat).
        self._repeats = (self._no_drafts is not None and not self.needs_context and mode == "disaggregated"
                         and not self.pricer.attention)
        self.length_counts = LengthCounts(self.draft_tokens)  # over measured request-steps
        self._joined = 0  # requests that joined the batch since the last plan (their first step is the next one)
        self._idle = True  # nothing to run since the last plan: the next step wakes the engine
        self.recent_prefills = RecentPrefills(profile)  # prompts prefilled on this device (prefill.decode_tail_s)
        self.load = 0  # requests held (decoding, prefilling, waiting) for the least-loaded router, counted
        self._wakeup: Event | None = None
        self.process = env.process(self._run())

    @property
    def resume_remaining(self) -> Mapping[int, int]:
        """Preempted requests not decoding yet -> output tokens they still need (read-only)."""
        return MappingProxyType(self._resume)

    @property
    def kv_used(self) -> int:
        """KV in use: tokens (reserve mode) or blocks (paged mode)."""
        return self.kv.used

    @property
    def verified_length_counts(self) -> np.ndarray:
        """Measured request-steps by verified draft tokens l_r -> [g + 1]."""
        return self.length_counts.verified

    @property
    def accepted_length_counts(self) -> np.ndarray:
        """Measured request-steps by accepted draft tokens min(l_r, accepted_r) -> [g + 1]."""
        return self.length_counts.accepted

    def submit(self, request_id: int) -> None:
        store = self.store
        self.load += 1
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
                                            self._kv_tokens(rid), token_room)
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
        store.decode_start_at[ids[first]] = self.now
        store.engine[ids] = self.engine_id
        self.decode.add(store, ids, remaining, held)
        self._joined += ids.size

    # ------------------------------------------------------------------ the step loop

    def _run(self):
        env = self.env
        while True:
            self.now = env.now
            plan = self._next_plan()
            if plan is None:
                self._idle = True
                self._wakeup = env.event()
                yield self._wakeup
                self._wakeup = None
                continue
            for _ in range(MAX_RUN_AHEAD_STEPS):  # steps whose end nobody else sees: no SimPy round trip
                if not self._may_run_ahead(plan):
                    break
                if (self._repeats and not self.waiting and plan.decision.smoothed is None and not self.memory.smoothed
                        and not plan.churn_s and not self.recent_prefills.pending):
                    self._repeat(plan)
                else:
                    self._apply(plan, plan.end_at)
                plan = self._next_plan()
                assert plan is not None, "only a finish or a completed prefill empties an engine"
            delay_s = plan.duration_s
            if plan.start_at != env.now:  # ran ahead: the timeout must end where the plain loop's would
                end_at = plan.end_at
                if env.now + (end_at - env.now) == end_at:
                    delay_s = end_at - env.now
                else:  # catch up with the step's start first, exactly (start <= 2 env.now: Sterbenz' lemma)
                    yield _StepEnd(env, plan.start_at - env.now)
            yield _StepEnd(env, delay_s)
            self._apply(plan, env.now)

    def _may_run_ahead(self, plan: DecodeStep) -> bool:
        """Whether a planned step can be applied now, ahead of ``env.now``: it ends before every other scheduled
        event (ties go to them), calls back no one (finishes no request, completes no prefill), and ends at most
        at twice ``env.now``, so that the engine can schedule its next step exactly where the plain loop would."""
        end_at = plan.end_at
        return (self._runs_ahead and not plan.ends_request and not plan.completes_prefill
                and end_at < self.env.peek() and end_at <= 2.0 * self.env.now)

    def _repeat(self, plan: DecodeStep) -> None:
        """Apply ``plan``, a step without draft tokens that may run ahead, and the identical ones after it that may
        too and end no request (nothing they depend on changes until an event or a finish): as ``_apply`` would,
        one after the other, with nothing but the log written per step."""
        decode, env = self.decode, self.env
        ends = repeat_without_drafts(plan, self.steps, self.engine_id, self.budget, env.peek(), 2.0 * env.now,
                                     int(decode.remaining.min()) - 1)
        decode.steps_without_drafts(len(ends))
        measured = sum(end_at > self.measure_from_s for end_at in ends)
        self.length_counts.add_without_drafts(plan.num_requests * measured)
        self.now = ends[-1]

    def _next_plan(self) -> DecodeStep | None:
        if self.waiting and self.mode == "disaggregated":
            self._admit_decoding()
        return self._plan()

    def _plan(self) -> DecodeStep | None:
        """Decide the step: decode lengths, KV (preempting if needed), prefill chunks, and its cost."""
        plan = DecodeStep(start_at=self.now)
        if self.decode.size:
            self._decide(plan)
        if self.mode == "chunked":
            room = self.budget - plan.decode_tokens  # type: ignore[operator]
            if self.kv.paged:  # blocks for this step's chunks first; a step that preempted admits no one (vLLM v1)
                room_left, num_preempted = self._allocate_chunks(max(room, 0))
                plan.num_preempted += num_preempted
                if room_left > 0 and not plan.num_preempted:
                    self._admit_prefilling(room_left)
            elif room > 0:
                self._admit_prefilling(room - int((self.prefill.target - self.prefill.done).sum()))
            left = self.prefill.target - self.prefill.done
            plan.chunks = prefill_chunks(left, max(room, 0))
            plan.completes_prefill = bool((plan.chunks == left).any())
        if plan.num_requests == 0 and not (plan.chunks.size and plan.chunks.any()):
            return None
        plan.priced(self.costs.verify(plan, self.prefill.done), self._churn_s(plan))
        return plan

    def _churn_s(self, plan: DecodeStep) -> float:
        """The profile's work for the requests that joined the batch before ``plan``, those it finishes, and for
        waking the engine when it sat idle before it, and the tail of the prompts prefilled on its device."""
        (joined, self._joined), (woke, self._idle) = (self._joined, 0), (self._idle, False)
        tail_s = self.recent_prefills.step_s()
        if not plan.ends_request:
            return self.pricer.profile.churn_s(joined, 0, woke) + tail_s
        after = plan.remaining_after if plan.remaining_after is not None else self.decode.remaining - 1
        return self.pricer.profile.churn_s(joined, int(np.count_nonzero(after == 0)), woke) + tail_s

    def _decide(self, plan: DecodeStep) -> None:
        policy, g, decode = self.policy, self.draft_tokens, self.decode
        ids = decode.ids
        context = decode.prompt_tokens + decode.decoded_tokens() if self.needs_context else None  # KV before
        draft_s, sched_s, cost = self.pricer.before_decision(ids.size, context)
        signal = None
        if self._no_drafts is not None:
            decision, lengths, accepted = self._no_drafts.decide(self.memory, ids, cost)
        else:
            if self._ahead is not None:
                signal, accepted = self._ahead.next_step(decode)
            else:
                decoded_tokens = decode.decoded_tokens() if self._reads_position else None
                signal, accepted = self.acceptance.sample_step(self.rng, decode.domain_idx, decode.difficulty, g,
                                                               decoded_tokens)
            # The online estimate has learned from earlier steps' verified outcomes only (non-anticipating).
            confidence = signal if self.estimator is None else self.estimator.estimate(signal)
            view = self.memory.view(ids, confidence, cost, accepted if policy.needs_outcomes else None,
                                    token_budget=self.budget)
            decision = policy.decide(view)
            lengths = check_decision(policy, decision, ids.size, g, self.budget)
        plan.decided(ids, decision, lengths, accepted, context, draft_s, sched_s)
        if self.kv.paged:
            before = decode.size + self.prefill.size
            plan.keep_oldest(self._allocate_step(context, lengths))  # type: ignore[arg-type]
            plan.num_preempted = before - decode.size - self.prefill.size
        if self.estimator is not None and signal is not None:  # this step's verified outcomes, for later steps
            self.estimator.update(signal[: plan.num_requests], plan.lengths, plan.accepted)
        plan.settle(decode.remaining, drafts=g > 0)

    def write_counters(self) -> None:
        """Write the decoding requests' counters so far to the store (at the end of a run, so that unfinished
        requests show their steps, verified and accepted tokens); the engine counts on from zero."""
        add_counters(self.store, self.decode.counters())
        self.decode.reset_counters()

    # ------------------------------------------------------------------ applying a step

    def _apply(self, plan: DecodeStep, now: float) -> None:
        """The step has ended at ``now``: tokens, counters, the policy's memory, the step log, finishes, chunks."""
        self.now, decode = now, self.decode
        if plan.num_requests:
            measured = now > self.measure_from_s
            if plan.good is None:  # no draft tokens
                decode.step_done(None, None, None)
                if measured:
                    self.length_counts.add_without_drafts(plan.num_requests)
            else:
                decode.step_done(plan.lengths, plan.accepted, plan.remaining_after,
                                 self.length_counts.histograms if measured else None)
        if plan.decision is not None:
            self.memory = self.memory.after(self.policy, plan.decided_ids, plan.decision)
        emitted = plan.num_good + plan.num_requests  # num_good, num_accepted: 0 in a step without drafts
        self.steps.record(self.engine_id, plan, now, emitted, plan.num_accepted, self.budget)
        if plan.ends_request:
            self._finish(decode.take(decode.remaining == 0), now)
        if plan.chunks.size and plan.chunks.any():
            self._advance_prefill(plan, now)

    def _finish(self, gone: dict[str, np.ndarray], now: float) -> None:
        finished = gone["ids"]
        self.store.finished_at[finished] = now
        add_counters(self.store, gone)
        self.kv.used -= int(gone["held"].sum())
        self.load -= finished.size
        self.on_finish(finished)

    def _advance_prefill(self, plan: DecodeStep, now: float) -> None:
        """Chunks computed: requests whose prefill completed emit their first token (unless recomputing) and
        decode from the next step; single-token requests finish here."""
        store = self.store
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
            self.load -= int(single.sum())
            self.on_finish(ids[single])
        self._start_decoding(ids[~single], remaining[~single], gone["held"][~single])
