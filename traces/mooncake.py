"""Reader for the Mooncake FAST'25 traces (JSON Lines: conversation, synthetic, tool-and-agent).

Each line is ``{"timestamp": ms, "input_length": tokens, "output_length":
tokens, "hash_ids": [int, ...]}``. ``timestamp`` counts milliseconds from the
start of the trace; many requests share one timestamp (the conversation trace
arrives in batches about every 3 s), and replay keeps such ties. ``hash_ids``
are the prompt's prefix blocks (512 tokens each in these files): requests with
equal leading ids share that prompt prefix. They become the workload's
``prefix_hash_ids``. The domain label of every row is ``mooncake``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from traces.fileio import read_jsonl
from traces.rows import RowChecker, TraceFormatError, check_order, parse_count_column, parse_number_column
from traces.table import TraceTable, good_rows_table

TIME, PROMPT, OUTPUT, HASHES = "timestamp", "input_length", "output_length", "hash_ids"


def read_mooncake(path: Path, *, skip_bad_rows: bool = False, keep_prefix_hash_ids: bool = True) -> TraceTable:
    """Read a Mooncake JSONL trace; ``hash_ids`` are checked and kept when any line has them."""
    rows = read_jsonl(path, [TIME, PROMPT, OUTPUT], [HASHES])
    absent = [k for k in (TIME, PROMPT, OUTPUT) if k not in rows.keys_seen]
    if absent and rows.keys_seen:
        raise TraceFormatError(f"{path.name}: not a mooncake trace: no line has key(s) {absent}; "
                               f"keys seen: {sorted(rows.keys_seen)}")
    checker = RowChecker(path.name, rows.line, skip_bad_rows=skip_bad_rows)
    checker.flag(rows.malformed, "line", "not a JSON object")
    frame = rows.frame
    time_ms = parse_number_column(checker, frame[TIME], TIME)
    prompt = parse_count_column(checker, frame[PROMPT], PROMPT, min_value=1)
    output = parse_count_column(checker, frame[OUTPUT], OUTPUT, min_value=0)
    hashes = None
    if HASHES in rows.keys_seen:
        hashes = _check_hash_ids(checker, rows.lists[HASHES], rows.malformed)
    check_order(checker, time_ms, TIME, frame[TIME])
    skipped = checker.finish()
    return good_rows_table(
        file_name=path.name,
        format="mooncake",
        times=time_ms,
        ticks_per_s=1e3,
        describe_time=lambda i: f"{frame[TIME].iloc[i]} ms ({TIME})",
        prompt_tokens=prompt,
        output_tokens=output,
        line=rows.line,
        good=~checker.bad,
        domain_label=np.full(len(frame), "mooncake", dtype=object),
        skipped_rows=skipped,
        output_field=OUTPUT,
        prefix_hash_ids=hashes if keep_prefix_hash_ids else None,
    )


def _check_hash_ids(checker: RowChecker, values: list[object], malformed: np.ndarray) -> tuple[tuple[int, ...], ...]:
    """Per row a tuple of ints (empty on bad rows); flags absent lists and lists of non-integers."""
    out: list[tuple[int, ...]] = []
    missing = np.zeros(len(values), dtype=bool)
    wrong = np.zeros(len(values), dtype=bool)
    for i, value in enumerate(values):
        if isinstance(value, tuple):  # already checked as list<int> by the fast reader
            out.append(value)
        elif isinstance(value, list) and all(type(x) is int for x in value):
            out.append(tuple(value))
        else:
            out.append(())
            missing[i] = value is None and not malformed[i]
            wrong[i] = value is not None
    checker.flag(missing, HASHES, "missing")
    checker.flag(wrong, HASHES, "not a list of integers", values)
    return tuple(out)
