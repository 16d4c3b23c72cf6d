"""The profiler's quick CPU run writes a profile the simulator loads; the comparison figure is written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from calibration.profiling.compare import main as compare_main
from calibration.profiling.measure import batch_grid, padding_cost, split_tokens
from simulator.profile import load_profile

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("profile") / "tiny_measured.json"
    subprocess.run([sys.executable, "calibration/profile_gpu.py", "--preset", "tiny", "--drafters", "dspark,dflash",
                    "--quick", "--no-progress", "--device", "cpu", "--out", str(out)],
                   cwd=REPO, check=True, capture_output=True, text=True, timeout=120)
    return out


def test_quick_profile_loads_and_says_measured(measured: Path) -> None:
    profile = load_profile(measured)
    meta = profile.metadata
    assert profile.source == "measured" and meta["model"] == "tiny" and meta["dtype"] == "float32"
    assert meta["device"].startswith("cpu") and meta["torch"] and meta["config"]["repeats"] == 3
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


def test_comparison_figure_is_written(measured: Path, tmp_path: Path) -> None:
    out = compare_main([str(measured), "h200_qwen3-8b_analytic", "--out", str(tmp_path / "cmp.png")])
    assert out.stat().st_size > 10_000
    assert json.loads(measured.read_text())["metadata"]["source"] == "measured"


def test_grids_and_layout() -> None:
    default = batch_grid(1024, "default")
    assert default[:64] == list(range(1, 65))
    assert {512, 513, 528, 529, 1024} <= set(default)  # CUDA-graph sizes and the point after each
    assert batch_grid(100, "full") == list(range(1, 101))
    assert split_tokens(19, 8) == [8, 8, 3]


def test_help_documents_every_option() -> None:
    text = subprocess.run([sys.executable, "-m", "calibration.profile_gpu", "--help"], cwd=REPO, check=True,
                          capture_output=True, text=True).stdout
    for option in ("--preset", "--drafters", "--out", "--quick", "--context-tokens", "--repeats", "--compile"):
        assert option in text
