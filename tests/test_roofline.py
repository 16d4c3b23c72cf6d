"""Analytic roofline: preset shapes against public configs, profile validity, and the curve's regimes."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import numpy as np
import pytest

from calibration.models.shapes import default_drafters, get_shape
from calibration.profiling.analytic import build_document, build_profile, main
from calibration.profiling.drafter_cost import draft_latency_s
from calibration.profiling.roofline import GPUS, Assumptions, Roofline, cuda_graph_sizes, gpus_per_replica, verify_grid
from simulator.profile import load_profile, profile_from_dict

FIXED_DAY = datetime.date(2026, 1, 1)


@pytest.mark.parametrize("name, public_params", [
    ("qwen3-4b", 4.02e9),  # Qwen/Qwen3-4B model card: 4.0B, tied embeddings
    ("qwen3-8b", 8.19e9),  # Qwen/Qwen3-8B safetensors: 8.19B incl. embeddings and LM head
    ("qwen3-14b", 14.77e9),  # Qwen/Qwen3-14B safetensors: 14.8B
])
def test_dense_presets_match_public_parameter_counts(name: str, public_params: float) -> None:
    shape = get_shape(name)
    assert shape.total_params == pytest.approx(public_params, rel=0.005)
    assert shape.active_params == shape.total_params  # dense: every weight is active


def test_qwen3_8b_count_by_hand() -> None:
    # 36 x (q/o 2*4096*4096 + k/v 2*4096*1024 + qk-norm 256 + MLP 3*4096*12288 + norms 8192)
    # + embedding + untied LM head (151936 x 4096 each) + final norm.
    per_layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 256 + 3 * 4096 * 12288 + 2 * 4096
    assert get_shape("qwen3-8b").total_params == 36 * per_layer + 2 * 151936 * 4096 + 4096


def test_v4flash_like_is_an_approximation_near_reported_sizes() -> None:
    shape = get_shape("v4flash-like")
    assert shape.total_params == pytest.approx(284e9, rel=0.02)
    assert shape.active_params == pytest.approx(13e9, rel=0.1)
    assert "APPROXIMATION" in shape.note
    assert gpus_per_replica(shape, GPUS["h200"], Assumptions()) == 8  # 568 GB of bf16 weights
    assert gpus_per_replica(get_shape("qwen3-8b"), GPUS["h200"], Assumptions()) == 1


def test_unknown_presets_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="unknown model shape 'qwen9'"):
        get_shape("qwen9")
    with pytest.raises(ValueError, match="unknown GPU 'a100'"):
        build_profile("qwen3-8b", "a100")


@pytest.mark.parametrize("model, gpu", [("qwen3-8b", "h200"), ("qwen3-8b", "h100"), ("v4flash-like", "h200")])
def test_profile_validates_and_is_labelled_analytic(model: str, gpu: str) -> None:
    profile = profile_from_dict(build_profile(model, gpu, today=FIXED_DAY))
    assert profile.source == "analytic"
    assert profile.metadata["created"] == "2026-01-01"
    assert profile.max_batch_tokens == 8192
    assert set(profile.draft) == {"dspark", "dflash", "eagle3", "mtp"}
    assert profile.draft_s("dspark", 1024, 16) > 0  # tables cover max concurrency and gamma 16
    np.testing.assert_array_equal(profile.verify_sps.x[:64], np.arange(1, 65))


@pytest.mark.parametrize("name", ["h200_qwen3-8b_analytic", "h100_qwen3-8b_analytic", "h200_v4flash-like_analytic"])
def test_builtin_profiles_load(name: str) -> None:
    profile = load_profile(name)
    assert profile.source == "analytic" and "assumptions" in profile.metadata


@pytest.mark.parametrize("name", ["h200_qwen3-8b_analytic", "h100_qwen3-8b_analytic", "h200_v4flash-like_analytic"])
def test_builtin_profiles_are_reproduced_byte_for_byte(name: str, tmp_path) -> None:
    shipped = Path(load_profile(name).path)
    meta = json.loads(shipped.read_text())["metadata"]
    model, gpu = meta["model"], name.split("_")[0]
    document = build_document(model, gpu, today=datetime.date.fromisoformat(meta["created"]))
    assert document.write(tmp_path / "p.json").read_bytes() == shipped.read_bytes()


def _roofline(model: str = "qwen3-8b", gpu: str = "h200") -> Roofline:
    shape, assume = get_shape(model), Assumptions()
    return Roofline(shape, GPUS[gpu], assume, gpus_per_replica(shape, GPUS[gpu], assume))


def test_grid_reproduces_the_step_function_exactly() -> None:
    roof = _roofline()
    grid = verify_grid(roof.assume)
    every = np.arange(1, roof.assume.max_batch_tokens + 1)
    interpolated = np.interp(every, grid, roof.verify_step_s(grid))
    np.testing.assert_allclose(interpolated, roof.verify_step_s(every), rtol=1e-12)


def test_curve_is_stepped_at_a_tile_edge() -> None:
    profile = profile_from_dict(build_profile("qwen3-8b", "h200", today=FIXED_DAY))
    # 192 tokens fill three 64-token tiles; 193 needs a fourth, in the compute-bound regime.
    assert profile.verify_sps(193) < 0.85 * profile.verify_sps(192)
    assert profile.verify_sps(256) == profile.verify_sps(193)


def test_memory_bound_at_small_batch_and_compute_bound_at_large() -> None:
    roof = _roofline()
    small = 1.0 / roof.verify_step_s(np.arange(1, 65))
    assert small.max() / small.min() < 1.01  # weight streaming dominates: SPS flat
    t4k, t8k = roof.verify_step_s(np.array([4096, 8192]))
    assert t8k / t4k == pytest.approx(2.0, rel=0.1)  # FLOPs dominate: time ~ tokens


def test_moe_step_grows_with_distinct_experts() -> None:
    roof = _roofline("v4flash-like")
    assert roof.expected_experts(np.array([1]))[0] == pytest.approx(6.0)
    assert roof.expected_experts(np.array([4096]))[0] == pytest.approx(256.0, rel=1e-6)
    sps = 1.0 / roof.verify_step_s(np.array([1, 8, 64]))
    assert sps[0] > sps[1] > sps[2]


def test_cuda_graph_sizes_are_vllm_like() -> None:
    sizes = cuda_graph_sizes(1024)
    assert sizes[:5].tolist() == [1, 2, 4, 8, 16]
    assert np.all(np.diff(sizes[3:67]) == 8) and sizes[66] == 512 and sizes[67] == 528 and sizes[-1] == 1024


def test_draft_latency_shapes_by_kind() -> None:
    roof = _roofline()
    drafters = default_drafters(roof.shape)

    def lat(kind: str, r: int, g: int) -> float:
        return draft_latency_s(roof, drafters[kind], r, g)

    # parallel drafters: one pass, nearly flat in gamma at one request
    assert lat("dflash", 1, 7) < 1.05 * lat("dflash", 1, 1)
    # DSpark = DFlash + a cheap sequential head
    assert lat("dflash", 8, 7) < lat("dspark", 8, 7) < 1.3 * lat("dflash", 8, 7)
    # autoregressive drafters: gamma passes
    assert lat("eagle3", 1, 7) == pytest.approx(7 * lat("eagle3", 1, 1))
    assert lat("mtp", 1, 4) == pytest.approx(4 * lat("mtp", 1, 1))
    with pytest.raises(ValueError, match="must be >= 1"):
        lat("dspark", 0, 3)


def test_cli_writes_a_loadable_profile(tmp_path, capsys) -> None:
    out = tmp_path / "p.json"
    main(["--model", "qwen3-4b", "--gpu", "h100", "--out", str(out), "--drafters", "dspark,mtp",
          "--max-requests", "256"])
    profile = load_profile(out)
    assert set(profile.draft) == {"dspark", "mtp"}
    assert json.loads(out.read_text())["metadata"]["assumptions"]["max_requests"] == 256
    assert "(analytic)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--model", "qwen3-4b", "--gpu", "h100", "--out", str(out), "--drafters", "medusa"])
