"""Load sweeps: Pareto envelopes and SLA reads on hand-made tables, and a small multirun end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from experiments.collect import SweepError, collect, load_latencies, load_sweep, main
from experiments.config import build_spec
from experiments.frontier import (
    THROUGHPUT,
    USER_SPEED,
    FrontierValue,
    best_at_least,
    matched_throughput,
    pareto_frontier,
    ratio_text,
    sla_table,
    throughput_at_sla,
    user_speed_at_throughput,
)
from experiments.plots import provenance, without_local_paths
from experiments.sweep_table import parse_overrides, sweep_frame, sweep_row, window_latencies

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "experiments" / "conf"


def points(label: str, pairs: list[tuple[float, float]]) -> pd.DataFrame:
    """A hand-made sweep: (tok/s/user, tok/s/GPU) per point."""
    return pd.DataFrame({"policy_label": label, USER_SPEED: [p[0] for p in pairs],
                         THROUGHPUT: [p[1] for p in pairs]})


# base: frontier A(10, 100), B(20, 80), D(30, 40); the others are dominated or duplicates.
BASE = points("base", [(10, 100), (20, 80), (15, 70), (30, 40), (30, 30), (5, 90), (20, 80)])
# fast: frontier (20, 150), (40, 100), (60, 50).
FAST = points("fast", [(60, 50), (40, 100), (20, 150), (30, 90)])
SWEEP = pd.concat([BASE, FAST], ignore_index=True)


# ---------------------------------------------------------------- Pareto envelope and frontier reads


def test_pareto_frontier_keeps_only_undominated_points_in_speed_order():
    front = pareto_frontier(BASE)
    assert list(zip(front[USER_SPEED], front[THROUGHPUT], strict=True)) == [(10, 100), (20, 80), (30, 40)]


def test_pareto_frontier_drops_nan_rows():
    with_nan = pd.concat([BASE, points("base", [(np.nan, 500.0), (50.0, np.nan)])], ignore_index=True)
    assert pareto_frontier(with_nan)[USER_SPEED].tolist() == [10, 20, 30]


@pytest.mark.parametrize(
    "sla, expected",
    [
        (25.0, FrontierValue(60.0, "interpolated")),  # halfway between (20, 80) and (30, 40)
        (10.0, FrontierValue(100.0, "interpolated")),  # on the first point
        (30.0, FrontierValue(40.0, "interpolated")),  # on the last point
        (7.0, FrontierValue(100.0, "peak")),  # past the frontier, but the sweep ran (5, 90): more load did not help
        (4.0, FrontierValue(100.0, "sweep_edge")),  # slower than anything the sweep ran: a lower bound
        (35.0, FrontierValue(None, "not_reached")),  # faster than any point: never extrapolated
    ],
)
def test_throughput_at_sla(sla, expected):
    assert throughput_at_sla(BASE, sla) == expected


@pytest.mark.parametrize(
    "throughput, expected",
    [
        (90.0, FrontierValue(15.0, "interpolated")),  # between (10, 100) and (20, 80)
        (30.0, FrontierValue(30.0, "peak")),  # below the frontier's 40, but (30, 30) was run
        (20.0, FrontierValue(30.0, "sweep_edge")),  # below anything run: a lighter load may be faster
        (120.0, FrontierValue(None, "not_reached")),
    ],
)
def test_user_speed_at_throughput(throughput, expected):
    assert user_speed_at_throughput(BASE, throughput) == expected


def test_best_at_least_rejects_a_non_frontier():
    with pytest.raises(ValueError, match="strictly ascending"):
        best_at_least(np.array([1.0, 1.0]), np.array([2.0, 1.0]), 1.0)


@pytest.mark.parametrize(
    "policy, baseline, text",
    [
        (FrontierValue(150.0, "interpolated"), FrontierValue(100.0, "interpolated"), "1.50x"),
        (FrontierValue(150.0, "sweep_edge"), FrontierValue(100.0, "interpolated"), ">= 1.50x"),
        (FrontierValue(150.0, "peak"), FrontierValue(100.0, "interpolated"), "1.50x"),
        (FrontierValue(150.0, "interpolated"), FrontierValue(100.0, "sweep_edge"), "<= 1.50x"),
        (FrontierValue(150.0, "sweep_edge"), FrontierValue(100.0, "sweep_edge"), "n/a (both at sweep edge)"),
        (FrontierValue(None, "not_reached"), FrontierValue(100.0, "interpolated"), "not reached"),
        (FrontierValue(150.0, "interpolated"), FrontierValue(None, "not_reached"), "baseline not reached"),
    ],
)
def test_ratio_text_marks_bounds(policy, baseline, text):
    assert ratio_text(policy, baseline) == text


def test_sla_table_interpolates_along_each_frontier():
    table = sla_table(SWEEP, "base", [25.0, 10.0, 50.0, 70.0]).set_index(["sla_tok_s_user", "policy"])
    # SLA 25: base 60 tok/s/GPU; fast 150 - 50 * 5/20 = 137.5. At base's 60 tok/s/GPU fast runs
    # 60 - 20 * 10/50 = 56 tok/s/user against base's 25.
    row = table.loc[(25.0, "fast")]
    assert row.throughput_tok_s_gpu == pytest.approx(137.5)
    assert row.throughput_vs_baseline == f"{137.5 / 60:.2f}x"
    assert row.matched_throughput_tok_s_gpu == pytest.approx(60.0)
    assert row.user_speed_at_matched_tok_s_user == pytest.approx(56.0)
    assert row.user_speed_vs_baseline == f"{56 / 25:.2f}x"
    assert table.loc[(25.0, "base")].throughput_vs_baseline == "1.00x"
    # SLA 10: fast's most loaded point already runs 20 tok/s/user, so 150 is a lower bound.
    assert table.loc[(10.0, "fast")].throughput_vs_baseline == ">= 1.50x"
    assert table.loc[(10.0, "fast")].user_speed_vs_baseline == "4.00x"
    # SLA 50: the baseline never runs that fast; SLA 70: nobody does.
    assert table.loc[(50.0, "fast")].throughput_tok_s_gpu == pytest.approx(75.0)
    assert table.loc[(50.0, "fast")].throughput_vs_baseline == "baseline not reached"
    assert table.loc[(70.0, "fast")].throughput_vs_baseline == "not reached"


def test_matched_throughput_keeps_only_interpolated_points():
    matched = matched_throughput(SWEEP, "base")
    # base frontier throughputs 100, 80, 40; fast's frontier spans 50..150, so 40 is left out.
    assert matched[["throughput_tok_s_gpu", "baseline_tok_s_user", "policy_tok_s_user"]].values.tolist() == [
        [100.0, 10.0, 40.0], [80.0, 20.0, 48.0]]
    assert matched["speedup"].tolist() == pytest.approx([4.0, 2.4])


def test_sla_table_names_a_missing_baseline():
    with pytest.raises(ValueError, match="baseline 'mtp1' is not in the sweep; policies found: base, fast"):
        sla_table(SWEEP, "mtp1", [80.0])


# ---------------------------------------------------------------- sweep table


def _summary(policy: str, params: dict, lossless: bool = True) -> dict:
    return {"policy": policy, "policy_params": params, "lossless": lossless, "drafter": "dspark", "gamma": 5,
            "profile": "p (analytic)", "profile_source": "analytic", "seed": 0, "num_decode_gpus": 1,
            "output_tokens_per_s_per_gpu": 1.0, "tokens_per_s_per_user": {"mean": 1.0, "p50": 1.0, "p90": 1.0},
            "verification_budget_per_request": 3.0, "mean_acceptance_length": 2.5}


def test_labels_name_mtp_k_varying_parameters_and_lossy_policies():
    config = {"traffic": {"name": "chat", "arrival": "closed", "num_users": 4}, "cluster": {"num_decode_engines": 1}}
    summaries = [_summary("mtp", {"k": 3}), _summary("threshold", {"theta": 0.2, "variant": "prefix"}),
                 _summary("threshold", {"theta": 0.5, "variant": "prefix"}),
                 _summary("global_sync", {"objective": "tokens_x_sps"}, lossless=False)]
    frame = sweep_frame([sweep_row(str(i), s, config, ["policy=x"]) for i, s in enumerate(summaries)])
    assert frame["policy_label"].tolist() == ["global_sync (LOSSY)", "mtp3", "threshold theta=0.2",
                                              "threshold theta=0.5"]
    # budget 3 = 1 + 2 verified draft tokens, tau 2.5 = 1 + 1.5 accepted: 0.5 rejected per request-step.
    assert frame["rejected_draft_tokens_per_request_step"].tolist() == [0.5] * 4
    assert frame["offered_load"].tolist() == [4] * 4 and frame["override.policy"].tolist() == ["x"] * 4


def test_parse_overrides():
    assert parse_overrides(["policy=mtp1", "+x.y=1", "traffic.num_users=8"]) == {
        "policy": "mtp1", "x.y": "1", "traffic.num_users": "8"}


# ---------------------------------------------------------------- collect: bad input


def test_collect_names_an_empty_directory(tmp_path):
    with pytest.raises(SweepError, match="no summary.json found; expected a Hydra multirun directory"):
        load_sweep(tmp_path)


def test_collect_names_a_missing_directory(tmp_path):
    with pytest.raises(SweepError, match="no such directory"):
        load_sweep(tmp_path / "nope")


def test_collect_names_a_job_without_hydra_files(tmp_path):
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "summary.json").write_text(json.dumps(_summary("mtp", {"k": 1})))
    with pytest.raises(SweepError, match=r"0: has summary.json but no .hydra/overrides.yaml"):
        load_sweep(tmp_path)


def write_job(root: Path, name: str, summary: dict, traffic: str = "chat", num_users: int = 4) -> None:
    """A job directory as ``experiments.run -m`` leaves it (summary.json and the .hydra files)."""
    job = root / name
    (job / ".hydra").mkdir(parents=True)
    (job / "summary.json").write_text(json.dumps(summary))
    (job / ".hydra" / "overrides.yaml").write_text(f"- traffic={traffic}\n- traffic.num_users={num_users}\n")
    (job / ".hydra" / "config.yaml").write_text(
        f"traffic: {{name: {traffic}, arrival: closed, num_users: {num_users}}}\n"
        "cluster: {num_decode_engines: 1}\nhardware: p\nwarmup_s: 1.0\n")


def test_collect_refuses_frontiers_across_traffic_setups(tmp_path):
    for i, (traffic, users) in enumerate([("chat", 4), ("chat", 8), ("code", 4), ("code", 8)]):
        write_job(tmp_path / "sweep", str(i), _summary("mtp", {"k": 1}), traffic, users)
    written, report = collect(tmp_path / "sweep", tmp_path / "out")
    assert "the sweep mixes traffic_name (chat, code)" in report
    assert {p.name for p in written} == {"sweep.csv", "sweep.parquet"}
    with pytest.raises(SweepError, match="--baseline 'mtp1': no frontiers to compare, the sweep mixes traffic"):
        collect(tmp_path / "sweep", tmp_path / "out", baseline="mtp1")


def test_collect_names_jobs_without_summary(tmp_path):
    write_job(tmp_path, "0", _summary("mtp", {"k": 1}), num_users=4)
    write_job(tmp_path, "1", _summary("mtp", {"k": 1}), num_users=8)
    (tmp_path / "1" / "summary.json").unlink()  # a job that crashed
    with pytest.raises(SweepError, match=r"1 job\(s\) have no summary.json .*: 1; pass --allow-missing"):
        load_sweep(tmp_path)
    assert len(load_sweep(tmp_path, allow_missing=True)) == 1


def test_collect_cli_exits_with_the_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path)])
    assert exit_info.value.code == 2
    assert "no summary.json found" in capsys.readouterr().err


# ---------------------------------------------------------------- provenance stamps and latency CDFs


def _with_run_record(summary: dict, revision: str | None) -> dict:
    """A summary as experiments.run now writes it: window and code revision recorded."""
    record = {"window_s": 4.0, "window_start_at": 1.0, "window_end_at": 5.0}
    if revision is not None:
        record["code_revision"] = {"commit": f"{revision}0000", "describe": revision, "dirty": False}
    return {**summary, **record}


@pytest.mark.parametrize("revisions, text", [
    (["abc1234"] * 2, "rev abc1234"),
    (["abc1234", "def5678-dirty"], "revs differ: abc1234, def5678-dirty"),
    (["abc1234", None], "rev abc1234 + unrecorded"),  # one run from before summaries recorded revisions
    ([None, None], "rev not recorded"),
])
def test_figures_are_stamped_with_the_runs_revisions(revisions, text):
    config = {"traffic": {"name": "chat", "arrival": "closed", "num_users": 4}, "cluster": {"num_decode_engines": 1}}
    rows = [sweep_row(str(i), _with_run_record(_summary("mtp", {"k": 1}), rev), config, []) for i, rev in
            enumerate(revisions)]
    assert provenance(sweep_frame(rows)) == f"profile: p (analytic) | {text}"


def test_figure_text_never_shows_a_local_path():
    assert without_local_paths("traffic: /home/me/traces/burst.csv") == "traffic: burst.csv"
    assert without_local_paths("a (~/p/h200.json) and C:\\data\\x.jsonl") == "a (h200.json) and x.jsonl"
    assert without_local_paths("SLA 80 tok/s/user") == "SLA 80 tok/s/user"


def test_sweep_table_flattens_the_revision_and_leaves_the_config_out():
    summary = {**_with_run_record(_summary("mtp", {"k": 1}), "abc1234"), "config": {"seed": 0},
               "traffic_source": {"kind": "synthetic", "spec": {"arrival": "closed"}}}
    row = sweep_row("0", summary, {"cluster": {"num_decode_engines": 1}}, [])
    assert row["code_revision_describe"] == "abc1234" and row["code_revision_dirty"] is False
    assert "config" not in row and json.loads(row["traffic_source"])["spec"] == {"arrival": "closed"}


def _requests_table(first_token_at: list[float], finished_at: list[float]) -> pd.DataFrame:
    first, done = np.array(first_token_at), np.array(finished_at)
    return pd.DataFrame({"first_token_at": first, "finished_at": done, "ttft_s": first - 0.5,
                         "tpot_s": (done - first) / 10, "other": 0})


def test_window_latencies_take_the_summarys_populations():
    table = _requests_table([0.9, 1.5, 2.0, 4.0, 5.5], [2.0, 3.0, np.nan, 6.0, np.nan])
    latencies = window_latencies(table, start_at=1.0, end_at=5.0)
    # first tokens in (1, 5]: 1.5, 2.0, 4.0; finishes in (1, 5]: 2.0 (first token at 0.9), 3.0.
    assert latencies["ttft_s"].tolist() == pytest.approx([np.nan, 1.0, 1.5, 3.5], nan_ok=True)
    assert latencies["tpot_s"].tolist() == pytest.approx([0.11, 0.15, np.nan, np.nan], nan_ok=True)


def test_collect_draws_latency_cdfs_and_names_runs_without_request_tables(tmp_path):
    root = tmp_path / "sweep"
    for i, k in enumerate((1, 5, 3)):  # one load: no frontier, but CDFs all the same
        write_job(root, str(i), _with_run_record(_summary("mtp", {"k": k}), "abc1234"))
    for i in (0, 2):
        _requests_table([1.5, 2.0, 3.0], [2.5, 4.0, np.nan]).to_parquet(root / str(i) / "requests.parquet")
    written, report = collect(root, tmp_path / "out")
    assert {"latency_cdf.png", "latency_cdf.svg"} <= {p.name for p in written}
    assert "1 of 3 runs have no requests.parquet (run with write_tables=true) or no window in their summary, " \
           "so the latency CDFs leave them out: 1" in report
    latencies, missing = load_latencies(root, load_sweep(root))
    assert missing == ["1"] and sorted(latencies["policy_label"].unique()) == ["mtp1", "mtp3"]
    assert latencies["ttft_s"].notna().sum() == 6 and latencies["tpot_s"].notna().sum() == 4


def test_collect_says_when_no_run_kept_its_request_table(tmp_path):
    write_job(tmp_path, "0", _with_run_record(_summary("mtp", {"k": 1}), "abc1234"))
    written, report = collect(tmp_path, tmp_path / "out")
    assert "no TTFT/TPOT CDFs: no run wrote its request table" in report
    assert "latency_cdf.png" not in {p.name for p in written}


# ---------------------------------------------------------------- presets compose


@pytest.mark.parametrize("policy, drafter", [("mtp1", "mtp"), ("mtp5", "mtp"), ("dspark", "dspark")])
def test_v4flash_preset_pairs_each_policy_with_its_drafter(policy, drafter):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=v4flash_prod", f"policy={policy}"])
    spec = build_spec(cfg)
    assert (spec.drafter.kind, spec.drafter.gamma) == (drafter, 5)
    assert spec.profile.gpus_per_replica == 8 and spec.profile.source == "analytic"


@pytest.mark.parametrize("experiment", sorted(p.stem for p in (CONF / "experiment").glob("*.yaml")))
def test_every_experiment_composes_with_its_sweep(experiment):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"experiment={experiment}"], return_hydra_config=True)
    assert cfg.hydra.sweeper.params, f"experiment {experiment} defines no sweep"
    build_spec(cfg)


# ---------------------------------------------------------------- a small multirun end to end

CONCURRENCY = (128, 512, 1024)  # requests per 8-GPU replica: moderate, high, the profile's limit


@pytest.fixture(scope="module")
def small_sweep(tmp_path_factory) -> Path:
    """experiment=v4flash_prod, 2 policies x 3 concurrencies, 10 simulated seconds, through the joblib launcher,
    with the request tables."""
    sweep_dir = tmp_path_factory.mktemp("sweep") / "multirun"
    args = ["-m", "experiment=v4flash_prod", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
            f"hydra.sweep.dir={sweep_dir}", "policy=mtp1,dspark",
            "traffic.num_users=" + ",".join(map(str, CONCURRENCY)), "duration_s=10", "warmup_s=3",
            "write_tables=true"]  # the preset keeps no tables; the latency CDFs need them
    proc = subprocess.run([sys.executable, "-m", "experiments.run", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return sweep_dir


@pytest.mark.slow  # a real 6-job multirun through the joblib launcher
def test_small_sweep_collects_into_tables_and_figures(small_sweep, tmp_path):
    out = tmp_path / "collected"
    written, report = collect(small_sweep, out, baseline="mtp1", slas=[80.0, 120.0])
    for name in ("sweep.csv", "sweep.parquet", "frontier.csv", "sla_table.md", "frontier.png", "frontier.svg",
                 "load.png", "load.svg", "sla_table.png", "sla_table.svg"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    assert "threshold.png" not in {p.name for p in written}  # no threshold sweep here
    table = pd.read_parquet(out / "sweep.parquet")
    assert len(table) == 6
    assert set(table["policy_label"]) == {"mtp1", "dspark"}
    assert sorted(table["num_users"].unique()) == list(CONCURRENCY)
    assert set(table["override.policy"]) == {"mtp1", "dspark"}
    assert "| 80 | dspark |" in report
    assert {"latency_cdf.png", "latency_cdf.svg"} <= {p.name for p in written}
    assert set(table["code_revision_describe"]) == {table["code_revision_describe"].iloc[0]}  # one checkout


@pytest.mark.slow  # a real 6-job multirun through the joblib launcher
def test_small_sweep_shows_the_production_shapes(small_sweep):
    sweep = load_sweep(small_sweep)
    by = {(row.policy_label, row.num_users): row for row in sweep.itertuples()}
    # MTP-1 always verifies its one draft token: a budget of exactly 2 target tokens per request.
    assert all(by[("mtp1", n)].verification_budget_per_request == 2.0 for n in CONCURRENCY)
    # DSpark out-serves MTP-1 at moderate load, by a margin, and is faster per user at every load.
    assert by[("dspark", 512)].output_tokens_per_s_per_gpu >= 1.2 * by[("mtp1", 512)].output_tokens_per_s_per_gpu
    assert all(by[("dspark", n)].tokens_per_s_per_user_mean > by[("mtp1", n)].tokens_per_s_per_user_mean
               for n in CONCURRENCY)
    # ...with a budget of 4-6 tokens there, that falls as load grows.
    budgets = [by[("dspark", n)].verification_budget_per_request for n in CONCURRENCY]
    assert 4.0 <= budgets[0] <= 6.0
    assert budgets[0] > budgets[1] + 0.1 and budgets[1] > budgets[2] + 0.5, budgets


@pytest.mark.slow  # a real 6-job multirun through the joblib launcher
def test_collect_is_deterministic(small_sweep, tmp_path):
    collect(small_sweep, tmp_path / "a", baseline="mtp1")
    collect(small_sweep, tmp_path / "b", baseline="mtp1")
    for name in ("sweep.csv", "sla_table.md", "frontier.svg", "load.svg", "latency_cdf.svg"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


@pytest.mark.slow  # a real 6-job multirun through the joblib launcher
def test_collect_rejects_a_baseline_not_in_the_sweep(small_sweep, tmp_path):
    with pytest.raises(SweepError, match="--baseline 'mtp3' is not in the sweep; policies found: dspark, mtp1"):
        collect(small_sweep, tmp_path, baseline="mtp3")
