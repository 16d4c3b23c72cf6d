"""The profiler's CUDA-graph tables, its drafter context axis and its memory hygiene (CPU-only checks).

``simulator/profiles/h200_qwen3-8b_v2_measured.json`` is the Qwen3-8B-shaped profile of the 2026-12-04 H200
session (its commands are in docs/calibration.md). ``tests/data/h200_tiny_v2_cuda_graphs.json`` is a real measurement:
``python -m calibration.profile_gpu --preset tiny --format-version 2 --quick --drafters dspark,mtp --cuda-graphs 16``
on an NVIDIA H200 (torch 2.11.0+cu130, code at 37e0f4b), the smoke run of the 2026-12-01 GPU session.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from calibration.models.drafters import build_drafter, drafter_num_layers
from calibration.models.model import build_verifier
from calibration.profiling.calls import chunk_call, draft_call
from calibration.profiling.compare import compare_figure
from calibration.profiling.graphs import graph_tables
from calibration.profiling.measure_context import ContextAxes, context_blocks, context_points, difference_pairs
from calibration.profiling.memory import drafter_slots, fit_requests
from calibration.profiling.profile_gpu import config_from_args, parse_args
from calibration.profiling.profile_gpu import main as profile_main
from calibration.profiling.timing import Prepare
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


def _small_v2_profile(out: Path, drafters: str, requests: str, draft_tokens: str, contexts: str, draft_contexts: str,
                      *extra: str) -> dict:
    """A version-2 CPU profile of the tiny models with no chunk or prefill table, one repeat: its dictionary."""
    profile_main(["--preset", "tiny", "--format-version", "2", "--device", "cpu", "--drafters", drafters,
                  "--max-batch-tokens", "32", "--requests", requests, "--draft-tokens", draft_tokens,
                  "--context-tokens", contexts, "--draft-contexts", draft_contexts, "--chunk-tokens", "",
                  "--prefill-prompts", "", "--probe-context", "64", "--warmup", "0", "--repeats", "1",
                  "--cpu-threads", "1", "--no-progress", *extra, "--out", str(out)])
    return json.loads(out.read_text())


def test_drafter_tables_have_their_own_context_axis(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    raw = _small_v2_profile(out, "mtp", "1,3", "1,2", "0,128,256", "0,64")
    assert raw["attention"]["context_tokens"] == [0, 128, 256]
    assert raw["draft"]["mtp"]["context_tokens"] == [0, 64] and raw["draft"]["mtp"]["num_requests"] == [1, 3]
    assert load_profile(str(out)).version == 2
    # what R requests cost beyond the dense part, before any context: a table of its own, one entry per R
    assert raw["per_request"]["num_requests"] == [1, 3] and min(raw["per_request"]["step_s"]) >= 0
    assert raw["metadata"]["per_request_definition"].startswith("t(R x 1 token over one cached key)")
    assert "per_request_negative_written_as_0" in raw["metadata"]["context_tables"]


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


@pytest.mark.parametrize("kind", ["mtp", "dspark", "eagle3"])
def test_the_memory_check_sizes_a_drafter_cache_as_the_drafter_builds_it(kind: str) -> None:
    """An mtp drafter chains one module per draft depth: its cache per request is max(gamma) layers deep (the check
    once counted one layer, and a Qwen3-8B profile ran out of GPU memory at mtp, 16,384 tokens, 128 requests)."""
    gen = torch.Generator().manual_seed(0)
    model = build_verifier("tiny", gen)
    drafter = build_drafter(kind, model, gen, max_depth=16)
    assert len(drafter.layers) == drafter_num_layers(kind, model.s, 16)
    budget_gb = 0.05
    cfg = config_from_args(parse_args(["--preset", "tiny", "--format-version", "2", "--device", "cpu", "--drafters",
                                       kind, "--requests", "1,2,4,8,16,32,64,128,256,512,1024,2048",
                                       "--draft-tokens", "1,16", "--context-tokens", "0,64", "--draft-contexts",
                                       "0,4096", "--probe-context", "0", "--kv-budget-gb", str(budget_gb),
                                       "--out", "unused.json"]))
    drafter.new_cache(1, 4096 + 16 + 1)  # the longest drafter context and the draft tokens, as the check counts
    cache_bytes = (drafter.cache.k.numel() + drafter.cache.v.numel()) * drafter.cache.k.element_size()
    fits = budget_gb * 1e9 / cache_bytes
    # the check counts whole verifier-depth slots first, so it may round down by up to that depth's share
    slots = drafter_slots(cfg, model, torch.device("cpu"), kind)
    assert fits - model.s.num_layers / len(drafter.layers) - 1 <= slots <= fits  # type: ignore[operator]


def test_each_drafter_grid_is_cut_by_its_own_cache() -> None:
    """A 16-module mtp chain cuts its own R grid, not dspark's (5 layers) nor the verifier's."""
    gen = torch.Generator().manual_seed(0)
    model = build_verifier("tiny", gen)
    cfg = config_from_args(parse_args(["--preset", "tiny", "--format-version", "2", "--device", "cpu", "--drafters",
                                       "dspark,mtp", "--requests", "1,4,16,64,256", "--draft-tokens", "1,16",
                                       "--context-tokens", "0,64", "--draft-contexts", "0,4096", "--probe-context",
                                       "0", "--kv-budget-gb", "0.2", "--out", "unused.json"]))
    cut, note = fit_requests(cfg, model, torch.device("cpu"))
    grids = cut.draft_grids()
    assert cut.num_requests == (1, 4, 16, 64, 256)  # the verifier's caches at the probe context fit
    assert grids == {"dspark": (1, 4, 16), "mtp": (1, 4)}  # 95 slots of 2 layers: 38 of 5 layers, 11 of 16
    assert note is not None and "the mtp drafter's caches: R grid cut from 256" in note


def test_the_shipped_h200_qwen3_8b_profile_is_a_measurement_with_its_provenance() -> None:
    profile = load_profile("h200_qwen3-8b_v2_measured")
    meta = profile.metadata
    assert profile.source == "measured" and meta["device"] == "NVIDIA H200" and meta["model"] == "qwen3-8b"
    assert len(meta["code_revision"]) == 40 and meta["torch"].startswith("2.11.0")
    assert meta["config"]["drafters"] == ["dspark", "mtp", "dflash", "eagle3"]  # one run, every table
    assert sorted(profile.draft) == ["dflash", "dspark", "eagle3", "mtp"]
    # graph-replayed attention pairs resolve the context: the cost per request doubles with the context, and
    # only the 1-query-token entries up to 4,096 tokens (context 0 replays slower) were negative, written as 0
    assert meta["context_tables"]["negative_differences_written_as_0"] == 3
    for q in (2, 9, 17):
        at = [profile.attention_s(np.array([c]), q) for c in (8192, 16384, 32768)]
        assert 1.8 < at[1] / at[0] < 2.2 and 1.8 < at[2] / at[1] < 2.2
    # one query token takes a cheaper path: at 32,768 tokens about one read of the request's KV cache
    assert profile.attention_s(np.array([32768]), 1) < 0.25 * profile.attention_s(np.array([32768]), 2)
    assert not profile.is_eager(512) and profile.is_eager(513)
    # what the file shows: a cliff at the largest captured size (eager 39 ms against 23 ms replayed at 512 tokens),
    # and each eager drafter step of four tokens costs about as much as a whole graph-replayed verify step
    assert profile.dense_s(513) > 1.5 * profile.dense_s(512)
    assert all(profile.draft_s(kind, 1, 4, 0.0) > 0.5 * profile.dense_s(8) for kind in profile.draft)


def test_the_comparison_figure_names_each_file_and_code_revision() -> None:
    measured, analytic = load_profile("h200_qwen3-8b_v2_measured"), load_profile("h200_qwen3-8b_v2_analytic")
    fig = compare_figure([measured, analytic])
    title = fig._suptitle.get_text()  # type: ignore[union-attr]
    assert f"code {measured.metadata['code_revision'][:12]}" in title and "(measured)" in title
    assert "h200_qwen3-8b_v2_analytic.json, code revision not recorded" in title
    assert len(fig.axes) == 6 and all(ax.lines for ax in fig.axes)


def test_with_graphs_on_the_attention_pairs_are_captured_and_the_chunk_pairs_are_not() -> None:
    """The first Qwen3-8B profile on an H200 took attention as differences of two eager forwards of about 40 ms,
    whose launch jitter buried every entry; with --cuda-graphs the attention pairs are replayed as graphs."""
    gen = torch.Generator().manual_seed(0)
    model = build_verifier("tiny", gen)
    axes = ContextAxes((0, 32, 64), (1, 3), (8,), (0, 16), 2, (), (0,))
    captured: list[Prepare] = []

    def capture(prepare: Prepare) -> Prepare:
        captured.append(prepare)
        return prepare
    drafters = {"dspark": build_drafter("dspark", model, gen, max_depth=2)}
    pairs = difference_pairs(axes, model, model, torch.device("cpu"), gen, drafters, lambda n: [n], capture)
    attention = [(base, point) for label, base, point in pairs if label.startswith("attention")]
    assert len(attention) == 2 * 2 and captured == [p for pair in attention for p in pair]
    assert len(pairs) == len(attention) + 2  # the chunk pairs, eager
    _, notes = context_blocks(axes, iter([1e-3] * len(pairs)), iter([]), {}, (1,), attention_replayed=True)
    assert "both forwards replayed as CUDA graphs" in notes["attention_definition"]
    _, eager = context_blocks(axes, iter([1e-3] * len(pairs)), iter([]), {}, (1,))
    assert "CUDA graphs" not in eager["attention_definition"]


def test_an_attention_pair_of_one_query_token_takes_its_base_at_one_cached_key(monkeypatch) -> None:
    """On the H200 a one-token forward over no cached key (a single key: SDPA's path of its own) ran 0.13 ms per
    request slower than over 1,024 keys, so every difference of the one-token row came out low by that much."""
    import calibration.profiling.measure_context as measure_context
    calls: list[tuple[list[int], int]] = []

    def record(model, forward, device, gen, tokens, query_lens, context):  # noqa: ANN001, ANN202
        calls.append((query_lens, context))
        return lambda: (lambda: None)
    monkeypatch.setattr(measure_context, "verify_call", record)
    axes = ContextAxes((0, 32, 64), (1, 3), (), (), 2, (), (0,))
    pairs = difference_pairs(axes, None, None, torch.device("cpu"), None, {}, lambda n: [n])  # type: ignore[arg-type]
    assert [label for label, _, _ in pairs] == ["attention C=32 q=1", "attention C=32 q=3", "attention C=64 q=1",
                                                "attention C=64 q=3"]
    assert calls == [([1, 1], 1), ([1, 1], 32), ([3, 3], 0), ([3, 3], 32), ([1, 1], 1), ([1, 1], 64), ([3, 3], 0),
                     ([3, 3], 64)]
    _, notes = context_blocks(axes, iter([1e-3] * len(pairs)), iter([]), {}, (1,))
    assert "at context 1 for q = 1" in notes["attention_definition"]


def test_per_request_pairs_take_the_dense_layout_as_base_and_capture_up_to_the_captured_size(monkeypatch) -> None:
    import calibration.profiling.measure_context as measure_context
    calls: list[tuple[list[int], int]] = []

    def record(model, forward, device, gen, tokens, query_lens, context):  # noqa: ANN001, ANN202
        calls.append((query_lens, context))
        return lambda: (lambda: None)
    monkeypatch.setattr(measure_context, "verify_call", record)
    captured: list[Prepare] = []

    def capture(prepare: Prepare) -> Prepare:
        captured.append(prepare)
        return prepare
    pairs = measure_context.request_pairs((1, 8, 20), None, None, torch.device("cpu"), None,  # type: ignore[arg-type]
                                          lambda n: [8] * (n // 8) + ([n % 8] if n % 8 else []), capture, 16)
    assert [label for label, _, _ in pairs] == ["per-request R=1", "per-request R=8", "per-request R=20"]
    assert calls == [([1], 0), ([1], 1), ([8], 0), ([1] * 8, 1), ([8, 8, 4], 0), ([1] * 20, 1)]
    assert len(captured) == 4  # R = 1 and 8 replayed as graphs; R = 20 lies above the captured sizes: eager
    notes: dict = {}
    assert measure_context.read_request_pairs(iter([2e-3, -1e-4, 5e-3]), (1, 8, 20), notes) == [2e-3, 0.0, 5e-3]
    assert notes["per_request_negative_written_as_0"] == 1


def test_a_profile_with_its_own_grid_per_drafter_loads_and_says_what_was_cut(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    raw = _small_v2_profile(out, "dspark,mtp", "1,4,16,64", "1,16", "0,128", "0,1024", "--kv-budget-gb", "0.05")
    assert raw["draft"]["dspark"]["num_requests"] == [1, 4, 16] and raw["draft"]["mtp"]["num_requests"] == [1, 4]
    assert raw["metadata"]["num_requests_capped"].startswith("the dspark drafter's caches: R grid cut from 64 to 16")
    profile = load_profile(str(out))
    assert profile.draft_s("dspark", 16, 1, 0.0) > 0
    with pytest.raises(ValueError, match="outside the profiled range 1..4"):
        profile.draft_s("mtp", 16, 1, 0.0)


def test_the_drafters_part_of_a_chunk_is_timed_alone_and_kept_within_the_chunk() -> None:
    """``prefill.chunk_attention.draft_s``: one point per (computed context, chunk), the first drafter's context build
    alone; a time above the chunk's whole difference (the two are timed apart) is written as that whole, counted."""
    gen = torch.Generator().manual_seed(0)
    model = build_verifier("tiny", gen)
    axes = ContextAxes((0, 32), (1, 2), (4, 8), (0, 16), 2, (), (0, 32))
    drafters = {"dspark": build_drafter("dspark", model, gen, max_depth=2)}
    points = context_points(axes, model, model, torch.device("cpu"), gen, drafters, {"dspark": (1,)}, (1,))
    chunk_points = [(label, prepare) for label, prepare in points if label.startswith("chunk draft")]
    assert [label for label, _ in chunk_points] == ["chunk draft P=0 n=4", "chunk draft P=0 n=8",
                                                    "chunk draft P=16 n=4", "chunk draft P=16 n=8"]
    for _, prepare in chunk_points:  # each runs, twice, on its own cache
        run = prepare()
        run()
        run()
    assert axes.num_points(1, 1) == 1 * 2 + 2 * 2 * 2 + 2  # attention, chunk pairs and drafter parts, draft table
    differences = iter([1e-3, 1e-3] + [1e-3, 2e-3, 3e-3, 4e-3])  # attention C=32 (q 1, 2), then the chunk pairs
    times = iter([5e-4, 3e-3, 1e-3, 1e-3] + [1e-3, 1e-3])  # the drafter's parts, then the draft table (C 0, 32)
    blocks, notes = context_blocks(axes, differences, times, {"dspark": (1,)}, (1,))
    assert blocks.chunk_attention is not None
    assert blocks.chunk_attention.draft_s == ((5e-4, 2e-3), (1e-3, 1e-3))
    assert notes["chunk_draft_capped_at_per_chunk_s"] == 1
    assert blocks.chunk_attention.to_dict()["draft_s"] == [[5e-4, 2e-3], [1e-3, 1e-3]]
    plain, _ = context_blocks(axes, iter([1e-3] * 6), iter([]), {}, (1,))  # no drafter: nothing to leave out
    assert plain.chunk_attention is not None and plain.chunk_attention.draft_s is None
