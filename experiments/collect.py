"""``python -m experiments.collect <multirun dir> [--baseline mtp1] [--sla 80,120] [--out DIR]``.

Collects a Hydra multirun of ``experiments.run`` (one ``summary.json`` per job
subdirectory, next to ``.hydra/overrides.yaml`` and ``.hydra/config.yaml``)
into one table and draws the sweep's figures. Writes into ``--out`` (default
``<multirun dir>/collected``):

* ``sweep.csv`` / ``sweep.parquet``: one row per job (summary, load, overrides);

when the sweep runs policies at several loads on one setup (traffic, hardware,
number of replicas):

* ``frontier.csv`` and ``frontier.png|svg``: each policy's points and Pareto
  envelope (tok/s/GPU vs tok/s/user) with the SLA lines;
* ``sla_table.md|csv|png|svg`` and ``matched_throughput.csv``: throughput at
  each SLA and per-user speed at matched throughput against the baseline
  (when the baseline is in the sweep);
* ``load.png|svg``: throughput and verification budget vs concurrency;

when the jobs wrote their request tables (``write_tables=true``, the default):

* ``latency_cdf.png|svg``: TTFT and TPOT CDFs per policy (each policy's runs
  pooled; runs without ``requests.parquet`` are named in the report);

and when it runs ``policy=threshold`` at several ``policy.theta``:

* ``threshold.png|svg``: accepted/rejected draft tokens and acceptance rate
  per threshold and traffic.

Figures are stamped with the code revision each run recorded in its summary
(and every revision when the runs disagree), never the revision ``collect``
runs at. This module is the I/O edge; tables and figures come from pure
functions in ``experiments.sweep_table``, ``experiments.frontier`` and
``experiments.plots``. The command line shows a progress bar over the runs.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import matplotlib
import pandas as pd
from matplotlib.figure import Figure
from omegaconf import OmegaConf
from tqdm import tqdm

from experiments.frontier import (
    SLA_HEADER,
    SLA_NOTE,
    THROUGHPUT,
    USER_SPEED,
    matched_throughput,
    pareto_frontier,
    sla_markdown,
    sla_rows,
    sla_table,
)
from experiments.intervals import draw_intervals
from experiments.plots import frontier_figure, latency_cdf_figure, load_figure, table_figure, threshold_figure
from experiments.sweep_table import sweep_frame, sweep_row, window_latencies

DEFAULT_BASELINE = "mtp1"
DEFAULT_SLAS = "80,120"  # the paper's V4-Flash anchors (tok/s/user)
# What must be the same for every job before per-policy frontiers mean anything.
SETUP_COLUMNS = ("traffic_name", "hardware", "num_decode_engines")
LATENCY_COLUMNS = ["first_token_at", "finished_at", "ttft_s", "tpot_s"]  # read from each run's requests.parquet


class SweepError(ValueError):
    """A multirun directory is missing what ``collect`` needs; the message names the path."""


def _read_yaml(path: Path, job: Path) -> object:
    if not path.is_file():
        raise SweepError(f"{job}: has summary.json but no {path.relative_to(job)}; expected a job directory "
                         "of a Hydra multirun (python -m experiments.run -m ...)")
    try:
        return OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except Exception as err:  # omegaconf raises several error types for bad YAML or interpolations
        raise SweepError(f"{path}: cannot read it as a resolved Hydra config ({err})") from err


def read_job(job: Path, root: Path) -> dict:
    """The table row of one job directory."""
    summary_path = job / "summary.json"
    try:
        summary = json.loads(summary_path.read_text())
    except json.JSONDecodeError as err:
        raise SweepError(f"{summary_path}: not valid JSON ({err})") from err
    for key in ("policy", "output_tokens_per_s_per_gpu", "tokens_per_s_per_user", "num_decode_gpus"):
        if key not in summary:
            raise SweepError(f"{summary_path}: missing field {key!r}; expected a summary written by experiments.run")
    overrides = _read_yaml(job / ".hydra" / "overrides.yaml", job)
    config = _read_yaml(job / ".hydra" / "config.yaml", job)
    steps_path = job / "steps.parquet"
    steps = pd.read_parquet(steps_path) if steps_path.is_file() else None
    return sweep_row(str(job.relative_to(root)), summary, config, list(overrides), steps)  # type: ignore[arg-type]


def load_sweep(root: Path, allow_missing: bool = False, progress: bool = False) -> pd.DataFrame:
    """The sweep table of a multirun directory; errors name what is missing. ``progress``: a bar over the jobs."""
    if not root.is_dir():
        raise SweepError(f"{root}: no such directory; expected a Hydra multirun directory "
                         "(hydra.sweep.dir of python -m experiments.run -m ...)")
    jobs = sorted(p.parent for p in root.rglob("summary.json"))
    if not jobs:
        raise SweepError(f"{root}: no summary.json found; expected a Hydra multirun directory whose job "
                         "subdirectories (0/, 1/, ...) each hold the summary.json that experiments.run writes")
    started = {p.parent.parent for p in root.rglob(".hydra/overrides.yaml")}
    missing = sorted(started - set(jobs))
    if missing and not allow_missing:
        names = ", ".join(str(p.relative_to(root)) for p in missing[:10])
        raise SweepError(f"{root}: {len(missing)} job(s) have no summary.json (failed or still running?): {names}; "
                         "pass --allow-missing to collect the others")
    bar = tqdm(jobs, desc="summaries", unit="run", disable=not progress, leave=False)
    return sweep_frame([read_job(job, root) for job in bar])


def load_latencies(root: Path, sweep: pd.DataFrame, progress: bool = False) -> tuple[pd.DataFrame, list[str]]:
    """Per-request TTFT and TPOT of every run that wrote ``requests.parquet`` (with ``job`` and
    ``policy_label``), and the jobs that did not (``write_tables=false``) or whose summary has no window."""
    frames, missing = [], []
    bar = tqdm(sweep.itertuples(index=False), total=len(sweep), desc="request tables", unit="run",
               disable=not progress, leave=False)
    for row in bar:
        path = root / row.job / "requests.parquet"
        window = (getattr(row, "window_start_at", None), getattr(row, "window_end_at", None))
        if not path.is_file() or any(pd.isna(t) for t in window):
            missing.append(row.job)
            continue
        frame = window_latencies(pd.read_parquet(path, columns=LATENCY_COLUMNS), *window)  # type: ignore[arg-type]
        frames.append(frame.assign(job=row.job, policy_label=row.policy_label))
    columns = ["ttft_s", "tpot_s", "job", "policy_label"]
    return (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)), missing


def _latency_cdfs(root: Path, sweep: pd.DataFrame, out: Path, progress: bool, report: list[str]) -> list[Path]:
    latencies, missing = load_latencies(root, sweep, progress)
    if missing:
        names = ", ".join(missing[:10]) + (", ..." if len(missing) > 10 else "")
        report.append(f"{len(missing)} of {len(sweep)} runs have no requests.parquet (run with write_tables=true) "
                      f"or no window in their summary, so the latency CDFs leave them out: {names}")
    if latencies.empty:
        report.append("no TTFT/TPOT CDFs: no run wrote its request table")
        return []
    return _save(latency_cdf_figure(latencies, sweep), out, "latency_cdf")


_SVG_ID = re.compile(r'(?<=id=")[a-z][0-9a-f]{10}(?=")|(?<=#)[a-z][0-9a-f]{10}(?=[")])')


def _save(fig: Figure, out: Path, name: str) -> list[Path]:
    paths = [out / f"{name}.png", out / f"{name}.svg"]
    fig.savefig(paths[0], dpi=150)
    # No timestamp and element ids numbered in order of appearance: the same sweep gives the same file.
    # (matplotlib hashes clip rectangles' full-precision bounds into ids, and those can differ in the last bit
    # from one drawing to the next.)
    with matplotlib.rc_context({"svg.hashsalt": "specsched"}):
        fig.savefig(paths[1], metadata={"Date": None})
    ids: dict[str, str] = {}
    text = _SVG_ID.sub(lambda m: ids.setdefault(m.group(0), f"{m.group(0)[0]}{len(ids)}"), paths[1].read_text())
    paths[1].write_text(text)
    return paths


def _parse_slas(text: str) -> list[float]:
    try:
        slas = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as err:
        raise SweepError(f"--sla: expected comma-separated tok/s/user values such as 80,120, got {text!r}") from err
    if not slas or any(s <= 0 for s in slas):
        raise SweepError(f"--sla: expected positive tok/s/user values such as 80,120, got {text!r}")
    return slas


def _not_a_load_sweep(sweep: pd.DataFrame) -> str | None:
    """Why the sweep has no per-policy frontier (None when it has one)."""
    for column in SETUP_COLUMNS:
        values = sorted(map(str, sweep[column].dropna().unique()))
        if len(values) > 1:
            return (f"the sweep mixes {column} ({', '.join(values)}) and a frontier needs one setup; "
                    "collect each setup's jobs separately")
    if not (sweep.groupby("policy_label")["offered_load"].nunique() > 1).any():
        return "no policy was run at more than one load"
    return None


def _frontiers(sweep: pd.DataFrame, labels: list[str], out: Path, baseline: str | None, slas: list[float],
               report: list[str]) -> list[Path]:
    """Frontier table and figure, SLA table (when the baseline is in the sweep) and load figure."""
    written = [out / "frontier.csv"]
    frontier = pd.concat([pareto_frontier(sweep[sweep["policy_label"] == name]) for name in labels])
    frontier[["policy_label", "offered_load", USER_SPEED, THROUGHPUT, "verification_budget_per_request",
              "job"]].to_csv(written[0], index=False)
    figure = frontier_figure(sweep, slas)
    draw_intervals(figure.axes[0], sweep)  # fitted profiles: prediction intervals as error bars
    written += _save(figure, out, "frontier")
    chosen = baseline or DEFAULT_BASELINE
    if chosen in labels:
        table, matched = sla_table(sweep, chosen, slas), matched_throughput(sweep, chosen)
        text = sla_markdown(table, matched, chosen)
        (out / "sla_table.md").write_text(text)
        table.to_csv(out / "sla_table.csv", index=False)
        matched.to_csv(out / "matched_throughput.csv", index=False)
        written += [out / "sla_table.md", out / "sla_table.csv", out / "matched_throughput.csv"]
        figure = table_figure(sla_rows(table), SLA_HEADER, f"SLA table against {chosen}", SLA_NOTE, sweep)
        written += _save(figure, out, "sla_table")
        report.append(text)
    elif baseline is not None:
        raise SweepError(f"--baseline {baseline!r} is not in the sweep; policies found: {', '.join(labels)}")
    else:
        report.append(f"no SLA table: the sweep has no {DEFAULT_BASELINE} runs (pass --baseline NAME)")
    written += _save(load_figure(sweep), out, "load")
    return written


def collect(root: Path, out: Path, baseline: str | None = None, slas: list[float] | None = None,
            allow_missing: bool = False, progress: bool = False) -> tuple[list[Path], str]:
    """Write the table and figures of the sweep in ``root`` into ``out``; returns the paths and a report.

    ``baseline=None`` uses mtp1 when the sweep has it and skips the SLA table otherwise;
    a baseline given by name must be in the sweep.
    """
    slas = slas if slas is not None else _parse_slas(DEFAULT_SLAS)
    sweep = load_sweep(root, allow_missing, progress)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "sweep.csv", out / "sweep.parquet"]
    sweep.to_csv(written[0], index=False)
    sweep.to_parquet(written[1], index=False)
    labels = list(dict.fromkeys(sweep["policy_label"]))
    report = [f"{len(sweep)} jobs, policies: {', '.join(labels)}"]
    problem = _not_a_load_sweep(sweep)
    if problem is not None:
        if baseline is not None:
            raise SweepError(f"--baseline {baseline!r}: no frontiers to compare, {problem}")
        report.append(f"no frontier, SLA table or load figure: {problem}")
    else:
        written += _frontiers(sweep, labels, out, baseline, slas, report)
    thresholds = sweep[sweep["policy"] == "threshold"]
    if thresholds["policy_params"].nunique() > 1:
        written += _save(threshold_figure(sweep), out, "threshold")
    written += _latency_cdfs(root, sweep, out, progress, report)
    return written, "\n".join(report)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.collect", description=__doc__.split("\n\n")[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep_dir", type=Path, help="Hydra multirun directory (hydra.sweep.dir)")
    parser.add_argument("--baseline", default=None,
                        help=f"policy label to compare against (default: {DEFAULT_BASELINE} when present)")
    parser.add_argument("--sla", default=DEFAULT_SLAS,
                        help="comma-separated per-user speed SLAs in tok/s/user (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: <sweep_dir>/collected)")
    parser.add_argument("--allow-missing", action="store_true",
                        help="collect even when some jobs wrote no summary.json")
    args = parser.parse_args(argv)
    try:
        written, report = collect(args.sweep_dir, args.out or args.sweep_dir / "collected", args.baseline,
                                  _parse_slas(args.sla), args.allow_missing, progress=True)
    except SweepError as err:
        parser.exit(2, f"error: {err}\n")
    print(report)
    print("wrote:")
    for path in written:
        print(f"  {path}")


if __name__ == "__main__":
    main()
