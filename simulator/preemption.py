"""Paged KV that does not fit: the engine preempts its newest requests by recompute, as vLLM does.

A mixin of :class:`simulator.engine.DecodeEngine`. Before a step, blocks for
the slots each decoding request writes (``1 + l_r`` past its context) are
allocated; when they do not fit, prefilling requests go first (they are the
newest), then the newest decoding ones, until the rest fit.

In chunked mode the prefilling requests' blocks are allocated next, for the
chunk each computes this step (the blocks covering ``done + chunk`` tokens,
less those it holds), as vLLM v1's scheduler allocates slots for the tokens it
schedules. When they do not fit, the newest prefilling requests are preempted
until the older ones' chunks fit; a request whose chunk does not fit even
after every newer one has gone is preempted too (vLLM v1 preempts the
lowest-priority, newest, running request, which is then the request itself).
A prefilling request never preempts a decoding one: those are older. A step
that preempted anyone admits no waiting request (as in vLLM v1); otherwise a
waiting request is admitted only when the blocks of its first chunk fit
(:meth:`simulator.kv.KVAccount.admission_units`), first come, first served.

A preempted request frees its blocks and recomputes its KV later: in chunked
mode it waits first in line at its engine, in disaggregated mode it goes
through the cluster's prefill pool (``on_preempt``) and comes back.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np

from simulator.batch import RequestColumns, prefill_chunks
from simulator.decode_set import DecodeSet, add_counters
from simulator.kv import KVAccount, survivors
from simulator.requests import RequestStore


class Preemption:
    """Allocation of a step's KV blocks and preemption of the newest requests (paged mode)."""

    kv: KVAccount
    decode: DecodeSet
    prefill: RequestColumns
    store: RequestStore
    waiting: deque[int]
    mode: str
    load: int
    _resume: dict[int, int]
    on_preempt: Callable[[np.ndarray, np.ndarray], None] | None
    _kv_tokens: Callable[[int], int]  # KV tokens a request holds once (re)computed

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

    def _allocate_chunks(self, room_tokens: int) -> tuple[int, int]:
        """Chunked mode, paged: blocks for the chunk each prefilling request computes this step (in admission
        order, within ``room_tokens``); preempts the newest prefilling requests until the older ones' chunks fit.
        Returns the room the remaining chunks leave for admission, and how many requests were preempted."""
        prefill, kv = self.prefill, self.kv
        if not prefill.size:
            return room_tokens, 0
        chunks = prefill_chunks(prefill.target - prefill.done, room_tokens)
        need = kv.chunk_growth(prefill.done, chunks, prefill.held)
        keep = survivors(need, prefill.held, kv.free)
        num_preempted = prefill.size - keep
        if num_preempted:
            self._preempt_prefilling(keep)
            chunks, need = chunks[:keep], need[:keep]
        prefill.held = prefill.held + need
        kv.used += int(need.sum())
        return room_tokens - int(chunks.sum()), num_preempted

    def _preempt_prefilling(self, keep: int) -> None:
        gone = self.prefill.split(keep)
        self.kv.used -= int(gone["held"].sum())
        self.store.num_preemptions[gone["ids"]] += 1
        self.waiting.extendleft(gone["ids"][::-1].tolist())  # oldest victim first in line

    def _preempt_decoding(self, keep: int) -> None:
        store = self.store
        gone = self.decode.split(keep)
        ids = gone["ids"]
        add_counters(store, gone)
        self.kv.used -= int(gone["held"].sum())
        store.num_preemptions[ids] += 1
        self._resume.update(zip(ids.tolist(), gone["remaining"].tolist(), strict=True))
        if self.mode == "chunked":
            self.waiting.extendleft(ids[::-1].tolist())
        else:
            assert self.on_preempt is not None
            self.load -= ids.size  # recomputed in the cluster's prefill pool, then submitted again
            self.on_preempt(ids, np.array([self._kv_tokens(int(rid)) for rid in ids], dtype=np.int64))
