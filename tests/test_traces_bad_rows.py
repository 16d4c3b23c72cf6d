"""Bad rows fail naming file, line and field; with skip_bad_rows they are left out and counted by reason."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from traces import TraceReplayWarning, TraceRowError, load_trace, load_trace_workload

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
GOOD_MOONCAKE = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}\n'


def azure_file(*rows: str) -> str:
    return AZURE_HEADER + "\r\n".join(rows)  # CRLF, no final newline, like the published files


def azure_row(second: int, prompt: str = "10", output: str = "5") -> str:
    return f"2023-11-16 18:17:{second:02d}.1234567,{prompt},{output}"


CASES = [
    # (file name, content, line, field, reason)
    ("code.csv", azure_file(azure_row(1), azure_row(2, prompt="-3")), 3, "ContextTokens", "negative"),
    ("code.csv", azure_file(azure_row(1, output=""), azure_row(2)), 2, "GeneratedTokens", "missing"),
    ("code.csv", azure_file(azure_row(1), azure_row(2, output="2.5")), 3, "GeneratedTokens", "not a whole number"),
    ("code.csv", azure_file(azure_row(1), azure_row(2, prompt="ten")), 3, "ContextTokens", "not a number"),
    ("code.csv", azure_file(azure_row(1), azure_row(2, prompt="0")), 3, "ContextTokens", "less than 1"),
    ("code.csv", azure_file(azure_row(1), "2023-11-31 25:00:00.1,10,5"), 3, "TIMESTAMP", "unparsable date-time"),
    ("code.csv", azure_file(azure_row(5), azure_row(6), azure_row(4)), 4, "TIMESTAMP", "earlier than a previous row"),
    ("code.csv", azure_file(azure_row(1), azure_row(2) + ",99"), 3, "row", "wrong number of fields"),
    ("code.csv", AZURE_HEADER + azure_row(1) + "\r\n\r\n" + azure_row(2), 3, "TIMESTAMP", "missing"),  # blank line
    ("t.jsonl", GOOD_MOONCAKE + '{"timestamp": 1, "input_length": 6\n', 2, "line", "not a JSON object"),
    ("t.jsonl", GOOD_MOONCAKE + GOOD_MOONCAKE.replace('"output_length": 5, ', ""), 2, "output_length", "missing"),
    ("t.jsonl", GOOD_MOONCAKE + GOOD_MOONCAKE.replace("[0, 1]", '"ab"'), 2, "hash_ids", "not a list of integers"),
    ("t.jsonl", GOOD_MOONCAKE.replace(": 0,", ": 9,") + GOOD_MOONCAKE, 2, "timestamp", "earlier than a previous row"),
    ("t.jsonl", GOOD_MOONCAKE + "\n\n" + GOOD_MOONCAKE.replace(": 600", ": -1"), 4, "input_length", "negative"),
    ("b.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
              "1,ChatGPT,5,abc,5,API log\n2,GPT-4,5,6,11,API log\n", 2, "Response tokens", "not a number"),
    ("g.csv", "arrival_s,prompt_tokens,output_tokens,domain\n0,5,5,chat\n1,5,5,\n", 3, "domain", "missing"),
]


@pytest.mark.parametrize(("file_name", "content", "line", "field", "reason"), CASES)
def test_bad_row_names_file_line_and_field(tmp_path: Path, file_name: str, content: str, line: int, field: str,
                                           reason: str) -> None:
    path = tmp_path / file_name
    path.write_text(content, newline="")
    with pytest.raises(TraceRowError) as caught:
        load_trace(path)
    err = caught.value
    assert (err.file_name, err.line, err.field, err.reason) == (file_name, line, field, reason)
    assert f"{file_name} line {line}, field {field!r}: {reason}" in str(err)
    assert "skip_bad_rows=True" in str(err)


@pytest.mark.parametrize(("file_name", "content", "line", "field", "reason"), CASES)
def test_skip_mode_counts_the_bad_row(tmp_path: Path, file_name: str, content: str, line: int, field: str,
                                      reason: str) -> None:
    path = tmp_path / file_name
    path.write_text(content, newline="")
    result = load_trace(path, skip_bad_rows=True)
    assert result.report.skipped_rows == {f"{field}: {reason}": 1}
    assert result.workload.num_requests == result.report.num_rows - 1


def test_the_earliest_bad_row_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "code.csv"
    path.write_text(azure_file(azure_row(1), azure_row(2, output="-1"), azure_row(3), azure_row(4, prompt="")))
    with pytest.raises(TraceRowError, match=r"code\.csv line 3, field 'GeneratedTokens': negative.*2 bad row"):
        load_trace(path)


def test_skip_mode_counts_by_reason_and_keeps_good_rows(tmp_path: Path) -> None:
    path = tmp_path / "code.csv"
    path.write_text(azure_file(
        azure_row(1),
        azure_row(2, prompt="-1", output=""),  # two problems, counted once under the first column's
        azure_row(3, output="x"),
        azure_row(4),
        azure_row(0),  # earlier than line 5
        "not a date,1,1",
        azure_row(7),
    ))
    result = load_trace(path, skip_bad_rows=True)
    assert result.report.skipped_rows == {
        "ContextTokens: negative": 1,
        "GeneratedTokens: not a number": 1,
        "TIMESTAMP: earlier than a previous row": 1,
        "TIMESTAMP: unparsable date-time": 1,
    }
    assert result.report.num_rows == 7 and result.report.num_skipped == 4
    np.testing.assert_allclose(result.workload.arrival_at, [0.0, 3.0, 6.0])
    assert "skipped 4 bad rows" in result.report.lines()[1]


def test_load_trace_workload_warns_with_the_counts(tmp_path: Path) -> None:
    path = tmp_path / "code.csv"
    path.write_text(azure_file(azure_row(1), azure_row(2, prompt="-1"), azure_row(3)))
    with pytest.warns(TraceReplayWarning, match=r"skipped 1 bad rows \(ContextTokens: negative: 1\)"):
        workload = load_trace_workload(path, skip_bad_rows=True)
    assert workload.num_requests == 2


def test_clean_trace_loads_without_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_trace_workload("azure_code").num_requests == 1482
