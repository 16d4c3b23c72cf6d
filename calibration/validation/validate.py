"""Sim-vs-real validation: the simulator's prediction next to the real serving loop, for the same setup.

    python -m calibration.validate --out outputs/validation
    python -m calibration.validate --models trained --policies mtp1,greedy,dspark --users 1,2,4,8

For one model, drafter, traffic and seed, and every (policy, concurrency) point:

1. **profile** the machine with :func:`calibration.profiling.measure.measure` on the very
   models that are served (random weights of the ``tiny`` preset, or the trained
   checkpoints), then the serving loop's own costs (host time per step, in-loop
   cost of the forward passes per concurrency, probed on the workload's lengths),
   the scheduler and the prefill are measured and put into the profile
   (:func:`calibration.profiling.loop_costs.with_loop_costs`);
2. **acceptance** from a log: ``--log`` (e.g. ``calibration.evaluate``'s log of the
   trained models), or one recorded here with
   :class:`simulator.acceptance.logs.AcceptanceRecorder` (every draft token
   verified, ``--log-requests`` requests per domain with the traffic's lengths);
   the simulator replays it
   (:class:`simulator.acceptance.replay.LoggedAcceptance`, default) or uses a preset
   fitted to it (:func:`calibration.acceptance.fit_preset.fit_preset`, ``--acceptance fitted``);
3. **simulate** with that profile and acceptance, and **serve** for real with
   :func:`calibration.serving.loop.serve` (same traffic generator, limits, duration and seed);
4. **report** throughput, mean/p50/p90 tok/s/user, TTFT, tau and the verification
   budget side by side with the relative error ``(sim - real) / real``, and draw
   both frontiers (throughput against mean tok/s/user over the concurrency sweep).

Pieces: :mod:`calibration.validation.setup`, :mod:`~calibration.validation.rounds` (profile passes and real
slices, round by round), :mod:`~calibration.validation.report`. Closed-loop traffic, short
lognormal lengths, torch on ``--threads`` CPU threads (1). Results are measured timings and vary run to run.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from calibration.profiling.machine import device_name
from calibration.profiling.profile_file import write_profile
from calibration.profiling.timing import scheduling_priority
from calibration.validation.bench_export import write_benchmark
from calibration.validation.passes import COMBINE_RULES, combine_passes
from calibration.validation.points import (
    drift_correction,
    drift_readings,
    kept_passes,
    point_result,
    slice_drifts,
)
from calibration.validation.report import (
    MachineNotSteady,
    drift_note,
    frontier_figure,
    loop_costs_line,
    machine_verdict,
    markdown_table,
    mean_abs_errors,
    noise_note,
    slice_records,
    worst_errors,
)
from calibration.validation.rounds import PROBE_COLUMNS, measure_rounds
from calibration.validation.setup import (
    Models,
    ValidationConfig,
    build_models,
    record_log,
    simulate_slice,
    simulation_spec,
    simulator_setup,
    speed_reference,
)
from policies import make_policy
from simulator.acceptance.logs import read_log, write_log
from simulator.cluster import Cluster
from simulator.costs import HardwareProfile

# --long-context: prompts of 1-4k tokens (lognormal around 2048, truncated at 4096), the tiny models' short outputs,
# and a version-2 profile whose attention table covers every context the requests reach.
LONG_CONTEXT: dict[str, Any] = {"prompt_tokens": 2048, "length_sigma": 0.35, "prompt_limit_tokens": 4096,
                                "profile_version": 2, "log_requests": 24}


@dataclass(frozen=True)
class Validation:
    """What a run produced: the side-by-side table (one row per point) and the inputs it was built from."""

    config: ValidationConfig
    table: pd.DataFrame
    profile: HardwareProfile
    logs: dict[int, pd.DataFrame]  # draft tokens per block -> the acceptance log replayed for those policies
    models: str
    real: dict[tuple[str, int], list[Any]]  # (policy, users) -> ServingResults of its slices
    sim: dict[tuple[str, int], list[list[Any]]]  # (policy, users) -> per slice, the simulator's Results of its
    # requests, one per acceptance draw (config.sim_replicas)
    slices: pd.DataFrame  # one row per (point, slice): its drift, whether it was kept, sim and real throughput
    probes: pd.DataFrame  # every timing of the reference probe: round, phase (profile/slice), point, before/after
    pricing: HardwareProfile | None = None  # what both loops' policies priced with (the first pass)
    passes: tuple[HardwareProfile, ...] = ()  # every profile pass, in order (the profile combines them)
    planned_rounds: int | None = None  # the rounds asked for (config.rounds: those served; max_rounds adds some)
    passes_kept: tuple[int, ...] | None = None  # the passes the profile combines (points.kept_passes); None: all


def run_validation(cfg: ValidationConfig, progress: Callable[[str], None] = lambda _: None) -> Validation:
    """Profile, fit acceptance, then simulate and serve every (policy, users) point (see the module docstring)."""
    torch.set_num_threads(cfg.threads)
    with scheduling_priority(cfg.nice, progress):
        return _run(cfg, progress)


def _run(cfg: ValidationConfig, progress: Callable[[str], None]) -> Validation:
    models = build_models(cfg)
    progress(f"models: {models.description}")
    reference = speed_reference(cfg, models)
    points = [(name, users) for name in cfg.policies for users in cfg.users]
    with tempfile.TemporaryDirectory(prefix="specsched-validate-") as tmp:
        logs, log_paths = _logs(cfg, models, Path(tmp), progress)
        def check(first: HardwareProfile) -> None:  # the simulator's start checks, before any real run
            first_setups = {g: simulator_setup(cfg, first, path, g, first) for g, path in log_paths.items()}
            for point in points:
                Cluster(simulation_spec(cfg, point, first_setups, 0))
        probe_log: list[dict[str, Any]] = []
        passes, reals = measure_rounds(cfg, models, points, reference, progress, check, probe_log)
        planned, cfg = cfg.rounds, cfg.with_rounds(len(reals[points[0]]))  # max_rounds may have added some
        probes = pd.DataFrame(probe_log, columns=list(PROBE_COLUMNS))
        before_s, after_s, pass_s = drift_readings(probes, cfg.drift_measure)
        kept = kept_passes(pass_s, cfg.drift_tolerance)  # one reading per pass, in order
        used = [passes[k] for k in kept]
        profile = used[0] if len(used) == 1 else combine_passes(used, cfg.combine_passes)
        pricing = passes[0]  # what the real loop's policies priced with
        setups = {g: simulator_setup(cfg, profile, path, g, pricing) for g, path in log_paths.items()}
        rows, sims, slice_rows = [], {}, []
        drifts = slice_drifts(before_s, after_s, pass_s)  # each slice's reading against the passes' median
        slice_probes = probes[probes["phase"] == "slice"]  # logged round by round: each point's in round order
        corrections, weight = drift_correction(drifts, before_s, after_s, pass_s, cfg.drift_tolerance,
                                               cfg.drift_reference)
        for point in points:
            sims[point] = [simulate_slice(cfg, point, setups, round_idx) for round_idx in range(cfg.rounds)]
            mine = ((slice_probes["policy"] == point[0]) & (slice_probes["num_users"] == point[1])).to_numpy()
            drift = drifts[mine]
            rows.append(point_result(cfg, point, sims[point], reals[point], drift, profile, weight, used,
                                     corrections[mine]))
            slice_rows += slice_records(point, drift, cfg.drift_tolerance, sims[point], reals[point])
    return Validation(cfg, pd.DataFrame(rows), profile, logs, models.description, reals, sims,
                      pd.DataFrame(slice_rows), probes, pricing, tuple(passes), planned, tuple(kept))


def _logs(cfg: ValidationConfig, models: Models, tmp: Path,
          progress: Callable[[str], None]) -> tuple[dict[int, pd.DataFrame], dict[int, Path]]:
    """The acceptance log per block size the policies draft (see :func:`_draft_counts`) and where it is."""
    logs, paths = {}, {}
    for num_draft in _draft_counts(cfg):
        if cfg.log is not None:
            progress(f"acceptance log: {cfg.log}")
            logs[num_draft], paths[num_draft] = read_log(cfg.log), Path(cfg.log)
        else:
            progress(f"recording a dense acceptance log, {num_draft} draft token(s) per block")
            logs[num_draft] = record_log(cfg, models, num_draft)
            paths[num_draft] = write_log(logs[num_draft], tmp / f"acceptance_log_g{num_draft}.parquet")
    return logs, paths


def _draft_counts(cfg: ValidationConfig) -> list[int]:
    """The block sizes the policies draft. A log recorded here has blocks of each: a block drafter's tokens attend
    to each other, so drafting 1 token is not the first position of a 7-token block. A given ``--log`` serves all
    (its first g positions)."""
    if cfg.log is not None:
        return [cfg.gamma]
    return sorted({max(make_policy(name).draft_tokens(cfg.gamma), 1) for name in cfg.policies})


def write_outputs(result: Validation, out: Path) -> dict[str, Path]:
    """config.json (the rounds served), profile.json, pricing_profile.json, profile_passes/pass<k>.json (with two
    passes or more), acceptance_log_g<draft tokens>.parquet, points.csv, validation.md, frontier.png and the real
    tables (requests, steps and, chunked, the prefill chunks: ``real_<policy>_u<users>_<table>.parquet``)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(asdict(result.config), indent=1) + "\n")  # what recombine reads
    paths = {"profile": out / "profile.json", "points": out / "points.csv",
             "report": out / "validation.md", "figure": out / "frontier.png"}
    write_profile(result.profile.raw, paths["profile"])
    if result.pricing is not None:  # with the logs and config.json, what re-simulates every point exactly
        paths["pricing"] = write_profile(result.pricing.raw, out / "pricing_profile.json")
    if len(result.passes) > 1:  # what the profile came from (points.csv's *_passes_mean; validation.recombine)
        for k, measured_pass in enumerate(result.passes, start=1):
            write_profile(measured_pass.raw, out / "profile_passes" / f"pass{k}.json")
    for num_draft, log in result.logs.items():
        paths[f"log_g{num_draft}"] = write_log(log, out / f"acceptance_log_g{num_draft}.parquet")
    result.table.to_csv(paths["points"], index=False)
    result.slices.to_csv(out / "slices.csv", index=False)
    result.probes.to_csv(out / "probes.csv", index=False)
    paths["report"].write_text(report_text(result) + "\n")
    fig = frontier_figure(result.table, f"{result.models}\nsolid: real loop, dashed: simulator "
                                        f"({result.profile.source} profile of this machine)")
    fig.savefig(paths["figure"], dpi=120)
    kinds = ("requests", "steps", "chunks") if result.config.prefill == "chunked" else ("requests", "steps")
    for (policy, users), real in result.real.items():
        for what in kinds:
            tables = [getattr(part, what).assign(slice=i) for i, part in enumerate(real)]
            pd.concat(tables, ignore_index=True).to_parquet(out / f"real_{policy}_u{users}_{what}.parquet")
    # Benchmark mode: the static points as vLLM JSON and CSV results (bench/), what calibration.fit_profile reads.
    paths.update(write_benchmark(result.real, result.config.drafter, result.config.gamma, result.models, out / "bench"))
    return paths


def report_text(result: Validation) -> str:
    cfg, worst = result.config, worst_errors(result.table)
    rule = "trimmed mean" if cfg.combine_passes == "trimmed" else cfg.combine_passes
    kept = len(result.passes) if result.passes_kept is None else len(result.passes_kept)
    refused = (f" ({len(result.passes) - kept} of {len(result.passes)} refused: reference beyond "
               f"+-{100 * cfg.drift_tolerance:g}% of the passes' median)" if kept < len(result.passes) else "")
    combined = f"; profile: the {rule} of {kept} passes{refused}" if len(result.passes) > 1 else ""
    lines = [
        f"models: {result.models}",
        f"machine: {device_name(torch.device('cpu'))}; profile: {result.profile.label}",
        loop_costs_line(result.profile),
        f"acceptance: {cfg.acceptance} of {cfg.log or 'a log recorded here'}; prefill: {cfg.prefill}; "
        f"traffic: closed loop, {cfg.domain}, prompt ~{cfg.prompt_tokens} (at most {cfg.max_prompt_tokens}), "
        f"output ~{cfg.output_tokens} tokens (lognormal sigma {cfg.length_sigma}); profile version "
        f"{result.profile.version}"
        + (f" (attention key padding: {result.profile.key_padding})" if result.profile.attention is not None else "")
        + f"; {cfg.duration_s:g} s per point ({cfg.warmup_s:g} s warm-up); real runs in {cfg.rounds} round-robin "
        f"slice(s) of {cfg.slice_duration_s:g} s, each with its warm-up{extended(result)}; the simulator pools "
        f"{cfg.sim_replicas} acceptance draw(s) of each slice's requests{combined}; seed {cfg.seed}",
        "",
        markdown_table(result.table),
        "",
        "worst |relative error|: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in worst.items())
        + "; mean |relative error|: "
        + ", ".join(f"{k} {100 * v:.1f}%" for k, v in mean_abs_errors(result.table).items())
        + drift_note(result.table, cfg.drift_tolerance, cfg.drift_measure, cfg.drift_reference),
        noise_note(result.table, result.logs, cfg.domain),
    ]
    verdict = machine_verdict(result.table)
    return "\n".join(([verdict, ""] if verdict else []) + lines)


def extended(result: Validation) -> str:
    """What the report says of rounds that ``max_rounds`` added (nothing when it added none)."""
    planned, served = result.planned_rounds, result.config.rounds
    if planned is None or planned == served:
        return ""
    return (f" ({planned} asked for, {served - planned} more while the profile passes disagreed; at most "
            f"{result.config.max_rounds})")


def _csv(text: str, kind: type) -> tuple:
    try:
        return tuple(kind(v.strip()) for v in text.split(",") if v.strip())
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected comma-separated {kind.__name__} values, got {text!r}") from err


def parse_args(argv: list[str] | None) -> tuple[ValidationConfig, Path]:
    d = ValidationConfig()
    p = argparse.ArgumentParser(prog="python -m calibration.validate", description=__doc__.split("\n\n")[0])
    p.add_argument("--policies", type=lambda s: _csv(s, str), default=d.policies, help="comma-separated policies")
    p.add_argument("--users", type=lambda s: _csv(s, int), default=d.users,
                   help="closed-loop users per point (the concurrency sweep); max_concurrency = the largest")
    p.add_argument("--drafter", default=d.drafter, help="drafter kind (default: %(default)s)")
    p.add_argument("--gamma", type=int, default=d.gamma, help="draft block size (default: %(default)s)")
    p.add_argument("--models", default=d.models, choices=["auto", "trained", "random"],
                   help="trained checkpoints, random tiny weights, or auto: trained when present")
    p.add_argument("--checkpoints", default=d.checkpoints, help="trained checkpoint directory")
    p.add_argument("--weights-std", type=float, default=d.weights_std, help="std of random weights")
    p.add_argument("--domain", default=d.domain, help="traffic domain: math, code, chat or mixed")
    p.add_argument("--prompt-tokens", type=int, default=d.prompt_tokens, help="median prompt length")
    p.add_argument("--output-tokens", type=int, default=d.output_tokens, help="median output length")
    p.add_argument("--length-sigma", type=float, default=d.length_sigma, help="lognormal sigma of both lengths")
    p.add_argument("--duration-s", type=float, default=d.duration_s, help="seconds per point (sim and real)")
    p.add_argument("--warmup-s", type=float, default=d.warmup_s, help="seconds left out of the metrics (per slice)")
    p.add_argument("--rounds", type=int, default=d.rounds, help="slices per real run, served round-robin over points")
    p.add_argument("--max-rounds", type=int, default=d.max_rounds,
                   help="go on past --rounds, a round at a time up to this many, while the profile passes price the "
                        "points' real steps with a mean standard error above --target-price-se (default: exactly "
                        "--rounds)")
    p.add_argument("--target-price-se", type=float, default=d.target_price_se,
                   help="the profile passes' price standard error (fraction) below which --max-rounds adds no round; "
                        "at most the steady bound, 0.0251 (default: %(default)s)")
    p.add_argument("--prompt-limit-tokens", type=int, default=d.prompt_limit_tokens,
                   help="longest prompt; longer draws are truncated (default: 4 x --prompt-tokens)")
    p.add_argument("--profile-version", type=int, choices=(1, 2), default=d.profile_version,
                   help="1: per-request KV reads at the mean context; 2: attention over each step's contexts")
    p.add_argument("--long-context", action="store_true",
                   help="contexts of 1-4k tokens: " + ", ".join(f"--{k.replace('_', '-')} {v}"
                                                                  for k, v in LONG_CONTEXT.items())
                        + " (options given explicitly win)")
    p.add_argument("--prefill", default=d.prefill, choices=["disaggregated", "colocated", "chunked"],
                   help="disaggregated (a prefill instance, the simulator's default), colocated (prefill blocks "
                        "decoding; no simulator counterpart) or chunked (co-located chunks under --token-budget, "
                        "the simulator's chunked mode; needs --profile-version 2)")
    p.add_argument("--token-budget", type=int, default=d.token_budget,
                   help="max_num_batched_tokens of a step, in the simulator and the real loop")
    p.add_argument("--log", default=None, help="acceptance log to fit (default: record one here)")
    p.add_argument("--log-requests", type=int, default=d.log_requests, help="requests per domain when recording a log")
    p.add_argument("--acceptance", default=d.acceptance, choices=["replay", "fitted"])
    p.add_argument("--profile", default=None, help="use this profile instead of measuring one")
    p.add_argument("--profile-repeats", type=int, default=d.profile_repeats)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--threads", type=int, default=d.threads, help="torch CPU threads (default: %(default)s)")
    p.add_argument("--clock", default=d.clock, choices=["cpu", "wall"],
                   help="the real loop's decode clock: cpu (its thread's CPU seconds plus sleeps: time other jobs take "
                        "is not booked) or wall (default: %(default)s)")
    p.add_argument("--sim-replicas", type=int, default=d.sim_replicas, help="acceptance draws the simulator pools "
                   "per slice (default: %(default)s)")
    _drift_arguments(p, d)
    p.add_argument("--combine-passes", default=d.combine_passes, choices=COMBINE_RULES,
                   help="how the profile passes make the simulator's profile (default: %(default)s)")
    p.add_argument("--stop-when-unsteady", action="store_true",
                   help="stop (exit code 3) after a round once its drifted slices make a MACHINE NOT STEADY report "
                        "certain, whatever the later profile passes read, or once the profile passes disagree so "
                        "much that the rounds left cannot bring them within twice the steady bound; probes.csv keeps "
                        "the timings so far (after the last round nothing is left to save: the run reports, under "
                        "that verdict)")
    p.add_argument("--nice", type=int, default=None,
                   help="scheduling priority while measuring, e.g. -15 on a shared machine (needs root)")
    p.add_argument("--out", type=Path, default=Path("outputs/validation"), help="output directory")
    args = vars(p.parse_args(argv))
    out = args.pop("out")
    if args.pop("long_context"):
        given = {a.split("=")[0] for a in (argv if argv is not None else sys.argv[1:]) if a.startswith("--")}
        args.update({k: v for k, v in LONG_CONTEXT.items() if f"--{k.replace('_', '-')}" not in given})
    try:
        return replace(d, **args), out
    except ValueError as err:
        p.error(str(err))
        raise  # unreachable: p.error exits


def _drift_arguments(p: argparse.ArgumentParser, d: ValidationConfig) -> None:
    """The options of the machine-drift guard: which slices it refuses and what it corrects."""
    p.add_argument("--drift-tolerance", type=float, default=d.drift_tolerance,
                   help="refuse a real slice whose reference probe differs from profiling's by more than this "
                        "(fraction; default: %(default)s); a point with fewer than half its slices is not reported")
    p.add_argument("--drift-measure", default=d.drift_measure, choices=["probe", "meter"],
                   help="the machine's drift from: probe (timed before and after each profile pass and slice) or "
                        "meter (a small canary timed before every serving step - the passes' loop probes, the real "
                        "slices - off the loop's clock; for machines whose speed flickers) (default: %(default)s)")
    p.add_argument("--drift-reference", default=d.drift_reference, choices=["slices", "passes"],
                   help="what the correction measures a slice's drift from: slices (the mean reading of the run's "
                        "kept slices: only a slice's departure from the run's own level is corrected) or passes (the "
                        "profile passes' reading, as the refusal does) (default: %(default)s)")


def main(argv: list[str] | None = None) -> Validation:
    cfg, out = parse_args(argv)
    out.mkdir(parents=True, exist_ok=True)  # the config first: a run that stops keeps it beside what it measured
    (out / "config.json").write_text(json.dumps(asdict(cfg), indent=1) + "\n")
    try:
        result = run_validation(cfg, progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    except MachineNotSteady as err:
        err.probes.to_csv(out / "probes.csv", index=False)
        print(f"error: {err}; the probe's timings so far: {out / 'probes.csv'}", file=sys.stderr)
        raise SystemExit(3) from None
    paths = write_outputs(result, out)
    print(report_text(result))
    print(f"\nwrote {', '.join(str(p) for p in [*paths.values(), out / 'config.json'])}")
    return result


if __name__ == "__main__":
    main()
