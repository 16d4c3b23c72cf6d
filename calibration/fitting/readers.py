"""Readers of benchmark results: vLLM ``bench serve --save-result`` JSON, SGLang ``bench_serving`` JSONL, plain CSV.

Each returns :class:`~calibration.fitting.runs.BenchmarkRun` records; the fields
read and the ones required are listed in ``docs/calibration.md``. A required
field that is missing or not a number is a :class:`ResultsError` naming the
file, the row (1-based object, line or data row) and the field. Other keys of
the tools' files (per-request lists, server metadata) are not used.

* **vLLM** (``vllm bench serve --save-result``): one JSON object per file, or one
  per line with ``--append-result``. Speculation is read from
  ``spec_decode_acceptance_length`` and, for ``k``, from ``num_speculative_tokens``
  (pass it with ``--metadata num_speculative_tokens=K spec_method=mtp``) or else
  ``spec_decode_draft_tokens / spec_decode_num_drafts`` when that is a whole number.
* **SGLang** (``python -m sglang.bench_serving --output-file``): one JSON object per
  line. SGLang records ``accept_length`` but not the server's draft length, so a
  speculative line needs ``num_speculative_tokens`` added to it.
* **CSV**: one row per run with the columns of :data:`CSV_COLUMNS`.

With ``format="auto"`` a JSON file's flavour comes from its content where the two differ: a record with vLLM's
``spec_decode_*`` fields is vLLM's, one with SGLang's ``accept_length`` is SGLang's, whatever the extension (an
SGLang result saved as ``*.json``, vLLM's ``--append-result`` lines in ``*.jsonl``); a file without either reads
alike both ways and goes by its extension. Read as the other tool's, either field is an error, never ignored.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any, Literal

from calibration.fitting.runs import NO_SPECULATION, BenchmarkRun, ResultsError

ResultsFormat = Literal["auto", "vllm", "sglang", "csv"]
FORMATS = ("vllm", "sglang", "csv")
EXTENSIONS = {".json": "vllm", ".jsonl": "sglang", ".csv": "csv"}

# Statistics the tools write under the same names (ms); all optional.
OPTIONAL_MS = ("median_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms",
               "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms")
JSON_REQUIRED = ("completed", "total_input_tokens", "total_output_tokens", "output_throughput", "mean_tpot_ms")
CSV_REQUIRED = ("spec_method", "num_speculative_tokens", "mean_input_tokens", "mean_output_tokens",
                "output_throughput", "mean_tpot_ms")
CSV_OPTIONAL = ("concurrency", "request_rate", "request_throughput", *OPTIONAL_MS, "acceptance_length",
                "mean_decode_requests", "label")
CSV_COLUMNS = CSV_REQUIRED + CSV_OPTIONAL


def _number(value: Any, where: str, field: str, *, positive: bool = True) -> float:
    """A finite number (strings of numbers accepted: vLLM's --metadata values are strings)."""
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number):
        raise ResultsError(f"{where}: field '{field}' must be a number, got {value!r}")
    if positive and number <= 0:
        raise ResultsError(f"{where}: field '{field}' must be > 0, got {value!r}")
    return number


def _optional(record: dict[str, Any], field: str, where: str, *, positive: bool = True) -> float | None:
    value = record.get(field)
    if value is None or value == "":
        return None
    return _number(value, where, field, positive=positive)


def _required(record: dict[str, Any], field: str, where: str, required: tuple[str, ...]) -> Any:
    if field not in record or record[field] is None or record[field] == "":
        raise ResultsError(f"{where}: missing field '{field}' (required: {', '.join(required)})")
    return record[field]


def _whole(value: float, where: str, field: str) -> int:
    if value < 0 or abs(value - round(value)) > 1e-6:
        raise ResultsError(f"{where}: field '{field}' must be a whole number >= 0, got {value:g}")
    return int(round(value))


def _request_rate(record: dict[str, Any], where: str) -> float | None:
    rate = record.get("request_rate")
    if rate is None or rate == "" or (isinstance(rate, str) and rate.strip().lower() == "inf"):
        return None
    number = _number(rate, where, "request_rate", positive=False)
    return None if math.isinf(number) else number


def _statistics(record: dict[str, Any], where: str) -> dict[str, float | None]:
    return {field: _optional(record, field, where) for field in OPTIONAL_MS}


def _acceptance(value: float | None, where: str, field: str) -> float | None:
    if value is not None and value < 1:
        raise ResultsError(f"{where}: field '{field}' is {value:g}; expected tokens per step per request, "
                           "bonus included (>= 1)")
    return value


def _vllm_speculation(record: dict[str, Any], where: str) -> tuple[str, int, float | None]:
    """(method, k, acceptance length) of a vLLM result."""
    acceptance = _acceptance(_optional(record, "spec_decode_acceptance_length", where),
                             where, "spec_decode_acceptance_length")
    method = str(record.get("spec_method") or "")
    if record.get("num_speculative_tokens") not in (None, ""):
        k = _whole(_number(record["num_speculative_tokens"], where, "num_speculative_tokens", positive=False),
                   where, "num_speculative_tokens")
    elif acceptance is None:
        k = 0
    else:
        drafts = _optional(record, "spec_decode_num_drafts", where)
        tokens = _optional(record, "spec_decode_draft_tokens", where)
        per_draft = tokens / drafts if drafts and tokens else math.nan
        if not math.isfinite(per_draft) or abs(per_draft - round(per_draft)) > 0.01:
            raise ResultsError(f"{where}: missing field 'num_speculative_tokens' (speculative run, and "
                               f"spec_decode_draft_tokens / spec_decode_num_drafts = {per_draft:g} is not a whole "
                               "number); pass --metadata num_speculative_tokens=K to vllm bench serve")
        k = int(round(per_draft))
    if k > 0 and acceptance is None:
        raise ResultsError(f"{where}: missing field 'spec_decode_acceptance_length' (num_speculative_tokens={k}); "
                           "a speculative run needs its mean acceptance length")
    if k == 0:
        return NO_SPECULATION, 0, None
    return method or "spec", k, acceptance


def _sglang_speculation(record: dict[str, Any], where: str) -> tuple[str, int, float | None]:
    """(method, k, acceptance length) of an SGLang line."""
    acceptance = _acceptance(_optional(record, "accept_length", where), where, "accept_length")
    given = record.get("num_speculative_tokens")
    if given in (None, ""):
        if acceptance is not None:
            raise ResultsError(f"{where}: missing field 'num_speculative_tokens' (the line has accept_length="
                               f"{acceptance:g} but SGLang does not record the draft length; add it to the line)")
        return NO_SPECULATION, 0, None
    k = _whole(_number(given, where, "num_speculative_tokens", positive=False), where, "num_speculative_tokens")
    if k > 0 and acceptance is None:
        raise ResultsError(f"{where}: missing field 'accept_length' (num_speculative_tokens={k}); a speculative "
                           "run needs its mean acceptance length")
    return (NO_SPECULATION, 0, None) if k == 0 else (str(record.get("spec_method") or "spec"), k, acceptance)


VLLM_SPECULATION_PREFIX = "spec_decode_"  # vLLM's speculation fields
SGLANG_ACCEPTANCE = "accept_length"  # SGLang's


def _flavour(record: dict[str, Any]) -> tuple[str, str] | None:
    """("vllm" or "sglang", the field that says so) when the record holds one tool's speculation fields (not null)
    and not the other's, else None."""
    vllm = next((key for key, value in record.items()
                 if key.startswith(VLLM_SPECULATION_PREFIX) and value is not None), None)
    sglang = SGLANG_ACCEPTANCE if record.get(SGLANG_ACCEPTANCE) is not None else None
    if (vllm is None) == (sglang is None):
        return None
    return ("vllm", vllm) if vllm is not None else ("sglang", SGLANG_ACCEPTANCE)


def _from_json_record(record: Any, source: str, row: int, fmt: str) -> BenchmarkRun:
    where = f"{source} row {row}"
    if not isinstance(record, dict):
        raise ResultsError(f"{where}: expected a JSON object, got {type(record).__name__}")
    found = _flavour(record)
    if found is not None and found[0] != fmt:
        flavour, field = found
        raise ResultsError(f"{where}: field '{field}' is {'SGLang' if flavour == 'sglang' else 'vLLM'}'s, but the "
                           f"file is read as {fmt}; read it as {flavour} (--format {flavour}, or auto)")
    for field in JSON_REQUIRED:
        _required(record, field, where, JSON_REQUIRED)
    completed = _number(record["completed"], where, "completed")
    method, k, acceptance = (_vllm_speculation if fmt == "vllm" else _sglang_speculation)(record, where)
    return BenchmarkRun(
        source=source, row=row, spec_method=method, num_speculative_tokens=k,
        mean_prompt_tokens=_number(record["total_input_tokens"], where, "total_input_tokens") / completed,
        mean_output_tokens=_number(record["total_output_tokens"], where, "total_output_tokens") / completed,
        output_tokens_per_s=_number(record["output_throughput"], where, "output_throughput"),
        mean_tpot_ms=_number(record["mean_tpot_ms"], where, "mean_tpot_ms"),
        concurrency=_optional(record, "max_concurrency", where),
        request_rate_per_s=_request_rate(record, where),
        requests_per_s=_optional(record, "request_throughput", where),
        acceptance_length=acceptance,
        mean_decode_requests=_optional(record, "mean_decode_requests", where),
        label=str(record.get("model_id") or record.get("label") or ""),
        num_completed=int(completed), duration_s=_optional(record, "duration", where),
        **_statistics(record, where),
    )


def _json_objects(path: Path) -> list[Any]:
    """One JSON document, or one per non-empty line (vLLM --append-result, SGLang)."""
    text = path.read_text()
    try:
        return [json.loads(text)]
    except json.JSONDecodeError:
        pass
    objects = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            objects.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise ResultsError(f"{path} line {number}: not valid JSON ({err.msg})") from err
    return objects


def _read_json(path: str | Path, fmt: str) -> list[BenchmarkRun]:
    """Every record of a JSON file as ``fmt`` ("vllm", "sglang", or "auto": the records' own flavour, see the
    module docstring, else the extension's); the file is read once."""
    path = Path(path)
    objects = _json_objects(path)
    if fmt == "auto":
        found = {f[0] for obj in objects if isinstance(obj, dict) and (f := _flavour(obj)) is not None}
        if len(found) > 1:
            raise ResultsError(f"{path}: holds both vLLM ({VLLM_SPECULATION_PREFIX}*) and SGLang "
                               f"({SGLANG_ACCEPTANCE}) records; put each tool's results in a file of its own")
        fmt = found.pop() if found else EXTENSIONS[path.suffix.lower()]
    return [_from_json_record(obj, str(path), i, fmt) for i, obj in enumerate(objects, start=1)]


def read_vllm(path: str | Path) -> list[BenchmarkRun]:
    return _read_json(path, "vllm")


def read_sglang(path: str | Path) -> list[BenchmarkRun]:
    return _read_json(path, "sglang")


def _from_csv_row(record: dict[str, str], source: str, row: int) -> BenchmarkRun:
    where = f"{source} row {row}"
    for field in CSV_REQUIRED:
        _required(record, field, where, CSV_REQUIRED)
    k = _whole(_number(record["num_speculative_tokens"], where, "num_speculative_tokens", positive=False),
               where, "num_speculative_tokens")
    method = record["spec_method"].strip()
    if (k == 0) != (method == NO_SPECULATION):
        raise ResultsError(f"{where}: spec_method={method!r} with num_speculative_tokens={k}; write "
                           f"spec_method={NO_SPECULATION} exactly when num_speculative_tokens is 0")
    acceptance = _acceptance(_optional(record, "acceptance_length", where), where, "acceptance_length")
    if k > 0 and acceptance is None:
        raise ResultsError(f"{where}: missing field 'acceptance_length' ({method}, num_speculative_tokens={k}); "
                           "a speculative run needs its mean acceptance length")
    return BenchmarkRun(
        source=source, row=row, spec_method=method, num_speculative_tokens=k,
        mean_prompt_tokens=_number(record["mean_input_tokens"], where, "mean_input_tokens"),
        mean_output_tokens=_number(record["mean_output_tokens"], where, "mean_output_tokens"),
        output_tokens_per_s=_number(record["output_throughput"], where, "output_throughput"),
        mean_tpot_ms=_number(record["mean_tpot_ms"], where, "mean_tpot_ms"),
        concurrency=_optional(record, "concurrency", where),
        request_rate_per_s=_request_rate(record, where),
        requests_per_s=_optional(record, "request_throughput", where),
        acceptance_length=acceptance if k > 0 else None,
        mean_decode_requests=_optional(record, "mean_decode_requests", where),
        label=record.get("label") or "",
        **_statistics(record, where),
    )


def read_csv(path: str | Path) -> list[BenchmarkRun]:
    path = Path(path)
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        header = reader.fieldnames or []
        unknown = [c for c in header if c not in CSV_COLUMNS]
        if unknown:
            raise ResultsError(f"{path}: unknown column '{unknown[0]}'; columns are {', '.join(CSV_COLUMNS)}")
        missing = [c for c in CSV_REQUIRED if c not in header]
        if missing:
            raise ResultsError(f"{path}: missing column '{missing[0]}' (required: {', '.join(CSV_REQUIRED)})")
        if "concurrency" not in header and "request_rate" not in header:
            raise ResultsError(f"{path}: missing column 'concurrency' or 'request_rate' (one of them is required)")
        runs = [_from_csv_row(record, str(path), i) for i, record in enumerate(reader, start=1)]
    return runs


READERS = {"vllm": read_vllm, "sglang": read_sglang, "csv": read_csv}


def detect_format(path: Path) -> str:
    fmt = EXTENSIONS.get(path.suffix.lower())
    if fmt is None:
        raise ResultsError(f"{path}: cannot tell the format from the extension {path.suffix!r}; name it "
                           f"{', '.join(f'*{e} ({f})' for e, f in EXTENSIONS.items())} or pass --format")
    return fmt


def read_results(paths: list[str | Path], fmt: ResultsFormat = "auto") -> list[BenchmarkRun]:
    """Every run of every file, in file then row order."""
    if fmt != "auto" and fmt not in FORMATS:
        raise ResultsError(f"format must be auto or one of {', '.join(FORMATS)}, got {fmt!r}")
    runs: list[BenchmarkRun] = []
    for raw in paths:
        path = Path(raw)
        if not path.is_file():
            raise ResultsError(f"{path}: no such results file")
        if fmt == "auto":  # a JSON file's records say whose they are (module docstring)
            kind = detect_format(path)
            found = read_csv(path) if kind == "csv" else _read_json(path, "auto")
        else:
            found = READERS[fmt](path)
        if not found:
            raise ResultsError(f"{path}: no runs in the file")
        runs.extend(found)
    return runs
