"""``python -m calibration.acceptance.fit_acceptance``: preset files from DeepSpec eval tables, published numbers
and logs, their fit check, and runs that use them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from calibration.acceptance.fit_acceptance import main
from calibration.acceptance.inputs import InputError, read_deepspec, read_published
from policies import make_policy
from simulator import DrafterSpec, SimulationSpec, load_profile, simulate
from simulator.acceptance.logs import write_log
from simulator.acceptance.presets import load_preset
from tests.log_factories import synthetic_log
from traces.synthetic import TrafficSpec

# What DeepSpec's eval.py prints (deepspec/eval/base_evaluator.py, build_results_table, with prettytable), for
# a hypothetical drafter of a team's own: one row per dataset, accept_rate@k a prefix survival.
HEADER = ["dataset", "target_model", "draft_model", "#propose", "accept_len", "verify_rate", "samples", "out_tokens",
          "tok/s", "verify/s", *[f"accept_rate@{k}" for k in range(7)]]
ROWS = [
    ["gsm8k", "Qwen3-32B", "step_latest", "7.00+1", "6.11", "0.7638", "500", "201234", "512.33", "95.12",
     "0.9490", "0.8700", "0.7950", "0.7250", "0.6600", "0.6000", "0.5450"],
    ["humaneval", "Qwen3-32B", "step_latest", "6.98+1", "5.38", "0.6741", "164", "80233", "498.10", "93.40",
     "0.9300", "0.8250", "0.7180", "0.6150", "0.5200", "0.4350", "0.3600"],
    ["mt-bench", "Qwen3-32B", "step_latest", "7.00+1", "3.66", "0.4575", "80", "40110", "401.20", "101.00",
     "0.7800", "0.5900", "0.4400", "0.3280", "0.2420", "0.1760", "0.1270"],
    ["arena-hard-v2", "Qwen3-32B", "step_latest", "7.00+1", "3.25", "0.4063", "500", "150311", "388.00", "104.30",
     "0.7300", "0.5200", "0.3680", "0.2600", "0.1820", "0.1270", "0.0880"],
]


def pretty_table(rows: list[list[str]]) -> str:
    """The rows as prettytable draws them, after the JSON line eval.py prints first."""
    widths = [max(len(cell) for cell in column) + 2 for column in zip(HEADER, *rows, strict=True)]
    rule = "+" + "+".join("-" * w for w in widths) + "+"

    def line(cells: list[str]) -> str:
        return "|" + "|".join(cell.center(w) for cell, w in zip(cells, widths, strict=True)) + "|"

    body = [rule, line(HEADER), rule, *map(line, rows), rule]
    return "\n".join(['{"target_name_or_path": "Qwen/Qwen3-32B", "temperature": 1.0}', *body]) + "\n"


DEEPSPEC_TABLE = pretty_table(ROWS)


@pytest.fixture
def deepspec_table(tmp_path):
    path = tmp_path / "eval_output.txt"
    path.write_text(DEEPSPEC_TABLE)
    return path


def test_deepspec_rows_read_as_survival_curves(deepspec_table):
    rows = read_deepspec(deepspec_table)
    assert [(r.name, r.domain) for r in rows] == [("gsm8k", "math"), ("humaneval", "code"), ("mt_bench", "chat"),
                                                 ("arena_hard", "chat")]
    gsm8k = rows[0]
    assert (gsm8k.target, gsm8k.drafter, gsm8k.gamma, gsm8k.tau) == ("Qwen3-32B", "step_latest", 7, 6.11)
    assert gsm8k.survival == (0.949, 0.87, 0.795, 0.725, 0.66, 0.6, 0.545)
    assert gsm8k.extra["verify_rate"] == "0.7638" and gsm8k.extra["samples"] == "500"  # kept, not dropped


def test_the_tab_separated_layout_reads_the_same(deepspec_table, tmp_path):
    lines = [line for line in DEEPSPEC_TABLE.splitlines() if line.startswith("|")]  # what prints without prettytable
    tsv = tmp_path / "eval.tsv"
    tsv.write_text("\n".join("\t".join(c.strip() for c in line.strip("|").split("|")) for line in lines) + "\n")
    def fields(rows):
        return [(r.target, r.drafter, r.name, r.domain, r.gamma, r.tau, r.survival, r.extra) for r in rows]

    assert fields(read_deepspec(tsv)) == fields(read_deepspec(deepspec_table))


def test_one_command_from_a_deepspec_table_to_a_simulation(deepspec_table, tmp_path, capsys):
    out = tmp_path / "presets"
    assert main([str(deepspec_table), "--out-dir", str(out), "--name", "qwen3-32b_mine", "--requests", "3000",
                 "--created", "2026-01-02"]) == 0
    printed = capsys.readouterr().out
    assert "tau_simulated" in printed and "largest |simulated - input|" in printed
    path = out / "qwen3-32b_mine.json"
    data = json.loads(path.read_text())
    assert (data["format"], data["version"], data["created"]) == ("specsched-acceptance-preset", 1, "2026-01-02")
    assert data["source"]["kind"] == "deepspec-eval" and len(data["inputs"]) == 4
    for row in data["check"]:  # the fit's own check: simulated tau vs the table's accept_len, per row
        assert abs(row["error_pct"]) < 2.0, row
    preset = load_preset(path)
    np.testing.assert_allclose(preset.benchmark("gsm8k")[1].survival(7),
                               [0.949, 0.87, 0.795, 0.725, 0.66, 0.6, 0.545], atol=1e-6)
    assert preset.curve("chat").tau(7) == pytest.approx((3.66 + 3.25) / 2, abs=0.03)  # mean of the chat rows
    assert "code" in preset.domains and "math" in preset.domains
    spec = SimulationSpec(policy=make_policy("dspark"), profile=load_profile("h200_qwen3-8b_analytic"),
                          drafter=DrafterSpec("dspark", 7, acceptance=str(path), latency="dspark",
                                              benchmark_mix={"mt_bench": 1.0, "arena_hard": 1.0}),
                          traffic=TrafficSpec(num_users=8, max_output_tokens=128), duration_s=2.0, seed=1)
    assert simulate(spec).summary["mean_acceptance_length"] > 1.5


def test_a_thresholded_eval_is_refused(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text(pretty_table([ROWS[0][:3] + ["5.31+1", "5.20"] + ROWS[0][5:], *ROWS[1:]]))
    with pytest.raises(InputError, match=r"line 5: #propose 5.31\+1 .* --confidence-threshold 0"):
        read_deepspec(path)


def test_an_unknown_dataset_needs_a_domain(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text(pretty_table([["internal-qa"] + ROWS[0][1:], *ROWS[1:]]))
    with pytest.raises(InputError, match="no domain for benchmark 'internal_qa'.*--domain internal_qa="):
        read_deepspec(path)
    assert read_deepspec(path, {"internal_qa": "chat"})[0].domain == "chat"


def test_published_tau_needs_its_block_size_and_a_shape(tmp_path):
    csv = tmp_path / "numbers.csv"
    csv.write_text("# a paper's table\nbenchmark,tau\ngsm8k,5.9\nhumaneval,5.0\nalpaca,3.1\n")
    with pytest.raises(InputError, match="data row 1: no target or drafter"):
        read_published(csv)
    with pytest.raises(InputError, match="no block size: add a gamma column or pass --gamma"):
        read_published(csv, target="Llama-3-70B", drafter="dspark")
    out = tmp_path / "presets"
    assert main([str(csv), "--target", "Llama-3-70B", "--drafter", "medusa", "--gamma", "5",
                 "--out-dir", str(out)]) == 2  # no curve shape for an unknown drafter kind
    assert main([str(csv), "--target", "Llama-3-70B", "--drafter", "medusa", "--gamma", "5", "--shape-from",
                 "qwen3-8b_dflash", "--out-dir", str(out), "--requests", "3000"]) == 0
    preset = load_preset(out / "llama-3-70b_medusa.json")
    assert preset.fit_positions == 5
    assert preset.benchmark("gsm8k")[1].tau(5) == pytest.approx(5.9, abs=1e-5)  # tau over the given gamma
    assert all(abs(row["error_pct"]) < 2.0 for row in preset.metadata["check"])


def test_an_acceptance_log_becomes_a_preset_with_its_head_auc(tmp_path):
    log = tmp_path / "log.parquet"
    write_log(synthetic_log(np.random.default_rng(4), num_requests=80, num_tokens=50), log)
    out = tmp_path / "presets"
    assert main([str(log), "--target", "tiny-byte", "--out-dir", str(out), "--requests", "2000"]) == 0
    preset = load_preset(out / "tiny-byte_dspark.json")
    assert preset.confidence_auc is not None and len(preset.confidence_auc) == 7
    assert preset.metadata["source"]["kind"] == "acceptance-log"
    assert all(abs(row["error_pct"]) < 3.0 for row in preset.metadata["check"])
