"""The Hydra app: configs compose for every policy and traffic, and the CLI runs end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from experiments.config import build_spec
from experiments.run import run

CONF = Path(__file__).resolve().parents[1] / "experiments" / "conf"
POLICIES = sorted(p.stem for p in (CONF / "policy").glob("*.yaml"))
TRAFFIC = sorted(p.stem for p in (CONF / "traffic").glob("*.yaml"))
DRAFTERS = sorted(p.stem for p in (CONF / "drafter").glob("*.yaml"))


def compose_cfg(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@pytest.mark.filterwarnings("ignore::simulator.LossyPolicyWarning")  # asserted in test_simulator
@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_runs(policy, tmp_path):
    cfg = compose_cfg(f"policy={policy}", "duration_s=3", "warmup_s=0.5", "progress=false",
                      "traffic.num_users=8")
    results = run(cfg, tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["num_steps"] > 0 and summary["output_tokens_per_s"] > 0
    assert (tmp_path / "requests.parquet").is_file() and (tmp_path / "steps.parquet").is_file()
    assert results.summary["policy"] == ("mtp" if policy.startswith("mtp") else policy)


@pytest.mark.parametrize("traffic", TRAFFIC)
def test_every_traffic_builds_and_runs(traffic, tmp_path):
    cfg = compose_cfg(f"traffic={traffic}", "duration_s=3", "warmup_s=0.5", "progress=false",
                      "write_tables=false")
    results = run(cfg, tmp_path)
    assert results.summary["num_requests_arrived"] > 0


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_every_drafter_composes(drafter):
    spec = build_spec(compose_cfg(f"drafter={drafter}"))
    assert spec.drafter.kind == drafter


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["traffic.arrival=sometimes"], "traffic.arrival must be closed, poisson or gamma"),
        (["+traffic.colour=red"], "traffic: unknown key.*colour.*valid keys"),
        (["hardware=/no/such/profile.json"], "neither a file nor a built-in profile"),
        (["+policy.staleness=3"], "has no parameter"),
        (["drafter.kind=medusa"], "valid drafters: eagle3, dflash, dspark, mtp"),
        (["+traffic.domain_mix.poetry=1.0"], "unknown domain"),
    ],
)
def test_bad_config_values_are_named(overrides, message):
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        build_spec(compose_cfg(*overrides))


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "experiments.run", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def test_cli_end_to_end(tmp_path):
    repo = Path(__file__).resolve().parents[1]
    out = tmp_path / "run"
    proc = _cli("policy=dspark", "traffic=chat", "duration_s=5", "warmup_s=1", "progress=false",
                f"hydra.run.dir={out}", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert "tok/s/user" in proc.stdout and "[ANALYTIC]" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["policy"] == "dspark" and summary["profile_source"] == "analytic"


def test_cli_unknown_group_option_lists_choices(tmp_path):
    repo = Path(__file__).resolve().parents[1]
    proc = _cli("policy=fastest", f"hydra.run.dir={tmp_path}", cwd=repo)
    assert proc.returncode != 0
    assert "Available options" in proc.stderr and "dspark" in proc.stderr


def test_cli_lossy_policy_is_flagged(tmp_path):
    repo = Path(__file__).resolve().parents[1]
    proc = _cli("policy=global_sync", "duration_s=2", "warmup_s=0", "progress=false", "write_tables=false",
                f"hydra.run.dir={tmp_path}", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert "LOSSY" in proc.stdout and "LOSSY" in proc.stderr


def test_drafter_log_replays_an_acceptance_log(tmp_path):
    import numpy as np

    from simulator.acceptance.logs import write_log
    from tests.log_factories import synthetic_log

    path = write_log(synthetic_log(np.random.default_rng(0), drafter="dspark", gamma=5), tmp_path / "log.parquet")
    cfg = compose_cfg(f"drafter.log={path}", "drafter.gamma=5", "policy=mtp5", "duration_s=3", "warmup_s=0.5",
                      "progress=false", "write_tables=false", "traffic.num_users=8")
    replayed = run(cfg, tmp_path).summary
    preset = run(compose_cfg("drafter.gamma=5", "policy=mtp5", "duration_s=3", "warmup_s=0.5", "progress=false",
                             "write_tables=false", "traffic.num_users=8"), tmp_path).summary
    assert replayed["mean_acceptance_length"] != preset["mean_acceptance_length"]
    assert 1.0 <= replayed["mean_acceptance_length"] <= 6.0
    with pytest.raises(ValueError, match="no drafter 'eagle3'"):
        run(compose_cfg(f"drafter.log={path}", "drafter.kind=eagle3", "drafter.gamma=5", "progress=false"), None)
