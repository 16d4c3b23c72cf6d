"""Analytic roofline profiles (``source: analytic``): the roofline's tables over the grids, as a profile file.

    python -m calibration.roofline --model qwen3-8b --gpu h200 --out simulator/profiles/h200_qwen3-8b_analytic.json

The verify table covers :func:`~calibration.profiling.roofline.verify_grid`, the
per-request and draft tables :func:`~calibration.profiling.roofline.requests_grid` and
gamma = 1..``max_draft_tokens``; every constant the numbers rest on goes into the metadata.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
from pathlib import Path
from typing import Any

import numpy as np

from calibration.models.shapes import DRAFT_KINDS, MODEL_SHAPES, DrafterSpec, default_drafters, get_shape
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
    GPUS,
    Assumptions,
    Roofline,
    cuda_graph_sizes,
    gpus_per_replica,
    requests_grid,
    verify_grid,
)

TOOL = "specsched 0.1.0 calibration.roofline"  # the command's name (python -m calibration.roofline)
NOTE = ("Analytic roofline estimate, not a measurement: max(compute, memory) + overheads, "
        "CUDA-graph and GEMM-tile padding. Every constant is listed below.")


def build_document(model: str, gpu: str, assume: Assumptions | None = None,
                   drafters: dict[str, DrafterSpec] | None = None,
                   today: datetime.date | None = None) -> ProfileDocument:
    """The analytic profile of a preset model on a preset GPU."""
    if gpu not in GPUS:
        raise ValueError(f"unknown GPU {gpu!r}; presets: {', '.join(GPUS)}")
    assume = assume or Assumptions()
    shape, spec = get_shape(model), GPUS[gpu]
    drafters = drafters if drafters is not None else default_drafters(shape)
    num_gpus = gpus_per_replica(shape, spec, assume)
    roof = Roofline(shape, spec, assume, num_gpus)

    batch = verify_grid(assume)
    reqs = requests_grid(assume.max_requests)
    gammas = np.arange(1, assume.max_draft_tokens + 1)
    fixed_s, tokens_per_s = roof.prefill()
    metadata = ProfileMetadata(
        source="analytic", device=f"{spec.name} x{num_gpus}" if num_gpus > 1 else spec.name, model=model,
        created=(today or datetime.date.today()).isoformat(), tool=TOOL, details={
            "note": NOTE,
            "gpu": dataclasses.asdict(spec),
            "assumptions": dataclasses.asdict(assume),
            "model_shape": dataclasses.asdict(shape),
            "total_params": shape.total_params,
            "active_params": shape.active_params,
            "drafters": {k: dataclasses.asdict(d) for k, d in drafters.items()},
            "cuda_graph_sizes": cuda_graph_sizes(assume.max_graph_tokens).tolist(),
        })
    draft = {kind: DraftTable(tuple(reqs.tolist()), tuple(gammas.tolist()),
                              tuple(tuple(draft_latency_s(roof, spec_d, int(r), int(g)) for g in gammas)
                                    for r in reqs))
             for kind, spec_d in drafters.items()}
    return ProfileDocument(
        metadata=metadata,
        gpus_per_replica=num_gpus,
        verify=VerifyTable(tuple(batch.tolist()), tuple((1.0 / roof.verify_step_s(batch)).tolist())),
        per_request=PerRequestTable(tuple(reqs.tolist()), tuple(roof.per_request_s(reqs).tolist())),
        draft=draft,
        prefill=PrefillCost(fixed_s, tokens_per_s),
        scheduler=SchedulerCost(assume.scheduler_fixed_s, assume.scheduler_per_candidate_s),
    )


def build_profile(model: str, gpu: str, assume: Assumptions | None = None,
                  drafters: dict[str, DrafterSpec] | None = None,
                  today: datetime.date | None = None) -> dict[str, Any]:
    """The profile dictionary (simulator format, ``source: analytic``) for a preset model on a preset GPU."""
    return build_document(model, gpu, assume, drafters, today).to_dict()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m calibration.roofline",
        description="Write an analytic roofline hardware profile (source: analytic) in the simulator's format.")
    parser.add_argument("--model", required=True, choices=[m for m in MODEL_SHAPES if m != "tiny"],
                        help="model shape preset")
    parser.add_argument("--gpu", required=True, choices=list(GPUS), help="GPU preset (datasheet peaks)")
    parser.add_argument("--out", required=True, type=Path, help="output JSON path")
    parser.add_argument("--drafters", default=",".join(DRAFT_KINDS),
                        help=f"comma-separated drafter kinds to tabulate (default: {','.join(DRAFT_KINDS)})")
    defaults = Assumptions()
    parser.add_argument("--context-tokens", type=int, default=defaults.context_tokens,
                        help="reference context length for attention FLOPs and KV reads (default: %(default)s)")
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
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    kinds = [k.strip() for k in args.drafters.split(",") if k.strip()]
    assume = dataclasses.replace(
        Assumptions(), context_tokens=args.context_tokens, compute_efficiency=args.compute_efficiency,
        memory_efficiency=args.memory_efficiency, step_overhead_s=args.step_overhead_ms / 1e3,
        max_batch_tokens=args.max_batch_tokens, max_requests=args.max_requests)
    all_drafters = default_drafters(get_shape(args.model))
    data = build_profile(args.model, args.gpu, assume, {k: all_drafters[k] for k in kinds})
    write_profile(data, args.out)
    sps = data["verify"]["steps_per_s"]
    print(f"wrote {args.out}: {data['metadata']['device']}, {args.model}, SPS {sps[0]:.1f} at B=1 .. "
          f"{sps[-1]:.2f} at B={data['verify']['batch_tokens'][-1]} (analytic)")
