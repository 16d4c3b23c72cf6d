"""``python -m experiments.bench``: simulator speed, printed as figures.

Two measurements per (R, gamma):
* engine steps per wall second (with ``--cpu-time`` also per CPU second of
  the process, which a busy machine disturbs less): one decode engine with R long-running
  requests (so R stays fixed), the whole SimPy loop included (acceptance
  sampling, policy, bookkeeping), for ``--policy``;
* scheduler microseconds per decision: ``policy.decide`` alone on random
  snapshots of R x gamma confidences (and two stale pools), for each of
  ``--decision-policies``. Each decision is timed on its own and the median is
  printed, so that a shared machine's pauses do not count.
Pin the process to one core (``taskset -c 0``) for one-core figures;
``--decisions-only`` skips the engine loop.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from policies import make_policy
from policies.base import StepView
from simulator import ClusterSpec, DrafterSpec, EngineLimits, SimulationSpec, load_profile
from simulator.cluster import Cluster
from traces.synthetic import LengthSpec, TrafficSpec

# Requests that never finish during the benchmark: R stays constant.
_LONG = LengthSpec(prompt_median_tokens=64, prompt_sigma=0.01, output_median_tokens=10**7, output_sigma=0.01)


def engine_steps_per_s(policy_name: str, num_requests: int, gamma: int, hardware: str, num_steps: int
                       ) -> tuple[float, float]:
    """Engine steps per wall second and per CPU second of this thread (the latter is what a shared machine's other
    processes disturb least)."""
    policy = make_policy(policy_name)
    traffic = TrafficSpec(arrival="closed", num_users=num_requests, max_output_tokens=10**8,
                          lengths={d: _LONG for d in ("chat", "code", "math")})
    spec = SimulationSpec(policy=policy, profile=load_profile(hardware), drafter=DrafterSpec("dspark", gamma),
                          cluster=ClusterSpec(num_prefill_instances=num_requests,
                                              limits=EngineLimits(num_requests, 10**12)),
                          traffic=traffic, duration_s=1e12)  # stepped by hand below
    cluster = Cluster(spec)
    env, rows = cluster.env, cluster.steps.rows
    while len(rows) < 20:  # warm up: every request admitted, caches filled
        env.step()
    start_rows, start, start_cpu = len(rows), time.perf_counter(), time.thread_time()
    while len(rows) < start_rows + num_steps:
        env.step()
    elapsed, elapsed_cpu = time.perf_counter() - start, time.thread_time() - start_cpu
    assert all(r[3] == num_requests for r in rows[start_rows:]), "R changed during the benchmark"
    num_done = len(rows) - start_rows  # an engine may apply several steps in one SimPy event
    return num_done / elapsed, num_done / elapsed_cpu


def decision_us(policy_name: str, num_requests: int, gamma: int, hardware: str, repeats: int) -> float:
    """Median microseconds of one ``decide`` over ``repeats`` calls cycling through 8 random snapshots."""
    policy = make_policy(policy_name)
    rng = np.random.default_rng(0)
    profile = load_profile(hardware)
    cost = profile.cost_curve(num_requests)
    views = [StepView(confidence=rng.uniform(0.3, 1.0, (num_requests, gamma)), cost=cost,
                      history=(rng.uniform(0.3, 1.0, (num_requests, gamma)),) * 2) for _ in range(8)]
    for view in views:  # warm up: first-use work (imports, the cost curve's memo) is not per decision
        policy.decide(view)
    elapsed_s = np.empty(repeats)
    clock = time.perf_counter
    for i in range(repeats):
        view = views[i % len(views)]
        start = clock()
        policy.decide(view)
        elapsed_s[i] = clock() - start
    return float(np.median(elapsed_s)) * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", default="dspark", help="policy of the engine loop (default dspark)")
    parser.add_argument("--decision-policies", default="dspark,greedy,threshold",
                        help="comma-separated policies whose decisions are timed (default dspark,greedy,threshold)")
    parser.add_argument("--hardware", default="h200_qwen3-8b_analytic", help="profile name or path")
    parser.add_argument("--requests", default="32,128,256", help="comma-separated R values")
    parser.add_argument("--gammas", default="5,7,16", help="comma-separated gamma values")
    parser.add_argument("--steps", type=int, default=3000, help="engine steps timed per point")
    parser.add_argument("--repeats", type=int, default=2000, help="policy decisions timed per point")
    parser.add_argument("--cpu-time", action="store_true",
                        help="also print engine steps per CPU second of the process (steadier on a busy machine)")
    parser.add_argument("--decisions-only", action="store_true", help="time decisions only, not the engine loop")
    args = parser.parse_args(argv)
    deciders = args.decision_policies.split(",")
    print(f"engine policy {args.policy}, hardware {args.hardware}; decision times are medians")
    header = f"{'R':>5} {'gamma':>5} {'engine steps/s':>15}" + (f" {'per CPU s':>10}" if args.cpu_time else "")
    print(header + "".join(f" {name + ' us':>13}" for name in deciders))
    for num_requests in (int(x) for x in args.requests.split(",")):
        for gamma in (int(x) for x in args.gammas.split(",")):
            steps, cpu_steps = (float("nan"),) * 2 if args.decisions_only else engine_steps_per_s(
                args.policy, num_requests, gamma, args.hardware, args.steps)
            times = [decision_us(name, num_requests, gamma, args.hardware, args.repeats) for name in deciders]
            cpu = f" {cpu_steps:>10,.0f}" if args.cpu_time else ""
            print(f"{num_requests:>5} {gamma:>5} {steps:>15,.0f}{cpu}" + "".join(f" {us:>13.1f}" for us in times),
                  flush=True)


if __name__ == "__main__":
    main()
