"""The profiler's quick CPU runs write profiles the simulator loads (version 1, and version 2 with attention over
context); the comparison figure is written."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from calibration.profiling import timing
from calibration.profiling.compare import main as compare_main
from calibration.profiling.loop_costs import LoopCosts, probe_misfit
from calibration.profiling.measure import batch_grid, padding_cost, split_tokens
from calibration.profiling.revision import commit_label
from policies import make_policy
from simulator import ClusterSpec, DrafterSpec, EngineLimits, SimulationSpec, simulate
from simulator.costs import load_profile
from simulator.costs import profile_from_dict as load_profile_dict
from traces.synthetic import LengthSpec, TrafficSpec

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("profile") / "tiny_measured.json"
    subprocess.run([sys.executable, "calibration/profile_gpu.py", "--preset", "tiny", "--drafters", "dspark,dflash",
                    "--quick", "--no-progress", "--device", "cpu", "--out", str(out)],
                   cwd=REPO, check=True, capture_output=True, text=True, timeout=120)
    return out


@pytest.mark.slow  # a real torch profiling run on the CPU
def test_quick_profile_loads_and_says_measured(measured: Path) -> None:
    profile = load_profile(measured)
    meta = profile.metadata
    assert profile.source == "measured" and meta["model"] == "tiny" and meta["dtype"] == "float32"
    assert meta["device"].startswith("cpu") and meta["torch"] and meta["config"]["repeats"] == 3
    assert meta["python"] == platform.python_version() and meta["nvidia_driver"] is None  # no driver on a CPU run
    assert meta.get("code_revision") == commit_label()  # the checkout's own commit, without --code-revision
    assert set(profile.draft) == {"dspark", "dflash"}
    assert profile.max_batch_tokens == 64 and profile.verify_sps(1) > 0
    assert profile.per_request_s is not None and profile.draft_s("dspark", 16, 8) > 0
    assert profile.prefill_tokens_per_s > 0
    curves = meta["verify_curves"]
    assert set(curves) == {"0", "64"}  # one SPS curve per context length
    assert curves["0"]["steps_per_s"] == profile.raw["verify"]["steps_per_s"]
    assert profile.padded_slot_s >= 0 and "padded_slot_definition" in meta


def test_padding_cost_is_the_excess_over_the_flat_interpolation_per_padded_slot() -> None:
    # R x 1 token: 1 ms + 0.1 ms/request; R x 8 tokens: + 0.02 ms per extra token; padding: 5 us per slot.
    short_s = {r: 1e-3 + 1e-4 * r for r in (1, 2, 4)}
    probes = {}
    for r in (2, 4):
        long_s = short_s[r] + 2e-5 * 7 * r
        mixed_s = short_s[r] + 2e-5 * 7 + 5e-6 * (r - 1) * 7
        probes[r] = (mixed_s, long_s)
    assert padding_cost(8, short_s, probes) == pytest.approx(5e-6)
    faster = {r: (m - 1e-3, lo) for r, (m, lo) in probes.items()}
    assert padding_cost(8, short_s, faster) == 0.0  # faster than flat: no cost
    assert padding_cost(8, {1: 1e-3}, {}) == 0.0


@pytest.mark.slow  # a real torch profiling run on the CPU
def test_comparison_figure_is_written(measured: Path, tmp_path: Path) -> None:
    out = compare_main([str(measured), "h200_qwen3-8b_analytic", "--out", str(tmp_path / "cmp.png")])
    assert out.stat().st_size > 10_000
    assert json.loads(measured.read_text())["metadata"]["source"] == "measured"


def test_a_difference_is_timed_in_rounds_of_both_calls(monkeypatch) -> None:
    """The attention table's differences: both calls in every round, the order alternating, the median kept. On a
    fake clock whose speed halves for two rounds, both sides of a round run at the same speed, so the slow spell
    cannot be charged to one side of the difference."""
    clock, order = [0.0], []
    speeds = iter([1.0] * 2 + [2.0] * 4 + [1.0] * 6)  # warm-up, two slow rounds, three fast ones

    def call(name: str, cost_s: float):
        def run() -> None:
            order.append(name)
            clock[0] += cost_s * next(speeds)
        return lambda: run
    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    labels: list[str] = []
    diffs = timing.time_differences([("pair", call("base", 1.0), call("point", 1.5))], warmup=1, repeats=5,
                                    device=timing.torch.device("cpu"), on_point=labels.append)
    assert labels == ["pair"]
    assert order == ["base", "point"] + ["base", "point", "point", "base"] * 2 + ["base", "point"]
    assert diffs == [0.5]  # rounds: 1.0, 1.0, 0.5, 0.5, 0.5


def test_grids_and_layout() -> None:
    default = batch_grid(1024, "default")
    assert default[:64] == list(range(1, 65))
    assert {512, 513, 528, 529, 1024} <= set(default)  # CUDA-graph sizes and the point after each
    assert batch_grid(100, "full") == list(range(1, 101))
    assert split_tokens(19, 8) == [8, 8, 3]


@pytest.mark.slow  # ~4 s: a subprocess that imports torch
def test_help_documents_every_option() -> None:
    text = subprocess.run([sys.executable, "-m", "calibration.profile_gpu", "--help"], cwd=REPO, check=True,
                          capture_output=True, text=True).stdout
    for option in ("--preset", "--drafters", "--out", "--quick", "--context-tokens", "--repeats", "--compile",
                   "--format-version", "--attention-queries", "--chunk-tokens", "--nice"):
        assert option in text


@pytest.fixture(scope="module")
def measured_v2(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("profile") / "tiny_measured_v2.json"
    subprocess.run([sys.executable, "calibration/profile_gpu.py", "--preset", "tiny", "--drafters", "dspark",
                    "--quick", "--format-version", "2", "--nice", "-15", "--no-progress", "--device", "cpu",
                    "--out", str(out)], cwd=REPO, check=True, capture_output=True, text=True, timeout=180)
    return out


@pytest.mark.slow  # a real torch profiling run on the CPU
def test_quick_v2_profile_prices_context_and_loads_in_the_simulator(measured_v2: Path) -> None:
    profile = load_profile(measured_v2)
    meta = profile.metadata
    assert profile.version == 2 and profile.source == "measured"
    # what R one-token requests cost beyond the dense table's layout, one entry per profiled R, never negative
    assert profile.per_request_s is not None and (profile.per_request_s.y >= 0).all()
    assert meta["per_request_definition"].startswith("t(R x 1 token over one cached key)")
    assert profile.key_padding == "longest"  # the verifier pads every request's keys to the longest context
    assert profile.cuda_graphs is None and meta["cuda_graphs"].startswith("none: measured on cpu")
    assert profile.attention is not None and profile.attention.x.tolist() == [0, 512, 2048]
    assert profile.attention.y.tolist() == [1, 2, 3, 5, 9]  # 1 + gamma for the quick gammas 1, 2, 4, 8
    assert profile.chunk_attention is not None and profile.draft_uses_context("dspark")
    # the drafter's context build over each chunk, timed alone: a part of the chunk's whole
    assert profile.chunk_draft is not None and profile.chunk_draft.values.sum() > 0
    assert (profile.chunk_draft.values <= profile.chunk_attention.values).all()
    # Attention grows with context: the dense part is at context 0, so the table's first row is exactly 0; summed
    # over the query sizes (one cell is a few per cent of its forwards, so noise can swap two neighbours) each row
    # costs more than the one before; and four requests over 2048 cached tokens each take visibly longer than over
    # none.
    np.testing.assert_array_equal(profile.attention.values[0], 0.0)
    assert (np.diff(profile.attention.values.sum(axis=1)) > 0).all()
    four = np.full(4, 2048)
    assert profile.attention_s(four, 1) > 0.05 * profile.verify_s(4, 4)
    result = simulate(SimulationSpec(
        policy=make_policy("dspark"), profile=profile, drafter=DrafterSpec("dspark", 8),
        traffic=TrafficSpec(arrival="closed", num_users=4, max_prompt_tokens=1500, max_output_tokens=200,
                            lengths={d: LengthSpec(1000, 0.2, 100, 0.2) for d in ("chat", "code", "math")}),
        cluster=ClusterSpec(limits=EngineLimits(4, 10**6)), duration_s=0.3, warmup_s=0.0))
    assert result.summary["output_tokens_per_s"] > 0


@pytest.mark.slow  # a real torch profiling run on the CPU
def test_loop_costs_fold_into_a_v2_profile_and_keep_its_context_tables(measured_v2: Path) -> None:
    raw = json.loads(measured_v2.read_text())
    costs = LoopCosts(num_requests=(1, 16), draft_tokens=(1, 8), draft_factor=((2.0, 2.0), (2.0, 2.0)),
                      extra_per_request_s=(1e-4, 2e-4), extra_per_batch_token_s=0.0, prefill_factor=1.5,
                      host_fixed_s=0.0, host_per_request_s=0.0, host_per_verified_token_s=0.0, num_steps=0)
    folded = load_profile_dict(costs.fold(raw))
    before = load_profile(measured_v2)
    assert folded.version == 2 and folded.attention is not None and folded.chunk_attention is not None
    np.testing.assert_array_equal(folded.attention.values, before.attention.values)  # attention is not a loop cost
    assert folded.draft_s("dspark", 4, 4, 1000.0) == pytest.approx(2 * before.draft_s("dspark", 4, 4, 1000.0))
    assert folded.per_request_s is not None and folded.verify_s(1, 1) == pytest.approx(before.verify_s(1, 1) + 1e-4)
    assert folded.prefill_tokens_per_s == pytest.approx(before.prefill_tokens_per_s / 1.5)


def test_probe_misfit_is_each_probes_mean_residual_off_the_line_over_its_mean_cycle(default_profile) -> None:
    # two static probes and the variable-length one at R = 1 and 4; residuals off a line by known amounts
    rows = []
    for users in (1, 4):
        for static, draft_tokens, off_s in ((True, 1, 2e-4), (True, 7, -1e-4), (False, 7, 0.0)):
            for cycle_s in (0.010, 0.012):  # two steps each: mean cycle 11 ms
                line_s = 1e-3 * users
                rows.append(dict(users=users, draft_tokens=draft_tokens, static=static, cycle_s=cycle_s,
                                 line_s=line_s, residual_s=line_s + off_s + (cycle_s - 0.011)))
    misfit = probe_misfit(pd.DataFrame(rows), (1, 4))
    assert set(misfit) == {"mtp1", "mtp7", "varlen-probe"}
    np.testing.assert_allclose(misfit["mtp1"], [2e-4 / 0.011] * 2, rtol=1e-12)
    np.testing.assert_allclose(misfit["mtp7"], [-1e-4 / 0.011] * 2, rtol=1e-12)
    np.testing.assert_allclose(misfit["varlen-probe"], [0.0, 0.0], atol=1e-15)
    # it travels with the loop costs into the folded profile's metadata
    costs = LoopCosts(num_requests=(1, 4), draft_tokens=(1, 7), draft_factor=((1.0, 1.0), (1.0, 1.0)),
                      extra_per_request_s=(0.0, 0.0), extra_per_batch_token_s=0.0, prefill_factor=1.0,
                      host_fixed_s=0.0, host_per_request_s=0.0, host_per_verified_token_s=0.0, num_steps=12,
                      probe_misfit=misfit)
    assert costs.fold(default_profile.raw)["metadata"]["loop_costs"]["probe_misfit"] == misfit


def test_a_measurement_names_the_commit_it_ran_from(tmp_path) -> None:  # noqa: ANN001
    """calibration.profiling.revision.commit_label: the commit, -dirty with tracked changes, None outside git."""
    import shutil
    assert commit_label(tmp_path) is None  # not a checkout
    if shutil.which("git") is None:
        return  # no git at all: None is all it can say, checked above
    def git(*args: str) -> str:  # noqa: E306
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                              check=True, capture_output=True, text=True).stdout.strip()
    git("init", "-q")
    (tmp_path / "a.txt").write_text("1")
    git("add", "a.txt")
    git("commit", "-q", "-m", "one")
    head = git("rev-parse", "HEAD")
    assert commit_label(tmp_path) == head
    (tmp_path / "b.txt").write_text("untracked files do not count")
    assert commit_label(tmp_path) == head
    (tmp_path / "a.txt").write_text("2")
    assert commit_label(tmp_path) == head + "-dirty"
