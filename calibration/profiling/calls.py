"""The calls a profile times: one verifier forward and one drafter step, each set up with its own cache.

Each function returns a :data:`~calibration.profiling.timing.Prepare`: calling it
builds the point's buffers (caches, index tensors, random inputs from ``gen``) outside
the timed region and returns the call to time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from calibration.models.drafters import Drafter
from calibration.models.model import Verifier
from calibration.profiling.timing import Prepare


def verify_call(model: Verifier, forward: Callable, device: torch.device, gen: torch.Generator, tokens: int,
                query_lens: list[int], context: int) -> Prepare:
    """Sets up one verifier forward of ``query_lens`` tokens per request over ``context`` cached tokens."""
    def prepare() -> Callable[[], object]:
        cache = model.new_cache(len(query_lens), context + max(query_lens))
        cache.lengths[:] = context  # values of the cached keys do not matter for timing
        batch = cache.batch(list(range(len(query_lens))), query_lens)
        ids = torch.randint(0, model.s.vocab_size, (tokens,), generator=gen, device=device)
        return lambda: forward(ids, batch, cache)
    return prepare


def _own_cache(drafter: Drafter, num_requests: int, max_tokens: int) -> tuple[Any, Any]:
    """A drafter cache of its own for one timing point, ``(cache, last_feature)``, left off the drafter: the point's
    cache dies with the point, not with the drafter."""
    drafter.new_cache(num_requests, max_tokens)
    own = drafter.cache, drafter.last_feature
    assert own[0] is not None
    drafter.cache = drafter.last_feature = None
    return own


def _on_own_cache(drafter: Drafter, own: tuple[Any, Any], work: Callable[[], object]) -> Callable[[], None]:
    """The timed call: ``work()`` with the point's ``own`` cache (:func:`_own_cache`) swapped into the drafter and
    out again."""
    def call() -> None:
        drafter.cache, drafter.last_feature = own
        try:
            work()
        finally:
            drafter.cache = drafter.last_feature = None
    return call


def draft_call(drafter: Drafter, context: int, device: torch.device, gen: torch.Generator,
               num_requests: int, gamma: int) -> Prepare:
    """Sets up one drafter step (one committed token, then ``propose``) of R requests over ``context`` tokens with
    its own cache."""
    def prepare() -> Callable[[], object]:
        own = _own_cache(drafter, num_requests, context + 1)
        cache = own[0]
        cache.lengths[:] = context - 1 if context > 0 else 0
        slots = torch.arange(num_requests)
        features = torch.randn(num_requests, drafter.fc.in_features, generator=gen,
                               device=device).to(drafter.fc.weight)
        anchor = torch.randint(0, drafter.s.vocab_size, (num_requests,), generator=gen, device=device)
        start = cache.lengths.clone()

        def one_step() -> None:
            cache.lengths.copy_(start)
            drafter.extend_context(slots, features, [1] * num_requests)
            drafter.propose(anchor, slots, gamma, gen)
        return _on_own_cache(drafter, own, one_step)
    return prepare


def chunk_call(model: Verifier, forward: Callable, drafter: Drafter | None, device: torch.device,
               gen: torch.Generator, chunk_tokens: int, context: int) -> Prepare:
    """Sets up one prefill chunk: a verifier forward of ``chunk_tokens`` prompt tokens over ``context`` computed ones
    and, with a ``drafter``, the drafter's context built from the chunk's target features (what a serving loop
    does with every prefilled token)."""
    verify = verify_call(model, forward, device, gen, chunk_tokens, [chunk_tokens], context)
    if drafter is None:
        return verify

    def prepare() -> Callable[[], object]:
        run = verify()
        own = _own_cache(drafter, 1, context + chunk_tokens)

        def one_chunk() -> None:
            own[0].lengths[:] = context
            drafter.extend_context([0], drafter.features_of(run()), [chunk_tokens])  # type: ignore[arg-type]
        return _on_own_cache(drafter, own, one_chunk)
    return prepare


def chunk_draft_call(drafter: Drafter, device: torch.device, gen: torch.Generator, chunk_tokens: int,
                     context: int) -> Prepare:
    """Sets up the drafter's part of one prefill chunk alone: its context built from ``chunk_tokens`` target
    features over ``context`` computed ones (what :func:`chunk_call` adds to the verifier's forward)."""
    def prepare() -> Callable[[], object]:
        own = _own_cache(drafter, 1, context + chunk_tokens)
        features = torch.randn(chunk_tokens, drafter.fc.in_features, generator=gen,
                               device=device).to(drafter.fc.weight)

        def one_build() -> None:
            own[0].lengths[:] = context
            drafter.extend_context([0], features, [chunk_tokens])  # type: ignore[arg-type]
        return _on_own_cache(drafter, own, one_build)
    return prepare
