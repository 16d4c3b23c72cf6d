"""Bad input stops ``python -m experiments.run`` at start with one line naming the key or file, the value and
what is valid; exit code 2 and no traceback (unless ``HYDRA_FULL_ERROR=1``).

Most rows go through ``compose()`` and the command's own checks (:func:`experiments.run.prepare`) and the
message the command prints (:func:`experiments.errors.user_message`); a few call the command's entry point
(:func:`experiments.run.cli`), and two run it in a new interpreter.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from experiments.errors import user_message
from experiments.run import cli, prepare
from policies import make_policy, policy_classes

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "experiments" / "conf"
BUILTIN_PROFILE = REPO / "simulator" / "profiles" / "h200_qwen3-8b_analytic.json"


def message_for(*overrides: str) -> str:
    """The line the command prints for ``overrides``; fails if it would run, or print a traceback."""
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose(config_name="config", overrides=list(overrides))
        prepare(cfg)
    except Exception as err:  # every kind of error the command can meet at start
        message = user_message(err, setup=True)
        assert message is not None, f"{overrides}: {err!r} would print a traceback"
        assert "\n" not in message
        return message
    pytest.fail(f"{overrides} was accepted")


@pytest.mark.parametrize(
    "overrides, expected",
    [
        # the list: each ran with wrong or empty results, or died in a traceback naming no key
        (["duration_s=0"], "duration_s=0.0: must be a finite number > 0"),
        (["duration_s=-1"], "duration_s=-1.0: must be a finite number > 0"),
        (["duration_s=abc"], "duration_s=abc: must be a number"),
        (["duration_s=inf"], "duration_s=inf: must be a finite number > 0"),
        (["warmup_s=30", "duration_s=20"], "warmup_s=30.0: must be < duration_s=20.0"),
        (["warmup_s=20", "duration_s=20"], "warmup_s=20.0: must be < duration_s=20.0"),  # an empty window
        (["warmup_s=-5"], "warmup_s=-5.0: must be a finite number >= 0"),
        (["cluster.max_concurrency=0"], "cluster.max_concurrency=0: must be >= 1"),
        (["cluster.max_concurrency=-3"], "cluster.max_concurrency=-3: must be >= 1"),
        (["policy.objective=foo"], "policy.objective=foo: must be one of tokens_x_sps, tokens_per_s"),
        (["policy=greedy", "policy.objective=foo"], "policy.objective=foo: must be one of"),  # each policy's own
        (["seed=1.5"], "seed=1.5: must be an integer"),  # was silently truncated to 1
        (["seed=abc"], "seed=abc: must be an integer"),
        (["seed=-1"], "seed=-1: must be >= 0"),
        (["interval_jobs=0"], "interval_jobs=0: a number of processes >= 1, or -1 for one per CPU"),
        (["interval_jobs=-2"], "interval_jobs=-2: a number of processes"),
        (["traffic.num_users=8.5"], "traffic.num_users=8.5: must be an integer"),
        (["traffic.num_users=0"], "traffic.num_users must be >= 1, got 0"),
        (["drafter.gamma=-1"], "drafter.gamma=-1: must be >= 0"),
        (["policy=threshold", "policy.theta=high"], "policy.theta=high: must be a number"),
        (["policy=threshold", "policy.theta=1.5"], "policy.theta must lie in [0, 1], got 1.5"),
        # unknown keys list the valid ones, unknown options the available ones
        (["foo=1"], "foo: unknown key; valid keys: policy, traffic, drafter, cluster"),
        (["+foo=1"], "foo: unknown key; valid keys: policy, traffic"),  # "+" cannot add keys to the schema
        (["policy.thta=0.5"], "policy.thta: unknown key; valid keys: name, staleness_steps, objective, ema_decay"),
        (["+policy.staleness=3"], "policy.staleness: unknown key; valid keys: name, staleness_steps"),
        (["traffic.colour=red"], "traffic.colour: unknown key; valid keys: name, benchmark_mix, arrival, domain_mix"),
        (["policy=dsprk"], "policy=dsprk: no such option; available: dspark, global_sync, goodput, greedy, mtp"),
        (["experiment=nope"], "experiment=nope: no such option; available: greedy_trap, threshold_sweep"),
        # other values out of their range or set
        (["traffic.arrival=sometimes"], "traffic.arrival=sometimes: must be one of closed, poisson, gamma"),
        (["traffic.domain_mix.poetry=1.0"], "traffic.domain_mix: unknown domain(s) ['poetry']"),
        (["traffic.lengths.chat.output_median_tokens=0"], "traffic.lengths.chat.output_median_tokens=0.0: must be"),
        (["drafter.kind=medusa"], "drafter.kind=medusa: must be one of "),
        (["drafter.log_order=sideways"], "drafter.log_order must be auto, walk or independent"),
        (["cluster.router=random"], "cluster.router must be round_robin or least_loaded, got 'random'"),
        (["policy=mtp3", "policy.k=4"], "policy.k=4: policy=mtp3 fixes k=3; use policy=mtp policy.k=4"),
        (["policy=mtp", "policy.k=0"], "policy.k must be >= 1, got 0"),
        (["policy=dspark", "policy.staleness_steps=3"], "policy.staleness_steps must be 0, 1 or 2, got 3"),
        (["acceptance.confidence.auc=0.4"], "acceptance.confidence.auc=0.4: "),
        (["traffic=azure_conv", "traffic.zero_output=maybe"], "traffic.zero_output=maybe: must be one of error"),
        (["traffic=azure_conv", "traffic.end_s=0"], "traffic: time window needs 0 <= start_s < end_s"),
        (["traffic=burstgpt"], "traffic.trace is required"),
        (["traffic=burstgpt", "traffic.trace=/no/such.csv"], "traffic.trace=/no/such.csv: no such file"),
        (["hardware=/no/such/profile.json"], "neither a file nor a built-in profile; built-in profiles: h100"),
        # known at start, failed minutes into a run before
        (["cluster.max_concurrency=2000"], "verify.batch_tokens ends at 8192, but a step can hold 16000 batch tokens"),
        (["cluster.max_concurrency=1100", "policy=none"], "per_request.num_requests covers 1..1024, but steps hold"),
        (["drafter.gamma=20"], "draft.dspark.draft_tokens covers 1..16, but every step drafts 20 tokens"),
        (["policy=mtp5", "drafter.gamma=3"], "policy mtp drafts 5 tokens per step but drafter.gamma=3"),
        (["cluster.kv_capacity_tokens=30000"], "max_output_tokens = 36864 KV tokens, but cluster.kv_capacity_tokens"),
        (["traffic=azure_conv", "cluster.kv_capacity_tokens=100"], "traffic azure_conv: request"),
        (["traffic=poisson", "duration_s=null"], None),  # open loop runs to completion: fine, no error
        (["duration_s=null"], "duration_s=null: closed-loop traffic never ends; set duration_s"),
    ],
)
def test_bad_config_is_one_line_naming_the_key(overrides, expected):
    if expected is None:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            prepare(compose(config_name="config", overrides=[*overrides, "traffic.num_requests=3"]))
        return
    assert expected in message_for(*overrides)


OBJECTIVE_POLICIES = sorted(name for name, cls in policy_classes().items()
                            if "objective" in {f.name for f in dataclasses.fields(cls)})


@pytest.mark.parametrize("name", OBJECTIVE_POLICIES)
def test_policy_refuses_an_unknown_objective(name):
    # built from Python too: any other string used to price tokens per second
    with pytest.raises(ValueError, match=f"{name}: objective must be one of tokens_x_sps, tokens_per_s, got 'foo'"):
        make_policy(name, objective="foo")


def _profile(tmp_path: Path, **changes: object) -> Path:
    data = json.loads(BUILTIN_PROFILE.read_text())
    data.update(changes)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(data))
    return path


def _short_draft_table(data: dict) -> dict:
    table = data["draft"]["dspark"]
    keep = [i for i, r in enumerate(table["num_requests"]) if r <= 64]
    return {"dspark": {"num_requests": [table["num_requests"][i] for i in keep],
                       "draft_tokens": table["draft_tokens"],
                       "latency_s": [table["latency_s"][i] for i in keep]}}


@pytest.mark.parametrize(
    "make, overrides, expected",
    [
        # a bool is an int in Python: `true` used to be read as 1 GPU
        (lambda d: {"gpus_per_replica": True}, [], "field 'gpus_per_replica' must be an integer >= 1, got True"),
        (lambda d: {"draft": []}, [], "field 'draft' must be an object, got []"),
        # a draft table that ends at 50 requests (the last point <= 64), with cluster.max_concurrency=256
        (lambda d: {"draft": _short_draft_table(d)}, [], "draft.dspark.num_requests covers 1..50, but steps hold"),
        # a profile without the configured drafter
        (lambda d: {"draft": _short_draft_table(d)}, ["drafter.kind=eagle3"], "no draft latency for drafter.kind"),
    ],
)
def test_bad_profile_file_is_named(tmp_path, make, overrides, expected):
    data = json.loads(BUILTIN_PROFILE.read_text())
    path = _profile(tmp_path, **make(data))
    message = message_for(f"hardware={path}", *overrides)
    assert str(path) in message and expected in message


def test_non_parquet_acceptance_log_is_named(tmp_path):
    log = tmp_path / "log.csv"
    log.write_text("request_id,position\n0,1\n")
    assert message_for(f"drafter.log={log}") == (f"drafter.log={log}: not a parquet file; an acceptance log is "
                                                 "parquet (docs/acceptance_logs.md)")


def test_trace_with_absurd_token_count_is_named(tmp_path):
    trace = tmp_path / "huge.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,100,1e23\n1,100,50\n")
    message = message_for("traffic=generic", f"traffic.trace={trace}")
    assert "huge.csv line 2, field 'output_tokens': more than 2147483647 tokens (value 1e+23)" in message


# ---------------------------------------------------------------- the command itself


def _command(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "experiments.run", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})})


@pytest.fixture
def cli_in_process(monkeypatch, capsys, tmp_path):
    """Run the command's entry point in this process (quicker than a new interpreter): (exit code, stderr)."""

    def call(*args: str) -> tuple[int, str]:
        monkeypatch.setattr(sys, "argv", ["experiments.run", "duration_s=2", "warmup_s=0", "progress=false",
                                          f"hydra.run.dir={tmp_path}", *args])
        monkeypatch.setenv("HYDRA_FULL_ERROR", "0")  # cli() sets it for Hydra; monkeypatch restores it
        GlobalHydra.instance().clear()
        try:
            with pytest.raises(SystemExit) as exit_info:
                cli()
        finally:
            GlobalHydra.instance().clear()
        captured = capsys.readouterr()
        assert captured.out == ""
        return exit_info.value.code, captured.err

    return call


@pytest.mark.parametrize(
    "args, expected",
    [
        (["seed=abc"], "error: seed=abc: must be an integer"),  # Hydra's type check while composing
        (["policy=dsprk"], "error: policy=dsprk: no such option; available: dspark,"),  # a missing group option
        (["policy.thta=0.5"], "error: policy.thta: unknown key; valid keys: name,"),  # an unknown key
        (["warmup_s=30", "duration_s=20"], "error: warmup_s=30.0: must be < duration_s=20.0"),  # the schema's check
        (["cluster.max_concurrency=2000"], "error: profile "),  # check_spec, before any simulation
    ],
)
def test_command_prints_one_line_and_exits_2(cli_in_process, args, expected):
    code, err = cli_in_process(*args)
    assert code == 2 and err.startswith(expected) and err.count("\n") == 1, err


def test_command_names_a_bad_profile_file(tmp_path):
    # the real command, in a new interpreter: one line on stderr, nothing on stdout, exit code 2
    path = _profile(tmp_path, gpus_per_replica=True)
    proc = _command(f"hardware={path}", "progress=false", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr == f"error: {path}: field 'gpus_per_replica' must be an integer >= 1, got True\n"


def test_debug_flag_shows_the_traceback(tmp_path):
    proc = _command("duration_s=0", f"hydra.run.dir={tmp_path}", env={"HYDRA_FULL_ERROR": "1"})
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and "ConfigError: duration_s=0.0: must be a finite number > 0" in proc.stderr
