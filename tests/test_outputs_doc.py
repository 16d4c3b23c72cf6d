"""docs/outputs.md lists exactly the columns and keys a run writes, so that the documented schema cannot drift.

A new column or summary key fails here until docs/outputs.md describes it (with its unit). Rows whose
meaning starts with an italic condition (``*only with paged KV*``, ``*detailed*``) are columns a default run
does not write: they may be absent here, never undocumented.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from experiments.run import run
from experiments.sweep_table import sweep_frame, sweep_row
from simulator.metrics import distribution

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "outputs.md"
CONF = REPO / "experiments" / "conf"
_ROW = re.compile(r"^\| `([^`]+)` \|(?:.*\|)? (\*)?[^|]*\|$")  # the last cell starts with * when optional


def documented(heading: str, optional: bool = True) -> list[str]:
    """The backticked names in the first column of the table under ``heading`` (up to the next heading);
    ``optional=False`` leaves out the rows a default run does not write."""
    names, every, inside = [], [], False
    for line in DOC.read_text().splitlines():
        if line.startswith("#"):
            inside = line.lstrip("#").strip() == heading
        elif inside and (match := _ROW.match(line)):
            every.append(match.group(1))
            if optional or not match.group(2):
                names.append(match.group(1))
    assert every, f"docs/outputs.md has no table under '{heading}'"
    assert len(every) == len(set(every)), f"docs/outputs.md '{heading}' lists a name twice"
    return names


def check_documented(heading: str, written: list[str]) -> None:
    """Every written name is documented; every name documented as always written is written."""
    undocumented = sorted(set(written) - set(documented(heading)))
    missing = sorted(set(documented(heading, optional=False)) - set(written))
    assert not undocumented and not missing, (f"docs/outputs.md '{heading}': undocumented {undocumented}, "
                                              f"documented but not written {missing}")


@pytest.fixture(scope="module")
def run_outputs():
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["duration_s=2", "warmup_s=0.5", "traffic.num_users=4",
                                                       "progress=false"])
    return cfg, run(cfg)


def test_requests_columns_are_documented(run_outputs):
    check_documented("`requests.parquet`", list(run_outputs[1].requests.columns))


def test_steps_columns_are_documented(run_outputs):
    check_documented("`steps.parquet`", list(run_outputs[1].steps.columns))


def test_summary_keys_are_documented(run_outputs):
    summary = run_outputs[1].summary
    check_documented("`summary.json`", list(summary))
    check_documented("Distributions", list(distribution([])))
    assert set(summary["ttft_s"]) == set(distribution([]))


def test_sweep_table_columns_are_documented(run_outputs):
    cfg, results = run_outputs
    config = OmegaConf.to_container(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]), resolve=True)
    frame = sweep_frame([sweep_row("0", results.summary, config, ["policy=dspark", "seed=0"], results.steps)])
    heading = "`sweep.csv` / `sweep.parquet` (`experiments.collect`)"
    listed = documented(heading)
    assert listed == documented(heading, optional=False)
    summary = results.summary
    flattened = {f"{key}_{sub}" for key, value in summary.items() if isinstance(value, dict) for sub in value}
    unexplained = [c for c in frame.columns
                   if c not in listed and c not in summary and c not in flattened and not c.startswith("override.")]
    assert not unexplained, f"docs/outputs.md '{heading}' does not explain columns {unexplained}"
    assert not set(listed) - set(frame.columns), f"documented but not in the table: {set(listed) - set(frame.columns)}"
    assert "config" not in frame.columns and {"override.policy", "override.seed"} <= set(frame.columns)
