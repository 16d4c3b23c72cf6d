"""KV-cache accounting of one engine: reservation at admission, or paged blocks that grow (vLLM-style).

Two modes (``cluster.kv_mode``):

* ``reserve`` - a request takes ``prompt + output`` tokens of KV when it is
  admitted and gives them back when it finishes; nothing grows, nothing is
  preempted. Units are tokens.
* ``paged`` - KV is allocated in blocks of ``kv_block_tokens`` tokens as it is
  written: before every step, the blocks a decoding request's verification
  writes, ``1 + l_r`` slots past its context (the verified lookahead), and
  the blocks of the prompt tokens a prefilling request computes. In
  disaggregated mode a request is admitted with the blocks of the KV it
  brings (its prompt, or prompt + output so far after a preemption); in
  chunked mode it is prefilled chunk by chunk and holds the blocks of the
  tokens computed so far plus this step's chunk (vLLM v1's
  ``allocate_slots(request, num_new_tokens)``): it is admitted with the
  blocks of its first chunk. Blocks stay with the request until it finishes
  (rejected slots are overwritten later). When a step's blocks do not fit,
  the newest requests are preempted by recompute (their blocks freed, their
  KV rebuilt later), as vLLM does (:mod:`simulator.preemption`). Units are
  blocks.
"""

from __future__ import annotations

import numpy as np

from simulator.specs import EngineLimits


def blocks_for(tokens: np.ndarray | int, block_tokens: int) -> np.ndarray | int:
    """Blocks that hold ``tokens`` tokens (ceil)."""
    return -(-tokens // block_tokens)


class KVAccount:
    """Capacity and use of one engine's KV cache, in units (tokens when reserving, blocks when paged)."""

    def __init__(self, limits: EngineLimits) -> None:
        self.paged = limits.kv_mode == "paged"
        self.block_tokens = limits.kv_block_tokens
        self.capacity = limits.kv_capacity_tokens // self.block_tokens if self.paged else limits.kv_capacity_tokens
        self.used = 0

    @property
    def free(self) -> int:
        return self.capacity - self.used

    def check_fits(self, request_id: int, prompt_tokens: int, output_tokens: int, draft_tokens: int) -> None:
        """Raise when a request could never run alone in this engine (checked when it is handed over)."""
        if not self.paged:
            need = prompt_tokens + output_tokens
            if need > self.capacity:
                raise ValueError(f"request {request_id} needs {need} KV tokens but an engine holds only "
                                 f"{self.capacity} (cluster.kv_capacity_tokens)")
            return
        # The longest context it reaches is prompt + output - 2, plus 1 + draft_tokens slots of its last step.
        tokens = prompt_tokens + output_tokens - 1 + draft_tokens
        need = int(blocks_for(tokens, self.block_tokens))
        if need > self.capacity:
            raise ValueError(f"request {request_id} needs {need} KV blocks ({tokens} tokens with its lookahead) but "
                             f"an engine holds only {self.capacity} (cluster.kv_capacity_tokens / "
                             f"cluster.kv_block_tokens)")

    def admission_units(self, prompt_tokens: int, output_tokens: int, kv_tokens: int,
                        chunk_tokens: int | None = None) -> int:
        """Units a request takes when admitted: prompt + output tokens (reserve), or (paged) the blocks of the
        ``kv_tokens`` it brings or is about to compute, of at most ``chunk_tokens`` of them when it is prefilled in
        chunks (the first chunk's blocks; the others are allocated step by step, :meth:`chunk_growth`)."""
        if not self.paged:
            return prompt_tokens + output_tokens
        return int(blocks_for(kv_tokens if chunk_tokens is None else min(kv_tokens, chunk_tokens), self.block_tokens))

    def step_growth(self, context_tokens: np.ndarray, lengths: np.ndarray, held: np.ndarray) -> np.ndarray:
        """Blocks each decoding request must add before a step that writes ``1 + l_r`` slots past its context
        -> [R] (paged only)."""
        need = blocks_for(context_tokens + 1 + lengths, self.block_tokens) - held
        return np.maximum(need, 0)

    def chunk_growth(self, done_tokens: np.ndarray, chunk_tokens: np.ndarray, held: np.ndarray) -> np.ndarray:
        """Blocks each prefilling request must add before a step that computes ``chunk_tokens`` more of its prompt
        -> [P] (paged only). A prefilling request holds exactly the blocks of its ``done_tokens``, so this is never
        negative."""
        return blocks_for(done_tokens + chunk_tokens, self.block_tokens) - held


def survivors(need: np.ndarray, held: np.ndarray, free: int) -> int:
    """How many of the oldest requests keep running when the newest are preempted until the rest fit.

    Requests are in admission order; preempting request k frees ``held[k]`` and
    drops its ``need[k]``. The answer is the largest n with
    ``sum(need[:n]) <= free + sum(held[n:])`` (vLLM preempts the newest running
    request until the allocation succeeds).
    """
    need_before = np.concatenate(([0], np.cumsum(need)))  # [R + 1]: need of the first n
    held_after = np.concatenate((np.cumsum(held[::-1])[::-1], [0]))  # [R + 1]: held by requests n..R-1
    fits = need_before <= free + held_after  # true for n = 0, and for a prefix of n
    return int(np.flatnonzero(fits)[-1])
