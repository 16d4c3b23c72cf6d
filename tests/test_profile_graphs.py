"""The profiler's CUDA-graph tables, its drafter context axis and its memory hygiene (CPU-only checks).

``tests/data/h200_tiny_v2_cuda_graphs.json`` is a real measurement: ``python -m calibration.profile_gpu --preset tiny
--format-version 2 --quick --drafters dspark,mtp --cuda-graphs 16`` on an NVIDIA H200 (torch 2.11.0+cu130, code at
37e0f4b), the smoke run of the GPU session described in docs/calibration.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from calibration.models.drafters import build_drafter
from calibration.models.model import build_verifier
from calibration.profiling.calls import chunk_call, draft_call
from calibration.profiling.graphs import graph_tables
from calibration.profiling.profile_gpu import main as profile_main
from simulator.costs import load_profile

GPU_FILE = Path(__file__).parent / "data" / "h200_tiny_v2_cuda_graphs.json"


def test_graph_tables_replay_up_to_the_cliff_and_eager_above() -> None:
    sps, block, meta = graph_tables((1, 2, 4, 5, 8), [2e-3, 2e-3, 2.1e-3, 2.2e-3, 2.4e-3], [3e-4, 3e-4, 4e-4], 4)
    assert sps == pytest.approx((1 / 3e-4, 1 / 3e-4, 1 / 4e-4, 1 / 2.2e-3, 1 / 2.4e-3))
    assert block.max_captured_tokens == 4 and block.eager_batch_tokens == (1, 2, 4, 5, 8)
    assert block.eager_steps_per_s == pytest.approx(tuple(1 / t for t in (2e-3, 2e-3, 2.1e-3, 2.2e-3, 2.4e-3)))
    assert meta["eager_minus_graph_s"]["min"] == pytest.approx(1.7e-3)
    with pytest.raises(ValueError, match="3 graph times for the 2 batch sizes"):
        graph_tables((1, 2, 4), [1.0, 1.0, 1.0], [0.1, 0.1, 0.1], 2)


def test_a_gpu_measured_file_with_the_cliff_loads_and_prices_eager_steps_above_it() -> None:
    profile = load_profile(str(GPU_FILE))
    raw = json.loads(GPU_FILE.read_text())
    assert profile.version == 2 and raw["metadata"]["device"] == "NVIDIA H200"
    assert raw["cuda_graphs"]["max_captured_tokens"] == 16
    assert not profile.is_eager(16) and profile.is_eager(17)
    eager = dict(zip(raw["cuda_graphs"]["eager"]["batch_tokens"], raw["cuda_graphs"]["eager"]["steps_per_s"],
                     strict=True))
    graph = dict(zip(raw["verify"]["batch_tokens"], raw["verify"]["steps_per_s"], strict=True))
    assert profile.dense_s(17) == pytest.approx(1 / eager[17])
    assert profile.dense_s(16) == pytest.approx(1 / graph[16])
    # what the file shows: the tiny model's eager step is launch-bound, several times its graph replay
    assert profile.dense_s(17) > 3 * profile.dense_s(16)


def test_cuda_graphs_needs_a_cuda_device(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="--cuda-graphs needs --format-version 2 on a CUDA device"):
        profile_main(["--preset", "tiny", "--format-version", "2", "--quick", "--device", "cpu", "--cuda-graphs",
                      "16", "--out", str(tmp_path / "p.json")])


def test_a_negative_probe_context_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="--probe-context: a context of >= 0 tokens, got -5"):
        profile_main(["--preset", "tiny", "--format-version", "2", "--quick", "--device", "cpu", "--probe-context",
                      "-5", "--out", str(tmp_path / "p.json")])


def test_drafter_tables_have_their_own_context_axis(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    profile_main(["--preset", "tiny", "--format-version", "2", "--device", "cpu", "--drafters", "mtp",
                  "--max-batch-tokens", "32", "--requests", "1,3", "--draft-tokens", "1,2",
                  "--context-tokens", "0,128,256", "--draft-contexts", "0,64", "--chunk-tokens", "",
                  "--prefill-prompts", "", "--probe-context", "64", "--warmup", "0", "--repeats", "1",
                  "--cpu-threads", "1", "--no-progress", "--out", str(out)])
    raw = json.loads(out.read_text())
    assert raw["attention"]["context_tokens"] == [0, 128, 256]
    assert raw["draft"]["mtp"]["context_tokens"] == [0, 64] and raw["draft"]["mtp"]["num_requests"] == [1, 3]
    assert load_profile(str(out)).version == 2


def test_a_timed_point_leaves_no_cache_on_the_drafter() -> None:
    gen = torch.Generator().manual_seed(0)
    model = build_verifier("tiny", gen)
    drafter = build_drafter("dspark", model, gen, max_depth=2)
    call = draft_call(drafter, 16, torch.device("cpu"), gen, 2, 2)()
    assert drafter.cache is None  # held by the point alone: freed when the point is done
    call()
    assert drafter.cache is None and drafter.last_feature is None
    chunk_call(model, model, drafter, torch.device("cpu"), gen, 8, 4)()()
    assert drafter.cache is None
