"""Benchmark runs written in the formats the readers read: vLLM JSON, SGLang JSONL, plain CSV.

For tools that produce runs themselves (the real serving loop's benchmark mode,
the synthetic examples): each file says what ``vllm bench serve --save-result``
or ``sglang.bench_serving`` would have written for such a run, with the keys a
user adds by hand (``--metadata num_speculative_tokens=K spec_method=...``) and
``mean_decode_requests`` when the producer measured it. Round trip:
``read_results`` of a written file gives back the same runs.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from calibration.fitting.readers import CSV_COLUMNS, OPTIONAL_MS
from calibration.fitting.runs import BenchmarkRun, ResultsError


def _totals(run: BenchmarkRun) -> dict[str, Any]:
    if run.num_completed is None:
        raise ResultsError(f"{run.where}: num_completed is needed to write totals")
    return {"completed": run.num_completed,
            "total_input_tokens": round(run.mean_prompt_tokens * run.num_completed),
            "total_output_tokens": round(run.mean_output_tokens * run.num_completed)}


def _common(run: BenchmarkRun) -> dict[str, Any]:
    out: dict[str, Any] = {
        "duration": run.duration_s, **_totals(run), "request_throughput": run.requests_per_s,
        "output_throughput": run.output_tokens_per_s, "mean_tpot_ms": run.mean_tpot_ms,
        **{field: getattr(run, field) for field in OPTIONAL_MS},
        "max_concurrency": None if run.concurrency is None else (
            int(run.concurrency) if float(run.concurrency).is_integer() else run.concurrency),
        "request_rate": "inf" if run.request_rate_per_s is None else run.request_rate_per_s,
    }
    if run.mean_decode_requests is not None:
        out["mean_decode_requests"] = run.mean_decode_requests
    return {k: v for k, v in out.items() if v is not None}  # the tools leave out what they did not measure


def vllm_record(run: BenchmarkRun) -> dict[str, Any]:
    """What ``vllm bench serve --save-result --metadata num_speculative_tokens=K spec_method=M`` writes."""
    out = {"backend": "specsched", "model_id": run.label, **_common(run)}
    if run.speculative:
        out.update({"num_speculative_tokens": str(run.num_speculative_tokens), "spec_method": run.spec_method,
                    "spec_decode_acceptance_length": run.acceptance_length})
    return out


def sglang_record(run: BenchmarkRun) -> dict[str, Any]:
    """One line of ``sglang.bench_serving --output-file``, with ``num_speculative_tokens`` added."""
    out = {"backend": "specsched", **_common(run), "accept_length": run.acceptance_length}
    if run.speculative:
        out.update({"num_speculative_tokens": run.num_speculative_tokens, "spec_method": run.spec_method})
    return out


def csv_text(runs: list[BenchmarkRun]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(CSV_COLUMNS), lineterminator="\n")
    writer.writeheader()
    for run in runs:
        row = {"spec_method": run.spec_method, "num_speculative_tokens": run.num_speculative_tokens,
               "mean_input_tokens": run.mean_prompt_tokens, "mean_output_tokens": run.mean_output_tokens,
               "output_throughput": run.output_tokens_per_s, "mean_tpot_ms": run.mean_tpot_ms,
               "concurrency": run.concurrency, "request_rate": run.request_rate_per_s,
               "request_throughput": run.requests_per_s,
               **{field: getattr(run, field) for field in OPTIONAL_MS},
               "acceptance_length": run.acceptance_length if run.speculative else None,
               "mean_decode_requests": run.mean_decode_requests, "label": run.label}
        writer.writerow({k: "" if v is None else v for k, v in row.items()})
    return buffer.getvalue()


def write_vllm(run: BenchmarkRun, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(vllm_record(run), indent=2) + "\n")
    return path


def write_sglang(runs: list[BenchmarkRun], path: str | Path) -> Path:
    path = Path(path)
    path.write_text("".join(json.dumps(sglang_record(r)) + "\n" for r in runs))
    return path


def write_csv(runs: list[BenchmarkRun], path: str | Path) -> Path:
    path = Path(path)
    path.write_text(csv_text(runs))
    return path
