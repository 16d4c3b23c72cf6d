"""The machine's speed read beside the served work: a small fixed call (the canary) timed before every step.

On a shared 2-core VM the speed of a core does not always wander slowly: it can flicker between a fast and a slow
state (a verifier forward 1.4-2x as long in the slow one) in spells of a few milliseconds to seconds, and the
share of time spent slow changes from minute to minute. A probe timed before and after a stretch of work reads
two moments of that; the meter reads the canary before every step of a serving run, so a stretch gets the mean of
hundreds of readings taken at its own pace, and two stretches can be compared by the ratio of their means.

Only serving-loop steps read it (:func:`calibration.serving.loop.serve`, outside the step and off its decode
clock): what ran just before the canary changes its time (the caches it finds), so readings compare only between
stretches of the same kind of work. A profile pass is read through its loop probes - the serving runs that fit
the loop's own costs, which scale the profile's tables to the loop's steps - and a real slice through its steps.

Use: build a :class:`SpeedMeter` around the canary and a timer, and wrap each stretch in
``with meter.phase(key):``. Inside it, :func:`tick` times the canary once; outside any phase it does nothing.
:meth:`SpeedMeter.summary` gives a phase's mean reading and its standard error.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

_ACTIVE: contextvars.ContextVar[tuple[SpeedMeter, Hashable] | None] = contextvars.ContextVar(
    "speed_meter", default=None)

# The standard error of a phase's mean is taken from this many contiguous batches of its readings: neighbouring
# readings share the machine's state, so the readings' own spread over sqrt(n) would understate it.
ERROR_BATCHES = 10


@dataclass
class SpeedMeter:
    """Canary timings (seconds, on ``timer``) per phase key."""

    canary: Callable[[], object]
    timer: Callable[[], float]
    readings: dict[Hashable, list[float]] = field(default_factory=dict)

    @contextmanager
    def phase(self, key: Hashable) -> Iterator[None]:
        """Readings taken inside the block (by :func:`tick`) are booked to ``key`` (added to earlier ones)."""
        self.readings.setdefault(key, [])
        token = _ACTIVE.set((self, key))
        try:
            yield
        finally:
            _ACTIVE.reset(token)

    def read(self, key: Hashable) -> float:
        """Time the canary once for ``key`` -> the reading (seconds)."""
        start = self.timer()
        self.canary()
        self.readings[key].append(self.timer() - start)
        return self.readings[key][-1]

    def summary(self, key: Hashable) -> tuple[float, float, int]:
        """(mean seconds, standard error of the mean from :data:`ERROR_BATCHES` contiguous batches, readings) of
        ``key``; NaN mean with no readings, NaN error with fewer than two per batch."""
        values = np.asarray(self.readings.get(key, []), dtype=np.float64)
        if values.size == 0:
            return float("nan"), float("nan"), 0
        if values.size < 2 * ERROR_BATCHES:
            return float(values.mean()), float("nan"), int(values.size)
        batches = np.array([b.mean() for b in np.array_split(values, ERROR_BATCHES)])
        return float(values.mean()), float(batches.std(ddof=1) / np.sqrt(ERROR_BATCHES)), int(values.size)


def tick() -> float:
    """Time the canary once for the active phase -> the reading (seconds); outside a phase nothing, NaN."""
    active = _ACTIVE.get()
    if active is None:
        return float("nan")
    meter, key = active
    return meter.read(key)
