"""Measure a hardware profile with the included torch models (``source: measured``): the command.

    python calibration/profile_gpu.py --preset tiny --drafters dspark,dflash --out PATH
    python -m calibration.profile_gpu --preset qwen3-8b --out h200_qwen3-8b_measured.json   # on a GPU
    python -m calibration.profile_gpu --preset tiny --format-version 2 --nice -15 --out tiny_v2.json

``--format-version 2`` measures the context axes as well (:mod:`calibration.profiling.measure_context`):
attention over (context, query tokens), prefill chunks over computed prompt tokens,
drafter latency over context, on a context grid by device (CPU: 0..4096 tokens; GPU:
0..32768) unless ``--context-tokens`` is given, and the prefill table over prompt tokens
(CPU: 1..4352, the long-context validation's reach; GPU: 1..32768; ``--prefill-prompts``).

What is timed, and how, is :mod:`calibration.profiling.measure`; the file is written by
:mod:`calibration.profiling.profile_file`. This module owns the options and the
progress bar.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from calibration.models.shapes import DRAFT_KINDS, MODEL_SHAPES
from calibration.profiling.measure import DTYPES, ProfileConfig, batch_grid, count_points, measure
from calibration.profiling.measure_context import (
    CPU_CONTEXTS,
    CPU_PREFILL_PROMPTS,
    GPU_CONTEXTS,
    GPU_PREFILL_PROMPTS,
    ContextAxes,
)
from calibration.profiling.profile_file import write_profile
from calibration.profiling.revision import commit_label
from calibration.profiling.roofline import requests_grid
from calibration.profiling.timing import scheduling_priority


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
                   help="small grids for tests: B up to 64, R in 1..16, gamma in {1,2,4,8}, 3 repeats (9 rounds per "
                        "difference pair: a difference is a small share of its forwards), "
                        "contexts 0,64 (version 2: 0,512,2048, queries 1,2,3,5,9, chunks 16,64 over 0,512), "
                        "prefill 32/128 tokens (overrides the grid options below)")
    p.add_argument("--grid", default="default", choices=["default", "full"],
                   help="B grid: default = 1..64 and every CUDA-graph size and size+1; full = every integer")
    p.add_argument("--max-batch-tokens", type=int, default=1024, help="largest B timed (default: %(default)s)")
    p.add_argument("--max-requests", type=int, default=1024,
                   help="largest R for per-request and draft tables, log-spaced from 1; must cover the "
                        "simulated concurrency (default: %(default)s)")
    p.add_argument("--requests", default=None,
                   help="comma-separated R of the per-request and draft tables, instead of --max-requests' "
                        "log-spaced grid")
    p.add_argument("--draft-tokens", default=",".join(map(str, range(1, 17))),
                   help="comma-separated gammas for the draft tables (default: 1..16)")
    _add_version2_options(p)
    p.add_argument("--nice", type=int, default=None,
                   help="scheduling priority while measuring, e.g. -15 on a shared machine (needs root)")
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
    p.add_argument("--code-revision", default=None,
                   help="the commit of the code that measures, recorded in metadata.code_revision (default: the "
                        "checkout's commit, with -dirty if tracked files changed; give it on a machine without the "
                        "git checkout)")
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    return p.parse_args(argv)


def _add_version2_options(p: argparse.ArgumentParser) -> None:
    """The format version and the grids of the version-2 tables."""
    p.add_argument("--format-version", type=int, choices=(1, 2), default=1,
                   help="1: SPS(B) at the smallest context + per-request KV reads (default); 2: the dense part at "
                        "context 0 + attention, chunk attention and drafter tables over the context grid")
    p.add_argument("--context-tokens", default="auto",
                   help="comma-separated context lengths C. Version 1: the smallest gives the verify table, the "
                        "largest the per-request and draft context (auto: 0,2048). Version 2: the context axis, "
                        f"starting at 0 (auto: {','.join(map(str, CPU_CONTEXTS))} on CPU, "
                        f"{','.join(map(str, GPU_CONTEXTS))} on CUDA)")
    p.add_argument("--attention-queries", default="auto",
                   help="version 2: query tokens per request of the attention table, starting at 1 "
                        "(auto: every one from 1 to 1 + the largest gamma)")
    p.add_argument("--chunk-tokens", default="auto",
                   help="version 2: prefill chunk sizes ('' for no chunk table; auto: 64,128,256,512,1024 up to "
                        "--max-batch-tokens)")
    p.add_argument("--chunk-contexts", default="auto",
                   help="version 2: computed prompt tokens before a chunk, starting at 0 (auto: the context axis)")
    p.add_argument("--prefill-prompts", default="auto",
                   help="version 2: prompt lengths of the prefill table, from 1 ('' for no table; auto: "
                        f"{','.join(map(str, CPU_PREFILL_PROMPTS))} on CPU, "
                        f"{','.join(map(str, GPU_PREFILL_PROMPTS))} on CUDA)")
    p.add_argument("--draft-contexts", default="auto",
                   help="version 2: the drafter tables' own context axis, starting at 0 (auto: the context axis); "
                        "a shorter one lets the R grid reach higher on a GPU, where every (R, C) cache must fit")
    p.add_argument("--probe-context", type=int, default=None,
                   help="context of the padding probe (and version 1's per-request pairs); default: the largest "
                        "context")
    p.add_argument("--cuda-graphs", type=int, default=None, metavar="N",
                   help="version 2 on CUDA: time the dense verify table as CUDA-graph replay up to N batch tokens "
                        "and eagerly above, and write the cuda_graphs block (the cliff at N)")
    p.add_argument("--attention-requests", type=int, default=4,
                   help="version 2: requests per attention probe (default: %(default)s)")


def config_from_args(args: argparse.Namespace) -> ProfileConfig:
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    dtype = ("bfloat16" if device.startswith("cuda") else "float32") if args.dtype == "auto" else args.dtype
    drafters = tuple(k.strip() for k in args.drafters.split(",") if k.strip())
    unknown = sorted(set(drafters) - set(DRAFT_KINDS))
    if unknown:
        raise SystemExit(f"unknown drafter kind(s) {', '.join(unknown)}; choose from {', '.join(DRAFT_KINDS)}")
    if args.quick:
        batch, reqs, gammas = batch_grid(64, "quick"), (1, 2, 4, 8, 16), (1, 2, 4, 8)
        contexts = (0, 512, 2048) if args.format_version == 2 else (0, 64)
        prefill, warmup, repeats = (32, 128), 1, 3
    else:
        batch = batch_grid(args.max_batch_tokens, args.grid)
        reqs = (_ints(args.requests, "--requests") if args.requests is not None
                else tuple(requests_grid(args.max_requests).tolist()))
        gammas = _ints(args.draft_tokens, "--draft-tokens")
        contexts = _default_contexts(args, device)
        prefill = _ints(args.prefill_tokens, "--prefill-tokens")
        warmup, repeats = args.warmup, args.repeats
    if len(prefill) != 2 or not 0 < prefill[0] < prefill[1]:
        raise SystemExit(f"--prefill-tokens needs two sizes 0 < n1 < n2, got {prefill}")
    if args.query_tokens < 1 or repeats < 1 or warmup < 0 or min(gammas) < 1:
        raise SystemExit("--query-tokens, --repeats and every gamma must be >= 1, --warmup >= 0")
    contexts = tuple(sorted(set(contexts)))
    if args.cuda_graphs is not None:
        if args.format_version != 2 or not device.startswith("cuda"):
            raise SystemExit(f"--cuda-graphs needs --format-version 2 on a CUDA device (got version "
                             f"{args.format_version} on {device})")
        if not 1 <= args.cuda_graphs < max(batch):
            raise SystemExit(f"--cuda-graphs {args.cuda_graphs}: must be in 1..{max(batch) - 1} (below the largest "
                             f"batch timed, --max-batch-tokens)")
        batch = sorted({*batch, args.cuda_graphs, args.cuda_graphs + 1})
    if min(reqs) < 1:
        raise SystemExit(f"--requests: every R must be >= 1, got {reqs}")
    if args.probe_context is not None and args.probe_context < 0:
        raise SystemExit(f"--probe-context: a context of >= 0 tokens, got {args.probe_context}")
    axes = None if args.format_version == 1 else _context_axes(args, contexts, max(gammas), max(batch), device)
    return ProfileConfig(args.preset, drafters, device, dtype, tuple(batch), tuple(int(r) for r in reqs),
                         tuple(sorted(set(gammas))), contexts, args.query_tokens,
                         (prefill[0], prefill[1]), warmup, repeats, args.seed, args.compile,
                         None if args.kv_budget_gb is None else args.kv_budget_gb * 1e9, args.host_overhead,
                         args.interleave, None if args.checkpoints is None else str(args.checkpoints),
                         format_version=args.format_version, context_axes=axes, probe_context=args.probe_context,
                         cuda_graph_tokens=args.cuda_graphs, difference_repeats=9 if args.quick else None)


def _default_contexts(args: argparse.Namespace, device: str) -> tuple[int, ...]:
    if args.context_tokens != "auto":
        return _ints(args.context_tokens, "--context-tokens")
    if args.format_version == 1:
        return (0, 2048)
    return GPU_CONTEXTS if device.startswith("cuda") else CPU_CONTEXTS


def _context_axes(args: argparse.Namespace, contexts: tuple[int, ...], max_gamma: int,
                  max_batch_tokens: int, device: str) -> ContextAxes:
    """The version-2 grids from the options (``auto``: see the help)."""
    def option(text: str, auto: tuple[int, ...], what: str) -> tuple[int, ...]:
        return tuple(sorted(set(auto if text == "auto" else _ints(text, what) if text.strip() else ())))
    if args.quick:
        queries, chunks, chunk_contexts = (1, 2, 3, 5, 9), (16, 64), (0, 512)
        prompts = option(args.prefill_prompts, (1, 512, 2048), "--prefill-prompts")
    else:
        prompts = option(args.prefill_prompts, GPU_PREFILL_PROMPTS if device.startswith("cuda")
                         else CPU_PREFILL_PROMPTS, "--prefill-prompts")
        queries = option(args.attention_queries, tuple(range(1, max_gamma + 2)), "--attention-queries")
        chunks = option(args.chunk_tokens, tuple(n for n in (64, 128, 256, 512, 1024) if n <= max_batch_tokens),
                        "--chunk-tokens")
        chunk_contexts = option(args.chunk_contexts, contexts, "--chunk-contexts")
    draft_contexts = option(args.draft_contexts, contexts, "--draft-contexts")
    if chunks and max(chunks) > max_batch_tokens:
        raise SystemExit(f"--chunk-tokens: a chunk is priced against the verify table, which ends at "
                         f"{max_batch_tokens} batch tokens; got {max(chunks)}")
    try:
        return ContextAxes(contexts, queries, chunks, chunk_contexts, args.attention_requests, prompts,
                           draft_contexts)
    except ValueError as err:
        raise SystemExit(f"profile_gpu: {err}") from err


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    cfg = config_from_args(args)
    threads = args.cpu_threads if args.cpu_threads is not None else (1 if args.quick and cfg.device == "cpu" else None)
    if threads is not None:
        torch.set_num_threads(threads)
    desc = f"{cfg.preset} on {cfg.device}"
    with tqdm(total=count_points(cfg), disable=args.no_progress, unit="pt", desc=desc) as bar:
        def on_point(label: str) -> None:
            bar.set_postfix_str(label, refresh=False)
            bar.update(1)

        def on_total(total: int) -> None:
            bar.total = total
            bar.refresh()

        started = time.perf_counter()
        with scheduling_priority(args.nice, lambda message: print(message, file=sys.stderr)):
            data = measure(cfg, on_point, on_total)
    data["metadata"]["profiling_wall_s"] = round(time.perf_counter() - started, 3)
    revision = args.code_revision if args.code_revision is not None else commit_label()
    if revision is not None:
        data["metadata"]["code_revision"] = revision
    write_profile(data, args.out)
    sps = data["verify"]["steps_per_s"]
    print(f"wrote {args.out} (measured on {data['metadata']['device']}, {cfg.dtype}): SPS {sps[0]:.1f} at B=1 .. "
          f"{sps[-1]:.1f} at B={cfg.batch_tokens[-1]}, {data['metadata']['profiling_wall_s']:.1f} s")
    return data


if __name__ == "__main__":
    main()
