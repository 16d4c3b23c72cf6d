"""BurstGPT and generic readers on fixtures written from their schemas; format detection; Azure labels."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from traces import TraceFormatError, ZeroOutputError, load_trace
from traces.azure import azure_label
from traces.formats import detect_format

BURSTGPT_V1 = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,0,1087,Conversation log
45,GPT-4,300,250,550,API log
118,ChatGPT,64,31,95,API log
"""

# v3 adds Session ID and Elapsed time; ids here are strings, as a hash-like id would be.
BURSTGPT_V3 = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type,Session ID,Elapsed time
0.5,ChatGPT,100,20,120,Conversation log,s-a,1.2
1.5,ChatGPT,200,30,230,Conversation log,s-b,2.0
2.0,GPT-4,150,0,150,API log,,0.1
4.5,ChatGPT,120,40,160,Conversation log,s-a,1.9
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_burstgpt_v1_failed_requests_raise_by_default(tmp_path: Path) -> None:
    path = write(tmp_path, "BurstGPT_1.csv", BURSTGPT_V1)
    with pytest.raises(ZeroOutputError, match=r"BurstGPT_1\.csv line 3, field 'Response tokens': 0 output"):
        load_trace(path)


def test_burstgpt_v1_drop_failed_requests(tmp_path: Path) -> None:
    result = load_trace(write(tmp_path, "BurstGPT_1.csv", BURSTGPT_V1), zero_output="drop")
    workload = result.workload
    np.testing.assert_array_equal(workload.arrival_at, [0.0, 40.0, 113.0])
    np.testing.assert_array_equal(workload.prompt_tokens, [472, 300, 64])
    np.testing.assert_array_equal(workload.output_tokens, [18, 250, 31])
    assert set(workload.domain.tolist()) == {"chat"}
    assert result.report.num_zero_output == 1 and result.report.zero_output == "drop"
    assert any("1 requests with 0 output tokens" in line for line in result.report.lines())


def test_burstgpt_v1_failed_requests_as_one_token(tmp_path: Path) -> None:
    result = load_trace(write(tmp_path, "BurstGPT_1.csv", BURSTGPT_V1), zero_output="one_token")
    np.testing.assert_array_equal(result.workload.output_tokens, [18, 1, 250, 31])
    np.testing.assert_array_equal(result.workload.arrival_at, [0.0, 40.0, 40.0, 113.0])  # ties kept
    assert result.report.num_zero_output == 1


def test_burstgpt_v3_sessions(tmp_path: Path) -> None:
    workload = load_trace(write(tmp_path, "BurstGPT_v3.csv", BURSTGPT_V3), zero_output="drop").workload
    np.testing.assert_array_equal(workload.arrival_at, [0.0, 1.0, 4.0])
    sessions = workload.session_id
    assert sessions is not None
    assert sessions[0] == sessions[2] != sessions[1]  # s-a, s-b, s-a
    assert sessions.min() >= 0


def test_burstgpt_v3_missing_session_is_unknown(tmp_path: Path) -> None:
    workload = load_trace(write(tmp_path, "BurstGPT_v3.csv", BURSTGPT_V3), zero_output="one_token").workload
    assert workload.session_id is not None and workload.session_id[2] == -1


GENERIC_CSV = """arrival_s,prompt_tokens,output_tokens,domain,session_id,note
10.0,100,20,math,7,ignored
10.5,200,30,code,7,ignored
12.25,300,40,coding,8,ignored
"""

GENERIC_JSONL = (
    '{"arrival_s": 1.0, "prompt_tokens": 10, "output_tokens": 5}\n'
    '{"arrival_s": 2.5, "prompt_tokens": 20, "output_tokens": 6, "session_id": 3}\n'
    '{"arrival_s": 4.0, "prompt_tokens": 30, "output_tokens": 7}\n'
)


def test_generic_csv_with_domains_and_sessions(tmp_path: Path) -> None:
    path = write(tmp_path, "mine.csv", GENERIC_CSV)
    with pytest.raises(ValueError, match=r"no domain for label\(s\) \['coding'\]"):
        load_trace(path)
    workload = load_trace(path, domain_map={"coding": "code"}).workload
    np.testing.assert_array_equal(workload.arrival_at, [0.0, 0.5, 2.25])
    assert workload.domain.tolist() == ["math", "code", "code"]
    assert workload.session_id is not None and workload.session_id.tolist() == [7, 7, 8]


def test_generic_jsonl_without_domain_is_chat(tmp_path: Path) -> None:
    workload = load_trace(write(tmp_path, "mine.jsonl", GENERIC_JSONL)).workload
    np.testing.assert_array_equal(workload.arrival_at, [0.0, 1.5, 3.0])
    np.testing.assert_array_equal(workload.prompt_tokens, [10, 20, 30])
    assert workload.domain.tolist() == ["chat"] * 3
    assert workload.session_id is not None and workload.session_id.tolist() == [-1, 3, -1]


@pytest.mark.parametrize(("name", "text"), [("mine.csv.gz", GENERIC_CSV), ("mine.jsonl.gz", GENERIC_JSONL)])
def test_gzipped_files(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_bytes(gzip.compress(text.encode()))
    assert load_trace(path, domain="chat").workload.num_requests == 3


@pytest.mark.parametrize(
    ("name", "text", "fmt"),
    [
        ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:17:03.9799600,10,2", "azure"),
        ("b.csv", BURSTGPT_V1, "burstgpt"),
        ("c.csv", GENERIC_CSV, "generic"),
        ("d.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [0]}\n', "mooncake"),
        ("e.jsonl", GENERIC_JSONL, "generic"),
    ],
)
def test_detect_format(tmp_path: Path, name: str, text: str, fmt: str) -> None:
    assert detect_format(write(tmp_path, name, text)) == fmt


def test_unknown_format_lists_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match=r"unknown CSV trace.*azure.*burstgpt.*generic"):
        load_trace(write(tmp_path, "x.csv", "when,size\n1,2\n"))
    with pytest.raises(TraceFormatError, match=r"missing column\(s\) \['GeneratedTokens'\] of the azure format"):
        load_trace(write(tmp_path, "y.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:17:03,1\n"), format="azure")


@pytest.mark.parametrize(
    ("file_name", "label"),
    [
        ("AzureLLMInferenceTrace_code.csv", "azure_code"),  # 2023 release
        ("AzureLLMInferenceTrace_conv_1week.csv", "azure_conv"),  # 2024 week-long release
        ("azure_llm_2023_code.csv", "azure_code"),
        ("my_trace.csv", "azure"),  # no hint: replay asks for a domain
    ],
)
def test_azure_label_from_file_name(file_name: str, label: str) -> None:
    assert azure_label(file_name) == label


def test_azure_file_without_domain_hint_needs_a_domain(tmp_path: Path) -> None:
    path = write(tmp_path, "my_trace.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                           "2024-05-10 00:00:00.003,10,2\n2024-05-10 00:00:01.5,11,3\n")
    with pytest.raises(ValueError, match=r"no domain for label\(s\) \['azure'\]"):
        load_trace(path)
    workload = load_trace(path, domain="code").workload
    np.testing.assert_allclose(workload.arrival_at, [0.0, 1.497])
