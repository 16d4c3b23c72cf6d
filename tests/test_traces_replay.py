"""Replay options: time window, request limit, rate scaling, output cap, domains, seeds, option checks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traces import ReplayOptions, TraceReplayWarning, load_trace, load_trace_workload
from traces.replay import replay
from traces.stats import interarrival_cv
from traces.table import TraceTable


def make_table(arrival_s: np.ndarray, *, output_tokens: np.ndarray | None = None,
               session_id: np.ndarray | None = None, label: str = "generic") -> TraceTable:
    n = arrival_s.shape[0]
    return TraceTable(
        file_name="fixture.csv", format="generic", arrival_s=arrival_s - arrival_s[0],
        prompt_tokens=np.full(n, 10, dtype=np.int64),
        output_tokens=np.full(n, 5, dtype=np.int64) if output_tokens is None else output_tokens,
        line=np.arange(2, n + 2), domain_label=np.full(n, label, dtype=object), num_rows=n, skipped_rows={},
        origin="0 s", output_field="output_tokens", session_id=session_id,
    )


@st.composite
def bursty_arrivals(draw: st.DrawFn) -> np.ndarray:
    """Sorted arrival times with ties and gaps over several orders of magnitude."""
    gaps = draw(st.lists(st.one_of(st.just(0.0), st.floats(1e-3, 1e3)), min_size=3, max_size=200))
    arrival_s = np.concatenate([[0.0], np.cumsum(gaps)])
    if arrival_s[-1] <= 0 or np.count_nonzero(np.diff(arrival_s)) < 2:
        return np.array([0.0, 1.0, 3.0])
    return arrival_s


@settings(max_examples=60, deadline=None)
@given(arrival_s=bursty_arrivals(), target_rate_per_s=st.floats(0.01, 1e4))
def test_rate_scaling_reaches_the_target_and_keeps_burstiness(arrival_s: np.ndarray, target_rate_per_s: float) -> None:
    table = make_table(arrival_s)
    workload = replay(table, ReplayOptions(target_rate_per_s=target_rate_per_s), source="fixture").workload
    scaled = workload.arrival_at
    assert scaled[0] == 0.0
    assert (scaled.shape[0] - 1) / scaled[-1] == pytest.approx(target_rate_per_s, rel=1e-9)
    assert interarrival_cv(scaled) == pytest.approx(interarrival_cv(arrival_s), rel=1e-9)
    np.testing.assert_array_equal(np.diff(scaled) == 0, np.diff(arrival_s) == 0)  # ties stay ties


def test_rate_scaling_on_a_batched_sample() -> None:
    recorded = load_trace("mooncake_conversation").workload
    result = load_trace("mooncake_conversation", target_rate_per_s=30.0)
    faster = result.workload
    assert faster.num_requests == recorded.num_requests
    assert (faster.num_requests - 1) / faster.arrival_at[-1] == pytest.approx(30.0)
    assert interarrival_cv(faster.arrival_at) == pytest.approx(interarrival_cv(recorded.arrival_at))
    assert np.unique(faster.arrival_at).size == np.unique(recorded.arrival_at).size == 100
    assert result.report.time_scale == pytest.approx(faster.arrival_at[-1] / recorded.arrival_at[-1])


def test_rate_scale_multiplies_the_rate() -> None:
    recorded = load_trace("azure_code").workload
    doubled = load_trace("azure_code", rate_scale=2.0).workload
    np.testing.assert_allclose(doubled.arrival_at, recorded.arrival_at / 2)


def test_time_window_keeps_requests_inside_and_restarts_the_clock() -> None:
    recorded = load_trace("azure_conv").workload.arrival_at
    result = load_trace("azure_conv", start_s=60.0, end_s=120.0)
    inside = recorded[(recorded >= 60.0) & (recorded < 120.0)]
    np.testing.assert_allclose(result.workload.arrival_at, inside - inside[0])
    assert result.report.num_outside_window == recorded.size - inside.size
    assert any("outside the time window" in line for line in result.report.lines())


def test_request_limit_keeps_the_first_requests() -> None:
    recorded = load_trace("mooncake_synthetic").workload
    result = load_trace("mooncake_synthetic", max_requests=100)
    np.testing.assert_array_equal(result.workload.arrival_at, recorded.arrival_at[:100])
    np.testing.assert_array_equal(result.workload.prompt_tokens, recorded.prompt_tokens[:100])
    assert result.workload.prefix_hash_ids == recorded.prefix_hash_ids[:100]
    assert result.report.num_over_limit == recorded.num_requests - 100


def test_window_then_limit() -> None:
    recorded = load_trace("azure_code").workload.arrival_at
    workload = load_trace("azure_code", start_s=100.0, max_requests=10).workload
    first = int(np.argmax(recorded >= 100.0))
    np.testing.assert_allclose(workload.arrival_at, recorded[first:first + 10] - recorded[first])


def test_empty_window_explains_itself() -> None:
    with pytest.raises(ValueError, match=r"no requests left to replay.*1482 outside the window"):
        load_trace("azure_code", start_s=10_000.0)


def test_output_cap_is_counted_and_warned() -> None:
    recorded = load_trace("azure_conv").workload.output_tokens
    result = load_trace("azure_conv", max_output_tokens=256)
    np.testing.assert_array_equal(result.workload.output_tokens, np.minimum(recorded, 256))
    assert result.report.num_output_capped == int((recorded > 256).sum()) > 0
    with pytest.warns(TraceReplayWarning, match=rf"capped {result.report.num_output_capped} outputs at 256"):
        load_trace_workload("azure_conv", max_output_tokens=256)


def test_domain_override_and_map() -> None:
    assert set(load_trace("azure_code", domain="math").workload.domain.tolist()) == {"math"}
    assert set(load_trace("azure_conv", domain_map={"azure_conv": "code"}).workload.domain.tolist()) == {"code"}


def test_domain_mix_is_seeded() -> None:
    mix = {"math": 0.2, "code": 0.3, "chat": 0.5}
    first = load_trace("azure_conv", domain_mix=mix, seed=7).workload.domain
    again = load_trace("azure_conv", domain_mix=mix, seed=7).workload.domain
    other = load_trace("azure_conv", domain_mix=mix, seed=8).workload.domain
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
    shares = {d: float(np.mean(first == d)) for d in mix}
    assert shares == pytest.approx(mix, abs=0.04)  # 2,867 draws


def test_domain_mix_keeps_one_domain_per_session() -> None:
    sessions = np.repeat(np.arange(50), 4)  # [200] four requests per session
    sessions[::10] = -1  # some unknown: drawn per request
    table = make_table(np.arange(200.0), session_id=sessions)
    domain = replay(table, ReplayOptions(domain_mix={"math": 1, "chat": 1}, seed=3), source="fixture").workload.domain
    for session in range(50):
        assert np.unique(domain[sessions == session]).size == 1
    assert set(domain.tolist()) == {"math", "chat"}


def test_unknown_sample_lists_the_valid_ones() -> None:
    with pytest.raises(FileNotFoundError, match="azure_code, azure_conv, mooncake_conversation, mooncake_synthetic"):
        load_trace("azure_cod")


def test_options_object_and_keywords_combine() -> None:
    options = ReplayOptions(max_requests=5, domain="math")
    workload = load_trace_workload("azure_code", options=options, max_requests=3)
    assert workload.num_requests == 3 and set(workload.domain.tolist()) == {"math"}
    assert workload.source == "azure_code"


def test_unknown_option_lists_the_valid_ones() -> None:
    with pytest.raises(TypeError, match=r"unknown replay option\(s\) \['max_reqests'\]; valid: start_s, end_s"):
        load_trace("azure_code", max_reqests=3)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"start_s": 5.0, "end_s": 5.0}, "start_s < end_s"),
        ({"max_requests": 0}, "max_requests must be >= 1"),
        ({"target_rate_per_s": 2.0, "rate_scale": 2.0}, "not both"),
        ({"rate_scale": -1.0}, "positive"),
        ({"domain": "poetry"}, r"unknown domain\(s\) \['poetry'\]"),
        ({"domain_map": {"azure_code": "poetry"}}, "unknown domain"),
        ({"domain_mix": {"math": 0.0}}, "positive sum"),
        ({"domain": "math", "domain_mix": {"math": 1.0}}, "not both"),
        ({"zero_output": "ignore"}, "zero_output must be"),
    ],
)
def test_bad_options_are_refused(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ReplayOptions(**fields)


def test_target_rate_needs_two_distinct_arrivals() -> None:
    table = make_table(np.array([0.0, 0.0]))
    with pytest.raises(ValueError, match="at least two requests at different times"):
        replay(table, ReplayOptions(target_rate_per_s=1.0), source="fixture")
