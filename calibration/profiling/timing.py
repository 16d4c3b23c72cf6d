"""Timing on a device, written once: warm up, synchronise around every timed run, repeat, keep the median.

A timed run is ``sync(); start; call(); sync(); stop`` so that queued device work is
neither charged to the run nor left out of it (on CPU ``sync`` does nothing). Warm-up
runs are untimed. A :data:`Prepare` sets a run up outside the timed region and returns
the call to time.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

Prepare = Callable[[], Callable[[], object]]  # sets up one timing point (untimed), returns the call to time


def _no_sync() -> None:
    return None


def synchronizer(device: torch.device) -> Callable[[], None]:
    """What waits for ``device``'s queued work: ``torch.cuda.synchronize`` on CUDA, nothing on CPU."""
    return torch.cuda.synchronize if device.type == "cuda" else _no_sync


def time_once_s(call: Callable[[], object], sync: Callable[[], None] = _no_sync) -> float:
    """Wall seconds of one run of ``call``, the device synchronised before and after."""
    sync()
    start = time.perf_counter()
    call()
    sync()
    return time.perf_counter() - start


def run_times_s(prepare: Prepare, warmup: int, repeats: int, sync: Callable[[], None] = _no_sync) -> list[float]:
    """Seconds of ``repeats`` timed runs after ``warmup`` untimed ones; each run is set up anew by ``prepare``."""
    for _ in range(warmup):
        prepare()()
    sync()
    return [time_once_s(prepare(), sync) for _ in range(repeats)]


def median_s(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int) -> float:
    """Median wall time of ``fn`` over ``repeats`` runs, synchronising the device around each."""
    return statistics.median(run_times_s(lambda: fn, warmup, repeats, synchronizer(device)))


def time_points(points: list[tuple[str, Prepare]], warmup: int, repeats: int, interleave: bool,
                device: torch.device, on_point: Callable[[str], None]) -> list[float]:
    """Median wall time of every point's call.

    One point after the other by default (only one point's buffers alive at a
    time). With ``interleave`` every point is set up first and then timed in
    ``repeats`` round-robin passes: on a shared machine a burst of load from
    other jobs then costs every point a little instead of a few points a lot.
    """
    if not interleave:
        times = []
        for label, prepare in points:
            on_point(label)
            times.append(median_s(prepare(), device, warmup, repeats))
        return times
    sync = synchronizer(device)
    calls = []
    for label, prepare in points:
        on_point(label)
        calls.append(prepare())
    for call in calls:
        for _ in range(warmup):
            call()
    samples: list[list[float]] = [[] for _ in calls]
    for _ in range(repeats):
        for call, out in zip(calls, samples, strict=True):
            out.append(time_once_s(call, sync))
    return [statistics.median(out) for out in samples]
