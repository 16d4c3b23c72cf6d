"""``python -m experiments.table1``: the paper's offline acceptance figures, simulated vs published.

* Table 1: tau of every benchmark cell of every target/drafter row, each through
  its shipped preset (``<target>_<drafter>``, benchmark mix of that one
  benchmark), with every draft verified (``mtp7``, gamma = 7: the paper's
  offline protocol, no scheduler), whole requests; next to the paper's value,
  with the error per cell;
* Figure 2: the Qwen3-4B conditional acceptance q_k per domain at the
  positions the paper quotes;
* ``--figure5``: the confidence-threshold sweep (acceptance rate with the bonus
  token, as the paper counts it) for both threshold variants, on the benchmarks
  Figure 5's threshold-0 rates come from (GSM8K, HumanEval, MT-Bench).

``--protocol simulator`` (default) runs the whole simulator per cell;
``--protocol offline`` runs the acceptance model alone
(:func:`simulator.acceptance.offline.run_offline`), seconds for all cells.
Figure 6 is ``python -m calibration.acceptance.confidence``.
"""

from __future__ import annotations

import argparse

import numpy as np

from policies import make_policy
from policies.base import CostCurve, StepView
from simulator import ClusterSpec, DrafterSpec, SimulationSpec, load_profile, simulate
from simulator.acceptance.offline import run_offline
from simulator.acceptance.paper import (
    FIGURE2_ANCHORS,
    FIGURE5_ACCEPTANCE_RATE,
    FIGURE5_THRESHOLD,
    TABLE1,
    drafter_kind,
    table1_tau,
)
from simulator.acceptance.parametric import AcceptanceModel
from simulator.acceptance.presets import load_preset
from traces.synthetic import TrafficSpec

FIGURE5_BENCHMARKS = {"math": "gsm8k", "code": "humaneval", "chat": "mt_bench"}  # tau / 8 = Figure 5 at 0


def conditional_acceptance(survival_rates: list[float]) -> np.ndarray:
    """Per-position survival (vLLM's per-position acceptance) -> conditional acceptance q_k."""
    survival = np.asarray(survival_rates, dtype=float)
    return survival / np.concatenate(([1.0], survival[:-1]))


def measure(preset: str, domain: str, num_requests: int, seed: int,
            benchmark: str | None = None) -> tuple[float, np.ndarray]:
    """tau and q_k through the whole simulator over every step of ``num_requests`` requests run to completion.

    Counting whole requests weights each request by its number of steps, as a per-round average over a
    benchmark does (a closed loop cut at a fixed time would over-weight the requests running at the cut).
    """
    drafter = DrafterSpec("dspark", 7, acceptance=preset, benchmark_mix={benchmark: 1.0} if benchmark else None)
    spec = SimulationSpec(
        policy=make_policy("mtp7"), profile=load_profile("h200_qwen3-8b_analytic"), drafter=drafter,
        cluster=ClusterSpec(num_prefill_instances=8),
        traffic=TrafficSpec(arrival="poisson", rate_per_s=20.0, num_requests=num_requests,
                            domain_mix={domain: 1.0}, max_output_tokens=2048),
        duration_s=None, warmup_s=0.0, seed=seed)
    summary = simulate(spec).summary
    return summary["mean_acceptance_length"], conditional_acceptance(summary["acceptance_rate_per_position"])


def measure_offline(preset: str, domain: str, num_requests: int, seed: int,
                    benchmark: str | None = None) -> tuple[float, np.ndarray]:
    """tau and q_k of the acceptance model alone, the same protocol without the engine."""
    model = AcceptanceModel(preset, 7, benchmark_mix={benchmark: 1.0} if benchmark else None)
    result = run_offline(model, domain, 7, np.random.default_rng(seed), num_requests, 64)
    return result.tau, result.conditional


def table1(protocol: str, num_requests: int, seed: int) -> list[float]:
    """Print every cell; returns the absolute errors in percent."""
    run = measure if protocol == "simulator" else measure_offline
    errors = []
    print(f"Table 1: tau per benchmark (gamma 7, every draft verified; {protocol}, {num_requests} requests a cell)")
    for target, row in TABLE1.items():
        for drafter in row:
            name = f"{target.lower()}_{drafter_kind(drafter)}"
            found = load_preset(name)
            cells = []
            for bench, paper in table1_tau(target, drafter).items():
                # A seed per cell: the cells' sampling errors are independent, not one shared draw of requests.
                tau, _ = run(name, found.benchmark(bench)[0], num_requests, seed + len(errors), bench)
                errors.append(abs(100.0 * (tau / paper - 1.0)))
                cells.append(f"{bench} {tau:.2f}/{paper:.2f} ({100.0 * (tau / paper - 1.0):+.1f}%)")
            print(f"{target:10} {drafter:6} " + "  ".join(cells))
    print(f"cells {len(errors)}, mean |error| {np.mean(errors):.2f}%, max {np.max(errors):.2f}%  "
          "(simulated/paper)")
    return errors


def figure2(protocol: str, num_requests: int, seed: int) -> None:
    run = measure if protocol == "simulator" else measure_offline
    print("Figure 2 (Qwen3-4B, domain curves): conditional acceptance q_1..q_7, simulated (paper anchors)")
    for kind in ("eagle3", "dflash", "dspark"):
        for domain in ("math", "code", "chat"):
            _, q = run(f"qwen3-4b_{kind}", domain, num_requests, seed)
            anchors = [f"q{k}={q[k - 1]:.3f} (paper {v:.2f})" for (d, dom, k), v in sorted(FIGURE2_ANCHORS.items())
                       if (d, dom) == (kind, domain)]
            print(f"{kind:7} {domain:5} {' '.join(f'{x:.3f}' for x in q)}   {', '.join(anchors)}")


def figure5(num_requests: int, seed: int) -> None:
    """The threshold sweep of Figure 5 on the acceptance model alone (a threshold decides from confidences only)."""
    thetas = (0.0, 0.2, 0.4, 0.6, 0.8, 0.9)
    cost = CostCurve(np.arange(1, 3), np.ones(2))  # unused by the threshold rule
    print("Figure 5 (Qwen3-4B DSpark, calibrated confidence): acceptance rate with the bonus token, "
          f"theta {', '.join(map(str, thetas))}")
    for variant in ("position", "prefix"):
        for domain, bench in FIGURE5_BENCHMARKS.items():
            rates = []
            for theta in thetas:
                policy = make_policy("threshold", theta=theta, variant=variant)
                model = AcceptanceModel("qwen3-4b_dspark", 7, benchmark_mix={bench: 1.0})
                result = run_offline(model, domain, 7, np.random.default_rng(seed), num_requests, 64,
                                     lengths=lambda c, p=policy: p.decide(StepView(c, cost)).lengths)
                rates.append(100.0 * result.acceptance_rate)
            low, high = FIGURE5_ACCEPTANCE_RATE[domain]
            print(f"{variant:8} {domain:4} ({bench:9}) " + " ".join(f"{r:5.1f}" for r in rates)
                  + f"   paper {100 * low:.1f} at 0, {100 * high:.1f} at {FIGURE5_THRESHOLD}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--protocol", choices=("simulator", "offline"), default="simulator")
    parser.add_argument("--requests", type=int, default=None,
                        help="requests per cell (default: 1000 simulator, 8000 offline)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--figure5", action="store_true", help="also the threshold sweep of Figure 5")
    args = parser.parse_args()
    requests = args.requests or (1000 if args.protocol == "simulator" else 8000)
    table1(args.protocol, requests, args.seed)
    print()
    figure2(args.protocol, requests, args.seed)
    if args.figure5:
        print()
        figure5(8000, args.seed)


if __name__ == "__main__":
    main()
