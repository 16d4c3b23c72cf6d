"""Analytic roofline profiles (``source: analytic``): the roofline's tables over the grids, as a profile file.

    python -m calibration.roofline --model qwen3-8b --gpu h200 --out simulator/profiles/h200_qwen3-8b_analytic.json
    python -m calibration.roofline --model qwen3-8b --gpu h200 --format-version 2 \
        --out simulator/profiles/h200_qwen3-8b_v2_analytic.json
    python -m calibration.roofline --model v4flash-like --gpu b200 --format-version 2 --weights-dtype fp8 \
        --kv-dtype fp8 --token-budget 8192 --out b200_v4flash-like_fp8_v2.json

Version 1 (the default, kept byte for byte for the shipped files): the verify table over
:func:`~calibration.profiling.roofline.verify_grid` with attention FLOPs at a reference
context and the eager overhead folded in, KV reads at that context per request. Version 2:
the dense part alone in CUDA-graph mode, the ``cuda_graphs`` cliff, attention over (context,
query tokens), prefill chunk attention, a prefill table over prompt tokens and context-aware drafter tables
(:mod:`calibration.profiling.context_tables`), no per-request table (the roofline's was only
KV reads), an optional token budget, BF16 or FP8 weights and KV. Every constant the
numbers rest on goes into the metadata (the GPU's with its datasheet).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
from pathlib import Path
from typing import Any

import numpy as np

from calibration.models.shapes import DRAFT_KINDS, MODEL_SHAPES, DrafterShape, default_drafters, get_shape
from calibration.profiling.context_tables import (
    ContextGrid,
    attention_block,
    chunk_attention_block,
    chunk_axis,
    cuda_graphs_block,
    draft_tables,
    prefill_axis,
    prefill_table_block,
    query_axis,
)
from calibration.profiling.drafter_cost import draft_latency_s
from calibration.profiling.profile_file import (
    DraftTable,
    PerRequestTable,
    PrefillCost,
    ProfileDocument,
    ProfileMetadata,
    SchedulerCost,
    VerifyTable,
    write_profile,
)
from calibration.profiling.roofline import (
    DTYPE_BYTES,
    GPUS,
    Assumptions,
    Precision,
    Roofline,
    cuda_graph_sizes,
    gpus_per_replica,
    requests_grid,
    verify_grid,
)
from simulator.costs import TokenBudgetBlock, Version2Blocks

TOOL = "specsched 0.1.0 calibration.roofline"  # the command's name (python -m calibration.roofline)
NOTE = ("Analytic roofline estimate, not a measurement: max(compute, memory) + overheads, "
        "CUDA-graph and GEMM-tile padding. Every constant is listed below.")
NOTE_V2 = ("Analytic roofline estimate, not a measurement (format version 2): the dense part max(GEMM compute, "
           "weight reads) + step overhead + collectives over batch tokens in CUDA-graph mode, the eager overhead "
           "above the largest captured graph, and per request attention max(QK/AV FLOPs, one read of its KV) over "
           "(context, query tokens). Every constant is listed below, the GPU's with its datasheet.")
DRAFTER_CONTEXT = ("No drafter here reads the target's KV cache; each reads its own KV of the context (one entry "
                   "per context token in each drafter layer, the target's per-layer KV shape and format): dspark and "
                   "dflash through KV injection of the target's context features (DSpark paper eq. 3) over the whole "
                   "context or their window_tokens, eagle3 and mtp in their one layer over the whole context. The "
                   "tables' context is the batch's mean context.")


BF16 = Precision()
DEFAULT_GRID = ContextGrid()


def _roofline(model: str, gpu: str, assume: Assumptions, precision: Precision) -> Roofline:
    if gpu not in GPUS:
        raise ValueError(f"unknown GPU {gpu!r}; presets: {', '.join(GPUS)}")
    shape, spec = get_shape(model), GPUS[gpu]
    return Roofline(shape, spec, assume, gpus_per_replica(shape, spec, assume, precision), precision)


def _common_details(roof: Roofline, drafters: dict[str, DrafterShape]) -> dict[str, Any]:
    shape = roof.shape
    return {"model_shape": dataclasses.asdict(shape), "total_params": shape.total_params,
            "active_params": shape.active_params,
            "drafters": {k: dataclasses.asdict(d) for k, d in drafters.items()},
            "cuda_graph_sizes": cuda_graph_sizes(roof.assume.max_graph_tokens).tolist()}


def build_document(model: str, gpu: str, assume: Assumptions | None = None,
                   drafters: dict[str, DrafterShape] | None = None,
                   today: datetime.date | None = None) -> ProfileDocument:
    """The version-1 analytic profile of a preset model on a preset GPU (BF16 weights and KV)."""
    assume = assume or Assumptions()
    roof = _roofline(model, gpu, assume, BF16)
    drafters = drafters if drafters is not None else default_drafters(roof.shape)
    batch = verify_grid(assume)
    reqs = requests_grid(assume.max_requests)
    gammas = np.arange(1, assume.max_draft_tokens + 1)
    fixed_s, tokens_per_s = roof.prefill()
    common = _common_details(roof, drafters)
    metadata = ProfileMetadata(
        source="analytic", device=_device(roof), model=model,
        created=(today or datetime.date.today()).isoformat(), tool=TOOL, details={
            "note": NOTE, "gpu": roof.gpu.v1_dict(), "assumptions": dataclasses.asdict(assume),
            **{k: common[k] for k in ("model_shape", "total_params", "active_params", "drafters",
                                      "cuda_graph_sizes")}})
    draft = {kind: DraftTable(tuple(reqs.tolist()), tuple(gammas.tolist()),
                              tuple(tuple(draft_latency_s(roof, spec_d, int(r), int(g)) for g in gammas)
                                    for r in reqs))
             for kind, spec_d in drafters.items()}
    return ProfileDocument(
        metadata=metadata,
        gpus_per_replica=roof.num_gpus,
        verify=VerifyTable(tuple(batch.tolist()), tuple((1.0 / roof.verify_step_s(batch)).tolist())),
        per_request=PerRequestTable(tuple(reqs.tolist()), tuple(roof.per_request_s(reqs).tolist())),
        draft=draft,
        prefill=PrefillCost(fixed_s, tokens_per_s),
        scheduler=SchedulerCost(assume.scheduler_fixed_s, assume.scheduler_per_candidate_s),
    )


def _device(roof: Roofline) -> str:
    return f"{roof.gpu.name} x{roof.num_gpus}" if roof.num_gpus > 1 else roof.gpu.name


def build_document_v2(model: str, gpu: str, assume: Assumptions | None = None, precision: Precision = BF16,
                      grid: ContextGrid = DEFAULT_GRID, token_budget: int | None = None,
                      drafters: dict[str, DrafterShape] | None = None,
                      today: datetime.date | None = None) -> ProfileDocument:
    """The version-2 analytic profile of a preset model on a preset GPU (see the module docstring)."""
    assume = assume or Assumptions()
    roof = _roofline(model, gpu, assume, precision)
    drafters = drafters if drafters is not None else default_drafters(roof.shape)
    batch = verify_grid(assume)
    reqs = tuple(requests_grid(assume.max_requests).tolist())
    gammas = tuple(range(1, assume.max_draft_tokens + 1))
    contexts, chunks = grid.contexts(), chunk_axis(assume.max_batch_tokens)
    fixed_s, tokens_per_s = roof.prefill()
    blocks = Version2Blocks(
        attention=attention_block(roof, contexts, query_axis(assume.max_draft_tokens)),
        cuda_graphs=cuda_graphs_block(roof),
        token_budget=None if token_budget is None else TokenBudgetBlock(token_budget),
        chunk_attention=chunk_attention_block(roof, contexts, chunks),
        prefill_table=prefill_table_block(roof, prefill_axis(grid.max_context_tokens)),
        draft=draft_tables(roof, drafters, contexts, reqs, gammas))
    metadata = ProfileMetadata(
        source="analytic", device=_device(roof), model=model,
        created=(today or datetime.date.today()).isoformat(), tool=TOOL,
        details=_details_v2(roof, drafters, grid, token_budget))
    return ProfileDocument(
        metadata=metadata, gpus_per_replica=roof.num_gpus,
        verify=VerifyTable(tuple(batch.tolist()), tuple((1.0 / roof.dense_step_s(batch)).tolist())),
        per_request=None, draft={}, prefill=PrefillCost(fixed_s, tokens_per_s),
        scheduler=SchedulerCost(assume.scheduler_fixed_s, assume.scheduler_per_candidate_s), version2=blocks)


def _details_v2(roof: Roofline, drafters: dict[str, DrafterShape], grid: ContextGrid,
                token_budget: int | None) -> dict[str, Any]:
    shape, p = roof.shape, roof.precision
    return {
        "note": NOTE_V2,
        "gpu": dataclasses.asdict(roof.gpu),
        "precision": {"weights": p.weights, "kv": p.kv, "weight_bytes_per_param": p.weight_bytes,
                      "kv_bytes_per_element": p.kv_bytes, "gemm_peak_flops_per_s": roof.gemm_flops_per_s,
                      "attention_peak_flops_per_s": roof.gpu.peak_flops_per_s},
        "assumptions": dataclasses.asdict(roof.assume),
        "context_grid": dataclasses.asdict(grid),
        "kv_bytes_per_token": shape.kv_bytes_per_token_at(p.kv_bytes),
        "kv_read_shards": roof.kv_read_shards,
        **_common_details(roof, drafters),
        "tables": {
            "verify": "dense part in CUDA-graph mode: GEMMs and LM head, step overhead, collectives; no attention",
            "attention": "max(4 L Hq d (q c + q (q+1)/2) / (G peak_bf16 eff_c), kv_bytes_per_token (c + q) / "
                         "(kv_read_shards bw eff_m)) per request, variable-length kernels (no key padding)",
            "chunk_attention": "the attention formula over (computed prompt tokens, chunk tokens)",
            "cuda_graphs": "assumptions.max_graph_tokens and assumptions.eager_overhead_s",
            "token_budget": ("none stated (a deployment setting: --token-budget, or cluster.max_num_batched_tokens)"
                             if token_budget is None else "stated with --token-budget"),
            "prefill": "fixed_s and tokens_per_s (version 1's line, not used in pricing when the table is "
                       "there): tokens at half the reference assumptions.context_tokens on average",
            "prefill_table": "one prefill of n prompt tokens: the verify formula (dense part) over n tokens, the "
                             "eager overhead above max_graph_tokens, and the attention formula at context 0 with n "
                             "query tokens (causal, quadratic in n)",
            "draft": DRAFTER_CONTEXT,
            "per_request": "none: the version-1 table held only KV reads, now in attention",
        },
    }


def build_profile(model: str, gpu: str, assume: Assumptions | None = None,
                  drafters: dict[str, DrafterShape] | None = None,
                  today: datetime.date | None = None) -> dict[str, Any]:
    """The version-1 profile dictionary (simulator format, ``source: analytic``) for a preset model on a preset GPU."""
    return build_document(model, gpu, assume, drafters, today).to_dict()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m calibration.roofline",
        description="Write an analytic roofline hardware profile (source: analytic) in the simulator's format.")
    parser.add_argument("--model", required=True, choices=[m for m in MODEL_SHAPES if m != "tiny"],
                        help="model shape preset")
    parser.add_argument("--gpu", required=True, choices=list(GPUS),
                        help="GPU preset (datasheet peaks; sources in the profile's metadata.gpu)")
    parser.add_argument("--out", required=True, type=Path, help="output JSON path")
    parser.add_argument("--format-version", type=int, choices=(1, 2), default=1,
                        help="1: SPS(B) + per-request KV reads at --context-tokens (default, the shipped files); "
                             "2: dense part + attention over (context, query tokens), CUDA-graph cliff, chunk "
                             "attention, context-aware drafters")
    parser.add_argument("--weights-dtype", choices=list(DTYPE_BYTES), default="bf16",
                        help="weight format (fp8: 1 byte/parameter, GEMMs at the FP8 peak; version 2 only)")
    parser.add_argument("--kv-dtype", choices=list(DTYPE_BYTES), default="bf16",
                        help="KV-cache format (fp8: 1 byte/element; version 2 only)")
    parser.add_argument("--token-budget", type=int, default=None,
                        help="state the engine's max_num_batched_tokens in the profile (version 2 only; "
                             "default: none, set it per run with cluster.max_num_batched_tokens)")
    parser.add_argument("--max-context-tokens", type=int, default=DEFAULT_GRID.max_context_tokens,
                        help="end of the context axes (version 2 only; default: %(default)s)")
    parser.add_argument("--drafters", default=",".join(DRAFT_KINDS),
                        help=f"comma-separated drafter kinds to tabulate (default: {','.join(DRAFT_KINDS)})")
    defaults = Assumptions()
    parser.add_argument("--context-tokens", type=int, default=defaults.context_tokens,
                        help="reference context: version 1's attention FLOPs and KV reads, both versions' prefill "
                             "pool (default: %(default)s)")
    parser.add_argument("--compute-efficiency", type=float, default=defaults.compute_efficiency,
                        help="fraction of peak FLOP/s reached (default: %(default)s)")
    parser.add_argument("--memory-efficiency", type=float, default=defaults.memory_efficiency,
                        help="fraction of HBM bandwidth reached (default: %(default)s)")
    parser.add_argument("--step-overhead-ms", type=float, default=defaults.step_overhead_s * 1e3,
                        help="per-step launch/framework overhead in ms (default: %(default)s)")
    parser.add_argument("--max-batch-tokens", type=int, default=defaults.max_batch_tokens,
                        help="largest batch in the verify table (default: %(default)s)")
    parser.add_argument("--max-requests", type=int, default=defaults.max_requests,
                        help="largest request count in the per-request and draft tables; must cover the "
                             "simulated max concurrency (default: %(default)s)")
    args = parser.parse_args(argv)
    unknown = sorted(set(k.strip() for k in args.drafters.split(",") if k.strip()) - set(DRAFT_KINDS))
    if unknown:
        parser.error(f"unknown drafter kind(s) {', '.join(unknown)}; choose from {', '.join(DRAFT_KINDS)}")
    if args.format_version == 1:
        v1_values = {"weights_dtype": "bf16", "kv_dtype": "bf16", "token_budget": None,
                     "max_context_tokens": DEFAULT_GRID.max_context_tokens}
        v2_only = [f"--{k.replace('_', '-')}" for k, value in v1_values.items() if getattr(args, k) != value]
        if v2_only:
            parser.error(f"{', '.join(v2_only)} need --format-version 2 (version 1 is bf16, without those tables)")
    if args.token_budget is not None and not 1 <= args.token_budget <= args.max_batch_tokens:
        parser.error(f"--token-budget must lie in 1..--max-batch-tokens ({args.max_batch_tokens}), "
                     f"got {args.token_budget}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    kinds = [k.strip() for k in args.drafters.split(",") if k.strip()]
    assume = dataclasses.replace(
        Assumptions(), context_tokens=args.context_tokens, compute_efficiency=args.compute_efficiency,
        memory_efficiency=args.memory_efficiency, step_overhead_s=args.step_overhead_ms / 1e3,
        max_batch_tokens=args.max_batch_tokens, max_requests=args.max_requests)
    all_drafters = default_drafters(get_shape(args.model))
    drafters = {k: all_drafters[k] for k in kinds}
    if args.format_version == 1:
        document = build_document(args.model, args.gpu, assume, drafters)
    else:
        try:
            document = build_document_v2(args.model, args.gpu, assume, Precision(args.weights_dtype, args.kv_dtype),
                                         ContextGrid(args.max_context_tokens), args.token_budget, drafters)
        except ValueError as err:
            raise SystemExit(f"calibration.roofline: {err}") from err
    data = document.to_dict()
    write_profile(data, args.out)
    sps = data["verify"]["steps_per_s"]
    print(f"wrote {args.out} (version {data['version']}): {data['metadata']['device']}, {args.model}, "
          f"SPS {sps[0]:.1f} at B=1 .. {sps[-1]:.2f} at B={data['verify']['batch_tokens'][-1]} (analytic)")
