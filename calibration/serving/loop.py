"""A real serving loop: continuous batching of real speculative decoding on the torch models.

The ground truth the simulator is validated against, so it implements admission, finishing and the length
histograms itself (the rules are the simulator's, the code is not): :mod:`calibration.serving` says what it shares.

``serve(spec, models)`` feeds the verifier and drafter of ``models`` with the
simulator's traffic (closed loop: ``num_users`` users; open loop: a workload's
arrival times; trace replay: a :class:`traces.workload.Workload`) and decodes
with one engine, the simulator's engine model made real:

* **Admission** as :class:`simulator.engine.DecodeEngine`: first come, first
  served, while ``max_concurrency`` and ``kv_capacity_tokens`` (prompt + full
  output reserved at admission) allow. Requests join between steps.
* **Steps**: :meth:`calibration.serving.batch.LiveBatch.step`, i.e.
  :meth:`calibration.serving.specdec.SpeculativeDecoder.step` (draft -> policy from
  ``policies/`` -> one flattened verifier forward -> rejection sampling -> bonus).
  A request keeps min(accepted + 1, tokens it still needs) tokens.
* **Prefill** runs on the same device between steps (one verifier forward over
  the prompt, the drafter's context, the first output token). With
  ``prefill="disaggregated"`` (default, what the simulator models) it is booked
  on its own timeline - one prefill instance, first come first served - and its
  wall time is cut out of the decode clock: the decode clock is the wall clock
  of the decode device. With ``prefill="colocated"`` nothing is cut: prefill
  blocks decoding, as on a single-device server (the simulator does not model that).
  With ``prefill="chunked"`` (the simulator's chunked mode, under
  ``limits.max_num_batched_tokens``) requests wait unprefilled and their prompts
  are computed in chunks inside the decode steps' verifier forward, after the
  verification tokens (:mod:`calibration.serving.chunked`); the policy sees the
  budget and never exceeds it.
* **Clock** (``spec.clock``): wall or the thread's CPU seconds plus sleeps, since
  the start, less prefill time (disaggregated). Arrivals are waited for.

The result has the simulator's tables: ``requests`` with the columns of
:class:`simulator.requests.RequestStore` (``difficulty`` is NaN: real requests
have none), the metrics of :func:`simulator.metrics.add_request_metrics` and
``in_window`` (the requests that arrived before the end, as the simulator's);
``steps`` with :data:`calibration.serving.spec.STEP_COLUMNS`: the simulator's
``StepLog.COLUMNS`` plus the loop's own (see there); ``chunks`` (chunked mode) with
:data:`calibration.serving.spec.CHUNK_COLUMNS`, each prefill chunk with its step,
request and computed-before context; the summary comes from
:func:`simulator.metrics.summarize` over the same window as the simulator's.
"""

from __future__ import annotations

import heapq
import time
from collections import deque

import numpy as np
import pandas as pd
import torch

from calibration.serving.batch import LiveBatch, Prefilled
from calibration.serving.chunked import ChunkedPrefill, Prefilling
from calibration.serving.clock import LoopClock
from calibration.serving.spec import (
    CHUNK_COLUMNS,
    STEP_COLUMNS,
    PrefillMode,
    PromptSource,
    ServingModels,
    ServingResults,
    ServingSpec,
    random_prompts,
)
from calibration.serving.speed_meter import tick as speed_tick
from simulator.engine import StepLog
from simulator.metrics import add_request_metrics, requests_in_run, summarize
from simulator.requests import RequestStore
from traces.synthetic import RequestSampler, TrafficSpec, synthetic_workload
from traces.workload import DOMAINS, Workload

__all__ = ["STEP_COLUMNS", "PrefillMode", "PromptSource", "ServingModels", "ServingResults", "ServingSpec",
           "random_prompts", "serve"]


class _Server:
    """The loop's state; ``run`` drives it. One instance per ``serve`` call."""

    def __init__(self, spec: ServingSpec, models: ServingModels) -> None:
        self.spec, self.models = spec, models
        # Streams 0 and 1 are the simulator's arrival and length streams (simulator.cluster), so both see
        # the same open-loop workload and the same closed-loop length sequence.
        streams = np.random.SeedSequence(spec.seed).spawn(8)
        self.rng_arrivals, self.rng_lengths = np.random.default_rng(streams[0]), np.random.default_rng(streams[1])
        self.rng_prompts, self.rng_accept = np.random.default_rng(streams[5]), np.random.default_rng(streams[6])
        self.generator = torch.Generator().manual_seed(int(streams[7].generate_state(1)[0]))
        self.store, self.steps = RequestStore(), StepLog()
        self.clock = LoopClock(spec.clock)
        traffic = spec.traffic
        self.sampler: RequestSampler | None = None
        self.pending: list[tuple[float, int, int]] = []  # closed loop: heap of (arrival_at, order, user)
        self.num_expected: int | None = None
        self.next_arrival = 0  # open loop: requests with id < next_arrival have arrived
        if isinstance(traffic, TrafficSpec) and traffic.arrival == "closed":
            self.sampler = RequestSampler(traffic)
            max_prompt, max_output = traffic.max_prompt_tokens, traffic.max_output_tokens
            for user in range(traffic.num_users):
                heapq.heappush(self.pending, (0.0, user, user))
            self._order = traffic.num_users
        else:
            workload = traffic if isinstance(traffic, Workload) else synthetic_workload(
                self.rng_arrivals, traffic, spec.duration_s)
            names, inverse = np.unique(workload.domain, return_inverse=True)
            domain_idx = np.array([DOMAINS.index(n) for n in names], dtype=np.int64)[inverse]
            self.store.add(workload.arrival_at, domain_idx, workload.prompt_tokens, workload.output_tokens,
                           np.full(workload.num_requests, np.nan))
            self.num_expected = workload.num_requests
            max_prompt = int(workload.prompt_tokens.max(initial=1))
            max_output = int(workload.output_tokens.max(initial=1))
        need = max_prompt + max_output
        if need > spec.limits.kv_capacity_tokens:
            raise ValueError(f"a request may need {need} KV tokens but the engine holds only "
                             f"{spec.limits.kv_capacity_tokens} (limits.kv_capacity_tokens)")
        budget = spec.limits.max_num_batched_tokens
        self.chunked = ChunkedPrefill(budget) if spec.prefill == "chunked" and budget is not None else None
        self.batch = LiveBatch(models.verifier, models.drafter, spec.policy, models.cost, spec.gamma,
                               spec.limits.max_concurrency, need, spec.temperature,
                               prefill_slots=spec.limits.max_concurrency if self.chunked else 0, token_budget=budget,
                               timer=self.clock.timer)
        self.staged: deque[tuple[int, Prefilled]] = deque()  # prefilled, in prefill-completion order
        self.prefill_free_at = 0.0
        self.kv_used_tokens = 0
        self.remaining: dict[int, int] = {}  # request id -> output tokens still to produce
        self.counters: dict[int, np.ndarray] = {}  # request id -> [steps, verified, accepted]
        self.outputs: dict[int, list[int]] = {}
        self.num_finished = 0
        self.waited_s = 0.0  # slept since the previous step (see _take_wait)
        self.joined = 0  # requests that joined the batch since the previous step (this step's num_joined)
        self.cut_prefills = 0  # prompts prefilled here, their time cut from the decode clock, since the previous step
        self.canary_s = float("nan")  # the speed meter's reading before the current step (see _read_speed)
        self.cpu_start_s = time.thread_time()
        g = spec.policy.draft_tokens(spec.gamma)
        self.verified_length_counts = np.zeros(g + 1, dtype=np.int64)
        self.accepted_length_counts = np.zeros(g + 1, dtype=np.int64)

    # ------------------------------------------------------------ arrivals and prefill

    def _arrivals(self, now: float) -> list[int]:
        """Ids of the requests that arrived by ``now`` and have not been prefilled, in arrival order."""
        if self.sampler is not None:
            users = []
            while self.pending and self.pending[0][0] <= now:
                at, _, user = heapq.heappop(self.pending)
                users.append((at, user))
            if not users:
                return []
            domain_idx, prompt, output = self.sampler.sample(self.rng_lengths, len(users))
            at = np.array([a for a, _ in users])
            ids = self.store.add(at, domain_idx, prompt, output, np.full(len(users), np.nan),
                                 np.array([u for _, u in users]))
            return ids.tolist()
        arrived = int(np.searchsorted(self.store.arrival_at[: self.store.size], now, side="right"))
        ids = list(range(self.next_arrival, arrived))
        self.next_arrival = max(self.next_arrival, arrived)
        return ids

    def _prefill(self, rid: int) -> None:
        store, clock = self.store, self.clock
        domain = DOMAINS[int(store.domain_idx[rid])]
        prompt = self.models.prompts(domain, int(store.prompt_tokens[rid]), self.rng_prompts)
        start_at = clock.now()
        started = clock.timer()
        staged = self.batch.prefill(prompt, self.rng_accept)
        prefill_s = clock.timer() - started
        if self.spec.prefill == "disaggregated":
            clock.excised_s += prefill_s  # booked to the prefill instance, not the decode device
            self.cut_prefills += 1  # its time is cut; what it left in the caches is the next steps' (num_cut_prefills)
            start_at = max(float(store.arrival_at[rid]), self.prefill_free_at)
            self.prefill_free_at = first_token_at = start_at + prefill_s
        else:
            first_token_at = clock.now()  # the decode device's own clock went on during the prefill
        store.prefill_start_at[rid] = start_at
        store.first_token_at[rid] = first_token_at
        if store.output_tokens[rid] == 1:
            self._finish(np.array([rid]), float(store.first_token_at[rid]))
            self.outputs[rid] = [staged.first_token]
        else:
            self.staged.append((rid, staged))

    def _admit(self, now: float) -> None:
        """FCFS: prefilled requests (first token by ``now``) join while concurrency and KV capacity allow."""
        store, limits = self.store, self.spec.limits
        while self.staged and self.batch.num_requests < limits.max_concurrency:
            rid, staged = self.staged[0]
            need = int(store.prompt_tokens[rid] + store.output_tokens[rid])
            if store.first_token_at[rid] > now or self.kv_used_tokens + need > limits.kv_capacity_tokens:
                break
            self.staged.popleft()
            self.kv_used_tokens += need
            self._join(rid, staged, now)

    def _join(self, rid: int, staged: Prefilled, at: float) -> None:
        self.batch.join(rid, staged)
        self.joined += 1
        self.store.decode_start_at[rid] = at
        self.store.engine[rid] = 0
        self.remaining[rid] = int(self.store.output_tokens[rid]) - 1
        self.counters[rid] = np.zeros(3, dtype=np.int64)

    # ------------------------------------------------------------ co-located chunked prefill

    def _admit_prefill(self, rid: int) -> Prefilling | None:
        """The head of the queue joins the prefill set if concurrency and KV allow (chunked mode)."""
        store, limits, chunked = self.store, self.spec.limits, self.chunked
        assert chunked is not None
        need = int(store.prompt_tokens[rid] + store.output_tokens[rid])
        if (self.batch.num_requests + len(chunked.active) >= limits.max_concurrency
                or self.kv_used_tokens + need > limits.kv_capacity_tokens):
            return None
        self.kv_used_tokens += need
        store.engine[rid] = 0
        domain = DOMAINS[int(store.domain_idx[rid])]
        prompt = self.models.prompts(domain, int(store.prompt_tokens[rid]), self.rng_prompts)
        return Prefilling(rid, self.batch.open_prefill(), prompt)

    def _fill(self, decode_tokens: int) -> list:
        assert self.chunked is not None
        return self.chunked.plan(decode_tokens, self._admit_prefill)

    def _advance_prefill(self, first_tokens: tuple, start_at: float, end_at: float) -> tuple[int, int]:
        """Book the step's chunks: prefill starts, completed prompts (first token at the step's end; they decode
        from the next step). Returns the step's (prefill tokens, prefilling requests)."""
        chunked, store = self.chunked, self.store
        if chunked is None:
            return 0, 0
        store.prefill_start_at[chunked.started()] = start_at
        planned = chunked.planned()
        for entry, first in chunked.advance(first_tokens, len(self.steps.rows)):  # this step's row comes next
            rid = entry.request_id
            store.first_token_at[rid] = end_at
            staged = self.batch.close_prefill(entry.slot, first)
            if store.output_tokens[rid] == 1:
                self.outputs[rid] = [first]
                self.kv_used_tokens -= int(store.prompt_tokens[rid] + store.output_tokens[rid])
                self._finish(np.array([rid]), end_at)
            else:
                self._join(rid, staged, end_at)
        return planned

    def _chunk_step(self) -> None:
        """A step of prefill chunks alone (nobody is decoding)."""
        assert self.chunked is not None
        start_at = self.clock.now()
        chunks = self.chunked.plan(0, self._admit_prefill)
        if not chunks:
            raise RuntimeError("requests wait to be prefilled but no chunk fits: check the token budget")
        firsts, timing = self.batch.chunk_step(chunks, self.rng_accept)
        end_at = self.clock.now()
        joined, cut, self.joined, self.cut_prefills = self.joined, self.cut_prefills, 0, 0  # a chunk step joins none
        prefill_tokens, num_prefilling = self._advance_prefill(firsts, start_at, end_at)
        host_s = (end_at - start_at) - timing.draft_s - timing.sched_s - timing.verify_s
        self.steps.append(0, start_at, end_at, 0, 0, 0, 0, 0, -1, timing.draft_s, timing.sched_s, timing.verify_s,
                          host_s, 0, 0, prefill_tokens, num_prefilling, 0, self._take_wait(),
                          time.thread_time() - self.cpu_start_s, self.canary_s, joined, 0, cut)

    def _take_wait(self) -> float:  # seconds slept since the previous step (its wait_s)
        waited_s, self.waited_s = self.waited_s, 0.0
        return waited_s

    def _finish(self, ids: np.ndarray, at: float) -> None:
        store = self.store
        store.finished_at[ids] = at
        self.num_finished += ids.size
        if self.sampler is not None:
            think_s = self.spec.traffic.think_time_s  # type: ignore[union-attr]
            for user in store.user[ids]:
                heapq.heappush(self.pending, (at + think_s, self._order, int(user)))
                self._order += 1

    # ------------------------------------------------------------ decode steps

    def _step(self) -> None:
        batch, store, clock = self.batch, self.store, self.clock
        ids = np.array(batch.request_ids, dtype=np.int64)
        contexts = batch.context_tokens()  # [R] KV tokens before the step
        start_at = clock.now()
        record, timing = batch.step(self.rng_accept, self.generator, self._fill if self.chunked else None)
        lengths, accepted = record.lengths, record.accepted  # accepted is among the verified ones
        remaining = np.array([self.remaining[r] for r in ids])
        emitted = np.minimum(accepted + 1, remaining)
        done_slots = []
        for slot, rid in enumerate(ids.tolist()):
            self.remaining[rid] -= int(emitted[slot])
            self.counters[rid] += (1, int(lengths[slot]), int(accepted[slot]))
            if self.remaining[rid] == 0:
                done_slots.append(slot)
        finished = ids[done_slots]
        for slot, rid in zip(done_slots, finished.tolist(), strict=True):
            self.outputs[rid] = batch.outputs[slot][: int(store.output_tokens[rid])]
            store.num_steps[rid], store.num_verified_tokens[rid], store.num_accepted_tokens[rid] = \
                self.counters.pop(rid)
            del self.remaining[rid]
            self.kv_used_tokens -= int(store.prompt_tokens[rid] + store.output_tokens[rid])
        if done_slots:
            batch.leave(done_slots)
        end_at = clock.now()
        # before the chunks' requests join: their first step is the next one
        joined, cut, self.joined, self.cut_prefills = self.joined, self.cut_prefills, 0, 0
        prefill_tokens, num_prefilling = self._advance_prefill(record.first_tokens, start_at, end_at)
        if end_at > self.spec.warmup_s:
            g = self.verified_length_counts.size - 1
            self.verified_length_counts += np.bincount(lengths, minlength=g + 1)
            self.accepted_length_counts += np.bincount(accepted, minlength=g + 1)
        host_s = (end_at - start_at) - timing.draft_s - timing.sched_s - timing.verify_s
        self.steps.append(0, start_at, end_at, ids.size, int(ids.size + lengths.sum()), int(lengths.sum()),
                          int(accepted.sum()), int(emitted.sum()), record.decision.capacity, timing.draft_s,
                          timing.sched_s, timing.verify_s, host_s, int(contexts.sum()), int(contexts.max()),
                          prefill_tokens, num_prefilling, int(lengths.max()), self._take_wait(),
                          time.thread_time() - self.cpu_start_s, self.canary_s, joined, len(done_slots), cut)
        if finished.size:
            self._finish(finished, end_at)

    # ------------------------------------------------------------ the loop

    def _next_event_at(self) -> float | None:
        """When something can next happen while the batch is empty (arrival or end of a prefill)."""
        times = []
        if self.staged:
            times.append(float(self.store.first_token_at[self.staged[0][0]]))
        if self.pending:
            times.append(self.pending[0][0])
        if self.num_expected is not None and self.next_arrival < self.num_expected:
            times.append(float(self.store.arrival_at[self.next_arrival]))
        return min(times) if times else None

    def _read_speed(self) -> None:
        """The speed meter's reading before a step (when one is active; the step's ``canary_s``, NaN without),
        kept off the decode clock."""
        started = self.clock.timer()
        self.canary_s = speed_tick()
        self.clock.excised_s += self.clock.timer() - started

    def run(self) -> float:
        """Serve until ``duration_s`` (or, open loop without one, until every request finished); returns the end."""
        until, clock = self.spec.duration_s, self.clock
        while True:
            now = clock.now()
            if until is not None and now >= until:
                return float(until)
            if self.num_expected is not None and self.num_finished >= self.num_expected:
                return now if until is None else float(until)
            for rid in self._arrivals(now):
                if self.chunked is not None:
                    self.chunked.waiting.append(rid)
                else:
                    self._prefill(rid)
            now = clock.now()
            self._admit(now)
            if self.batch.num_requests:
                self._read_speed()
                self._step()
                continue
            if self.chunked is not None and not self.chunked.idle:
                self._read_speed()
                self._chunk_step()
                continue
            wake_at = self._next_event_at()
            if wake_at is None:  # open loop, nothing left to arrive and nothing in flight
                return now if until is None else float(until)
            waited_from = clock.now()
            clock.wait_until(wake_at if until is None else min(wake_at, until))
            self.waited_s += clock.now() - waited_from


@torch.inference_mode()
def serve(spec: ServingSpec, models: ServingModels) -> ServingResults:
    """Run the real serving loop of ``spec`` on ``models`` (see the module docstring)."""
    server = _Server(spec, models)
    cpu_start_s, wall_start_s = time.thread_time(), time.perf_counter()
    end_at = server.run()
    cpu_fraction = (time.thread_time() - cpu_start_s) / (time.perf_counter() - wall_start_s)
    frame = add_request_metrics(server.store.to_frame())
    complete = spec.duration_s is None  # an open-loop workload served until every request finished
    start_at = float(frame["arrival_at"].min()) if complete else spec.warmup_s
    # As the simulator's table: the requests that arrived before the end (a workload's later rows never did).
    requests = requests_in_run(frame, start_at, None if complete else end_at)
    steps = pd.DataFrame(server.steps.rows, columns=list(STEP_COLUMNS))
    summary = {
        "policy": spec.policy.name,
        "policy_params": dict(vars(spec.policy)),
        "lossless": bool(spec.policy.lossless),
        "drafter": models.drafter.kind,
        "gamma": spec.gamma,
        "acceptance": {"source": "real", "drafter": models.drafter.kind},  # the models' own verification
        "models": models.description,
        "prefill": spec.prefill,
        "seed": spec.seed,
        "num_decode_gpus": 1,
        "mean_host_s": float(steps["host_s"].mean()) if len(steps) else float("nan"),
        # CPU seconds of this thread per wall second (idle waits included): well below 1 while the loop was
        # busy means other jobs took the CPU, and the wall-clock numbers carry their contention.
        "cpu_fraction": cpu_fraction,
        **summarize(requests, steps, server.verified_length_counts, server.accepted_length_counts,
                    start_at=start_at, end_at=end_at, num_decode_gpus=1),
    }
    log = server.chunked.log if server.chunked is not None else []
    chunks = pd.DataFrame(log, columns=list(CHUNK_COLUMNS), dtype="int64")
    return ServingResults(spec, requests, steps, summary, server.outputs, chunks)
