"""The calls a profile times: one verifier forward and one drafter step, each set up with its own cache.

Each function returns a :data:`~calibration.profiling.timing.Prepare`: calling it
builds the point's buffers (caches, index tensors, random inputs from ``gen``) outside
the timed region and returns the call to time.
"""

from __future__ import annotations

from collections.abc import Callable

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


def draft_call(drafter: Drafter, context: int, device: torch.device, gen: torch.Generator,
               num_requests: int, gamma: int) -> Prepare:
    """Sets up one drafter step (one committed token, then ``propose``) of R requests over ``context`` tokens with
    its own cache."""
    def prepare() -> Callable[[], object]:
        drafter.new_cache(num_requests, context + 1)
        cache, last_feature = drafter.cache, drafter.last_feature  # this point's own cache
        assert cache is not None
        cache.lengths[:] = context - 1 if context > 0 else 0
        slots = torch.arange(num_requests)
        features = torch.randn(num_requests, drafter.fc.in_features, generator=gen,
                               device=device).to(drafter.fc.weight)
        anchor = torch.randint(0, drafter.s.vocab_size, (num_requests,), generator=gen, device=device)
        start = cache.lengths.clone()

        def one_step() -> None:
            drafter.cache, drafter.last_feature = cache, last_feature
            cache.lengths.copy_(start)
            drafter.extend_context(slots, features, [1] * num_requests)
            drafter.propose(anchor, slots, gamma, gen)
            drafter.cache = drafter.last_feature = None  # the point's cache dies with the point, not the drafter
        drafter.cache = drafter.last_feature = None
        return one_step
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
        drafter.new_cache(1, context + chunk_tokens)
        cache, last_feature = drafter.cache, drafter.last_feature  # this point's own cache
        assert cache is not None

        def one_chunk() -> None:
            out = run()
            drafter.cache, drafter.last_feature = cache, last_feature
            cache.lengths[:] = context
            drafter.extend_context([0], drafter.features_of(out), [chunk_tokens])  # type: ignore[arg-type]
            drafter.cache = drafter.last_feature = None  # the point's cache dies with the point, not the drafter
        drafter.cache = drafter.last_feature = None
        return one_chunk
    return prepare


def chunk_draft_call(drafter: Drafter, device: torch.device, gen: torch.Generator, chunk_tokens: int,
                     context: int) -> Prepare:
    """Sets up the drafter's part of one prefill chunk alone: its context built from ``chunk_tokens`` target
    features over ``context`` computed ones (what :func:`chunk_call` adds to the verifier's forward)."""
    def prepare() -> Callable[[], object]:
        drafter.new_cache(1, context + chunk_tokens)
        cache, last_feature = drafter.cache, drafter.last_feature  # this point's own cache
        assert cache is not None
        features = torch.randn(chunk_tokens, drafter.fc.in_features, generator=gen,
                               device=device).to(drafter.fc.weight)

        def one_build() -> None:
            drafter.cache, drafter.last_feature = cache, last_feature
            cache.lengths[:] = context
            drafter.extend_context([0], features, [chunk_tokens])  # type: ignore[arg-type]
            drafter.cache = drafter.last_feature = None
        drafter.cache = drafter.last_feature = None
        return one_build
    return prepare
