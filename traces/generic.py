"""Reader for the project's generic trace format (CSV with a header, or JSON Lines).

Fields (CSV columns or JSON keys; other columns/keys are ignored):

========================  ========  ===================================================
``arrival_s``             required  arrival time in seconds (any origin; rows in arrival order)
``prompt_tokens``         required  prompt length, whole number >= 1
``output_tokens``         required  output length, whole number >= 0 (0 = failed request)
``domain``                optional  per-row label: ``math``, ``code``, ``chat`` or any label
                                    the replay option ``domain_map`` maps to one of them
``session_id``            optional  integer or string id of the conversation; empty = unknown
========================  ========  ===================================================

Without a ``domain`` field every row gets the label ``generic``. A file whose
first non-blank line starts with ``{`` is read as JSON Lines, otherwise as CSV.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from traces.fileio import first_line, read_csv_columns, read_jsonl
from traces.rows import (
    RowChecker,
    TraceFormatError,
    check_order,
    parse_count_column,
    parse_number_column,
    parse_session_column,
)
from traces.table import TraceTable, good_rows_table

TIME, PROMPT, OUTPUT, DOMAIN, SESSION = "arrival_s", "prompt_tokens", "output_tokens", "domain", "session_id"
REQUIRED = [TIME, PROMPT, OUTPUT]
OPTIONAL = [DOMAIN, SESSION]


def read_generic(path: Path, *, skip_bad_rows: bool = False) -> TraceTable:
    """Read a generic CSV or JSONL trace (see the module docstring for the fields)."""
    if first_line(path).startswith("{"):
        jsonl = read_jsonl(path, REQUIRED + OPTIONAL, [])
        absent = [k for k in REQUIRED if k not in jsonl.keys_seen]
        if absent and jsonl.keys_seen:
            raise TraceFormatError(f"{path.name}: not a generic trace: no line has key(s) {absent}; "
                                   f"keys seen: {sorted(jsonl.keys_seen)}")
        frame, line = jsonl.frame, jsonl.line
        present = [k for k in OPTIONAL if k in jsonl.keys_seen]
        checker = RowChecker(path.name, line, skip_bad_rows=skip_bad_rows)
        checker.flag(jsonl.malformed, "line", "not a JSON object")
    else:
        rows = read_csv_columns(path, REQUIRED, OPTIONAL, format="generic", text_columns=frozenset({DOMAIN, SESSION}))
        frame, line = rows.frame, rows.line
        present = [k for k in OPTIONAL if k in frame]
        checker = RowChecker(path.name, line, skip_bad_rows=skip_bad_rows)
        checker.flag(rows.wrong_width, "row", "wrong number of fields")
    time_s = parse_number_column(checker, frame[TIME], TIME)
    prompt = parse_count_column(checker, frame[PROMPT], PROMPT, min_value=1)
    output = parse_count_column(checker, frame[OUTPUT], OUTPUT, min_value=0)
    if DOMAIN in present:
        labels = frame[DOMAIN].astype("string").str.strip()
        checker.flag(labels.isna().to_numpy(dtype=bool) | labels.eq("").fillna(False).to_numpy(dtype=bool),
                     DOMAIN, "missing")
        domain_label = labels.fillna("").to_numpy(dtype=object)
    else:
        domain_label = np.full(len(frame), "generic", dtype=object)
    check_order(checker, time_s, TIME, frame[TIME])
    skipped = checker.finish()
    return good_rows_table(
        file_name=path.name,
        format="generic",
        times=time_s,
        ticks_per_s=1.0,
        describe_time=lambda i: f"{frame[TIME].iloc[i]} s ({TIME})",
        prompt_tokens=prompt,
        output_tokens=output,
        line=line,
        good=~checker.bad,
        domain_label=domain_label,
        skipped_rows=skipped,
        output_field=OUTPUT,
        session_id=parse_session_column(frame[SESSION]) if SESSION in present else None,
    )
