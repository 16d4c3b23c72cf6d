"""``python -m experiments.bench_workloads``: whole simulations timed on the wall clock.

Two workloads:

* ``vidur`` - the workload used to compare with Vidur: 10,000 requests,
  Poisson arrivals at 8 req/s, total length uniform in 256..2048 tokens split
  prompt:decode 4:1, one decode replica with at most 128 requests in a batch
  (prefill on a separate worker, as specsched models it), run to completion
  with ``policy=none`` and with ``dspark`` (gamma 7). Prints engine steps,
  wall seconds, steps per wall second and simulated seconds per wall second.
* ``fleet`` - a real trace repeated end to end and compressed to a target
  rate, replayed on N decode replicas behind the router, run to completion.
  Each replica count runs in its own process so that its peak resident memory
  is its own; prints wall seconds, peak RSS and steps per second per point.
  By default the requests grow with the replicas (a fixed number per replica
  and a fixed rate per replica), so flat wall time per request means linear
  scaling.

Pin to one core (``taskset -c 0``) for one-core figures.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np

from policies import make_policy
from simulator import ClusterSpec, DrafterSpec, EngineLimits, SimulationSpec, load_profile, simulate
from traces import load_trace_workload
from traces.workload import Workload

DEFAULT_HARDWARE = "h200_qwen3-8b_analytic"


@dataclass(frozen=True)
class RunTiming:
    """Wall-clock figures of one simulation run to completion."""

    wall_s: float
    cpu_s: float  # this process's CPU time: below wall_s when the machine is shared
    num_steps: int
    num_requests: int
    simulated_s: float  # from the first arrival to the last finish

    @property
    def steps_per_s(self) -> float:
        return self.num_steps / self.wall_s

    @property
    def simulated_per_wall_s(self) -> float:
        return self.simulated_s / self.wall_s


def vidur_workload(rng: np.random.Generator, num_requests: int = 10_000, rate_per_s: float = 8.0,
                   min_total_tokens: int = 256, max_total_tokens: int = 2048,
                   prompt_to_decode: float = 4.0) -> Workload:
    """Poisson arrivals; total lengths uniform over whole tokens; prompt = total x 4/5 rounded (ratio 4:1)."""
    arrival_at = np.cumsum(rng.exponential(1.0 / rate_per_s, num_requests))
    total = rng.integers(min_total_tokens, max_total_tokens + 1, num_requests)
    prompt = np.rint(total * prompt_to_decode / (1.0 + prompt_to_decode)).astype(np.int64)
    return Workload(arrival_at=arrival_at, prompt_tokens=prompt, output_tokens=total - prompt,
                    domain=np.full(num_requests, "chat"), source="vidur_uniform")


def vidur_spec(policy_name: str, workload: Workload, hardware: str = DEFAULT_HARDWARE,
               gamma: int = 7, seed: int = 0) -> SimulationSpec:
    """One decode replica, at most 128 requests per batch, one prefill worker; run to completion."""
    return SimulationSpec(policy=make_policy(policy_name), profile=load_profile(hardware),
                          drafter=DrafterSpec("dspark", gamma),
                          cluster=ClusterSpec(num_decode_engines=1, num_prefill_instances=1,
                                              limits=EngineLimits(max_concurrency=128, kv_capacity_tokens=600_000)),
                          traffic=workload, duration_s=None, seed=seed)


def repeated_trace(trace: str, num_requests: int, rate_per_s: float) -> Workload:
    """``trace`` played back to back until ``num_requests`` are reached, then compressed to ``rate_per_s``.

    Copy i is shifted by i x (the trace's span + its mean gap), so every copy keeps
    the recorded gaps and burstiness; the rate scaling multiplies every gap by one
    factor, as trace replay does (traces/replay.py).
    """
    one = load_trace_workload(trace)
    if one.num_requests < 2:
        raise ValueError(f"trace {trace}: needs at least 2 requests to be repeated, has {one.num_requests}")
    span_s = float(one.arrival_at[-1] - one.arrival_at[0])
    period_s = span_s + span_s / (one.num_requests - 1)
    copies = -(-num_requests // one.num_requests)
    arrival = (one.arrival_at[None, :] - one.arrival_at[0] + period_s * np.arange(copies)[:, None]).ravel()
    arrival = arrival[:num_requests]
    mean_rate = (num_requests - 1) / (arrival[-1] - arrival[0]) if num_requests > 1 else rate_per_s
    return Workload(arrival_at=arrival * (mean_rate / rate_per_s),
                    prompt_tokens=np.tile(one.prompt_tokens, copies)[:num_requests],
                    output_tokens=np.tile(one.output_tokens, copies)[:num_requests],
                    domain=np.tile(one.domain, copies)[:num_requests],
                    source=f"{one.source} x{copies}")


def fleet_spec(policy_name: str, workload: Workload, num_replicas: int, hardware: str = DEFAULT_HARDWARE,
               gamma: int = 7, router: str = "least_loaded", seed: int = 0) -> SimulationSpec:
    """``num_replicas`` decode replicas (128 requests each at most), two prefill workers per replica."""
    return SimulationSpec(policy=make_policy(policy_name), profile=load_profile(hardware),
                          drafter=DrafterSpec("dspark", gamma),
                          cluster=ClusterSpec(num_decode_engines=num_replicas, num_prefill_instances=2 * num_replicas,
                                              router=router,  # type: ignore[arg-type]
                                              limits=EngineLimits(max_concurrency=128, kv_capacity_tokens=600_000)),
                          traffic=workload, duration_s=None, seed=seed)


def time_run(spec: SimulationSpec) -> RunTiming:
    """Run ``spec`` to completion and time it (tables and summary included)."""
    start, start_cpu = time.perf_counter(), time.process_time()
    results = simulate(spec)
    wall_s, cpu_s = time.perf_counter() - start, time.process_time() - start_cpu
    requests = results.requests
    simulated_s = float(requests["finished_at"].max() - requests["arrival_at"].min())
    return RunTiming(wall_s=wall_s, cpu_s=cpu_s, num_steps=len(results.steps), num_requests=len(requests),
                     simulated_s=simulated_s)


def peak_rss_mb() -> float:
    """Peak resident memory of this process (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run_vidur(args: argparse.Namespace) -> None:
    workload = vidur_workload(np.random.default_rng(args.seed), args.requests, args.rate)
    print(f"vidur workload: {workload.num_requests} requests, Poisson {args.rate:g} req/s, total length "
          f"uniform 256..2048 tokens, prompt:decode 4:1; 1 replica, batch cap 128; hardware {args.hardware}")
    print(f"{'policy':>8} {'wall s':>8} {'cpu s':>8} {'steps':>9} {'steps/s':>9} {'sim s':>8} {'sim s/wall s':>12}")
    for policy_name in args.policies.split(","):
        timing = time_run(vidur_spec(policy_name, workload, args.hardware, seed=args.seed))
        print(f"{policy_name:>8} {timing.wall_s:>8.2f} {timing.cpu_s:>8.2f} {timing.num_steps:>9,} "
              f"{timing.steps_per_s:>9,.0f} {timing.simulated_s:>8.1f} {timing.simulated_per_wall_s:>12.1f}",
              flush=True)


def fleet_point(args: argparse.Namespace) -> dict[str, float]:
    """One fleet run in this process -> its figures (printed as one JSON line by the ``--point`` mode)."""
    num_requests = args.requests if args.requests else args.requests_per_replica * args.point
    workload = repeated_trace(args.trace, num_requests, args.rate_per_replica * args.point)
    timing = time_run(fleet_spec(args.policy, workload, args.point, args.hardware, router=args.router,
                                 seed=args.seed))
    return {"replicas": args.point, "requests": timing.num_requests, "wall_s": timing.wall_s, "cpu_s": timing.cpu_s,
            "steps": timing.num_steps, "simulated_s": timing.simulated_s, "peak_rss_mb": peak_rss_mb()}


def run_fleet(args: argparse.Namespace) -> None:
    if args.point:
        print(json.dumps(fleet_point(args)))
        return
    print(f"fleet: trace {args.trace} repeated, {args.rate_per_replica:g} req/s per replica, policy {args.policy}, "
          f"router {args.router}, hardware {args.hardware}; each point in its own process")
    print(f"{'replicas':>8} {'requests':>9} {'wall s':>8} {'cpu s':>8} {'us/request':>10} {'steps':>10} {'steps/s':>9} "
          f"{'sim s':>8} {'peak RSS MB':>11}")
    for num_replicas in (int(x) for x in args.replicas.split(",")):
        command = [sys.executable, "-m", "experiments.bench_workloads", "fleet", "--point", str(num_replicas)]
        for name in ("trace", "policy", "router", "hardware"):
            command += [f"--{name}", str(getattr(args, name))]
        command += ["--requests-per-replica", str(args.requests_per_replica), "--requests", str(args.requests),
                    "--rate-per-replica", str(args.rate_per_replica), "--seed", str(args.seed)]
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        point = json.loads(out.strip().splitlines()[-1])
        print(f"{point['replicas']:>8} {point['requests']:>9,} {point['wall_s']:>8.1f} {point['cpu_s']:>8.1f} "
              f"{point['wall_s'] / point['requests'] * 1e6:>10.0f} {point['steps']:>10,} "
              f"{point['steps'] / point['wall_s']:>9,.0f} {point['simulated_s']:>8.1f} {point['peak_rss_mb']:>11.0f}",
              flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="workload", required=True)
    vidur = sub.add_parser("vidur", help="the 10,000-request Vidur comparison workload")
    vidur.add_argument("--policies", default="none,dspark", help="comma-separated policies (default none,dspark)")
    vidur.add_argument("--requests", type=int, default=10_000)
    vidur.add_argument("--rate", type=float, default=8.0, help="Poisson arrival rate, req/s")
    fleet = sub.add_parser("fleet", help="a repeated real trace on many replicas")
    fleet.add_argument("--replicas", default="1,4,16,32", help="comma-separated replica counts")
    fleet.add_argument("--requests-per-replica", type=int, default=2_000)
    fleet.add_argument("--requests", type=int, default=0,
                       help="total requests for every point instead of a number per replica (e.g. 1000000)")
    fleet.add_argument("--rate-per-replica", type=float, default=32.0, help="arrival rate per replica, req/s")
    fleet.add_argument("--trace", default="azure_conv", help="trace sample name or path (default azure_conv)")
    fleet.add_argument("--policy", default="dspark")
    fleet.add_argument("--router", default="least_loaded", choices=("least_loaded", "round_robin"))
    fleet.add_argument("--point", type=int, default=0, help=argparse.SUPPRESS)  # internal: one point, JSON out
    for p in (vidur, fleet):
        p.add_argument("--hardware", default=DEFAULT_HARDWARE, help="profile name or path")
        p.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    run_vidur(args) if args.workload == "vidur" else run_fleet(args)


if __name__ == "__main__":
    main()
