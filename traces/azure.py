"""Reader for the Azure LLM inference traces (2023 code / conversation; 2024 week-long files).

Columns ``TIMESTAMP`` (date-time, ``YYYY-MM-DD HH:MM:SS.fffffff`` with 7
fractional digits in the 2023 files; no time zone is stated, so naive times
are read as UTC - only differences matter), ``ContextTokens`` (prompt) and
``GeneratedTokens`` (output). CRLF line endings and a missing final newline
are read as they are. Timestamps keep their full 100 ns resolution.

The files carry no per-row label; the workload type is in the file name
(``..._code...`` or ``..._conv...``), which sets the domain label
``azure_code`` or ``azure_conv``; a file named otherwise gets ``azure``.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from traces.fileio import read_csv_columns
from traces.rows import RowChecker, check_order, parse_count_column, parse_datetime_column
from traces.table import TraceTable, good_rows_table

TIME, PROMPT, OUTPUT = "TIMESTAMP", "ContextTokens", "GeneratedTokens"
COLUMNS = (TIME, PROMPT, OUTPUT)


def azure_label(file_name: str) -> str:
    """``azure_code``/``azure_conv`` from a file name such as ``AzureLLMInferenceTrace_conv_1week.csv``."""
    words = {w.lower() for w in re.split(r"[^A-Za-z]+", file_name)}
    if "code" in words:
        return "azure_code"
    if words & {"conv", "conversation"}:
        return "azure_conv"
    return "azure"


def read_azure(path: Path, *, skip_bad_rows: bool = False, label: str | None = None) -> TraceTable:
    """Read an Azure LLM inference trace CSV; ``label`` overrides the label taken from the file name."""
    rows = read_csv_columns(path, list(COLUMNS), [], format="azure", text_columns=frozenset({TIME}))
    checker = RowChecker(path.name, rows.line, skip_bad_rows=skip_bad_rows)
    checker.flag(rows.wrong_width, "row", "wrong number of fields")
    raw_time = rows.frame[TIME]
    time_ns = parse_datetime_column(checker, raw_time, TIME)
    prompt = parse_count_column(checker, rows.frame[PROMPT], PROMPT, min_value=1)
    output = parse_count_column(checker, rows.frame[OUTPUT], OUTPUT, min_value=0)
    check_order(checker, time_ns, TIME, raw_time)
    skipped = checker.finish()
    n = len(rows.frame)
    return good_rows_table(
        file_name=path.name,
        format="azure",
        times=time_ns,
        ticks_per_s=1e9,
        describe_time=lambda i: f"{raw_time.iloc[i]} ({TIME})",
        prompt_tokens=prompt,
        output_tokens=output,
        line=rows.line,
        good=~checker.bad,
        domain_label=np.full(n, label or azure_label(path.name), dtype=object),
        skipped_rows=skipped,
        output_field=OUTPUT,
    )
