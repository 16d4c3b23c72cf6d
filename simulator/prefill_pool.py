"""The disaggregated prefill pool: identical workers serving prefills first come, first served.

The pool behaves event for event like a ``simpy.Resource`` with one SimPy
process per job (``with pool.request(): yield timeout(prefill_s)``), without
the processes: it schedules the same events at the same points of the event
sequence, with plain callbacks instead of generators and the Resource's
request/release machinery (about half the cost per job). Keeping every event
matters beyond the start and end times: which of two events due at the same
instant runs first follows the order they were scheduled in, and a job's end
decides where the next closed-loop request queues.

A job's events, as the process had them:

1. joining schedules an urgent event (the process's start);
2. that event queues the job; a free worker takes the head of the queue (one
   job per call, as ``Resource._trigger_put`` does) by scheduling a grant event;
3. the grant event starts the job: its timeout of ``prefill_s(tokens)``;
4. the timeout frees the worker, schedules a release event and hands the job
   over (``on_done``); the process's own end event did nothing and is left out;
5. the release event lets a free worker take the head of the queue.

tests/test_prefill_pool.py checks the pool against that reference, ties included.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np
import simpy
from simpy.events import NORMAL, URGENT


class PrefillPool:
    """``num_workers`` prefill workers. ``join(rid, tokens, first)`` queues a job; the pool calls
    ``on_start(rid)`` when a first prefill (``first``) starts and ``on_done(rid, first)`` when any job ends."""

    def __init__(self, env: simpy.Environment, num_workers: int,
                 prefill_s: Callable[[int], float | np.ndarray], on_start: Callable[[int], None],
                 on_done: Callable[[int, bool], None]) -> None:
        if num_workers < 1:
            raise ValueError(f"cluster.num_prefill_instances must be >= 1, got {num_workers}")
        self.env = env
        self.num_free = num_workers
        self.waiting: deque[tuple[int, int, bool]] = deque()  # (request id, tokens, first) in joining order
        self._prefill_s = prefill_s
        self._seconds: dict[int, float] = {}  # prefill_s by token count (a pure function, so memoised)
        self._on_start = on_start
        self._on_done = on_done

    def _schedule(self, callback: Callable[[simpy.Event], None], priority: int = NORMAL) -> None:
        """A triggered event due now whose processing calls ``callback``."""
        event = simpy.Event(self.env)
        event._ok, event._value = True, None  # triggered, as Event.succeed() leaves it
        event.callbacks.append(callback)
        self.env.schedule(event, priority)

    def join(self, rid: int, tokens: int, first: bool) -> None:
        job = (rid, tokens, first)
        self._schedule(lambda _event: self._queue(job), URGENT)

    def _queue(self, job: tuple[int, int, bool]) -> None:
        self.waiting.append(job)
        self._take_head()

    def _take_head(self) -> None:
        if self.num_free and self.waiting:
            self.num_free -= 1
            job = self.waiting.popleft()
            self._schedule(lambda _event: self._start(*job))

    def _start(self, rid: int, tokens: int, first: bool) -> None:
        seconds = self._seconds.get(tokens)
        if seconds is None:
            seconds = self._seconds[tokens] = float(self._prefill_s(tokens))
        if first:
            self._on_start(rid)
        self.env.timeout(seconds).callbacks.append(lambda _event: self._end(rid, first))

    def _end(self, rid: int, first: bool) -> None:
        self.num_free += 1
        self._schedule(lambda _event: self._take_head())
        self._on_done(rid, first)
