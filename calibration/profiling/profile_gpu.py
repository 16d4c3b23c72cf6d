"""Measure a hardware profile with the included torch models (``source: measured``).

    python calibration/profile_gpu.py --preset tiny --drafters dspark,dflash --out PATH
    python -m calibration.profile_gpu --preset qwen3-8b --out h200_qwen3-8b_measured.json   # on a GPU

What is timed (median of ``--repeats`` runs after ``--warmup`` runs, the device
synchronised around each run; building index tensors on the host is excluded):

* verify: one verifier forward over B batch tokens, laid out as ceil(B / q) requests
  of q = ``--query-tokens`` tokens (the last one shorter), every request holding C
  context tokens, for each C in ``--context-tokens``. The profile's ``verify`` table
  is the curve at the smallest C (the token cost); every curve is kept in
  ``metadata.verify_curves``.
* per request: R requests of one token at the largest C minus the same at the
  smallest C (clipped at 0): the context (KV-read) cost the simulator adds per request.
* draft: ``propose`` of each drafter over (R, gamma), context C_max, after appending
  one committed token per request to the drafter's context.
* prefill: one request of n1 and of n2 tokens; tokens_per_s = (n2 - n1) / (t2 - t1).

Scheduler costs are host-side policy time: by default the profile carries the
roofline's documented assumptions for them, flagged in metadata. With
``--host-overhead`` (for the real serving loop, :mod:`calibration.serving`) they are
measured (``policies.Greedy.decide`` over (R, gamma)), and so are the loop's own
costs - host time per step and the in-loop slowdown of the forward passes - which
:mod:`calibration.loop_costs` folds into the draft, verify and per-request tables
(the isolated tables stay in ``metadata.forward_only``), and the loop's prefill.
Weights are random (latency depends on shapes only), or those of the trained
checkpoints with ``--checkpoints DIR`` (their shapes: the models the loop serves).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from calibration.drafter_cost import DRAFT_KINDS
from calibration.drafters import Drafter, build_drafter
from calibration.model import Verifier, build_verifier
from calibration.roofline import Assumptions, cuda_graph_sizes, requests_grid
from calibration.shapes import MODEL_SHAPES

TOOL = "specsched 0.1.0 calibration.profile_gpu"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class ProfileConfig:
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
    interleave: bool = False  # time the grid in round-robin passes (see time_points)
    checkpoints: str | None = None  # time the trained models of this directory instead of the preset


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


def median_s(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int) -> float:
    """Median wall time of ``fn`` over ``repeats`` runs, synchronising the device around each."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


Prepare = Callable[[], Callable[[], object]]  # sets up one timing point, returns the call to time


def time_points(points: list[tuple[str, Prepare]], cfg: ProfileConfig, device: torch.device,
                on_point: Callable[[str], None]) -> list[float]:
    """Median wall time of every point's call.

    One point after the other by default (only one point's buffers alive at a
    time). With ``cfg.interleave`` every point is set up first and then timed in
    ``cfg.repeats`` round-robin passes: on a shared machine a burst of load from
    other jobs then costs every point a little instead of a few points a lot.
    """
    if not cfg.interleave:
        times = []
        for label, prepare in points:
            on_point(label)
            times.append(median_s(prepare(), device, cfg.warmup, cfg.repeats))
        return times
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    calls = []
    for label, prepare in points:
        on_point(label)
        calls.append(prepare())
    for call in calls:
        for _ in range(cfg.warmup):
            call()
    samples: list[list[float]] = [[] for _ in calls]
    for _ in range(cfg.repeats):
        for call, out in zip(calls, samples, strict=True):
            sync()
            start = time.perf_counter()
            call()
            sync()
            out.append(time.perf_counter() - start)
    return [statistics.median(out) for out in samples]


def verify_call(model: Verifier, forward: Callable, device: torch.device, gen: torch.Generator, tokens: int,
                query_lens: list[int], context: int) -> Prepare:
    """Sets up one verifier forward of ``query_lens`` tokens per request over ``context`` cached tokens."""
    def prepare() -> Callable[[], object]:
        cache = model.new_cache(len(query_lens), context + max(query_lens))
        cache.lengths[:] = context  # values of the cached keys do not matter for timing
        batch = cache.batch(list(range(len(query_lens))), query_lens)
        ids = torch.randint(0, model.s.vocab_size, (tokens,), generator=gen, device=device)
        return lambda: forward(ids, batch, cache)
    return prepare


def draft_call(drafter: Drafter, context: int, device: torch.device, gen: torch.Generator,
               num_requests: int, gamma: int) -> Prepare:
    """Sets up one drafter step (one committed token, then ``propose``) of R requests over ``context`` tokens with
    its own cache."""
    def prepare() -> Callable[[], object]:
        drafter.new_cache(num_requests, context + 1)
        cache, last_feature = drafter.cache, drafter.last_feature  # this point's own cache
        assert cache is not None
        cache.lengths[:] = context - 1 if context > 0 else 0
        slots = torch.arange(num_requests)
        features = torch.randn(num_requests, drafter.fc.in_features, generator=gen,
                               device=device).to(drafter.fc.weight)
        anchor = torch.randint(0, drafter.s.vocab_size, (num_requests,), generator=gen, device=device)
        start = cache.lengths.clone()

        def one_step() -> None:
            drafter.cache, drafter.last_feature = cache, last_feature
            cache.lengths.copy_(start)
            drafter.extend_context(slots, features, [1] * num_requests)
            drafter.propose(anchor, slots, gamma, gen)
        return one_step
    return prepare


def kv_slots_that_fit(cfg: ProfileConfig, model: Verifier, device: torch.device, context: int) -> int | None:
    """How many requests' KV caches at ``context`` fit the budget (None: no budget, e.g. on CPU)."""
    budget = cfg.kv_budget_bytes
    if budget is None and device.type == "cuda":
        budget = 0.6 * torch.cuda.mem_get_info(device)[0]
    if budget is None:
        return None
    tokens = context + max(cfg.query_tokens, max(cfg.draft_tokens)) + 1
    return int(budget // (tokens * model.s.kv_bytes_per_token / 2 * model.embed.weight.element_size()))


def _fit_requests(cfg: ProfileConfig, max_slots: int | None) -> tuple[ProfileConfig, int | None]:
    """Drop request counts whose KV cache at the largest context exceeds the memory budget."""
    if max_slots is None or cfg.num_requests[-1] <= max_slots:
        return cfg, None
    fits = tuple(r for r in cfg.num_requests if r <= max_slots)
    if not fits:
        raise SystemExit(f"not even one request's KV cache at context {max(cfg.context_tokens)} fits the memory "
                         f"budget; lower --context-tokens or raise --kv-budget-gb")
    return dataclasses.replace(cfg, num_requests=fits), cfg.num_requests[-1]


def split_tokens(tokens: int, per_request: int) -> list[int]:
    """B tokens as ceil(B / q) requests of q tokens, the last one holding the remainder."""
    full, rest = divmod(tokens, per_request)
    return [per_request] * full + ([rest] if rest else [])


def count_points(cfg: ProfileConfig) -> int:
    return (len(cfg.batch_tokens) * len(cfg.context_tokens) + 2 * len(cfg.num_requests)
            + 2 * len(padded_requests(cfg)) + len(cfg.drafters) * len(cfg.num_requests) * len(cfg.draft_tokens)
            + 2 + 3 * cfg.host_overhead)


def padded_requests(cfg: ProfileConfig) -> list[int]:
    """The R of the padding probe: every profiled R >= 2 (one request cannot be padded)."""
    return [r for r in cfg.num_requests if r >= 2] if cfg.query_tokens > 1 else []


def padding_cost(query_tokens: int, short_s: dict[int, float], probes: dict[int, tuple[float, float]]) -> float:
    """Seconds per padded query slot from the padding probe (see ``padded_slot_definition``); 0 without one.

    ``short_s[R]``: R requests of 1 token; ``probes[R]``: (one request of ``query_tokens`` + R-1 of 1, R requests
    of ``query_tokens``) seconds. A variable-length attention kernel gives ~0 (noise can make it negative: kept
    at 0).
    """
    q, slots, excess = query_tokens, [], []
    for r, (mixed_s, long_s) in probes.items():
        batch = q + r - 1
        flat_s = short_s[r] + (long_s - short_s[r]) * (batch - r) / (q * r - r)  # linear in B, same R
        slots.append((r - 1) * (q - 1))
        excess.append(mixed_s - flat_s)
    if not slots:
        return 0.0
    slope = sum(x * y for x, y in zip(slots, excess, strict=True)) / sum(x * x for x in slots)
    return max(0.0, slope)


def served_models(cfg: ProfileConfig, gen: torch.Generator) -> tuple[Verifier, Callable[[str], Drafter]]:
    """The verifier and a drafter factory of ``cfg``: random weights of the preset, or the trained checkpoints."""
    device, dtype = torch.device(cfg.device), DTYPES[cfg.dtype]
    if cfg.checkpoints is not None:
        from calibration import checkpoints

        target = checkpoints.load_target(Path(cfg.checkpoints)).to(device=device, dtype=dtype)
        return target, lambda kind: checkpoints.load_drafter(kind, target, Path(cfg.checkpoints)).to(device, dtype)
    model = build_verifier(cfg.preset, gen, device, dtype)
    return model, lambda kind: build_drafter(kind, model, gen, max_depth=max(cfg.draft_tokens))


@torch.inference_mode()
def measure(cfg: ProfileConfig, on_point: Callable[[str], None] = lambda _: None,
            on_total: Callable[[int], None] = lambda _: None,
            models: tuple[Verifier, Callable[[str], Drafter]] | None = None) -> dict[str, Any]:
    """Run every timing of ``cfg`` and return the profile dictionary (simulator format).

    ``on_total`` hears the number of points once the grids are final, ``on_point`` each point as it starts.
    ``models`` (a verifier and a drafter factory) times those models instead of :func:`served_models`.
    """
    device = torch.device(cfg.device)
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    model, drafter_for = models if models is not None else served_models(cfg, gen)
    forward = torch.compile(model, dynamic=False) if cfg.compile else model
    ctx_lo, ctx_hi = min(cfg.context_tokens), max(cfg.context_tokens)
    cfg, capped_from = _fit_requests(cfg, kv_slots_that_fit(cfg, model, device, ctx_hi))
    on_total(count_points(cfg))

    points: list[tuple[str, Prepare]] = []
    verify_keys: list[tuple[int, int]] = []  # (context, B) of each verify point
    for context in cfg.context_tokens:
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
    drafters = {kind: drafter_for(kind) for kind in cfg.drafters}
    context = max(cfg.context_tokens)
    for kind, drafter in drafters.items():
        for r in cfg.num_requests:
            for g in cfg.draft_tokens:
                points.append((f"draft {kind} R={r} gamma={g}", draft_call(drafter, context, device, gen, r, g)))
    times = iter(time_points(points, cfg, device, on_point))

    curves: dict[str, dict[str, list]] = {str(c): {"batch_tokens": [], "steps_per_s": []} for c in cfg.context_tokens}
    for context, b in verify_keys:
        curves[str(context)]["batch_tokens"].append(b)
        curves[str(context)]["steps_per_s"].append(1.0 / next(times))
    if curves[str(ctx_lo)]["batch_tokens"] != list(cfg.batch_tokens):
        raise SystemExit(f"the verify grid does not fit in memory at context {ctx_lo}; lower --max-batch-tokens")
    short_s = []  # R x 1 token at ctx_hi, for the padding fit
    per_request = []
    for _ in cfg.num_requests:
        short_s.append(next(times))
        per_request.append(max(0.0, short_s[-1] - next(times)))  # hi - lo
    padded_slot_s = padding_cost(cfg.query_tokens, dict(zip(cfg.num_requests, short_s, strict=True)),
                                 {r: (next(times), next(times)) for r in padded_requests(cfg)})
    draft: dict[str, Any] = {}
    for kind in drafters:
        rows = [[next(times) for _ in cfg.draft_tokens] for _ in cfg.num_requests]
        draft[kind] = {"num_requests": list(cfg.num_requests), "draft_tokens": list(cfg.draft_tokens),
                       "latency_s": rows}
    del drafters

    n1, n2 = cfg.prefill_tokens
    on_point(f"prefill {n1} tokens")
    t1 = median_s(verify_call(model, forward, device, gen, n1, [n1], 0)(), device, cfg.warmup, cfg.repeats)
    on_point(f"prefill {n2} tokens")
    t2 = median_s(verify_call(model, forward, device, gen, n2, [n2], 0)(), device, cfg.warmup, cfg.repeats)
    tokens_per_s = (n2 - n1) / (t2 - t1) if t2 > t1 else n2 / t2  # noise guard: fall back to the mean rate
    fixed_s = max(0.0, t1 - n1 / tokens_per_s)

    assumed = Assumptions()
    profile = {
        "format": "specsched-hardware-profile",
        "version": 1,
        "metadata": {
            "source": "measured",
            "device": device_name(device),
            "model": model.s.name,
            "created": datetime.date.today().isoformat(),
            "tool": TOOL,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "dtype": cfg.dtype,
            "preset": cfg.preset if cfg.checkpoints is None else None,
            "checkpoints": cfg.checkpoints,
            "model_shape": asdict(model.s),
            "feature_layers": list(model.feature_layers),
            "config": asdict(cfg),
            "timing": (f"median of {cfg.repeats} runs after {cfg.warmup} warm-up runs, device synchronised"
                       + (", interleaved round-robin over the grid; " if cfg.interleave else "; ")
                       + "host-side index building excluded; "
                       + ("random weights" if cfg.checkpoints is None else f"weights of {cfg.checkpoints}")),
            "verify_layout": f"B tokens as ceil(B/{cfg.query_tokens}) requests; verify table at context {ctx_lo}",
            "verify_curves": curves,  # context length -> {batch_tokens, steps_per_s}
            "per_request_definition": f"t(R x 1 token at context {ctx_hi}) - t(R x 1 token at context {ctx_lo})",
            "padded_slot_definition": (f"least-squares slope over R of t(one request of {cfg.query_tokens} tokens "
                                       f"+ R-1 of 1) minus the linear interpolation in B between R x 1 and "
                                       f"R x {cfg.query_tokens} tokens, per padded slot (R-1) x "
                                       f"{cfg.query_tokens - 1}, context {ctx_hi}"),
            "scheduler_source": "assumed (calibration.roofline.Assumptions), not measured",
            "cpu_threads": torch.get_num_threads(),
            "num_requests_capped": (None if capped_from is None else
                                    f"R grid cut from {capped_from} to {cfg.num_requests[-1]}: the KV cache of more "
                                    f"requests at context {ctx_hi} does not fit the memory budget"),
        },
        "gpus_per_replica": 1,
        "verify": {**curves[str(ctx_lo)], "padded_slot_s": padded_slot_s},
        "per_request": {"num_requests": list(cfg.num_requests), "step_s": per_request},
        "draft": draft,
        "prefill": {"fixed_s": fixed_s, "tokens_per_s": tokens_per_s},
        "scheduler": {"fixed_s": assumed.scheduler_fixed_s, "per_candidate_s": assumed.scheduler_per_candidate_s},
    }
    if cfg.host_overhead:
        profile = _with_host_costs(profile, cfg, model, drafter_for, on_point)
    return profile


def _with_host_costs(profile: dict[str, Any], cfg: ProfileConfig, model: Verifier,
                     drafter_for: Callable[[str], Drafter], on_point: Callable[[str], None]) -> dict[str, Any]:
    """The serving loop's scheduler, prefill and loop costs folded into a new profile (calibration.loop_costs)."""
    from calibration.loop_costs import with_loop_costs

    if not cfg.drafters:
        raise SystemExit("--host-overhead runs the serving loop, which needs a drafter: pass --drafters")
    kind = cfg.drafters[0]
    gamma = max(cfg.draft_tokens)
    probe = tuple(r for r in cfg.num_requests if r <= 8) or cfg.num_requests[:1]
    return with_loop_costs(profile, model, drafter_for(kind), gamma, probe, cfg.prefill_tokens, seed=cfg.seed,
                           warmup=cfg.warmup, repeats=cfg.repeats, on_point=on_point)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    threads = torch.get_num_threads()
    return f"cpu ({platform.processor() or platform.machine()}, {threads} thread{'s' if threads > 1 else ''})"


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{what}: expected comma-separated integers, got {text!r}") from err
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"{what}: expected non-negative integers, got {text!r}")
    return values


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m calibration.profile_gpu",
        description="Time the included torch verifier and drafters and write a measured hardware profile "
                    "(simulator format, source: measured). Runs on CUDA if available, else CPU.")
    p.add_argument("--preset", default="tiny", choices=[m for m, s in MODEL_SHAPES.items() if not s.is_moe],
                   help="model shape preset (random weights; default: %(default)s)")
    p.add_argument("--drafters", default="dspark,dflash",
                   help=f"comma-separated drafter kinds to time, from {','.join(DRAFT_KINDS)}; '' for none "
                        "(default: %(default)s)")
    p.add_argument("--out", required=True, type=Path, help="output profile JSON path")
    p.add_argument("--device", default="auto", help="auto (cuda if available, else cpu), cpu, cuda, cuda:N")
    p.add_argument("--dtype", default="auto", choices=["auto", *DTYPES],
                   help="auto = bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--quick", action="store_true",
                   help="small grids for tests: B up to 64, R in 1..16, gamma in {1,2,4,8}, 3 repeats, "
                        "contexts 0,64, prefill 32/128 tokens (overrides the grid options below)")
    p.add_argument("--grid", default="default", choices=["default", "full"],
                   help="B grid: default = 1..64 and every CUDA-graph size and size+1; full = every integer")
    p.add_argument("--max-batch-tokens", type=int, default=1024, help="largest B timed (default: %(default)s)")
    p.add_argument("--max-requests", type=int, default=1024,
                   help="largest R for per-request and draft tables, log-spaced from 1; must cover the "
                        "simulated concurrency (default: %(default)s)")
    p.add_argument("--draft-tokens", default=",".join(map(str, range(1, 17))),
                   help="comma-separated gammas for the draft tables (default: 1..16)")
    p.add_argument("--context-tokens", default="0,2048",
                   help="comma-separated context lengths C; the smallest gives the verify table, the largest "
                        "the per-request and draft context (default: %(default)s)")
    p.add_argument("--query-tokens", type=int, default=8,
                   help="tokens per request in the verify layout, 1 + gamma (default: %(default)s)")
    p.add_argument("--prefill-tokens", default="512,2048", help="two prompt sizes n1,n2 (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=3, help="warm-up runs per point (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=10, help="timed runs per point; the median is kept "
                                                            "(default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights and inputs")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the verifier (static shapes: one compilation per batch layout)")
    p.add_argument("--kv-budget-gb", type=float, default=None,
                   help="memory for KV caches; request counts that do not fit at the largest context are "
                        "dropped from the R grid (default: 60%% of free GPU memory; no limit on CPU)")
    p.add_argument("--cpu-threads", type=int, default=None,
                   help="torch CPU threads (default: torch's choice; 1 with --quick on CPU, which keeps "
                        "timings stable on shared machines where OpenMP threads get oversubscribed)")
    p.add_argument("--host-overhead", action="store_true",
                   help="also measure the scheduler (greedy decide) and the serving loop's host time per step "
                        "and fold them into the profile (for calibration.serving / calibration.validate)")
    p.add_argument("--interleave", action="store_true",
                   help="time the grid in round-robin passes (steadier medians on a shared machine; keeps every "
                        "point's buffers alive at once)")
    p.add_argument("--checkpoints", type=Path, default=None,
                   help="time the trained models in this directory (calibration.train) instead of --preset")
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    return p.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> ProfileConfig:
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    dtype = ("bfloat16" if device.startswith("cuda") else "float32") if args.dtype == "auto" else args.dtype
    drafters = tuple(k.strip() for k in args.drafters.split(",") if k.strip())
    unknown = sorted(set(drafters) - set(DRAFT_KINDS))
    if unknown:
        raise SystemExit(f"unknown drafter kind(s) {', '.join(unknown)}; choose from {', '.join(DRAFT_KINDS)}")
    if args.quick:
        batch, reqs, gammas = batch_grid(64, "quick"), (1, 2, 4, 8, 16), (1, 2, 4, 8)
        contexts, prefill, warmup, repeats = (0, 64), (32, 128), 1, 3
    else:
        batch = batch_grid(args.max_batch_tokens, args.grid)
        reqs = tuple(requests_grid(args.max_requests).tolist())
        gammas = _ints(args.draft_tokens, "--draft-tokens")
        contexts = _ints(args.context_tokens, "--context-tokens")
        prefill = _ints(args.prefill_tokens, "--prefill-tokens")
        warmup, repeats = args.warmup, args.repeats
    if len(prefill) != 2 or not 0 < prefill[0] < prefill[1]:
        raise SystemExit(f"--prefill-tokens needs two sizes 0 < n1 < n2, got {prefill}")
    if args.query_tokens < 1 or repeats < 1 or warmup < 0 or min(gammas) < 1:
        raise SystemExit("--query-tokens, --repeats and every gamma must be >= 1, --warmup >= 0")
    return ProfileConfig(args.preset, drafters, device, dtype, tuple(batch), tuple(int(r) for r in reqs),
                         tuple(sorted(set(gammas))), tuple(sorted(set(contexts))), args.query_tokens,
                         (prefill[0], prefill[1]), warmup, repeats, args.seed, args.compile,
                         None if args.kv_budget_gb is None else args.kv_budget_gb * 1e9, args.host_overhead,
                         args.interleave, None if args.checkpoints is None else str(args.checkpoints))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    cfg = config_from_args(args)
    threads = args.cpu_threads if args.cpu_threads is not None else (1 if args.quick and cfg.device == "cpu" else None)
    if threads is not None:
        torch.set_num_threads(threads)
    from tqdm import tqdm  # the CLI owns the progress bar

    desc = f"{cfg.preset} on {cfg.device}"
    with tqdm(total=count_points(cfg), disable=args.no_progress, unit="pt", desc=desc) as bar:
        def on_point(label: str) -> None:
            bar.set_postfix_str(label, refresh=False)
            bar.update(1)

        def on_total(total: int) -> None:
            bar.total = total
            bar.refresh()

        started = time.perf_counter()
        data = measure(cfg, on_point, on_total)
    data["metadata"]["profiling_wall_s"] = round(time.perf_counter() - started, 3)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    sps = data["verify"]["steps_per_s"]
    print(f"wrote {args.out} (measured on {data['metadata']['device']}, {cfg.dtype}): SPS {sps[0]:.1f} at B=1 .. "
          f"{sps[-1]:.1f} at B={cfg.batch_tokens[-1]}, {data['metadata']['profiling_wall_s']:.1f} s")
    return data


if __name__ == "__main__":
    main()
