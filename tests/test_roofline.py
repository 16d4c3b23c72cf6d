"""Analytic roofline: preset shapes against public configs, profile validity, the curve's regimes, and version 2
(attention over context, CUDA-graph cliff, FP8, context-aware drafters, GPU datasheet constants)."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import numpy as np
import pytest

from calibration.models.shapes import default_drafters, get_shape
from calibration.profiling.analytic import build_document, build_document_v2, build_profile, main
from calibration.profiling.drafter_cost import draft_latency_s
from calibration.profiling.roofline import (
    GPUS,
    Assumptions,
    Precision,
    Roofline,
    cuda_graph_sizes,
    gpus_per_replica,
    verify_grid,
)
from simulator.costs import load_profile, profile_from_dict

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


# ------------------------------------------------------------------ version 2


BF16 = Precision()
V2_BUILTINS = ["h200_qwen3-8b_v2_analytic", "h100_qwen3-8b_v2_analytic", "h200_v4flash-like_v2_analytic"]


@pytest.mark.slow  # ~1.5 s each: every table of a shipped version-2 profile rebuilt
@pytest.mark.parametrize("name", V2_BUILTINS)
def test_builtin_v2_profiles_are_reproduced_byte_for_byte(name: str, tmp_path) -> None:
    shipped = Path(load_profile(name).path)
    meta = json.loads(shipped.read_text())["metadata"]
    document = build_document_v2(meta["model"], name.split("_")[0],
                                 today=datetime.date.fromisoformat(meta["created"]))
    assert document.version == 2
    assert document.write(tmp_path / "p.json").read_bytes() == shipped.read_bytes()


@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_gpu_presets_state_dense_peaks_and_their_datasheet(gpu: str) -> None:
    spec = GPUS[gpu]
    assert "datasheet" in spec.source.lower() or "data sheet" in spec.source.lower()
    # every one of these parts doubles its dense BF16 tensor rate in FP8 (datasheets, dense columns)
    assert spec.peak_fp8_flops_per_s == pytest.approx(2 * spec.peak_flops_per_s, rel=1e-3)
    assert 0.9e15 < spec.peak_flops_per_s < 2.5e15 and 3e12 <= spec.hbm_bytes_per_s <= 8e12


def test_v2_profile_is_labelled_and_states_every_constant() -> None:
    profile = profile_from_dict(build_document_v2("qwen3-8b", "b200", today=FIXED_DAY).to_dict())
    meta = profile.metadata
    assert profile.version == 2 and profile.source == "analytic" and profile.per_request_s is None
    assert meta["gpu"]["source"] == GPUS["b200"].source and meta["gpu"]["peak_fp8_flops_per_s"] == 4.5e15
    assert meta["precision"]["weights"] == meta["precision"]["kv"] == "bf16"
    assert meta["kv_bytes_per_token"] == 36 * 8 * 128 * 2 * 2  # layers x KV heads x head dim x (K, V) x bf16
    assert "target's KV" in meta["tables"]["draft"]
    assert profile.cuda_graphs is not None and profile.cuda_graphs.max_captured_tokens == 1024
    assert profile.token_budget is None  # a deployment setting, only with --token-budget
    assert all(profile.draft_uses_context(kind) for kind in ("dspark", "dflash", "eagle3", "mtp"))
    assert profile.attention is not None and profile.attention.x[-1] == 262144
    assert profile.attention.y.tolist() == list(range(1, 18))  # 1 + gamma for gamma up to 16


def _roof_v2(model: str = "qwen3-8b", gpu: str = "h200", precision: Precision = BF16) -> Roofline:
    shape, assume = get_shape(model), Assumptions()
    return Roofline(shape, GPUS[gpu], assume, gpus_per_replica(shape, GPUS[gpu], assume, precision), precision)


def test_attention_reads_the_kv_once_so_verifying_more_tokens_is_nearly_free_at_long_context() -> None:
    roof = _roof_v2()
    kv_s_per_token = 36 * 8 * 128 * 2 * 2 / (4.8e12 * 0.8)
    assert roof.attention_s(32768, 1) == pytest.approx(kv_s_per_token * 32769)  # memory-bound: one read
    assert roof.attention_s(32768, 8) / roof.attention_s(32768, 1) < 1.001
    assert roof.attention_s(32768, 1) > 60 * roof.attention_s(512, 1)
    # a prefill chunk of 4096 tokens is compute-bound: FLOPs of 4096 x (32768 + 2048.5) (query, key) pairs
    flops = 4.0 * 36 * 32 * 128 * 4096 * (32768 + 4097 / 2)
    assert roof.attention_s(32768, 4096) == pytest.approx(flops / (989e12 * 0.6))


def test_fp8_halves_what_is_memory_bound_and_doubles_the_gemm_peak() -> None:
    bf16, fp8 = _roof_v2(), _roof_v2(precision=Precision("fp8", "fp8"))
    assert fp8.attention_s(65536, 1) == pytest.approx(bf16.attention_s(65536, 1) / 2)
    overhead = Assumptions().step_overhead_s
    one = np.array([1])
    assert fp8.dense_step_s(one)[0] - overhead == pytest.approx((bf16.dense_step_s(one)[0] - overhead) / 2)
    big = np.array([8192])  # compute-bound
    assert fp8.dense_step_s(big)[0] - overhead == pytest.approx((bf16.dense_step_s(big)[0] - overhead) / 2, rel=1e-3)
    moe = get_shape("v4flash-like")
    assert gpus_per_replica(moe, GPUS["h200"], Assumptions(), Precision("fp8")) == 4  # 284 GB of weights
    assert _roof_v2("v4flash-like").kv_read_shards == 8  # a latent cache: data-parallel attention over 8 GPUs


def test_v2_at_the_reference_context_stays_near_version_1() -> None:
    """Same roofline, split differently: v1 folds attention FLOPs into the GEMMs and adds KV reads; v2 prices each
    request's attention as max(FLOPs, KV read)."""
    v1, v2 = (profile_from_dict(d) for d in (build_profile("qwen3-8b", "h200", today=FIXED_DAY),
                                             build_document_v2("qwen3-8b", "h200", today=FIXED_DAY).to_dict()))
    for requests, query in ((1, 1), (64, 1), (64, 8), (512, 8)):
        tokens = requests * query
        v2_s = v2.verify_s(requests, tokens) + v2.attention_s(np.full(requests, 2048), query)
        assert v2_s == pytest.approx(v1.verify_s(requests, tokens), rel=0.06)
    assert v2.dense_s(1025) - v2.dense_s(1024) > Assumptions().eager_overhead_s  # the cliff, stated


def test_v2_tables_interpolate_close_to_the_roofline() -> None:
    roof = _roof_v2()
    profile = profile_from_dict(build_document_v2("qwen3-8b", "h200", today=FIXED_DAY).to_dict())
    rng = np.random.default_rng(0)
    contexts = rng.uniform(0, 262144, 300)
    queries = rng.integers(1, 18, 300)
    np.testing.assert_allclose([profile.attention_s(np.array([c]), q) for c, q in zip(contexts, queries, strict=True)],
                               roof.attention_s(contexts, queries), rtol=1e-9)
    chunks = rng.integers(64, 8193, 300)
    assert profile.chunk_attention is not None
    np.testing.assert_allclose(profile.chunk_attention(contexts, chunks), roof.attention_s(contexts, chunks),
                               rtol=0.01)
    drafters = default_drafters(roof.shape)
    for kind, spec in drafters.items():
        for c, r, g in zip(rng.uniform(0, 262144, 40), rng.choice([1, 8, 64, 256, 1024], 40),
                           rng.integers(1, 17, 40), strict=True):
            exact = draft_latency_s(roof, spec, int(r), int(g), float(c))
            table_s = profile.draft_s(kind, int(r), int(g), float(c))  # a convex function: never below
            assert (1 - 1e-12) * exact <= table_s <= 1.12 * exact, (kind, c, r, g)


def test_drafters_read_their_own_kv_of_the_context_windowed_ones_stop_at_the_window() -> None:
    dense, moe = _roof_v2(), _roof_v2("v4flash-like")
    for kind, spec in default_drafters(dense.shape).items():
        short, long = (draft_latency_s(dense, spec, 64, 4, c) for c in (100, 65536))
        assert long > 1.5 * short, kind  # memory-bound: its layers' KV over 64 x 65536 tokens dominates
    for kind, spec in default_drafters(moe.shape).items():
        short, long = (draft_latency_s(moe, spec, 64, 4, c) for c in (100, 65536))
        if spec.window_tokens is None:
            assert long > short, kind
        else:
            assert long == draft_latency_s(moe, spec, 64, 4, spec.window_tokens), kind


def test_cli_writes_version_2_with_dtypes_and_budget(tmp_path, capsys) -> None:
    out = tmp_path / "v2.json"
    main(["--model", "qwen3-14b", "--gpu", "mi300x", "--format-version", "2", "--weights-dtype", "fp8",
          "--kv-dtype", "fp8", "--token-budget", "4096", "--max-context-tokens", "32768", "--drafters", "mtp",
          "--max-requests", "64", "--out", str(out)])
    profile = load_profile(out)
    assert profile.version == 2 and profile.token_budget == 4096 and set(profile.draft) == {"mtp"}
    assert profile.metadata["precision"]["gemm_peak_flops_per_s"] == 2614.9e12
    assert profile.attention is not None and profile.attention.x[-1] == 32768
    assert "(version 2)" in capsys.readouterr().out
    for bad in (["--weights-dtype", "fp8"], ["--token-budget", "2048"]):  # version-2 options without version 2
        with pytest.raises(SystemExit):
            main(["--model", "qwen3-8b", "--gpu", "h100", "--out", str(out), *bad])
