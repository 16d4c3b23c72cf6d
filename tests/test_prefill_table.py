"""A measured prefill table (``prefill.table``, profile version 2): read, interpolated, checked at start, priced."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from policies import make_policy
from simulator import EngineLimits, simulate
from simulator.checks import SpecError, check_spec
from simulator.costs import PrefillTableBlock, ProfileError, Version2Blocks, load_profile, profile_from_dict
from tests.cost_factories import closed_spec

# Convex in the prompt, like a real prefill: a fixed part, a linear part and a quadratic (attention) part.
PROMPTS = (1, 256, 1024, 4096)


def convex_s(n: np.ndarray | float) -> np.ndarray:
    n = np.asarray(n, dtype=np.float64)
    return 2e-3 + n * 1e-5 + n * n * 5e-9


@pytest.fixture(scope="module")
def tabled(default_profile):
    block = PrefillTableBlock(PROMPTS, tuple(float(v) for v in convex_s(np.array(PROMPTS))))
    return profile_from_dict(Version2Blocks(prefill_table=block).apply(default_profile.raw, "tabled.json"),
                             "tabled.json")


def test_the_table_replaces_the_line_and_interpolates_linearly(default_profile, tabled):
    assert default_profile.prefill_table is None and tabled.prefill_table is not None
    np.testing.assert_allclose(tabled.prefill_s(np.array(PROMPTS)), convex_s(np.array(PROMPTS)))
    low, high = convex_s(1024.0), convex_s(4096.0)
    assert float(tabled.prefill_s(2560)) == pytest.approx(low + (high - low) * (2560 - 1024) / (4096 - 1024))
    # The line of the same file is unchanged and still read (version 1 fields keep their meaning).
    assert (tabled.prefill_fixed_s, tabled.prefill_tokens_per_s) == (default_profile.prefill_fixed_s,
                                                                     default_profile.prefill_tokens_per_s)
    assert float(default_profile.prefill_s(1000)) == pytest.approx(
        default_profile.prefill_fixed_s + 1000 / default_profile.prefill_tokens_per_s)
    with pytest.raises(ValueError, match=r"prefill\.table latency_s over prompt_tokens: 5000\.\.5000 is outside the "
                                         r"profiled range 1\.\.4096 \(profile tabled\.json\)"):
        tabled.prefill_s(5000)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["prefill"]["table"]["latency_s"].pop(), r"'prefill\.table\.latency_s' must be a list of 4"),
        (lambda d: d["prefill"]["table"]["prompt_tokens"].reverse(), r"'prefill\.table\.prompt_tokens' must be "
                                                                     r"strictly increasing"),
        (lambda d: d["prefill"]["table"].__setitem__("prompt_tokens", [0, 256, 1024, 4096]),
         r"'prefill\.table\.prompt_tokens\[0\]' must be > 0"),
        (lambda d: d["prefill"]["table"]["latency_s"].__setitem__(1, 0.0), r"'prefill\.table\.latency_s\[1\]' must "
                                                                           r"be > 0"),
        (lambda d: d["prefill"]["table"].__setitem__("seconds", [1.0]), r"unknown field 'prefill\.table\.seconds'"),
        (lambda d: d["prefill"].__setitem__("table", [1, 2]), r"field 'prefill\.table' must be an object"),
        (lambda d: d.__setitem__("version", 1), r"field 'prefill\.table' needs version 2"),
    ],
)
def test_malformed_tables_name_the_file_and_the_field(tabled, tmp_path, mutate, message):
    data = copy.deepcopy(tabled.raw)
    mutate(data)
    path = tmp_path / "bad_prefill.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match=message) as err:
        load_profile(path)
    assert str(path) in str(err.value)


def test_a_prefill_takes_what_the_table_says(tabled):
    result = simulate(closed_spec(make_policy("none"), tabled, 2, prompt_tokens=1500, output_tokens=50,
                                  duration_s=1.0, warmup_s=0.0))
    done = result.requests.dropna(subset=["first_token_at"])
    assert len(done) > 2
    took = (done["first_token_at"] - done["prefill_start_at"]).to_numpy()
    np.testing.assert_allclose(took, tabled.prefill_s(done["prompt_tokens"].to_numpy()), rtol=1e-12)


def test_prompts_outside_the_table_are_refused_at_start(tabled):
    long = closed_spec(make_policy("none"), tabled, 2, prompt_tokens=3000, output_tokens=50)  # prompts up to 6000
    with pytest.raises(SpecError, match=r"profile tabled\.json: prefill\.table\.prompt_tokens covers 1\.\.4096, but "
                                        r"traffic\.max_prompt_tokens give prefills of 1\.\.6000 tokens"):
        check_spec(long)
    short = closed_spec(make_policy("none"), tabled, 2, prompt_tokens=1500, output_tokens=400)
    check_spec(short)
    paged = closed_spec(make_policy("none"), tabled, 2, prompt_tokens=1500, output_tokens=800,
                        limits=EngineLimits(max_concurrency=2, kv_capacity_tokens=2**20, kv_mode="paged"))
    with pytest.raises(SpecError, match=r"\(\+ outputs: paged KV recomputes preempted requests\) give prefills of "
                                        r"1\.\.4599 tokens"):
        check_spec(paged)
    chunked = closed_spec(make_policy("none"), tabled, 2, prompt_tokens=3000, output_tokens=50, mode="chunked")
    check_spec(chunked)  # chunked mode prices chunks, not this table


def test_the_roofline_table_is_convex_and_interpolates_close_to_the_roofline():
    from calibration.profiling.analytic import BF16, _roofline
    from calibration.profiling.context_tables import prefill_axis, prefill_table_block
    from calibration.profiling.roofline import Assumptions

    roof = _roofline("qwen3-8b", "h200", Assumptions(), BF16)
    prompts = prefill_axis(262144)
    assert prompts[:4] == (1, 64, 128, 192) and prompts[-1] == 262144
    block = prefill_table_block(roof, prompts)
    table = profile_from_dict(Version2Blocks(prefill_table=block).apply(load_profile(
        "h200_qwen3-8b_v2_analytic").raw, "roof.json"), "roof.json")
    # A prefill is the chunk the simulator would price at context 0: dense part plus its attention over itself.
    n = np.array([128, 4096, 32768])
    chunk = roof.dense_step_s(n) + np.where(n > roof.assume.max_graph_tokens, roof.assume.eager_overhead_s, 0.0) \
        + roof.attention_s(np.zeros(3), n)
    np.testing.assert_allclose(table.prefill_s(n), chunk, rtol=1e-12)
    per_token = table.prefill_s(np.array([8192, 65536, 262144])) / np.array([8192, 65536, 262144])
    assert per_token[0] < per_token[1] < per_token[2] / 2  # quadratic attention dominates long prompts
    between = np.sqrt(np.array(prompts[1:-1]) * np.array(prompts[2:])).astype(np.int64)  # inside every cell
    long = between > 2048  # shorter prompts: within a GEMM tile's cost of the roofline's staircase
    np.testing.assert_allclose(table.prefill_s(between[long]), roof.prefill_s(between[long]), rtol=0.04)
    np.testing.assert_allclose(table.prefill_s(between[~long]), roof.prefill_s(between[~long]), rtol=0.12)
