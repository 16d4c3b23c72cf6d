"""The entry point the experiment layer calls: a shipped sample name or a file path in, a workload out."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, fields, replace
from pathlib import Path

from traces.formats import read_trace
from traces.replay import ReplayOptions, TraceReplay, replay
from traces.workload import Workload

SAMPLES_DIR = Path(__file__).resolve().parent / "samples"


@dataclass(frozen=True)
class Sample:
    """A small slice of a public trace shipped in ``traces/samples/`` (see ``traces/README.md``)."""

    file_name: str
    format: str
    label: str | None = None  # domain label, where the format takes it from the file name


SAMPLES: dict[str, Sample] = {
    "azure_code": Sample("azure_code.csv", "azure", label="azure_code"),
    "azure_conv": Sample("azure_conv.csv", "azure", label="azure_conv"),
    "mooncake_conversation": Sample("mooncake_conversation.jsonl", "mooncake"),
    "mooncake_synthetic": Sample("mooncake_synthetic.jsonl", "mooncake"),
}


class TraceReplayWarning(UserWarning):
    """Rows were skipped, dropped or changed while loading a workload (the counts are in the message)."""


def sample_path(name: str) -> Path:
    """The file of a shipped sample; unknown names raise with the list of valid ones."""
    if name not in SAMPLES:
        raise ValueError(f"unknown trace sample {name!r}; valid: {', '.join(SAMPLES)}")
    return SAMPLES_DIR / SAMPLES[name].file_name


def load_trace(name_or_path: str | Path, *, format: str | None = None, options: ReplayOptions | None = None,
               **replay_options: object) -> TraceReplay:
    """Read a sample or file and replay it; returns the workload and the report of what was left out.

    ``replay_options`` are :class:`ReplayOptions` fields; they override ``options``.
    """
    valid = [f.name for f in fields(ReplayOptions)]
    unknown = sorted(set(replay_options) - set(valid))
    if unknown:
        raise TypeError(f"unknown replay option(s) {unknown}; valid: {', '.join(valid)}")
    opts = replace(options or ReplayOptions(), **replay_options)  # type: ignore[arg-type]
    name = str(name_or_path)
    label = None
    if name in SAMPLES:
        sample = SAMPLES[name]
        path, source, label = sample_path(name), name, sample.label
        format = format or sample.format
    else:
        path = Path(name_or_path).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"{name!r} is neither a trace sample nor a file; samples: {', '.join(SAMPLES)}")
        source = path.name
    table = read_trace(path, format, skip_bad_rows=opts.skip_bad_rows,
                       keep_prefix_hash_ids=opts.keep_prefix_hash_ids, label=label)
    return replay(table, opts, source=source)


def load_trace_workload(name_or_path: str | Path, *, format: str | None = None,
                        options: ReplayOptions | None = None, **replay_options: object) -> Workload:
    """The workload of :func:`load_trace`, warning (:class:`TraceReplayWarning`) with the counts of any
    rows skipped, dropped or changed, since the caller does not get the report."""
    result = load_trace(name_or_path, format=format, options=options, **replay_options)
    report = result.report
    if report.num_skipped or report.num_zero_output or report.num_output_capped:
        warnings.warn("; ".join(report.lines()), TraceReplayWarning, stacklevel=2)
    return result.workload
