"""The studies in docs/studies run, and the context study's two conclusions hold at a small size: on the analytic
H200 profile speculation gains, on the measured one (our torch code's multi-query attention) it loses more as the
context grows (docs/context_gain_study.md)."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "docs" / "studies" / "context_gain.py"


def context_gain_module():
    spec = importlib.util.spec_from_file_location("context_gain", SCRIPT)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def small_args(hardware: str) -> argparse.Namespace:
    return argparse.Namespace(trace="mooncake_conversation", hardware=hardware, concurrency=[32],
                              kv_capacity_tokens=10**8, gamma=7, requests_per_band=300, duration_s=8.0,
                              warmup_s=2.0, seed=0, band_edges=[0, 2048, 8192])


@pytest.mark.parametrize("hardware", ["h200_qwen3-8b_v2_analytic", "h200_qwen3-8b_v2_measured"])
def test_context_gain_study_keeps_its_sign_on_each_h200_profile(hardware: str) -> None:
    frame = context_gain_module().sweep(small_args(hardware))
    mtp3 = frame[frame["policy"] == "mtp3"].sort_values("band_low_tokens")
    gains = mtp3["gain_output_tokens_per_s"].to_numpy()
    assert len(gains) == 2 and (mtp3["mean_context_tokens"].diff().dropna() > 0).all()
    if hardware.endswith("analytic"):
        assert (gains > 1.5).all()  # one KV read per request whatever its query tokens: verification is cheap
    else:
        assert (gains < 1.0).all() and gains[1] < gains[0]  # SDPA's multi-query path: dearer with context


def test_context_gain_band_edges_are_checked_at_start(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, str(SCRIPT), "--band-edges", "8192", "2048"], capture_output=True,
                         text=True, cwd=REPO)
    assert run.returncode == 2 and "--band-edges must be at least two ascending token counts" in run.stderr
    module = context_gain_module()
    args = small_args("h200_qwen3-8b_v2_analytic")
    args.band_edges = [0, 500]  # the trace's shortest prompt is about 0.9k tokens
    with pytest.raises(SystemExit, match="no request of mooncake_conversation has a prompt of 0 to 500 tokens"):
        module.sweep(args)
    # a band past the measured profile's drafter table (16,384 tokens of context): one line naming the table
    run = subprocess.run([sys.executable, str(SCRIPT), "--hardware", "h200_qwen3-8b_v2_measured", "--band-edges",
                          "8192", "16384", "--concurrency", "32", "--requests-per-band", "500", "--duration-s", "1",
                          "--warmup-s", "0.2", "--out", str(tmp_path / "gain.png")],
                         capture_output=True, text=True, cwd=REPO)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert run.stderr.strip().startswith("error: profile ") and "draft.dspark.context_tokens covers 0..16384" \
        in run.stderr and len(run.stderr.strip().splitlines()) == 1
