"""The serving loop's decode clock: seconds of the decode device since the start, less what is booked elsewhere."""

from __future__ import annotations

import time

from calibration.serving.spec import ClockKind


class LoopClock:
    """Seconds of the decode device since creation, less the time booked to the prefill instance.

    ``wall``: the wall clock. ``cpu``: the loop thread's CPU seconds (``time.thread_time``; torch runs on this
    thread) plus the seconds it slept for arrivals: the decode device is busy exactly while the loop computes, and
    time other jobs take from it on a shared machine is not booked to it.
    """

    def __init__(self, kind: ClockKind = "wall") -> None:
        self.timer = time.thread_time if kind == "cpu" else time.perf_counter
        self.sleeps_count = kind == "cpu"  # the CPU clock does not run while the thread sleeps
        self._start, self.excised_s, self.slept_s = self.timer(), 0.0, 0.0

    def now(self) -> float:
        return self.timer() - self._start - self.excised_s + self.slept_s

    def wait_until(self, at: float) -> None:
        delay = at - self.now()
        if delay > 0:
            time.sleep(delay)
            if self.sleeps_count:
                self.slept_s += delay
