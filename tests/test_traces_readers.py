"""Each reader on its shipped sample, checked against the raw file parsed independently (csv/json, no pandas)."""

from __future__ import annotations

import csv
import hashlib
import json
import math
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest

from traces import SAMPLES, load_trace, sample_path
from traces.formats import detect_format


def azure_raw(path: Path) -> tuple[list[float], list[int], list[int]]:
    """Seconds since the first row, prompt and output lengths, with the standard library only."""
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    seconds = []
    for row in rows:
        stamp = row["TIMESTAMP"]
        whole, fraction = stamp.split(".")
        base = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
        seconds.append(int(base) * 10**7 + int(fraction.ljust(7, "0")))  # in 100 ns ticks, exact
    first = seconds[0]
    return ([(s - first) / 1e7 for s in seconds], [int(r["ContextTokens"]) for r in rows],
            [int(r["GeneratedTokens"]) for r in rows])


def mooncake_raw(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("name", ["azure_code", "azure_conv"])
def test_azure_sample_matches_raw_file(name: str) -> None:
    seconds, prompt, output = azure_raw(sample_path(name))
    workload = load_trace(name).workload
    assert workload.num_requests == len(seconds)
    assert workload.arrival_at[0] == 0.0
    assert workload.arrival_at[-1] == pytest.approx(seconds[-1], abs=1e-9)
    np.testing.assert_allclose(workload.arrival_at, seconds, atol=1e-9)
    assert int(workload.prompt_tokens.sum()) == sum(prompt)
    assert int(workload.output_tokens.sum()) == sum(output)
    assert workload.session_id is None and workload.prefix_hash_ids is None


@pytest.mark.parametrize(
    ("name", "num_rows", "last_arrival_s"),
    [
        ("azure_code", 1482, 585.903294),  # first 600 s of the 2023 code trace
        ("azure_conv", 2867, 599.971336),  # first 600 s of the 2023 conversation trace
        ("mooncake_conversation", 918, 297.0),  # first 300 s: 100 batches about 3 s apart
        ("mooncake_synthetic", 1091, 298.716),  # first 300 s of Poisson arrivals
    ],
)
def test_sample_sizes_and_spans(name: str, num_rows: int, last_arrival_s: float) -> None:
    workload = load_trace(name).workload
    assert workload.num_requests == num_rows
    assert workload.arrival_at[-1] == pytest.approx(last_arrival_s, abs=1e-9)
    assert sample_path(name).stat().st_size < 300_000


def test_azure_samples_keep_the_source_quirks() -> None:
    for name in ("azure_code", "azure_conv"):
        data = sample_path(name).read_bytes()
        assert data.count(b"\r\n") == data.count(b"\n")  # CRLF everywhere
        assert not data.endswith(b"\n")  # no final newline, like the source file
        first_stamp = data.split(b"\r\n")[1].split(b",")[0]
        assert len(first_stamp.split(b".")[1]) == 7  # 7 fractional digits


@pytest.mark.parametrize("name", ["mooncake_conversation", "mooncake_synthetic"])
def test_mooncake_sample_matches_raw_file(name: str) -> None:
    records = mooncake_raw(sample_path(name))
    workload = load_trace(name).workload
    assert workload.num_requests == len(records)
    np.testing.assert_array_equal(workload.arrival_at, [(r["timestamp"] - records[0]["timestamp"]) / 1000
                                                        for r in records])
    assert int(workload.prompt_tokens.sum()) == sum(r["input_length"] for r in records)
    assert int(workload.output_tokens.sum()) == sum(r["output_length"] for r in records)
    assert workload.prefix_hash_ids == tuple(tuple(r["hash_ids"]) for r in records)
    blocks = [math.ceil(p / 512) for p in workload.prompt_tokens]  # 512-token prefix blocks
    assert [len(h) for h in workload.prefix_hash_ids] == blocks


def test_mooncake_conversation_keeps_batched_arrivals() -> None:
    workload = load_trace("mooncake_conversation").workload
    instants, counts = np.unique(workload.arrival_at, return_counts=True)
    assert instants.size == 100  # one batch every ~3 s
    assert counts.max() > 1 and counts.sum() == workload.num_requests


@pytest.mark.parametrize(
    ("name", "domain"),
    [("azure_code", "code"), ("azure_conv", "chat"), ("mooncake_conversation", "chat"), ("mooncake_synthetic", "chat")],
)
def test_default_domains(name: str, domain: str) -> None:
    assert set(load_trace(name).workload.domain.tolist()) == {domain}


@pytest.mark.parametrize("name", list(SAMPLES))
def test_sample_format_is_detected(name: str) -> None:
    assert detect_format(sample_path(name)) == SAMPLES[name].format


def test_keep_prefix_hash_ids_false_drops_them() -> None:
    assert load_trace("mooncake_synthetic", keep_prefix_hash_ids=False).workload.prefix_hash_ids is None


def test_samples_match_the_checksums_in_the_readme() -> None:
    """The shipped samples are the exact bytes the README documents (source, slice, sha256)."""
    readme = (Path(__file__).resolve().parents[1] / "traces" / "README.md").read_text()
    for name in SAMPLES:
        digest = hashlib.sha256(sample_path(name).read_bytes()).hexdigest()
        row = next(line for line in readme.splitlines() if line.startswith(f"| `{name}` |"))
        assert f"`{digest}`" in row, name
