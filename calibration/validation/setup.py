"""What a sim-vs-real validation is built from: its config, the served models, the profile and the acceptance log.

:class:`ValidationConfig` holds every option of ``python -m calibration.validate``;
:func:`build_models` loads the trained checkpoints or builds random tiny models;
:func:`measure_profile` profiles them on this machine with the serving loop's own costs
(:mod:`calibration.profiling.loop_costs`); :func:`record_log` writes an acceptance log on the traffic's
lengths; :func:`simulator_setup` points the simulator at that log (replayed or fitted) and
:func:`simulate_slice` runs one slice of a point in it; :func:`speed_reference` is a fixed probe of the
machine's current speed, for the drift column.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import torch

from calibration.acceptance.evaluate import decode_and_record
from calibration.acceptance.fit_preset import fit_preset
from calibration.models import checkpoints
from calibration.models.drafters import Drafter, build_drafter
from calibration.models.model import Verifier, build_verifier
from calibration.profiling.calls import draft_call, verify_call
from calibration.profiling.loop_costs import with_loop_costs
from calibration.profiling.measure import ProfileConfig, batch_grid, measure
from calibration.profiling.measure_context import ContextAxes
from calibration.serving.loop import PrefillMode, PromptSource, random_prompts
from calibration.serving.specdec import ContextCost
from calibration.training.corpora import corpus_prompts
from calibration.validation.passes import DEFAULT_RULE, check_rule
from calibration.validation.report import STEADY_MAX_PROFILE_PRICE_SE
from policies import make_policy
from policies.driver import CostSource
from simulator import ClusterSpec, DrafterSpec, EngineLimits, SimulationSpec, simulate
from simulator.acceptance.presets import PRESETS
from simulator.costs import HardwareProfile, load_profile, profile_from_dict
from traces.synthetic import LengthSpec, RequestSampler, TrafficSpec
from traces.workload import DOMAINS

ModelsKind = Literal["auto", "trained", "random"]
AcceptanceKind = Literal["replay", "fitted"]


@dataclass(frozen=True)
class ValidationConfig:
    """Everything one validation run needs (CLI options of the same names)."""

    policies: tuple[str, ...] = ("mtp1", "greedy", "dspark")
    users: tuple[int, ...] = (1, 2, 4, 8)
    drafter: str = "dspark"
    gamma: int = 7
    models: ModelsKind = "auto"
    checkpoints: str = str(checkpoints.DEFAULT_DIR)
    weights_std: float = 0.1
    domain: str = "chat"
    prompt_tokens: int = 32
    output_tokens: int = 64
    length_sigma: float = 0.3
    duration_s: float = 4.0
    warmup_s: float = 0.5
    rounds: int = 5  # real runs split into this many slices, run round-robin over the points
    max_rounds: int | None = None  # add rounds up to this many while the passes' price se > target_price_se
    # at most the steady bound (2.51%: the price alone puts an exact simulator's mean |error| at 2%); at 1.5%, 1.2%
    target_price_se: float = 0.015
    prefill: PrefillMode = "disaggregated"
    log: str | None = None
    log_requests: int = 64
    acceptance: AcceptanceKind = "replay"
    profile: str | None = None
    profile_repeats: int = 11
    seed: int = 0
    threads: int = 1
    nice: int | None = None  # scheduling priority while measuring (negative: ahead of other jobs; needs root)
    profile_version: int = 1  # 2: attention over context (measure_context) instead of per-request KV reads
    prompt_limit_tokens: int | None = None  # longest prompt (lengths above are truncated); None: 4 x prompt_tokens
    token_budget: int | None = None  # max_num_batched_tokens of a step (sim and real); chunked prefill needs one
    clock: str = "cpu"  # the real loop's decode clock: "cpu" (thread CPU seconds + sleeps) or "wall"
    drift_tolerance: float = 0.10  # a slice whose reference probe is further than this from profiling's is refused
    # what measures the drift: "probe" (speed_reference, timed before and after each pass and slice) or "meter"
    # (the canary timed before every serving step, the passes' loop probes and the slices: serving.speed_meter)
    drift_measure: str = "probe"
    # what the correction measures each slice's drift from (points.drift_correction): "slices" (the mean reading of
    # the run's kept slices) or "passes" (the profile passes' median reading, as the refusal does)
    drift_reference: str = "slices"
    # stop after a round once the slices so far make a not-steady report certain (points.least_refused)
    stop_when_unsteady: bool = False
    # the simulator runs each slice with this many draws of the acceptance process (same requests, other logged
    # texts and draws; SimulationSpec.acceptance_seed) and pools them: its own sampling noise shrinks
    sim_replicas: int = 4
    combine_passes: str = DEFAULT_RULE  # how the profile passes make one profile (validation.passes.COMBINE_RULES)

    def __post_init__(self) -> None:
        if not self.policies or not self.users or min(self.users) < 1:
            raise ValueError(f"need >= 1 policy and user counts >= 1, got {self.policies}, {self.users}")
        if self.domain not in (*DOMAINS, "mixed"):
            raise ValueError(f"domain must be one of {', '.join(DOMAINS)} or mixed, got {self.domain!r}")
        if min(self.prompt_tokens, self.output_tokens, self.log_requests, self.gamma, self.rounds) < 1:
            raise ValueError("prompt_tokens, output_tokens, log_requests, gamma and rounds must be >= 1")
        if self.max_rounds is not None and self.max_rounds < self.rounds:
            raise ValueError(f"max_rounds ({self.max_rounds}) must be >= rounds ({self.rounds})")
        if self.max_rounds is not None and self.profile is not None:
            raise ValueError("max_rounds extends a run while its profile passes disagree; with a given profile "
                             "there is one pass: leave out profile or max_rounds")
        if not 0 < self.target_price_se <= STEADY_MAX_PROFILE_PRICE_SE:
            raise ValueError(f"target_price_se must lie in (0, {STEADY_MAX_PROFILE_PRICE_SE:.5f}] (the steady "
                             f"bound), got {self.target_price_se}")
        if not 0 <= self.warmup_s < self.duration_s:
            raise ValueError(f"warmup_s must lie in [0, duration_s), got {self.warmup_s} and {self.duration_s}")
        for name in self.policies:
            make_policy(name)  # fails early, naming the valid policies
        if self.profile_version not in (1, 2):
            raise ValueError(f"profile_version must be 1 or 2, got {self.profile_version}")
        if self.prefill == "chunked" and (self.token_budget is None or self.profile_version != 2):
            raise ValueError("prefill=chunked needs token_budget and profile_version 2 (chunk attention)")
        if self.token_budget is not None and self.token_budget < max(self.users):
            raise ValueError(f"token_budget ({self.token_budget}) must leave each of max(users) = {max(self.users)} "
                             "decoding requests its one token per step")
        for key, valid in (("models", ("auto", "trained", "random")), ("acceptance", ("replay", "fitted")),
                           ("clock", ("cpu", "wall")), ("drift_measure", ("probe", "meter")),
                           ("drift_reference", ("slices", "passes"))):
            if getattr(self, key) not in valid:
                raise ValueError(f"{key} must be one of {', '.join(valid)}, got {getattr(self, key)!r}")
        if self.drift_measure == "meter" and self.profile is not None:
            raise ValueError("drift_measure 'meter' reads the machine during profiling (its loop probes); "
                             "it cannot with a given profile: leave out profile or use drift_measure 'probe'")
        check_rule(self.combine_passes)
        if self.sim_replicas < 1:
            raise ValueError(f"sim_replicas must be >= 1, got {self.sim_replicas}")
        if not self.drift_tolerance > 0:
            raise ValueError(f"drift_tolerance must be > 0, got {self.drift_tolerance}")
        if self.prompt_limit_tokens is not None and self.prompt_limit_tokens < self.prompt_tokens:
            raise ValueError(f"prompt_limit_tokens ({self.prompt_limit_tokens}) must be >= prompt_tokens "
                             f"({self.prompt_tokens})")

    @property
    def max_prompt_tokens(self) -> int:
        return 4 * self.prompt_tokens if self.prompt_limit_tokens is None else self.prompt_limit_tokens

    @property
    def context_tokens(self) -> int:
        """The mean context a decode step attends over (prompt + half the output)."""
        return self.prompt_tokens + self.output_tokens // 2

    @property
    def max_output_tokens(self) -> int:
        return 4 * self.output_tokens

    def traffic(self, num_users: int) -> TrafficSpec:
        lengths = LengthSpec(self.prompt_tokens, self.length_sigma, self.output_tokens, self.length_sigma)
        mix = {d: 1.0 for d in DOMAINS} if self.domain == "mixed" else {self.domain: 1.0}
        return TrafficSpec(arrival="closed", domain_mix=mix, num_users=num_users, think_time_s=0.0,
                           max_prompt_tokens=self.max_prompt_tokens, max_output_tokens=self.max_output_tokens,
                           lengths={d: lengths for d in DOMAINS})

    @property
    def slice_duration_s(self) -> float:
        """Length of one real-run slice: its own warm-up plus its share of the measured window."""
        return self.warmup_s + (self.duration_s - self.warmup_s) / self.rounds

    def with_rounds(self, rounds: int) -> ValidationConfig:
        """The config of a run that served ``rounds`` rounds of the same slices (``max_rounds`` extended it): the
        measured window grows with them, the slice length stays."""
        if rounds == self.rounds:
            return self
        measured_s = (self.duration_s - self.warmup_s) / self.rounds * rounds
        return replace(self, rounds=rounds, duration_s=self.warmup_s + measured_s)

    def limits(self) -> EngineLimits:
        return EngineLimits(max_concurrency=max(self.users),
                            kv_capacity_tokens=max(self.users) * (self.max_prompt_tokens + self.max_output_tokens),
                            max_num_batched_tokens=self.token_budget)


@dataclass(frozen=True)
class Models:
    """The served models (one verifier, one drafter) and where their prompts come from."""

    verifier: Verifier
    drafter: Drafter
    prompts: PromptSource
    description: str
    trained: bool


def _trained_available(directory: str, kind: str) -> bool:
    return (Path(directory) / "target.pt").exists() and (Path(directory) / f"{kind}.pt").exists()


def build_models(cfg: ValidationConfig) -> Models:
    """Trained checkpoints (``models=trained``, or ``auto`` when they exist) or random weights of ``tiny``."""
    use_trained = cfg.models == "trained" or (cfg.models == "auto" and _trained_available(cfg.checkpoints,
                                                                                           cfg.drafter))
    if use_trained:
        verifier = checkpoints.load_target(Path(cfg.checkpoints))
        drafter = checkpoints.load_drafter(cfg.drafter, verifier, Path(cfg.checkpoints))
        return Models(verifier, drafter, corpus_prompts(),
                      f"trained {verifier.s.name} target + {cfg.drafter} drafter ({cfg.checkpoints})", True)
    gen = torch.Generator().manual_seed(cfg.seed)
    verifier = build_verifier("tiny", gen, std=cfg.weights_std)
    drafter = build_drafter(cfg.drafter, verifier, gen, std=cfg.weights_std, max_depth=max(cfg.gamma, 8))
    return Models(verifier, drafter, random_prompts(verifier.s.vocab_size),
                  f"random tiny target + {cfg.drafter} drafter (weights std {cfg.weights_std}, seed {cfg.seed})",
                  False)


def profile_config(cfg: ValidationConfig) -> ProfileConfig:
    """Grids that cover the sweep: B up to max users x (1 + gamma), R up to max users (>= 2); contexts 0 and typical
    (version 1), or a context axis from 0 to the longest prompt + output (version 2)."""
    # R up to at least 2, even for one user: the decisions' cost is a line over R x g, and mtp drafts g = 1 only
    max_users = max(*cfg.users, 2)
    max_batch = max(max_users * (1 + cfg.gamma), cfg.token_budget or 0)
    requests = sorted({r for r in (1, 2, 4, 8, 16, 32, 64) if r <= max_users} | {max_users})
    contexts: tuple[int, ...] = (0, cfg.context_tokens)
    axes = None
    if cfg.profile_version == 2:
        contexts = validation_contexts(cfg.max_prompt_tokens + cfg.max_output_tokens)
        chunks: tuple[int, ...] = ()
        if cfg.prefill == "chunked" and cfg.token_budget is not None:  # chunk sizes up to the budget
            chunks = tuple(sorted({1, *(c for c in (8, 16, 32, 64, 128, 256, 512, 1024) if c < cfg.token_budget),
                                   cfg.token_budget}))
        # disaggregated: a prefill table over the traffic's prompts (prefill is convex in the prompt)
        prompts = (1, *validation_contexts(cfg.max_prompt_tokens)[1:]) if cfg.prefill == "disaggregated" else ()
        # chunk contexts over the whole axis: the simulator's start check asks for every context a request reaches
        axes = ContextAxes(contexts, tuple(range(1, cfg.gamma + 2)), chunks, contexts if chunks else (),
                           attention_requests=4, prefill_prompts=prompts)
    return ProfileConfig(
        preset="tiny", drafters=(cfg.drafter,), device="cpu", dtype="float32",
        batch_tokens=tuple(sorted(set(batch_grid(max_batch, "quick")) | set(axes.chunks if axes else ()))),
        num_requests=tuple(requests),
        draft_tokens=tuple(sorted({1, 2, 4, cfg.gamma})), context_tokens=contexts, query_tokens=1 + cfg.gamma,
        prefill_tokens=(max(2, cfg.prompt_tokens // 2), 2 * cfg.prompt_tokens), warmup=2,
        repeats=cfg.profile_repeats, seed=cfg.seed, compile=False, host_overhead=False, interleave=True,
        checkpoints=None, format_version=cfg.profile_version, context_axes=axes, probe_context=cfg.context_tokens)


def prompt_quantiles(cfg: ValidationConfig) -> tuple[int, ...]:
    """Prompt lengths at the 10, 30, 50, 70 and 90% quantiles of the traffic's lognormal (truncated as it is): where
    the loop's prefill is fitted, so that its mean time over the traffic's prompts comes out right."""
    z = np.array([-1.2816, -0.5244, 0.0, 0.5244, 1.2816])  # standard normal quantiles
    points = np.minimum(np.round(cfg.prompt_tokens * np.exp(cfg.length_sigma * z)), cfg.max_prompt_tokens)
    return tuple(sorted({max(2, int(p)) for p in points}))


def validation_contexts(longest_tokens: int) -> tuple[int, ...]:
    """0, then powers of two and their midpoints from about a sixteenth of the longest context a request reaches
    (at least 64) up to it, and that end."""
    low = max(6, (longest_tokens // 16).bit_length() - 1)
    points = {0, longest_tokens}
    for k in range(low, 30):
        points |= {p for p in (1 << k, 3 << (k - 1)) if p < longest_tokens}
    return tuple(sorted(points))


def measure_profile(cfg: ValidationConfig, models: Models) -> HardwareProfile:
    """Profile the served models on this machine (or load ``cfg.profile``)."""
    if cfg.profile is not None:
        return load_profile(cfg.profile)
    profile_cfg = profile_config(cfg)
    data = measure(profile_cfg, models=(models.verifier, lambda kind: models.drafter))
    # The loop's own costs, probed on the workload's lengths: attention pads to the longest context in a batch.
    lengths = LengthSpec(cfg.prompt_tokens, cfg.length_sigma, cfg.output_tokens, cfg.length_sigma)
    data = with_loop_costs(data, models.verifier, models.drafter, cfg.gamma, profile_cfg.num_requests,
                           prompt_quantiles(cfg), lengths, cfg.seed, profile_cfg.warmup, profile_cfg.repeats,
                           policies=cfg.policies, max_lengths=(cfg.max_prompt_tokens, cfg.max_output_tokens),
                           clock=cfg.clock,  # type: ignore[arg-type]
                           token_budget=cfg.token_budget if cfg.prefill == "chunked" else None)
    data["metadata"]["model"] = models.description
    return profile_from_dict(data, "<validation profile>")


def speed_reference(cfg: ValidationConfig, models: Models, repeats: int = 30) -> Callable[[], float]:
    """A fixed probe of this machine's current speed: mean seconds of one drafter proposal and one verifier
    forward (R = 1, gamma draft tokens) over ``repeats`` runs, on the real loop's clock (thread CPU seconds with
    ``clock="cpu"``: what is left of the machine's drift once other jobs' time is not booked - shared caches,
    memory bandwidth, a busy sibling core). The mean, as the loop pays it. Its ratio between two moments tells how
    much the machine's speed drifted between them."""
    device, gen = torch.device("cpu"), torch.Generator().manual_seed(cfg.seed)
    context = cfg.context_tokens
    draft = draft_call(models.drafter, context, device, gen, 1, cfg.gamma)()
    verify = verify_call(models.verifier, models.verifier, device, gen, 1 + cfg.gamma, [1 + cfg.gamma], context)()
    timer = time.thread_time if cfg.clock == "cpu" else time.perf_counter

    @torch.inference_mode()
    def measure_s() -> float:
        for _ in range(2):
            draft(), verify()
        start = timer()
        for _ in range(repeats):
            draft(), verify()
        return (timer() - start) / repeats
    return measure_s


def speed_canary(cfg: ValidationConfig, models: Models) -> Callable[[], object]:
    """The speed meter's canary (:mod:`calibration.serving.speed_meter`): one verifier forward of one token at
    the traffic's median context (3 ms on the trained tiny models), with its own cache."""
    call = verify_call(models.verifier, models.verifier, torch.device("cpu"), torch.Generator().manual_seed(cfg.seed),
                       1, [1], cfg.context_tokens)()

    def canary() -> object:
        with torch.inference_mode():
            return call()
    return canary


def record_log(cfg: ValidationConfig, models: Models, num_draft: int, num_tokens: int | None = None,
               max_kept_tokens: int | None = 1) -> pd.DataFrame:
    """A dense acceptance log of the served models on the traffic's prompts: a verified block of ``num_draft``
    tokens at every output position, replayed in order by the simulator
    (:class:`simulator.acceptance.replay.LoggedAcceptance`).

    Per domain, ``log_requests`` requests with prompt lengths drawn from the traffic's
    distribution are decoded together by :class:`calibration.serving.specdec.SpeculativeDecoder`
    under ``mtp<num_draft>`` (every draft token verified), keeping one token per step, up
    to the traffic's longest output: any simulated request finds a logged block at every
    position it reaches, with the context length it has there. ``num_tokens`` decodes fewer;
    ``max_kept_tokens=None`` decodes the same prompts as the serving loop does (every accepted token kept).
    """
    frames = []
    for d_idx, domain in enumerate(DOMAINS):
        seeds = np.random.SeedSequence([cfg.seed, 7, d_idx])
        rng = np.random.default_rng(seeds)
        sampler = RequestSampler(replace(cfg.traffic(1), domain_mix={domain: 1.0}))
        _, prompt_tokens, _ = sampler.sample(rng, cfg.log_requests)
        # The decoder's last prompt token is its first anchor: it stands for the prefill's first output token.
        prompts = [models.prompts(domain, int(n) + 1, rng) for n in prompt_tokens]
        generator = torch.Generator().manual_seed(int(seeds.generate_state(1)[0]))
        tokens = cfg.max_output_tokens - 1 if num_tokens is None else num_tokens
        frames.append(decode_and_record(models.verifier, models.drafter, prompts, tokens, num_draft, domain, rng,
                                        generator, max_kept_tokens=max_kept_tokens))
    return pd.concat(frames, ignore_index=True)


def simulator_setup(cfg: ValidationConfig, profile: HardwareProfile, log_path: Path, num_draft: int | None = None,
                    pricing: HardwareProfile | None = None) -> tuple[HardwareProfile, DrafterSpec, HardwareProfile]:
    """(profile, drafter spec, pricing profile) that make ``simulate`` take its acceptance from the log at
    ``log_path``, for policies that draft ``num_draft`` tokens (default gamma; the drafter spec's gamma).
    ``pricing`` (default ``profile``) is what the policy prices with (``SimulationSpec.policy_profile``).

    ``replay``: :class:`simulator.acceptance.replay.LoggedAcceptance` through ``DrafterSpec.log``.
    ``fitted``: a preset fitted to the log (:func:`calibration.acceptance.fit_preset.fit_preset`), installed
    under a new name; both profiles' draft tables of the drafter are copied under that name (same measured
    latencies).
    """
    gamma = cfg.gamma if num_draft is None else num_draft
    pricing = profile if pricing is None else pricing
    if cfg.acceptance == "replay":
        return profile, DrafterSpec(cfg.drafter, gamma, log=str(log_path)), pricing
    fitted = fit_preset(log_path, drafter=cfg.drafter)
    name = f"validation-{cfg.drafter}-{abs(hash(tuple(sorted(fitted.tau.items())))) % 10**8}"
    if name not in PRESETS:
        fitted.install(name)

    def renamed(p: HardwareProfile) -> HardwareProfile:
        raw = json.loads(json.dumps(p.raw))
        raw["draft"][name] = raw["draft"][cfg.drafter]
        return profile_from_dict(raw, p.path)
    return renamed(profile), DrafterSpec(name, gamma, confidence=fitted.confidence_spec()), renamed(pricing)


def simulate_slice(cfg: ValidationConfig, point: tuple[str, int],
                   setups: dict[int, tuple[HardwareProfile, DrafterSpec, HardwareProfile]], round_idx: int) -> list:
    """The simulator's runs of one slice: ``cfg.sim_replicas`` draws of the acceptance process over the slice's
    requests (the first with the seed's own streams, then acceptance seeds 1, 2, ...)."""
    spec = simulation_spec(cfg, point, setups, round_idx)
    return [simulate(replace(spec, acceptance_seed=None if r == 0 else r)) for r in range(cfg.sim_replicas)]


def simulation_spec(cfg: ValidationConfig, point: tuple[str, int],
                    setups: dict[int, tuple[HardwareProfile, DrafterSpec, HardwareProfile]],
                    round_idx: int) -> SimulationSpec:
    """The simulator's run of one slice of a (policy, users) point, with the acceptance log of the block size it
    drafts and the real loop's pricing profile. Slice k has the real slice's length and seed (seed + k), hence
    the same sequence of request domains and lengths."""
    name, users = point
    policy = make_policy(name)
    num_draft = max(policy.draft_tokens(cfg.gamma), 1)
    sim_profile, drafter_spec, pricing = setups[num_draft] if num_draft in setups else setups[max(setups)]
    cluster = ClusterSpec(num_decode_engines=1, num_prefill_instances=1, limits=cfg.limits(),
                          mode="chunked" if cfg.prefill == "chunked" else "disaggregated")
    return SimulationSpec(policy=policy, profile=sim_profile, drafter=drafter_spec, cluster=cluster,
                          traffic=cfg.traffic(users), duration_s=cfg.slice_duration_s, warmup_s=cfg.warmup_s,
                          seed=cfg.seed + round_idx, policy_profile=pricing)


def loop_pricing(profile: HardwareProfile, drafter: str, draft_tokens: int) -> CostSource | ContextCost:
    """What the real loop's policy prices a step with: the profile's step cost, with the requests' contexts when
    the profile prices context (as the simulator's engine does)."""
    if profile.uses_context(drafter):
        return ContextCost(lambda r, contexts: profile.step_cost_curve(drafter, r, draft_tokens, contexts))
    return partial(profile.step_cost_curve, drafter, draft_tokens=draft_tokens)
