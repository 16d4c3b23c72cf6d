"""``python -m experiments.run policy=dspark traffic=chat``: one simulation (Hydra app).

Writes ``summary.json``, ``requests.parquet`` and ``steps.parquet`` into the
Hydra run directory and prints a summary. ``run(cfg)`` is the plain function
tests call.

A bad config, profile, trace or acceptance log stops the command with one line,
``error: <key or file>: <what is wrong and what is valid>``, and exit code 2;
``HYDRA_FULL_ERROR=1`` shows the traceback instead.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig
from tqdm import tqdm

from experiments.config import build_spec
from experiments.errors import DEBUG_ENV, debug_requested, exit_with, user_message
from experiments.intervals import interval_text, with_intervals
from experiments.provenance import provenance
from experiments.report import format_summary, summary_json
from simulator import Results, SimulationSpec, simulate
from simulator.checks import check_spec

log = logging.getLogger(__name__)
_debug: bool | None = None  # HYDRA_FULL_ERROR as the user set it, before cli() sets it for Hydra


def prepare(cfg: DictConfig) -> SimulationSpec:
    """The checked spec of ``cfg``: raises for a bad value or file before anything is simulated."""
    spec = build_spec(cfg)
    check_spec(spec)
    return spec


def simulate_to(cfg: DictConfig, spec: SimulationSpec, out_dir: Path | None = None) -> Results:
    """Simulate ``spec``; write tables and summary into ``out_dir`` when given."""
    started_s = time.perf_counter()
    with tqdm(total=spec.duration_s, unit="sim s", disable=not cfg.progress, leave=False,
              bar_format="{l_bar}{bar}| {n:.1f}/{total_fmt} sim s [{elapsed}]") as bar:
        results = simulate(spec, progress=lambda now: bar.update(now - bar.n))
    # a fitted profile's alternatives: *_low / *_high in the summary
    results = with_intervals(spec, results, jobs=cfg.interval_jobs, central_s=time.perf_counter() - started_s)
    results = dataclasses.replace(results, summary={**results.summary, **provenance(cfg, spec)})
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        if cfg.write_tables:
            results.requests.to_parquet(out_dir / "requests.parquet")
            results.steps.to_parquet(out_dir / "steps.parquet")
        # Last, as the mark of a complete run (collect counts jobs by it); strict JSON, null for missing values.
        (out_dir / "summary.json").write_text(summary_json(results.summary))
    return results


def run(cfg: DictConfig, out_dir: Path | None = None) -> Results:
    """Check and simulate ``cfg``; write tables and summary into ``out_dir`` when given."""
    return simulate_to(cfg, prepare(cfg), out_dir)


def _to_run_log(text: str) -> None:
    """``text`` into Hydra's job log file (``run.log``) only: the console already shows it, printed."""
    record = logging.getLogger(f"{__name__}.record")
    record.propagate = False
    record.setLevel(logging.INFO)
    record.handlers = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    for line in text.splitlines():
        record.info(line)


def _stop_single_run(err: Exception, setup: bool) -> None:
    """A single run stops here with one line for an error the user can fix; a sweep job re-raises, so that
    Hydra names the job and the command reports the error once the sweep stops."""
    message = user_message(err, setup)
    debug = debug_requested() if _debug is None else _debug
    if message is not None and not debug and HydraConfig.get().mode == RunMode.RUN:
        exit_with(message)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        spec = prepare(cfg)
    except Exception as err:
        _stop_single_run(err, setup=True)
        raise
    try:
        results = simulate_to(cfg, spec, out_dir)
    except Exception as err:
        _stop_single_run(err, setup=False)
        raise
    text = format_summary(results.summary) + interval_text(results.summary)
    print(text)
    print(f"tables and summary.json in {out_dir}")
    _to_run_log(f"{text}\ntables and summary.json in {out_dir}")
    return float(results.summary["output_tokens_per_s"])


def cli() -> None:
    """``main`` with Hydra's own error report replaced by one line for errors the user can fix."""
    global _debug
    _debug = debug_requested()
    os.environ[DEBUG_ENV] = "1"  # Hydra then re-raises composition errors here instead of printing them
    try:
        main()
    except Exception as err:
        message = user_message(err)
        if _debug or message is None:
            raise
        exit_with(message)


if __name__ == "__main__":
    cli()
