"""``python -m experiments.plan``: how many GPUs each policy needs to serve a request rate within an SLO.

For each policy the planner searches the load one replica can carry while every
SLO holds, then sizes the fleet for ``--target-rate`` requests per second:

* the load is the number of closed-loop users (``traffic.num_users``, an
  integer between 1 and ``cluster.max_concurrency``) or, for open-loop
  traffic, the arrival rate (``traffic.rate_per_s``);
* an SLO is ``<metric>:p<q><=<bound>`` (``ttft_s``, ``tpot_s``, ``e2e_s``, upper
  bounds) or ``tokens_per_s_per_user:p<q>>=<bound>`` (a lower bound: ``p10>=60``
  means 90% of requests get at least 60 tok/s). Percentiles are read from the
  run's requests table: TTFT over the requests whose first token came inside
  the measurement window, the others over the requests that finished inside it
  (linear interpolation, as the summary's p50/p90/p99). A run the summary flags
  as overloaded (its backlog grows through the window) fails every SLO;
* the search is a bisection on the load, assuming the SLO metrics get worse as
  the load grows (they do in expectation; every probe uses the same seed). It
  stops when the passing and the failing load are within ``--rel-tol`` of each
  other (or 1 user apart); the load kept is the highest one that passed, so
  the answer errs on the safe side by at most that tolerance. A pass above a
  failure, which would contradict the assumption, is reported;
* one replica carries the finished request rate measured at that load
  (closed loop) or that arrival rate (open loop); replicas are independent, so
  the fleet needs ``ceil(target / per-replica rate)`` replicas, times the
  profile's GPUs per replica.

Any override of ``python -m experiments.run`` may follow (``hardware=...``,
``traffic=poisson``, ``duration_s=30``, ``cluster.max_concurrency=128``, ...)::

    python -m experiments.plan --policies mtp1,greedy,dspark --slo tpot_s:p90<=0.01 --target-rate 100
    python -m experiments.plan --slo ttft_s:p99<=2 --slo tokens_per_s_per_user:p10>=50 traffic=poisson --out plan/

With ``--out`` it writes ``plan.csv`` (one row per policy), ``frontier.csv``
(every probe) and ``plan.png|svg`` (each SLO metric against the load, with the
code revision and the configuration stamped on the figure).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from hydra import compose, initialize_config_dir

from experiments.config import build_spec
from experiments.plan_report import describe, write_outputs
from simulator import SimulationSpec, simulate
from traces.synthetic import TrafficSpec

# metric -> True when the SLO is an upper bound (latencies), False for a lower bound (per-user speed)
SLO_METRICS = {"ttft_s": True, "tpot_s": True, "e2e_s": True, "tokens_per_s_per_user": False}
_SLO_TEXT = re.compile(r"^(?P<metric>[a-z_]+):p(?P<q>\d+(?:\.\d+)?)(?P<op><=|>=)(?P<bound>[0-9.eE+-]+)$")


@dataclass(frozen=True)
class Slo:
    """One service-level objective: the ``percentile`` of ``metric`` over requests is within ``bound``."""

    metric: str
    percentile: float  # 0..100
    bound: float

    @classmethod
    def parse(cls, text: str) -> Slo:
        match = _SLO_TEXT.match(text.replace(" ", ""))
        if match is None or match["metric"] not in SLO_METRICS:
            raise ValueError(f"--slo {text!r}: expected <metric>:p<q><=<bound> or tokens_per_s_per_user:p<q>>=<bound>"
                             f" with metric one of {', '.join(SLO_METRICS)}, e.g. ttft_s:p90<=0.5")
        upper = SLO_METRICS[match["metric"]]
        if (match["op"] == "<=") != upper:
            raise ValueError(f"--slo {text!r}: {match['metric']} takes {'<=' if upper else '>='} (it is "
                             f"{'a latency' if upper else 'a speed'})")
        percentile, bound = float(match["q"]), float(match["bound"])
        if not 0 <= percentile <= 100 or not (math.isfinite(bound) and bound > 0):
            raise ValueError(f"--slo {text!r}: the percentile must lie in 0..100 and the bound be a positive number")
        return cls(match["metric"], percentile, bound)

    @property
    def label(self) -> str:
        op = "<=" if SLO_METRICS[self.metric] else ">="
        return f"{self.metric} p{self.percentile:g} {op} {self.bound:g}"

    def holds(self, value: float | None) -> bool:
        if value is None:
            return False
        return value <= self.bound if SLO_METRICS[self.metric] else value >= self.bound


def percentile_of(requests: pd.DataFrame, metric: str, percentile: float, start_at: float,
                  end_at: float) -> float | None:
    """``percentile`` of ``metric`` over the requests whose first token (TTFT) or finish (the others) lies in
    ``(start_at, end_at]``; None when there are none."""
    at = requests["first_token_at"] if metric == "ttft_s" else requests["finished_at"]
    values = requests.loc[(at > start_at) & (at <= end_at), metric].to_numpy(dtype=np.float64)
    values = values[~np.isnan(values)]
    return float(np.percentile(values, percentile)) if values.size else None


@dataclass(frozen=True)
class Probe:
    """One simulation of the search: a policy at one load, and what it measured."""

    policy: str
    load: float
    passed: bool
    overloaded: bool
    values: tuple[float | None, ...]  # one per SLO
    finished_per_s: float  # requests finished per second in the window
    tokens_per_s_per_gpu: float


def load_key(spec: SimulationSpec) -> str:
    """``num_users`` for closed-loop traffic, ``rate_per_s`` for open loop."""
    if not isinstance(spec.traffic, TrafficSpec):
        raise ValueError("the planner varies synthetic traffic; this config replays a trace: use a synthetic "
                         "traffic (traffic=chat|code|math|mixed for closed loop, traffic=poisson|mixed_poisson)")
    if spec.duration_s is None:
        raise ValueError("duration_s=null runs to completion; the planner needs a measurement window (duration_s)")
    return "num_users" if spec.traffic.arrival == "closed" else "rate_per_s"


def probe(spec: SimulationSpec, load: float, slos: list[Slo], label: str | None = None) -> Probe:
    """Simulate ``spec`` at ``load`` (users or req/s) and check every SLO; ``label`` names the policy (default
    its name)."""
    key = load_key(spec)
    traffic = dataclasses.replace(spec.traffic, **{key: int(load) if key == "num_users" else float(load)})
    results = simulate(dataclasses.replace(spec, traffic=traffic))
    summary = results.summary
    values = tuple(percentile_of(results.requests, s.metric, s.percentile, spec.warmup_s, float(spec.duration_s))
                   for s in slos)
    overloaded = bool(summary.get("overloaded"))
    passed = not overloaded and all(s.holds(v) for s, v in zip(slos, values, strict=True))
    return Probe(policy=label or spec.policy.name, load=load, passed=passed, overloaded=overloaded, values=values,
                 finished_per_s=float(summary["request_finish_rate_per_s"] or 0.0),
                 tokens_per_s_per_gpu=float(summary["output_tokens_per_s_per_gpu"] or 0.0))


def search_load(spec: SimulationSpec, slos: list[Slo], rel_tol: float, label: str | None = None,
                max_steps: int = 16) -> list[Probe]:
    """Probes of a bracket-then-bisect search for the highest load that meets every SLO (see the module doc)."""
    closed = load_key(spec) == "num_users"
    probes: list[Probe] = []

    def run(load: float) -> Probe:
        probes.append(probe(spec, load, slos, label))
        return probes[-1]

    if closed:
        lo, hi = 1.0, float(spec.cluster.limits.max_concurrency)
        if not run(lo).passed or run(hi).passed:
            return probes  # infeasible at one user, or feasible up to the concurrency limit
    else:
        start = float(spec.traffic.rate_per_s)  # type: ignore[union-attr]
        passing, failing = (start, None) if run(start).passed else (None, start)
        for _ in range(max_steps):  # double up to a failure, or halve down to a pass
            if passing is not None and failing is None:
                passing, failing = (2 * passing, None) if run(2 * passing).passed else (passing, 2 * passing)
            elif failing is not None and passing is None:
                passing, failing = (failing / 2, failing) if run(failing / 2).passed else (None, failing / 2)
            else:
                break
        if passing is None or failing is None:
            return probes  # no pass, or no failure, within 2^max_steps of the start
        lo, hi = passing, failing
    while hi - lo > max(rel_tol * hi, 1.0 if closed else 0.0):
        mid = float((lo + hi) // 2) if closed else 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if run(mid).passed else (lo, mid)
    return probes


@dataclass(frozen=True)
class PolicyPlan:
    """What the search found for one policy."""

    policy: str
    max_load: float | None  # highest passing load; None: the SLO fails even at the lowest load tried
    per_replica_per_s: float | None  # requests per second one replica carries there
    limited_by: str  # "slo", "max_concurrency", "range" (the bracket never found a failure) or "infeasible"
    num_replicas: int | None
    num_gpus: int | None
    non_monotone: bool  # some load passed above one that failed


def summarize_search(probes: list[Probe], closed: bool, max_load: float, target_rate_per_s: float,
                     gpus_per_replica: int) -> PolicyPlan:
    passing = [p for p in probes if p.passed]
    failing = [p for p in probes if not p.passed]
    non_monotone = bool(passing and failing and max(p.load for p in passing) > min(p.load for p in failing))
    if not passing:
        return PolicyPlan(probes[0].policy, None, None, "infeasible", None, None, non_monotone)
    best = max(passing, key=lambda p: p.load)
    if not failing:
        limited_by = "max_concurrency" if closed and best.load >= max_load else "range"
    else:
        limited_by = "slo"
    per_replica = best.finished_per_s if closed else best.load
    replicas = math.ceil(target_rate_per_s / per_replica) if per_replica > 0 else None
    return PolicyPlan(best.policy, best.load, per_replica, limited_by, replicas,
                      None if replicas is None else replicas * gpus_per_replica, non_monotone)


def frontier_table(probes: list[Probe], slos: list[Slo]) -> pd.DataFrame:
    rows = [{"policy": p.policy, "load": p.load, "passed": p.passed, "overloaded": p.overloaded,
             "finished_per_s": p.finished_per_s, "tokens_per_s_per_gpu": p.tokens_per_s_per_gpu,
             **{s.label: v for s, v in zip(slos, p.values, strict=True)}} for p in probes]
    return pd.DataFrame(rows).sort_values(["policy", "load"], kind="stable").reset_index(drop=True)


def plan_table(plans: list[PolicyPlan]) -> pd.DataFrame:
    return pd.DataFrame([dataclasses.asdict(p) for p in plans])


def compose_spec(policy: str, overrides: list[str]) -> SimulationSpec:
    """The run config of ``python -m experiments.run policy=<policy> <overrides>``, as a spec."""
    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parent / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"policy={policy}", *overrides])
    return build_spec(cfg)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policies", default="mtp1,greedy,dspark", help="comma-separated policies")
    parser.add_argument("--slo", action="append", default=None,
                        help="an SLO, repeatable (default tpot_s:p90<=0.01, i.e. 90%% of requests at 100 tok/s)")
    parser.add_argument("--target-rate", type=float, default=100.0, help="requests per second the fleet must serve")
    parser.add_argument("--rel-tol", type=float, default=0.05, help="relative tolerance of the load search")
    parser.add_argument("--out", type=Path, default=None, help="folder for plan.csv, frontier.csv and the figure")
    parser.add_argument("overrides", nargs="*", help="overrides of experiments.run (key=value)")
    args = parser.parse_args(argv)
    try:
        slos = [Slo.parse(text) for text in (args.slo or ["tpot_s:p90<=0.01"])]
    except ValueError as err:
        parser.error(str(err))
    if not 0 < args.rel_tol < 1 or not args.target_rate > 0:
        parser.error("--rel-tol must lie in (0, 1) and --target-rate be positive")
    plans, probes = [], []
    for policy in args.policies.split(","):
        spec = compose_spec(policy, args.overrides)
        closed = load_key(spec) == "num_users"
        found = search_load(spec, slos, args.rel_tol, label=policy)
        probes += found
        plans.append(summarize_search(found, closed, spec.cluster.limits.max_concurrency, args.target_rate,
                                      spec.profile.gpus_per_replica))
        print(f"{policy}: {len(found)} simulations", file=sys.stderr, flush=True)
    print(describe(plans, frontier_table(probes, slos), slos, spec, args.target_rate, args.rel_tol))
    if args.out is not None:
        write_outputs(args.out, plans, frontier_table(probes, slos), slos, spec, args.target_rate, args.overrides)
        print(f"plan.csv, frontier.csv and plan.png|svg in {args.out}")


if __name__ == "__main__":
    main()
