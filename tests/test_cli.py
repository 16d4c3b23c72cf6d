"""The Hydra app: configs compose for every policy and traffic, and the CLI runs end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from experiments.config import ConfigError, build_spec
from experiments.report import format_summary
from experiments.run import run
from simulator import LossyPolicyWarning
from traces.load import TraceReplayWarning

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


SAMPLES_DIR = Path(__file__).resolve().parents[1] / "traces" / "samples"
BURSTGPT = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
0,ChatGPT,472,18,490,Conversation log
0.4,ChatGPT,1087,0,1087,Conversation log
0.9,GPT-4,300,250,550,API log
1.5,ChatGPT,64,31,95,API log
"""
GENERIC = "arrival_s,prompt_tokens,output_tokens,domain\n0,100,20,math\n0.5,200,30,support\n1.0,50,10,code\n"


@pytest.fixture
def user_traces(tmp_path) -> dict[str, Path]:
    """A file of each trace format, as a user would pass it with ``traffic=<format> traffic.trace=PATH``."""
    (tmp_path / "BurstGPT_1.csv").write_text(BURSTGPT)
    (tmp_path / "requests.csv").write_text(GENERIC)
    return {"azure": SAMPLES_DIR / "azure_code.csv", "mooncake": SAMPLES_DIR / "mooncake_conversation.jsonl",
            "burstgpt": tmp_path / "BurstGPT_1.csv", "generic": tmp_path / "requests.csv"}


@pytest.mark.filterwarnings("ignore::traces.load.TraceReplayWarning")  # BurstGPT's failed requests, dropped
@pytest.mark.parametrize("traffic", TRAFFIC)
def test_every_traffic_builds_and_runs(traffic, tmp_path, user_traces):
    file = [f"traffic.trace={user_traces[traffic]}"] if traffic in user_traces else []
    options = ["traffic.domain_map.support=chat"] if traffic == "generic" else []
    cfg = compose_cfg(f"traffic={traffic}", *file, *options, "duration_s=3", "warmup_s=0.5", "progress=false",
                      "write_tables=false")
    results = run(cfg, tmp_path)
    assert len(results.requests) > 0  # requests that arrived (in the window or during the warm-up)


def test_user_trace_options_are_plain_keys(user_traces):
    # zero_output, domain_map, domain_mix and the rate are keys of every trace option: no "+" needed.
    with pytest.warns(TraceReplayWarning, match="1 requests with 0 output tokens"):
        spec = build_spec(compose_cfg("traffic=burstgpt", f"traffic.trace={user_traces['burstgpt']}",
                                      "traffic.zero_output=one_token", "traffic.domain_map.burstgpt=code",
                                      "traffic.target_rate_per_s=2"))
    assert spec.traffic.source == "BurstGPT_1.csv" and spec.traffic.num_requests == 4
    assert set(spec.traffic.domain) == {"code"} and spec.traffic.output_tokens.min() == 1
    spec = build_spec(compose_cfg("traffic=generic", f"traffic.trace={user_traces['generic']}",
                                  "traffic.domain_mix={math: 1.0}"))
    assert set(spec.traffic.domain) == {"math"}


def test_a_sample_config_replays_the_full_file_of_its_format(user_traces):
    spec = build_spec(compose_cfg("traffic=azure_conv", f"traffic.trace={user_traces['azure']}"))
    assert spec.traffic.source == "azure_code.csv"


def test_a_sample_config_refuses_a_file_of_another_format(user_traces):
    # A BurstGPT file under traffic=azure_conv would be labelled azure_conv.
    with pytest.raises(ConfigError, match="a burstgpt trace, but traffic=azure_conv .* use traffic=burstgpt"):
        build_spec(compose_cfg("traffic=azure_conv", f"traffic.trace={user_traces['burstgpt']}"))


def test_length_distributions_are_set_from_the_command_line():
    spec = build_spec(compose_cfg("traffic.lengths.chat.output_median_tokens=500",
                                  "traffic.lengths.math.prompt_sigma=0.2"))
    assert spec.traffic.lengths["chat"].output_median_tokens == 500
    assert spec.traffic.lengths["math"].prompt_sigma == 0.2
    assert spec.traffic.lengths["code"].output_median_tokens == 350  # the other domains keep their defaults


def test_group_mappings_are_replaced_not_merged():
    # traffic=code states domain_mix whole; the schema has no default that it would merge into.
    assert build_spec(compose_cfg("traffic=code")).traffic.domain_mix == {"code": 1.0}


@pytest.mark.parametrize("policy, k", [("mtp1", 1), ("mtp3", 3), ("mtp5", 5)])
def test_mtp_shorthands_fix_k(policy, k):
    assert build_spec(compose_cfg(f"policy={policy}")).policy.k == k


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_every_drafter_composes(drafter):
    spec = build_spec(compose_cfg(f"drafter={drafter}"))
    assert spec.drafter.kind == drafter


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


def test_cli_lossy_policy_is_flagged(tmp_path):
    # in this process (the command's own run; test_cli_end_to_end starts a fresh interpreter): a warning on
    # stderr as the run starts and a mark on the summary the command prints
    cfg = compose_cfg("policy=global_sync", "duration_s=2", "warmup_s=0", "progress=false", "write_tables=false")
    with pytest.warns(LossyPolicyWarning, match="global_sync is LOSSY"):
        summary = run(cfg, tmp_path).summary
    assert "LOSSY" in format_summary(summary)


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
