"""Reader for BurstGPT CSV traces (v1/v2 files, and v3 files with sessions).

Columns ``Timestamp`` (seconds from 0:00:00 on the trace's first day),
``Model`` (``ChatGPT`` / ``GPT-4``), ``Request tokens`` (prompt),
``Response tokens`` (output), ``Total tokens`` and ``Log Type``
(``Conversation log`` / ``API log``); v3 files add ``Session ID`` and
``Elapsed time``. Only the timestamp, the two lengths and the session id are
used; ``Total tokens`` is not checked against their sum.

**Failed requests.** BurstGPT logs a failed request as a row with
``Response tokens`` = 0 (the ``..._without_fails`` files leave them out). Such
rows are read as good rows with 0 output tokens; the replay option
``zero_output`` then decides, explicitly, whether they raise (the default),
are dropped, or are replayed with one output token - and the replay report
counts them. The domain label of every row is ``burstgpt``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from traces.fileio import read_csv_columns
from traces.rows import (
    RowChecker,
    check_order,
    parse_count_column,
    parse_number_column,
    parse_session_column,
)
from traces.table import TraceTable, good_rows_table

TIME, PROMPT, OUTPUT, SESSION = "Timestamp", "Request tokens", "Response tokens", "Session ID"
HEADER_MARKERS = (TIME, PROMPT, OUTPUT)


def read_burstgpt(path: Path, *, skip_bad_rows: bool = False) -> TraceTable:
    """Read a BurstGPT CSV; ``Session ID`` (v3) becomes the session id when present."""
    rows = read_csv_columns(path, [TIME, PROMPT, OUTPUT], [SESSION], format="burstgpt",
                            text_columns=frozenset({SESSION}), category_columns=frozenset({"Model", "Log Type"}))
    checker = RowChecker(path.name, rows.line, skip_bad_rows=skip_bad_rows)
    checker.flag(rows.wrong_width, "row", "wrong number of fields")
    frame = rows.frame
    time_s = parse_number_column(checker, frame[TIME], TIME)
    prompt = parse_count_column(checker, frame[PROMPT], PROMPT, min_value=1)
    output = parse_count_column(checker, frame[OUTPUT], OUTPUT, min_value=0)
    check_order(checker, time_s, TIME, frame[TIME])
    skipped = checker.finish()
    session = parse_session_column(frame[SESSION]) if SESSION in frame else None
    return good_rows_table(
        file_name=path.name,
        format="burstgpt",
        times=time_s,
        ticks_per_s=1.0,
        describe_time=lambda i: f"{frame[TIME].iloc[i]} s ({TIME})",
        prompt_tokens=prompt,
        output_tokens=output,
        line=rows.line,
        good=~checker.bad,
        domain_label=np.full(len(frame), "burstgpt", dtype=object),
        skipped_rows=skipped,
        output_field=OUTPUT,
        session_id=session,
    )
