"""A live batch for continuous batching: requests join and leave the speculative decoder.

:class:`~calibration.serving.specdec.SpeculativeDecoder` runs one real speculative step
(draft -> policy -> verify -> rejection sampling -> bonus) over the requests in
cache slots ``0..R-1``. :class:`LiveBatch` keeps that invariant while requests
come and go, so every step is the decoder's own ``step``:

* **prefill** (:meth:`LiveBatch.prefill`): one verifier forward over the whole
  prompt in a staging cache, the drafter's context built from its target
  features, and the first output token sampled from the verifier's last row (the
  prefill emits the first token, as in the simulator). The result is a
  :class:`Prefilled` request: its KV cache rows, ready to be handed over.
* **join** (:meth:`LiveBatch.join`): the staged KV rows are copied into slot R
  (the hand-over of disaggregated serving) and the first token becomes the anchor.
* **leave** (:meth:`LiveBatch.leave`): the highest slots move into the holes left
  by finished requests (caches, anchor, outputs and the policy's EMA row), so the
  slots stay ``0..R-1`` - what vLLM's persistent batch does when it condenses.

Each step reports wall-clock seconds spent in the drafter (``propose`` and
``extend_context``), in ``policy.decide`` and in the verifier forward; the rest of
the step is host work (index building, softmax to numpy, token-level rejection
sampling, cache bookkeeping).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from calibration.models.drafters import Drafter, SlotContext, softmax_t
from calibration.models.model import Verifier
from calibration.serving.specdec import (
    ChunkFill,
    ContextCost,
    IdleDrafter,
    PrefillChunk,
    SpeculativeDecoder,
    StepRecord,
    working_drafter,
)
from policies.base import Policy
from policies.driver import CostSource
from policies.lossless.sampler import sample_token

TIMED_PARTS = ("draft", "sched", "verify")  # stopwatch names, also the steps table's *_s columns


class Stopwatch:
    """Accumulates seconds of the calls it wraps, on ``timer`` (wall clock by default; the serving loop's CPU clock
    passes ``time.thread_time``)."""

    def __init__(self, timer: Callable[[], float] = time.perf_counter) -> None:
        self.total_s, self.timer = 0.0, timer

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = self.timer()
            try:
                return fn(*args, **kwargs)
            finally:
                self.total_s += self.timer() - start
        return timed

    def take(self) -> float:
        """Seconds accumulated since the last ``take``."""
        value, self.total_s = self.total_s, 0.0
        return value


class _Timed:
    """``target`` with some methods (or the call itself, ``"__call__"``) run on a stopwatch; the rest passes through."""

    def __init__(self, target: Any, watch: Stopwatch, methods: Sequence[str]) -> None:
        self._target = target
        self._call = watch.wrap(target) if "__call__" in methods else None
        for name in methods:
            if name != "__call__":
                setattr(self, name, watch.wrap(getattr(target, name)))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._call is None:
            raise TypeError(f"{type(self._target).__name__} is not timed as a callable")
        return self._call(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


@dataclass(frozen=True)
class Prefilled:
    """A prompt after prefill: its KV rows, the drafter's context rows and the first output token."""

    prompt_tokens: int
    first_token: int
    verifier_k: torch.Tensor  # [layers, Hkv, n, d]
    verifier_v: torch.Tensor
    drafter: SlotContext | None  # the drafter's context rows and the last prompt token's feature (None: no drafter)


@dataclass(frozen=True)
class StepTiming:
    """Wall-clock seconds of one step and of its timed parts (host = the rest)."""

    total_s: float
    draft_s: float
    sched_s: float
    verify_s: float

    @property
    def host_s(self) -> float:
        return max(0.0, self.total_s - self.draft_s - self.sched_s - self.verify_s)


class LiveBatch:
    """Up to ``max_requests`` requests decoded together; request ids ride along with their slots."""

    def __init__(self, verifier: Verifier, drafter: Drafter, policy: Policy, cost: CostSource | ContextCost,
                 gamma: int, max_requests: int, max_tokens_per_request: int, temperature: float = 1.0,
                 prefill_slots: int = 0, token_budget: int | None = None,
                 timer: Callable[[], float] = time.perf_counter) -> None:
        if max_requests < 1 or max_tokens_per_request < 2:
            raise ValueError(f"max_requests must be >= 1 and max_tokens_per_request >= 2, got {max_requests}, "
                             f"{max_tokens_per_request}")
        self.timer = timer  # what the step's parts are timed with (wall clock, or the loop's CPU clock)
        self.watches = {name: Stopwatch(timer) for name in TIMED_PARTS}
        self.verifier, self.temperature = verifier, temperature
        self.drafter: Drafter | IdleDrafter = working_drafter(drafter, policy, gamma)  # none runs no drafter
        self.max_requests = max_requests
        # The cache holds the prompt, the output and one step's unverified tail (anchor + gamma drafts).
        self.max_tokens = max_tokens_per_request + gamma + 1
        self.decoder = SpeculativeDecoder(
            _Timed(verifier, self.watches["verify"], ["__call__"]),
            _Timed(self.drafter, self.watches["draft"], ["propose", "extend_context"]),
            _Timed(policy, self.watches["sched"], ["decide"]), cost, gamma, temperature)
        # Slots max_requests.. hold prompts being prefilled in chunks (co-located prefill), until they join.
        self.decoder.attach(max_requests + prefill_slots, self.max_tokens)
        self.decoder.token_budget = token_budget
        self.free_prefill_slots = list(range(max_requests, max_requests + prefill_slots))
        self.device = verifier.embed.weight.device
        self.request_ids: list[int] = []  # [R] request id in slot r

    @property
    def num_requests(self) -> int:
        return len(self.request_ids)

    def context_tokens(self) -> np.ndarray:
        """[R] KV tokens each request holds in the verifier's cache (its context before the next step)."""
        return self.decoder.cache.lengths[: self.num_requests].numpy().copy()

    @property
    def outputs(self) -> list[list[int]]:
        """[R] output tokens of the request in slot r (the first one from prefill)."""
        return self.decoder.outputs

    @torch.inference_mode()
    def prefill(self, prompt: Sequence[int], rng: np.random.Generator) -> Prefilled:
        """Prefill ``prompt`` outside the batch (a staging cache) and sample the first output token."""
        n = len(prompt)
        if not 1 <= n <= self.max_tokens - self.decoder.gamma - 2:
            raise ValueError(f"a prompt of {n} tokens does not fit a cache slot of {self.max_tokens} tokens")
        cache = self.verifier.new_cache(1, n)
        out = self.verifier(torch.as_tensor(list(prompt), device=self.device), cache.batch([0], [n]), cache)
        cache.commit([0], [n])
        probs = softmax_t(out.logits[-1], self.temperature).double().cpu().numpy()
        first = sample_token(probs / probs.sum(), rng)
        return Prefilled(n, first, *cache.rows(0), self.drafter.staged_context(self.drafter.features_of(out)))

    @torch.inference_mode()
    def join(self, request_id: int, staged: Prefilled) -> int:
        """Copy a prefilled request into the next free slot; returns the slot."""
        slot = self.num_requests
        if slot >= self.max_requests:
            raise RuntimeError(f"the batch is full ({self.max_requests} requests)")
        self.decoder.cache.write(slot, staged.verifier_k, staged.verifier_v)
        self.drafter.load_slot(slot, staged.drafter)
        self.decoder.admit(staged.first_token)
        self.request_ids.append(request_id)
        return slot

    def step(self, rng: np.random.Generator, generator: torch.Generator,
             fill: ChunkFill | None = None) -> tuple[StepRecord, StepTiming]:
        """One speculative step of every request in the batch (SpeculativeDecoder.step), timed; ``fill`` adds prefill
        chunks to its verifier forward."""
        if not self.request_ids:
            raise RuntimeError("step on an empty batch")
        for watch in self.watches.values():
            watch.take()
        start = self.timer()
        record = self.decoder.step(rng, generator, fill=fill)
        return record, self._timing(self.timer() - start)

    def _timing(self, total_s: float) -> StepTiming:
        parts = {name: watch.take() for name, watch in self.watches.items()}
        return StepTiming(total_s, parts["draft"], parts["sched"], parts["verify"])

    # ------------------------------------------------------------ co-located chunked prefill

    def open_prefill(self) -> int:
        """A free prefill slot for a prompt to be computed in chunks (its caches emptied)."""
        if not self.free_prefill_slots:
            raise RuntimeError("no free prefill slot")
        slot = self.free_prefill_slots.pop(0)
        self.decoder.cache.lengths[slot] = 0
        self.drafter.clear_slots([slot])
        return slot

    def chunk_step(self, chunks: Sequence[PrefillChunk], rng: np.random.Generator) -> tuple[tuple, StepTiming]:
        """A step of prefill chunks alone (nobody decoding), timed: the first tokens of completed prompts."""
        for watch in self.watches.values():
            watch.take()
        start = self.timer()
        firsts = self.decoder.prefill_chunks(chunks, rng)
        return firsts, self._timing(self.timer() - start)

    @torch.inference_mode()
    def close_prefill(self, slot: int, first_token: int) -> Prefilled:
        """The prompt computed in prefill slot ``slot`` as a :class:`Prefilled` request (ready to :meth:`join`); the
        slot is freed."""
        staged = Prefilled(int(self.decoder.cache.lengths[slot]), first_token, *self.decoder.cache.rows(slot),
                           self.drafter.slot_context(slot))
        self.free_prefill_slots.append(slot)
        return staged

    @torch.inference_mode()
    def leave(self, slots: Sequence[int]) -> None:
        """Remove the requests in ``slots``; the highest remaining slots fill the holes."""
        num = self.num_requests
        gone = sorted(set(int(s) for s in slots))
        if gone and (gone[0] < 0 or gone[-1] >= num):
            raise ValueError(f"slots {gone} outside 0..{num - 1}")
        keep = [s for s in range(num) if s not in set(gone)]
        size = len(keep)
        holes = [s for s in gone if s < size]
        movers = [s for s in keep if s >= size]
        order = list(range(size))  # order[new slot] = old slot
        for dst, src in zip(holes, movers, strict=True):
            self._move(src, dst)
            order[dst] = src
        self.decoder.reorder(order)
        self.request_ids = [self.request_ids[s] for s in order]
        self.decoder.cache.lengths[size:num] = 0
        self.drafter.clear_slots(slice(size, num))

    def _move(self, src: int, dst: int) -> None:
        self.decoder.cache.move(src, dst)
        self.drafter.move_slot(src, dst)
