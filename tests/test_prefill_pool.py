"""The prefill pool against its reference: a ``simpy.Resource`` with one process per job.

Same start and end times for every job, the same order of hand-overs (jobs ending at one instant in the order
they started), with arrivals in bursts, ties in durations, jobs joining from inside a hand-over (a closed-loop
user whose request ends at its prefill) and recomputations mixed in.
"""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from simulator.prefill_pool import PrefillPool


def _durations(rng: np.random.Generator, num_jobs: int) -> dict[int, float]:
    # Few distinct token counts, so that many jobs take exactly as long as others.
    return {rid: float(rng.choice([0.25, 0.5, 0.75, 1.0])) for rid in range(num_jobs)}


def _arrivals(rng: np.random.Generator, num_jobs: int) -> list[float]:
    return np.sort(rng.choice(np.arange(0.0, 6.0, 0.25), num_jobs)).tolist()  # bursts at shared instants


def _run_reference(num_workers, arrivals, seconds, rejoin):
    """One process per job holding a simpy.Resource slot: [(event, rid, time)] in the order they happen."""
    env, log = simpy.Environment(), []
    pool = simpy.Resource(env, capacity=num_workers)

    def job(rid):
        with pool.request() as slot:
            yield slot
            log.append(("start", rid, env.now))
            yield env.timeout(seconds[rid])
        log.append(("end", rid, env.now))
        if rid in rejoin:
            env.process(job(rejoin[rid]))

    def source():
        for rid, at in enumerate(arrivals):
            if at > env.now:
                yield env.timeout(at - env.now)
            env.process(job(rid))

    env.process(source())
    env.run()
    return log


def _run_pool(num_workers, arrivals, seconds, rejoin):
    env, log = simpy.Environment(), []

    def done(rid, first):
        log.append(("end", rid, env.now))
        if rid in rejoin:
            pool.join(rejoin[rid], rejoin[rid], True)

    def started(rid):
        log.append(("start", rid, env.now))

    pool = PrefillPool(env, num_workers, lambda tokens: seconds[tokens], started, done)

    def source():
        for rid, at in enumerate(arrivals):
            if at > env.now:
                yield env.timeout(at - env.now)
            pool.join(rid, rid, True)  # tokens = rid: each job its own duration

    env.process(source())
    env.run()
    return log


@pytest.mark.parametrize("num_workers", [1, 2, 3, 8])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pool_matches_one_process_per_job(num_workers, seed):
    rng = np.random.default_rng(seed)
    num_jobs = 120
    arrivals = _arrivals(rng, num_jobs)
    rejoin = {rid: num_jobs + rid for rid in range(0, num_jobs, 7)}  # these send a new job when they end
    seconds = _durations(rng, num_jobs + num_jobs)
    reference = _run_reference(num_workers, arrivals, seconds, rejoin)
    ends = [entry for entry in reference if entry[0] == "end"]
    assert len(ends) == num_jobs + len(rejoin)
    if num_workers > 1:
        assert len({t for _, _, t in ends}) < len(ends)  # ties really happen
    pool_log = _run_pool(num_workers, arrivals, seconds, rejoin)
    assert sorted(pool_log, key=lambda e: (e[0], e[1])) == sorted(reference, key=lambda e: (e[0], e[1]))
    assert [e for e in pool_log if e[0] == "end"] == ends  # hand-overs in the same order


def test_recomputations_take_a_worker_without_a_start_record():
    env, starts, ends = simpy.Environment(), [], []
    pool = PrefillPool(env, 1, lambda tokens: tokens / 10, starts.append,
                       lambda rid, first: ends.append((rid, first, env.now)))
    pool.join(0, 10, True)
    pool.join(1, 5, False)  # a recomputation queues behind the first prefill
    pool.join(2, 10, True)
    env.run()
    assert starts == [0, 2]
    assert ends == [(0, True, 1.0), (1, False, 1.5), (2, True, 2.5)]
    assert pool.num_free == 1 and not pool.waiting


def test_a_pool_needs_a_worker():
    with pytest.raises(ValueError, match="num_prefill_instances"):
        PrefillPool(simpy.Environment(), 0, lambda tokens: 1.0, print, print)
