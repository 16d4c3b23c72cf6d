"""Measure a hardware profile with the included torch models (``source: measured``).

The command is :mod:`calibration.profiling.profile_gpu` (``python calibration/profile_gpu.py``);
:func:`measure` does the work and returns the profile dictionary.

What is timed (median of ``--repeats`` runs after ``--warmup`` runs, the device
synchronised around each run; building index tensors on the host is excluded):

* verify: one verifier forward over B batch tokens, laid out as ceil(B / q) requests
  of q = ``--query-tokens`` tokens (the last one shorter), every request holding C
  context tokens, for each C in ``--context-tokens``. The profile's ``verify`` table
  is the curve at the smallest C (the token cost); every curve is kept in
  ``metadata.verify_curves``.
* per request: R requests of one token at the largest C minus the same at the smallest C (clipped at 0); in
  version 2, R one-token requests over one cached key minus the verify table's forward of R tokens (the context
  is in the attention table: :mod:`calibration.profiling.measure_context`).
* draft: ``propose`` of each drafter over (R, gamma), context C_max, after appending
  one committed token per request to the drafter's context.
* prefill: one request of n1 and of n2 tokens; tokens_per_s = (n2 - n1) / (t2 - t1).
* version 2 with ``cuda_graph_tokens`` N (CUDA): the verify points up to N again, as CUDA-graph replay, timed
  first (:mod:`calibration.profiling.graphs`); the attention and per-request pairs are replayed as graphs too.

Scheduler costs are host-side policy time: by default the profile carries the
roofline's documented assumptions for them, flagged in metadata. With
``--host-overhead`` (for the real serving loop, :mod:`calibration.serving`) they are
measured (``policies.Greedy.decide`` over (R, gamma)), and so are the loop's own
costs - host time per step and the in-loop slowdown of the forward passes - which
:mod:`calibration.profiling.loop_costs` folds into the draft, verify and per-request tables
(the isolated tables stay in ``metadata.forward_only``), and the loop's prefill.
Weights are random (latency depends on shapes only), or those of the trained
checkpoints with ``--checkpoints DIR`` (their shapes: the models the loop serves).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from calibration.models import checkpoints
from calibration.models.drafters import Drafter, build_drafter
from calibration.models.model import Verifier, build_verifier
from calibration.profiling.calls import draft_call, verify_call
from calibration.profiling.graphs import cuda_graphs_note, graph_call, graph_tables
from calibration.profiling.loop_costs import with_loop_costs
from calibration.profiling.machine import device_name, software
from calibration.profiling.measure_context import (
    ContextAxes,
    context_blocks,
    context_points,
    difference_pairs,
    read_request_pairs,
    request_pairs,
)
from calibration.profiling.memory import fit_requests, kv_slots_that_fit
from calibration.profiling.profile_file import (
    DraftTable,
    PerRequestTable,
    PrefillCost,
    ProfileDocument,
    ProfileMetadata,
    SchedulerCost,
    VerifyTable,
)
from calibration.profiling.roofline import Assumptions, cuda_graph_sizes
from calibration.profiling.timing import Prepare, median_s, time_differences, time_points

TOOL = "specsched 0.1.0 calibration.profile_gpu"  # the command's name (python -m calibration.profile_gpu)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class ProfileConfig:
    """One profiling run: the models, the grids of every table and the timing protocol (the CLI's options)."""

    preset: str
    drafters: tuple[str, ...]
    device: str
    dtype: str
    batch_tokens: tuple[int, ...]
    num_requests: tuple[int, ...]
    draft_tokens: tuple[int, ...]
    context_tokens: tuple[int, ...]
    query_tokens: int
    prefill_tokens: tuple[int, int]
    warmup: int
    repeats: int
    seed: int
    compile: bool
    kv_budget_bytes: float | None = None  # None: 60% of free memory on CUDA, unlimited on CPU
    host_overhead: bool = False  # measure the serving loop's host time and the scheduler (see module docstring)
    interleave: bool = False  # time the grid in round-robin passes (see timing.time_points)
    checkpoints: str | None = None  # time the trained models of this directory instead of the preset
    # Version 2 (measure_context): the verify table at context 0 only, attention, chunk and drafter tables over
    # context_axes.contexts (which context_tokens must equal); no per-request table.
    format_version: int = 1
    context_axes: ContextAxes | None = None
    probe_context: int | None = None  # context of the padding and per-request probes (None: the largest)
    cuda_graph_tokens: int | None = None  # version 2 on CUDA: dense verify table as graph replay up to this B
    # Version 2: each drafter's own R grid, in ``drafters`` order (empty: ``num_requests`` for every drafter); the
    # memory check cuts each by that drafter's cache alone (memory.fit_requests)
    draft_requests: tuple[tuple[int, ...], ...] = ()
    difference_repeats: int | None = None  # version 2: timed rounds of each difference pair (None: ``repeats``)

    def __post_init__(self) -> None:
        if self.format_version not in (1, 2):
            raise ValueError(f"format_version must be 1 or 2, got {self.format_version}")
        if (self.format_version == 2) != (self.context_axes is not None):
            raise ValueError("a version-2 profile needs context_axes, a version-1 profile has none")
        if self.context_axes is not None and self.context_axes.contexts != self.context_tokens:
            raise ValueError(f"context_tokens {self.context_tokens} must be the context axis "
                             f"{self.context_axes.contexts} in version 2")
        if self.draft_requests and len(self.draft_requests) != len(self.drafters):
            raise ValueError(f"draft_requests holds {len(self.draft_requests)} grids for {len(self.drafters)} drafters")
        if self.cuda_graph_tokens is not None and not (
                self.format_version == 2 and self.device.startswith("cuda") and self.cuda_graph_tokens in
                self.batch_tokens and self.cuda_graph_tokens < self.batch_tokens[-1]):
            raise ValueError(f"cuda_graph_tokens {self.cuda_graph_tokens} needs version 2, a CUDA device and a batch "
                             f"size of the verify grid below its end ({self.batch_tokens[-1]})")

    def draft_grids(self) -> dict[str, tuple[int, ...]]:
        """Each drafter's R grid (version 1: ``num_requests`` for every one)."""
        if not self.draft_requests:
            return {kind: self.num_requests for kind in self.drafters}
        return dict(zip(self.drafters, self.draft_requests, strict=True))

    @property
    def verify_contexts(self) -> tuple[int, ...]:
        """Contexts of the verify curves: every one in version 1, only 0 in version 2 (attention is its own table)."""
        return self.context_tokens if self.context_axes is None else (0,)

    @property
    def probe_context_tokens(self) -> int:
        return max(self.context_tokens) if self.probe_context is None else self.probe_context

    @property
    def captured_tokens(self) -> tuple[int, ...]:
        """The batch sizes captured as CUDA graphs (none without ``cuda_graph_tokens``)."""
        cap = self.cuda_graph_tokens
        return () if cap is None else tuple(b for b in self.batch_tokens if b <= cap)


def batch_grid(max_batch_tokens: int, grid: str) -> list[int]:
    """quick: a dozen points; default: 1..64 and every CUDA-graph size (and size + 1); full: every integer."""
    if grid == "quick":
        points = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
    elif grid == "full":
        points = list(range(1, max_batch_tokens + 1))
    else:
        sizes = cuda_graph_sizes(max(max_batch_tokens, 1)).tolist()
        points = [*range(1, 65), *sizes, *(s + 1 for s in sizes if s >= 64)]
    return sorted({p for p in points if p <= max_batch_tokens} | {max_batch_tokens})


def split_tokens(tokens: int, per_request: int) -> list[int]:
    """B tokens as ceil(B / q) requests of q tokens, the last one holding the remainder."""
    full, rest = divmod(tokens, per_request)
    return [per_request] * full + ([rest] if rest else [])


def count_points(cfg: ProfileConfig) -> int:
    draft_rows = sum(len(grid) for grid in cfg.draft_grids().values())
    drafts = draft_rows * len(cfg.draft_tokens)
    axes = cfg.context_axes
    context = 0 if axes is None else axes.num_points(draft_rows, len(cfg.draft_tokens)) - drafts
    return (len(cfg.batch_tokens) * len(cfg.verify_contexts) + len(cfg.captured_tokens) + 2 * len(padded_requests(cfg))
            + (2 if axes is None else 3) * len(cfg.num_requests) + drafts + context + 2
            + 3 * cfg.host_overhead)


def padded_requests(cfg: ProfileConfig) -> list[int]:
    """The R of the padding probe: every profiled R >= 2 (one request cannot be padded)."""
    return [r for r in cfg.num_requests if r >= 2] if cfg.query_tokens > 1 else []


def padding_cost(query_tokens: int, short_s: dict[int, float], probes: dict[int, tuple[float, float]]) -> float:
    """Seconds per padded query slot from the padding probe (see ``padded_slot_definition``); 0 without one.

    ``short_s[R]``: R requests of 1 token; ``probes[R]``: (one request of ``query_tokens`` + R-1 of 1, R requests
    of ``query_tokens``) seconds. A variable-length attention kernel gives ~0 (noise can make it negative: kept at 0).
    """
    q, slots, excess = query_tokens, [], []
    for r, (mixed_s, long_s) in probes.items():
        flat_s = short_s[r] + (long_s - short_s[r]) * (q - 1) / (q * r - r)  # linear in B = q + r - 1, same R
        slots.append((r - 1) * (q - 1))
        excess.append(mixed_s - flat_s)
    if not slots:
        return 0.0
    slope = sum(x * y for x, y in zip(slots, excess, strict=True)) / sum(x * x for x in slots)
    return max(0.0, slope)


ServedModels = tuple[Verifier, Callable[[str], Drafter]]  # the verifier and a drafter factory (kind -> drafter)


def served_models(cfg: ProfileConfig, gen: torch.Generator) -> ServedModels:
    """The verifier and a drafter factory of ``cfg``: random weights of the preset, or the trained checkpoints."""
    device, dtype = torch.device(cfg.device), DTYPES[cfg.dtype]
    if cfg.checkpoints is not None:
        target = checkpoints.load_target(Path(cfg.checkpoints)).to(device=device, dtype=dtype)
        return target, lambda kind: checkpoints.load_drafter(kind, target, Path(cfg.checkpoints)).to(device, dtype)
    model = build_verifier(cfg.preset, gen, device, dtype)
    return model, lambda kind: build_drafter(kind, model, gen, max_depth=max(cfg.draft_tokens))


@torch.inference_mode()
def measure(cfg: ProfileConfig, on_point: Callable[[str], None] = lambda _: None,
            on_total: Callable[[int], None] = lambda _: None, models: ServedModels | None = None) -> dict[str, Any]:
    """Run every timing of ``cfg`` and return the profile dictionary (simulator format).

    ``on_total`` hears the number of points once the grids are final, ``on_point`` each point as it starts.
    ``models`` (a verifier and a drafter factory) times those models instead of :func:`served_models`.
    """
    device = torch.device(cfg.device)
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    model, drafter_for = models if models is not None else served_models(cfg, gen)
    forward = torch.compile(model, dynamic=False) if cfg.compile else model
    ctx_lo, ctx_hi = min(cfg.context_tokens), max(cfg.context_tokens)
    cfg, capped = fit_requests(cfg, model, device)
    on_total(count_points(cfg))

    graph_s = time_points([(f"graph B={b}", graph_call(verify_call(model, forward, device, gen, b,
                                                                   split_tokens(b, cfg.query_tokens), 0)))
                           for b in cfg.captured_tokens], cfg.warmup, cfg.repeats, False, device, on_point)
    verify_keys, points = _forward_points(cfg, model, forward, device, gen, on_point)
    drafters = {kind: drafter_for(kind) for kind in cfg.drafters}
    axes = cfg.context_axes
    if axes is None:
        for kind, drafter in drafters.items():
            for r in cfg.num_requests:
                for g in cfg.draft_tokens:
                    points.append((f"draft {kind} R={r} gamma={g}", draft_call(drafter, ctx_hi, device, gen, r, g)))
    else:
        points += context_points(axes, model, forward, device, gen, drafters, cfg.draft_grids(), cfg.draft_tokens)
    times = iter(time_points(points, cfg.warmup, cfg.repeats, cfg.interleave, device, on_point))

    curves = _verify_curves(cfg, verify_keys, times)
    per_request, padded_slot_s = _per_request_costs(cfg, times)
    verify = VerifyTable(tuple(curves[str(ctx_lo)]["batch_tokens"]), tuple(curves[str(ctx_lo)]["steps_per_s"]),
                         padded_slot_s)
    metadata = _metadata(cfg, model, device, curves, capped)
    blocks = None
    if axes is None:
        draft = {kind: DraftTable(cfg.num_requests, cfg.draft_tokens,
                                  tuple(tuple(next(times) for _ in cfg.draft_tokens) for _ in cfg.num_requests))
                 for kind in drafters}
    else:
        replay = cfg.cuda_graph_tokens is not None  # graphs on: the attention pairs are replayed too
        layout, capture = (lambda n: split_tokens(n, cfg.query_tokens)), (graph_call if replay else None)
        differences = iter(time_differences(
            difference_pairs(axes, model, forward, device, gen, drafters, layout, capture)
            + request_pairs(cfg.num_requests, model, forward, device, gen, layout, capture, cfg.cuda_graph_tokens),
            cfg.warmup, cfg.difference_repeats or cfg.repeats, device, on_point))
        blocks, notes = context_blocks(axes, differences, times, cfg.draft_grids(), cfg.draft_tokens,
                                       attention_replayed=replay)
        per_request = read_request_pairs(differences, cfg.num_requests, notes)
        draft = {}
        metadata.details.update(context_tables=notes, cuda_graphs=cuda_graphs_note(device, cfg.cuda_graph_tokens))
        if graph_s:
            eager_s = [1.0 / v for v in verify.steps_per_s]
            sps, graphs, metadata.details["cuda_graph_timing"] = graph_tables(cfg.batch_tokens, eager_s, graph_s,
                                                                              cfg.cuda_graph_tokens)  # type: ignore
            verify = dataclasses.replace(verify, steps_per_s=sps)
            blocks = dataclasses.replace(blocks, cuda_graphs=graphs)
    del drafters
    prefill = _prefill_cost(cfg, model, forward, device, gen, on_point)
    assumed = Assumptions()
    profile = ProfileDocument(
        metadata=metadata,
        gpus_per_replica=1,
        verify=verify,
        per_request=PerRequestTable(cfg.num_requests, tuple(per_request)),
        draft=draft,
        prefill=prefill,
        scheduler=SchedulerCost(assumed.scheduler_fixed_s, assumed.scheduler_per_candidate_s),
        version2=blocks,
    ).to_dict()
    if cfg.host_overhead:
        profile = _with_host_costs(profile, cfg, model, drafter_for, on_point)
    return profile


def _forward_points(cfg: ProfileConfig, model: Verifier, forward: Callable, device: torch.device,
                    gen: torch.Generator, on_point: Callable[[str], None]
                    ) -> tuple[list[tuple[int, int]], list[tuple[str, Prepare]]]:
    """The verifier's timing points: the verify grid per context, the per-request pairs and the padding probe.
    Returns (context, B) of each verify point that fits in memory, and every point in timing order."""
    ctx_lo, ctx_hi = min(cfg.context_tokens), cfg.probe_context_tokens
    points: list[tuple[str, Prepare]] = []
    verify_keys: list[tuple[int, int]] = []  # (context, B) of each verify point
    for context in cfg.verify_contexts:
        max_slots = kv_slots_that_fit(cfg, model, device, context)
        for b in cfg.batch_tokens:
            layout = split_tokens(b, cfg.query_tokens)
            if max_slots is not None and len(layout) > max_slots:
                on_point(f"verify B={b} C={context} (does not fit)")
                continue  # this context's KV cache for so many requests does not fit: left out of the curve
            verify_keys.append((context, b))
            points.append((f"verify B={b} C={context}", verify_call(model, forward, device, gen, b, layout,
                                                                       context)))
    for r in cfg.num_requests:
        points.append((f"per-request R={r}", verify_call(model, forward, device, gen, r, [1] * r, ctx_hi)))
        points.append((f"per-request R={r} (base)", verify_call(model, forward, device, gen, r, [1] * r, ctx_lo)))
    q = cfg.query_tokens
    for r in padded_requests(cfg):  # one long request among short ones, and the uniform long layout
        points.append((f"padded R={r}", verify_call(model, forward, device, gen, q + r - 1, [q] + [1] * (r - 1),
                                                     ctx_hi)))
        points.append((f"uniform R={r} q={q}", verify_call(model, forward, device, gen, q * r, [q] * r, ctx_hi)))
    return verify_keys, points


def _verify_curves(cfg: ProfileConfig, verify_keys: list[tuple[int, int]],
                   times: Iterator[float]) -> dict[str, dict[str, list]]:
    """Context length -> {batch_tokens, steps_per_s} from the verify points' times."""
    curves: dict[str, dict[str, list]] = {str(c): {"batch_tokens": [], "steps_per_s": []} for c in cfg.verify_contexts}
    for context, b in verify_keys:
        curves[str(context)]["batch_tokens"].append(b)
        curves[str(context)]["steps_per_s"].append(1.0 / next(times))
    ctx_lo = min(cfg.context_tokens)
    if curves[str(ctx_lo)]["batch_tokens"] != list(cfg.batch_tokens):
        raise SystemExit(f"the verify grid does not fit in memory at context {ctx_lo}; lower --max-batch-tokens")
    return curves


def _per_request_costs(cfg: ProfileConfig, times: Iterator[float]) -> tuple[list[float], float]:
    """(per-request step seconds per R, seconds per padded slot) from the per-request pairs and the padding probe."""
    short_s = []  # R x 1 token at ctx_hi, for the padding fit
    per_request = []
    for _ in cfg.num_requests:
        short_s.append(next(times))
        per_request.append(max(0.0, short_s[-1] - next(times)))  # hi - lo
    padded_slot_s = padding_cost(cfg.query_tokens, dict(zip(cfg.num_requests, short_s, strict=True)),
                                 {r: (next(times), next(times)) for r in padded_requests(cfg)})
    return per_request, padded_slot_s


def _prefill_cost(cfg: ProfileConfig, model: Verifier, forward: Callable, device: torch.device,
                  gen: torch.Generator, on_point: Callable[[str], None]) -> PrefillCost:
    """The verifier's prefill from one request of n1 and one of n2 tokens: tokens_per_s = (n2 - n1) / (t2 - t1)."""
    n1, n2 = cfg.prefill_tokens
    on_point(f"prefill {n1} tokens")
    t1 = median_s(verify_call(model, forward, device, gen, n1, [n1], 0)(), device, cfg.warmup, cfg.repeats)
    on_point(f"prefill {n2} tokens")
    t2 = median_s(verify_call(model, forward, device, gen, n2, [n2], 0)(), device, cfg.warmup, cfg.repeats)
    tokens_per_s = (n2 - n1) / (t2 - t1) if t2 > t1 else n2 / t2  # noise guard: fall back to the mean rate
    return PrefillCost(max(0.0, t1 - n1 / tokens_per_s), tokens_per_s)


def _metadata(cfg: ProfileConfig, model: Verifier, device: torch.device, curves: dict[str, dict[str, list]],
              capped: str | None) -> ProfileMetadata:
    """What was measured how: the models, the configuration, the timing protocol and every table's definition."""
    ctx_lo, ctx_hi = min(cfg.context_tokens), cfg.probe_context_tokens
    details = {
        **software(device),
        "dtype": cfg.dtype,
        "preset": cfg.preset if cfg.checkpoints is None else None,
        "checkpoints": cfg.checkpoints,
        "model_shape": asdict(model.s),
        "feature_layers": list(model.feature_layers),
        "config": asdict(cfg),
        "timing": (f"median of {cfg.repeats} runs ({cfg.difference_repeats or cfg.repeats} rounds per difference "
                   f"pair) after {cfg.warmup} warm-up runs, device synchronised"
                   + (", interleaved round-robin over the grid; " if cfg.interleave else "; ")
                   + "host-side index building excluded; "
                   + ("random weights" if cfg.checkpoints is None else f"weights of {cfg.checkpoints}")),
        "verify_layout": f"B tokens as ceil(B/{cfg.query_tokens}) requests; verify table at context {ctx_lo}",
        "verify_curves": curves,  # context length -> {batch_tokens, steps_per_s}
        "per_request_definition": (f"t(R x 1 token at context {ctx_hi}) - t(R x 1 token at context {ctx_lo})"
                                   if cfg.context_axes is None else
                                   "t(R x 1 token over one cached key) - t(the verify table's forward of R tokens, "
                                   "its layout), clipped at 0: what R requests cost beyond the dense part before "
                                   "any context (each request's context is in the attention table); replayed as "
                                   "CUDA graphs where the verify table is"),
        "padded_slot_definition": (f"least-squares slope over R of t(one request of {cfg.query_tokens} tokens "
                                   f"+ R-1 of 1) minus the linear interpolation in B between R x 1 and "
                                   f"R x {cfg.query_tokens} tokens, per padded slot (R-1) x "
                                   f"{cfg.query_tokens - 1}, context {ctx_hi}"),
        "scheduler_source": "assumed (calibration.roofline.Assumptions), not measured",
        "cpu_threads": torch.get_num_threads(),
        "num_requests_capped": capped,
    }
    return ProfileMetadata(source="measured", device=device_name(device), model=model.s.name,
                           created=datetime.date.today().isoformat(), tool=TOOL, details=details)


def _with_host_costs(profile: dict[str, Any], cfg: ProfileConfig, model: Verifier,
                     drafter_for: Callable[[str], Drafter], on_point: Callable[[str], None]) -> dict[str, Any]:
    """The serving loop's scheduler, prefill and loop costs folded into a new profile (:mod:`.loop_costs`)."""
    if not cfg.drafters:
        raise SystemExit("--host-overhead runs the serving loop, which needs a drafter: pass --drafters")
    kind = cfg.drafters[0]
    gamma = max(cfg.draft_tokens)
    probe = tuple(r for r in cfg.num_requests if r <= 8) or cfg.num_requests[:1]
    return with_loop_costs(profile, model, drafter_for(kind), gamma, probe, cfg.prefill_tokens, seed=cfg.seed,
                           warmup=cfg.warmup, repeats=cfg.repeats, on_point=on_point)
