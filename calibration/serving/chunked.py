"""Co-located chunked prefill in the real loop: prompts computed in chunks inside the decode steps, under a budget.

The rules are the simulator's chunked mode (and vLLM's scheduler order), written
again here: each step first gives every decoding request its verification tokens
(the policy decides them within the token budget), then fills what is left of the
budget with prefill chunks:

* requests wait unprefilled in arrival order; while the step has room beyond the
  prompt tokens still to compute, the head of the queue is admitted to the
  prefill set if concurrency (decoding + prefilling requests) and KV (prompt +
  output reserved) allow;
* the prefill set is served in admission order, each request taking what it still
  needs while room lasts (the first ones complete, the next gets a partial chunk);
* a chunk attends over its prompt's computed tokens; the step that completes a
  prompt samples the first output token, and the request decodes from the next step.

:class:`ChunkedPrefill` keeps the queue and the prefill set, plans the chunks and
logs every computed chunk (:data:`calibration.serving.spec.CHUNK_COLUMNS`: its step,
request, computed prompt tokens before it and its tokens); the loop
(:mod:`calibration.serving.loop`) admits, runs the steps and records times.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from calibration.serving.specdec import PrefillChunk


@dataclass
class Prefilling:
    """A request in the prefill set: its cache slot, its prompt and how many of its tokens are computed."""

    request_id: int
    slot: int
    prompt: list[int]
    done_tokens: int = 0

    @property
    def left_tokens(self) -> int:
        return len(self.prompt) - self.done_tokens


Admit = Callable[[int], Prefilling | None]  # request id -> its prefill entry, or None when limits do not allow it


class ChunkedPrefill:
    """The waiting queue, the prefill set and each step's chunks under ``token_budget`` batch tokens."""

    def __init__(self, token_budget: int) -> None:
        if token_budget < 1:
            raise ValueError(f"the token budget must be >= 1, got {token_budget}")
        self.token_budget = token_budget
        self.waiting: deque[int] = deque()  # arrived, not yet admitted (arrival order)
        self.active: list[Prefilling] = []  # admission order
        self._planned: list[tuple[Prefilling, int]] = []
        self.log: list[tuple[int, int, int, int]] = []  # computed chunks, rows of CHUNK_COLUMNS

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.active

    def plan(self, decode_tokens: int, admit: Admit) -> list[PrefillChunk]:
        """The chunks of a step whose decoding requests hold ``decode_tokens`` batch tokens (admitting from the
        queue while the step has room beyond the prefill work already admitted)."""
        room = self.token_budget - decode_tokens
        self._planned = []
        if room <= 0:
            return []
        token_room = room - sum(p.left_tokens for p in self.active)
        while self.waiting and token_room > 0:
            entry = admit(self.waiting[0])
            if entry is None:
                break  # first come, first served: the head waits for room
            self.waiting.popleft()
            self.active.append(entry)
            token_room -= entry.left_tokens
        chunks = []
        for entry in self.active:
            n = min(entry.left_tokens, room)
            if n <= 0:
                break
            start = entry.done_tokens
            chunks.append(PrefillChunk(entry.slot, tuple(entry.prompt[start:start + n]), n == entry.left_tokens))
            self._planned.append((entry, n))
            room -= n
        return chunks

    def planned(self) -> tuple[int, int]:
        """(prompt tokens, requests) of the planned chunks."""
        return sum(n for _, n in self._planned), len(self._planned)

    def started(self) -> list[int]:
        """Request ids whose first chunk is in the planned step."""
        return [entry.request_id for entry, _ in self._planned if entry.done_tokens == 0]

    def advance(self, first_tokens: tuple[int | None, ...], step: int) -> list[tuple[Prefilling, int]]:
        """The planned chunks were computed in step ``step`` (its row in the steps table; logged with them): the
        completed requests (in admission order) with their first token."""
        if len(first_tokens) != len(self._planned):
            raise ValueError(f"{len(first_tokens)} chunk results for {len(self._planned)} planned chunks")
        completed = []
        for (entry, n), first in zip(self._planned, first_tokens, strict=True):
            self.log.append((step, entry.request_id, entry.done_tokens, n))
            entry.done_tokens += n
            if entry.left_tokens == 0:
                if first is None:
                    raise RuntimeError(f"request {entry.request_id}: its last chunk sampled no first token")
                completed.append((entry, first))
        self.active = [e for e in self.active if e.left_tokens > 0]
        self._planned = []
        return completed
