"""Timing on a device, written once: warm up, synchronise around every timed run, repeat, keep the median.

A timed run is ``sync(); start; call(); sync(); stop`` so that queued device work is
neither charged to the run nor left out of it (on CPU ``sync`` does nothing). Warm-up
runs are untimed. A :data:`Prepare` sets a run up outside the timed region and returns
the call to time.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

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


def time_differences(pairs: list[tuple[str, Prepare, Prepare]], warmup: int, repeats: int, device: torch.device,
                     on_point: Callable[[str], None]) -> list[float]:
    """Median over ``repeats`` rounds of t(point) - t(base) for every ``(label, base, point)``, one pair at a time.

    In each round the two calls run back to back (which goes first alternates, so a trend within a round
    cancels), so a spell in which the machine runs slow costs both sides of a difference alike. A difference of
    two medians timed seconds apart does not have that: on a machine whose speed flickers it can come out several
    times too large or below zero.
    """
    sync = synchronizer(device)
    medians = []
    for label, base_prepare, point_prepare in pairs:
        on_point(label)
        base, point = base_prepare(), point_prepare()
        for _ in range(warmup):
            base()
            point()
        diffs = []
        for r in range(repeats):
            if r % 2:
                point_s = time_once_s(point, sync)
                base_s = time_once_s(base, sync)
            else:
                base_s = time_once_s(base, sync)
                point_s = time_once_s(point, sync)
            diffs.append(point_s - base_s)
        medians.append(statistics.median(diffs))
    return medians


@contextmanager
def scheduling_priority(nice: int | None, progress: Callable[[str], None]) -> Iterator[None]:
    """Measure at scheduling priority ``nice`` (None: unchanged), restored afterwards.

    On a shared machine other jobs preempt the loop and inflate wall-clock step
    times in bursts. A negative nice keeps this thread on a core; with the
    kernel's autogroup scheduling the nice of the session's group
    (``/proc/self/autogroup``) is what competes with other sessions, so it is set
    too. Both need root; without it the run goes on at the current priority.
    """
    if nice is None:
        yield
        return
    group = Path("/proc/self/autogroup")
    before_thread = os.getpriority(os.PRIO_PROCESS, 0)
    before_group = group.read_text().split("nice")[-1].strip() if group.exists() else None
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
        if before_group is not None:
            group.write_text(str(nice))
    except OSError as err:
        progress(f"could not set nice {nice} ({err}); timing at the current priority")
    try:
        yield
    finally:
        try:
            if before_group is not None:
                group.write_text(before_group)
            os.setpriority(os.PRIO_PROCESS, 0, before_thread)
        except OSError:
            pass  # lowering the priority back needs no privilege; raising it back may be refused
