"""Acceptance presets: every Table 1 row of the DSpark paper ships, per benchmark and domain, and reproduces it.

A curve's tau is exact arithmetic (1 + sum of prefix products); the parametric
model is then checked to reproduce it over steps (the offline protocol: every
draft verified, whole requests, so hard requests weigh more, as in a
per-round average), and the whole simulator too (slow). Sample sizes keep the
tolerances several standard errors wide.
"""

from __future__ import annotations

import numpy as np
import pytest

from calibration.acceptance.build import BuildOptions, build_presets
from calibration.acceptance.inputs import read_published
from policies import make_policy
from simulator import DrafterSpec, load_profile, simulate
from simulator.acceptance.curves import AcceptanceCurve
from simulator.acceptance.offline import run_offline
from simulator.acceptance.paper import (
    BENCHMARK_DOMAINS,
    FIGURE2_ANCHORS,
    TABLE1,
    TABLE1_QWEN3_4B,
    drafter_kind,
    table1_domain_means,
    table1_tau,
)
from simulator.acceptance.parametric import AcceptanceModel
from simulator.acceptance.preset_file import PresetError
from simulator.acceptance.presets import BUILTIN_DIR, DEFAULT_PRESETS, builtin_presets, load_preset, preset
from traces.workload import DOMAINS

PAPER_DIR = BUILTIN_DIR.parents[2] / "calibration" / "acceptance" / "paper"
ROWS = [(target, drafter) for target, row in TABLE1.items() for drafter in row]


def preset_name(target: str, drafter: str) -> str:
    return f"{target.lower()}_{drafter_kind(drafter)}"


def test_every_table1_row_ships_with_its_source():
    names = builtin_presets()
    for target, drafter in ROWS:
        found = load_preset(preset_name(target, drafter))
        assert (found.target, found.drafter) == (target, drafter)
        assert set(found.benchmarks) == set(BENCHMARK_DOMAINS) and set(found.domains) == set(DOMAINS)
        assert "Table 1 (p. 11)" in found.metadata["source"]["reference"]
        assert found.fit_positions == 7
    assert set(DEFAULT_PRESETS.values()) <= set(names)


@pytest.mark.parametrize("target, drafter", ROWS)
def test_preset_curves_hit_every_table1_cell_exactly(target, drafter):
    found = load_preset(preset_name(target, drafter))
    for bench, tau in table1_tau(target, drafter).items():
        domain, curve = found.benchmark(bench)
        assert domain == BENCHMARK_DOMAINS[bench]
        assert curve.tau(7) == pytest.approx(tau, abs=2e-5)  # the file keeps q to 6 decimals
    for domain, tau in table1_domain_means(target, drafter).items():
        assert found.curve(domain).tau(7) == pytest.approx(tau, abs=1e-3)  # the paper's domain figure


def test_shipped_presets_are_what_the_tool_builds_from_the_paper_table():
    rows = read_published(PAPER_DIR / "table1.csv")
    for built in build_presets(rows, BuildOptions(source={"kind": "published", "reference": "test"})):
        shipped = load_preset(built.name)
        for name, curve in built.domains.items():
            np.testing.assert_allclose(shipped.curve(name).q, curve.q, atol=1e-6)
        for name, (_, curve) in built.benchmarks.items():
            np.testing.assert_allclose(shipped.benchmark(name)[1].q, curve.q, atol=1e-6)


def test_the_paper_table_input_is_table1_as_printed():
    rows = read_published(PAPER_DIR / "table1.csv")
    printed = {(r.target, r.drafter, r.name): r.tau for r in rows if not r.is_domain}
    expected = {(t, d, b): tau for t, d in ROWS for b, tau in table1_tau(t, d).items()}
    assert printed == expected


@pytest.mark.parametrize("key, value", sorted(FIGURE2_ANCHORS.items()))
def test_qwen3_4b_domain_curves_pass_through_the_figure2_anchors(key, value):
    drafter, domain, position = key
    assert preset(drafter, domain).conditional(7)[position - 1] == pytest.approx(value, abs=1e-3)


CHECKED = [("qwen3-4b_dspark", "gsm8k"), ("qwen3-4b_dspark", "arena_hard"), ("qwen3-8b_eagle3", "mt_bench"),
           ("qwen3-14b_dflash", "livecodebench"), ("gemma4-12b_dspark", "aime25")]


@pytest.mark.parametrize("name, bench", CHECKED)
def test_the_model_reproduces_a_benchmark_cell_over_steps(name, bench):
    found = load_preset(name)
    domain, curve = found.benchmark(bench)
    model = AcceptanceModel(found, 7, benchmark_mix={bench: 1.0})
    result = run_offline(model, domain, 7, np.random.default_rng(3), num_requests=6000, output_tokens=64)
    assert result.tau == pytest.approx(curve.tau(7), rel=0.012)  # standard error about 0.35 %
    np.testing.assert_allclose(result.conditional, curve.conditional(7), atol=0.012)


def test_a_benchmark_mix_draws_each_requests_curve_by_weight_and_keeps_it():
    model = AcceptanceModel("qwen3-8b_dspark", 7, benchmark_mix={"gsm8k": 3.0, "aime25": 1.0, "alpaca": 1.0})
    rng = np.random.default_rng(0)
    difficulty = model.request_difficulty(rng, 40_000)
    math = np.full(difficulty.size, DOMAINS.index("math"))
    classes, ease = model.request_classes(math, difficulty)
    names = np.array([c.name for c in model.classes])[classes]
    assert (names == "gsm8k").mean() == pytest.approx(0.75, abs=0.01)  # 3 : 1 within the math domain
    assert set(names) == {"gsm8k", "aime25"}
    assert ease.mean() == pytest.approx(0.0, abs=0.02) and ease.std() == pytest.approx(1.0, abs=0.02)
    for picked in ("gsm8k", "aime25"):  # the ease on each curve is still standard normal
        assert ease[names == picked].std() == pytest.approx(1.0, abs=0.03)
    again, _ = model.request_classes(math, difficulty)
    np.testing.assert_array_equal(again, classes)  # a request keeps its benchmark
    chat, _ = model.request_classes(np.full(10, DOMAINS.index("chat")), difficulty[:10])
    assert {model.classes[c].name for c in chat} == {"alpaca"}
    code, _ = model.request_classes(np.full(10, DOMAINS.index("code")), difficulty[:10])
    assert {model.classes[c].name for c in code} == {"code"}  # no code benchmark in the mix: the domain curve


def test_benchmark_mix_errors_name_what_is_valid():
    with pytest.raises(PresetError, match="has no benchmark 'gsm9k'.*gsm8k"):
        AcceptanceModel("qwen3-8b_dspark", 7, benchmark_mix={"gsm9k": 1.0})
    with pytest.raises(PresetError, match="non-negative weights"):
        AcceptanceModel("qwen3-8b_dspark", 7, benchmark_mix={"gsm8k": -1.0})
    with pytest.raises(PresetError, match="per domain only"):
        AcceptanceModel("assumed_mtp", 7, benchmark_mix={"gsm8k": 1.0})


def test_drafter_kind_is_shorthand_for_preset_and_latency_table():
    spec = DrafterSpec("dspark", 7)
    assert (spec.acceptance_preset, spec.latency_table) == ("qwen3-8b_dspark", "dspark")
    apart = DrafterSpec("dspark", 7, acceptance="qwen3-4b_eagle3", latency="mtp")
    assert (apart.acceptance_preset, apart.latency_table) == ("qwen3-4b_eagle3", "mtp")
    assert apart.acceptance_model().preset.name == "qwen3-4b_eagle3"
    with pytest.raises(PresetError, match="no default acceptance preset; set drafter.acceptance"):
        _ = DrafterSpec("medusa", 7).acceptance_preset
    with pytest.raises(PresetError, match="not a built-in preset"):
        load_preset("qwen3-9b_dspark")
    with pytest.raises(ValueError, match="apply to presets only"):
        DrafterSpec("dspark", 7, log="x.parquet", acceptance="qwen3-8b_dspark")


def test_the_default_preset_belongs_to_the_default_profiles_target():
    model = load_profile("h200_qwen3-8b_analytic").metadata["model"]
    assert load_preset(DrafterSpec().acceptance_preset).target.lower() == model


def test_older_callers_keep_their_qwen3_4b_view():
    assert preset("dspark", "math").tau(7) == pytest.approx(np.mean(TABLE1_QWEN3_4B["dspark"]["math"]), abs=1e-3)
    assert preset("mtp", "chat") == load_preset("assumed_mtp").curve("chat")


def test_curve_from_survival_and_tail():
    curve = AcceptanceCurve.from_survival([0.8, 0.6, 0.45], tail_decay=0.5)
    np.testing.assert_allclose(curve.conditional(5), [0.8, 0.75, 0.75, 0.375, 0.1875])
    assert curve.tau(3) == pytest.approx(1 + 0.8 + 0.6 + 0.45)
    with pytest.raises(ValueError, match="strictly decreasing"):
        AcceptanceCurve.from_survival([0.8, 0.9])
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        AcceptanceCurve((0.9, 1.0))


def test_the_latency_table_is_chosen_apart_from_the_preset(small_spec, default_profile):
    steps = simulate(small_spec(make_policy("mtp3"), drafter=DrafterSpec("dspark", 5, latency="mtp"))).steps
    row = steps.iloc[len(steps) // 2]
    assert row["draft_s"] == pytest.approx(default_profile.draft_s("mtp", int(row["num_requests"]), 3))
    assert row["draft_s"] != pytest.approx(default_profile.draft_s("dspark", int(row["num_requests"]), 3))


@pytest.mark.slow  # ~5 s: two subprocesses that fit presets
def test_fits_are_kept_on_disk_across_processes(tmp_path):
    """A second process finds the first one's fit on disk: it neither fits again nor imports the root finder."""
    import os
    import subprocess
    import sys
    code = ("import sys\nfrom simulator.acceptance import AcceptanceModel\n"
            "import numpy as np\nm = AcceptanceModel('dspark', 5)\n"
            "m.sample_step(np.random.default_rng(0), np.array([0, 1, 2]), np.zeros(3), 5)\n"
            "print('scipy.optimize' in sys.modules)")
    env = {**os.environ, "SPECSCHED_CACHE_DIR": str(tmp_path)}
    first, second = (subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                    check=True).stdout.strip() for _ in range(2))
    assert (first, second) == ("True", "False")
    assert any(tmp_path.rglob("output.pkl"))
