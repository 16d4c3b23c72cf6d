"""Sampling ahead: the parametric acceptance model's draws for several steps of an unchanged batch at once.

An engine samples every step; for a handful of requests the cost is numpy's
per-call overhead, not the numbers. While the decoding requests stay the same,
:class:`SampleAhead` samples K steps in one call
(:meth:`~simulator.acceptance.parametric.AcceptanceModel.sample_steps`) and
hands them out one per step, doubling K while the batch lasts. When the batch
changes, the draws of the steps not handed out are taken back: every step sees
exactly the values, from exactly the draws, of sampling step by step: the
normals go back to a :class:`NormalStream`, which serves them again first. Its
fresh normals are the generator's own, drawn by numba where that is exact
(:func:`~simulator.acceptance.kernels.standard_normals`).
"""

from __future__ import annotations

import numpy as np

from simulator.acceptance.kernels import standard_normals
from simulator.acceptance.parametric import AcceptanceModel
from simulator.decode_set import DecodeSet

MAX_AHEAD_STEPS = 32
MAX_AHEAD_VALUES = 16384  # draft tokens (steps x requests x g) sampled in one call at most
FIRST_AHEAD_VALUES = 256  # a new batch samples this many draft tokens' worth of steps first (at most 8 steps)


class NormalStream:
    """A generator's standard normals in order; the last ones served can be given back, and are served again."""

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng
        self._back = np.empty(0)  # given back: the next values of the stream
        self._last = np.empty(0)  # what the last call served
        self.num_served = 0  # normals served so far, given-back ones not counted

    def standard_normal(self, size: int) -> np.ndarray:
        if not isinstance(size, (int, np.integer)):
            raise TypeError(f"NormalStream draws a count of normals, got size={size!r}")
        back = self._back
        if not back.size:
            served = standard_normals(self._rng, size)
        elif back.size >= size:
            served, self._back = back[:size], back[size:]
        else:
            served, self._back = np.concatenate((back, standard_normals(self._rng, size - back.size))), back[:0]
        self._last = served
        self.num_served += size
        return served

    def give_back(self, count: int) -> None:
        """The last ``count`` normals of the last call were not used: serve them again, first."""
        if count:
            self._back = np.concatenate((self._last[self._last.size - count:], self._back))
            self._last = self._last[:self._last.size - count]
            self.num_served -= count


class SampleAhead:
    """One engine's steps of a parametric acceptance model, sampled several at a time (see the module)."""

    def __init__(self, model: AcceptanceModel, rng: np.random.Generator, draft_tokens: int) -> None:
        model.check_draft_tokens(draft_tokens)
        self.model, self.draft_tokens = model, draft_tokens
        self.stream = NormalStream(rng)
        self._version = -1  # the DecodeSet version the samples belong to
        self._confidence = np.empty((0, 0, draft_tokens))  # [K, R, g]
        self._accepted = np.empty((0, 0), dtype=np.int64)  # [K, R]
        self._next = 0  # the next step handed out
        self._draws_per_step = 0  # normals a step draws: R (2 g + 1)
        self._batch: tuple[np.ndarray, np.ndarray, np.ndarray] = (np.empty((0, 5, 0)), np.empty(0, dtype=np.int64),
                                                                   np.empty(0))  # AcceptanceModel.batch_rows

    def next_step(self, decode: DecodeSet) -> tuple[np.ndarray, np.ndarray]:
        """Confidences [R, g] and accepted draft counts [R] of the decoding requests' next step."""
        count = self._accepted.shape[0]
        if decode.version != self._version:  # few requests: a few steps cost what one does
            self.stream.give_back((count - self._next) * self._draws_per_step)  # steps not handed out
            self._sample(decode, max(1, min(8, FIRST_AHEAD_VALUES // max(decode.size * self.draft_tokens, 1))))
        elif self._next == count:
            limit = max(1, MAX_AHEAD_VALUES // max(decode.size * self.draft_tokens, 1))
            self._sample(decode, min(2 * count, MAX_AHEAD_STEPS, limit))
        step = self._next
        self._next += 1
        return self._confidence[step], self._accepted[step]

    def _sample(self, decode: DecodeSet, num_steps: int) -> None:
        if decode.version != self._version:  # what the model needs of the batch: once per batch
            self._batch = self.model.batch_rows(decode.domain_idx, decode.difficulty)
            self._version, self._draws_per_step = decode.version, decode.size * (2 * self.draft_tokens + 1)
        self._confidence, self._accepted = self.model.draw_steps(
            self.stream, self._batch, self.draft_tokens, num_steps)  # type: ignore[arg-type]
        self._next = 0
