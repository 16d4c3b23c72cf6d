"""Build an acceptance preset file from published numbers, a DeepSpec eval table or an acceptance log.

    python -m calibration.acceptance.fit_acceptance NUMBERS.csv --gamma 7 --source "Paper X, Table 2, p. 5"
    python -m calibration.acceptance.fit_acceptance eval_output.txt        # DeepSpec eval.py's results table
    python -m calibration.acceptance.fit_acceptance run.parquet --drafter dspark --target Qwen3-8B  # our log

Writes one versioned preset file per target/drafter pair of the input
(``<target>_<drafter>.json``, or ``--name``) into ``--out-dir`` and prints
the fit's own check: per input row, the input tau, the preset curve's exact
tau and the tau simulated by the offline protocol (every draft verified,
whole requests). A run uses the file with ``drafter.acceptance=PATH``. The
input formats are described in :mod:`calibration.acceptance.inputs`; how the
curves are made in :mod:`calibration.acceptance.build`; docs/acceptance.md
has a worked example.
"""

from __future__ import annotations

import argparse
import datetime
import math
import sys
from pathlib import Path

import pandas as pd

from calibration.acceptance.build import BuildOptions, build_presets, check_preset, slug
from calibration.acceptance.fit_preset import fit_preset
from calibration.acceptance.inputs import InputError, Row, read_deepspec, read_published
from simulator.acceptance.logs import LogError
from simulator.acceptance.preset_file import AcceptancePreset, PresetError

FORMATS = ("auto", "numbers", "deepspec", "log")


def detect_format(path: Path) -> str:
    if path.suffix == ".parquet":
        return "log"
    try:
        head = path.read_text(errors="replace")[:20000]
    except OSError as err:
        raise InputError(f"{path}: cannot read ({err})") from None
    return "deepspec" if "accept_rate@0" in head and "accept_len" in head else "numbers"


def _domain_map(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, sep, domain = pair.partition("=")
        if not sep:
            raise InputError(f"--domain {pair}: expected BENCHMARK=DOMAIN")
        out[name.strip().lower()] = domain.strip()
    return out


def _from_log(args: argparse.Namespace) -> tuple[list[AcceptancePreset], list[Row]]:
    fitted = fit_preset(args.input, drafter=args.drafter)
    target = args.target or "unknown"
    name = args.name or f"{slug(target)}_{slug(fitted.drafter)}"
    preset = fitted.to_preset(name, target)
    rows = [Row(target=target, drafter=fitted.drafter, name=d, domain=d, gamma=fitted.gamma,
                where=f"{args.input} ({d})", tau=fitted.tau[d]) for d in fitted.curves]
    return [preset], rows


def _plain(value: object) -> object:
    """A check-table cell as strict JSON holds it: floats rounded, missing values null."""
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, 4)
    return value


def run(args: argparse.Namespace) -> list[tuple[AcceptancePreset, pd.DataFrame]]:
    """Read the input, build and write the presets; returns each preset with its check table."""
    path = Path(args.input)
    kind = detect_format(path) if args.format == "auto" else args.format
    domains = _domain_map(args.domain or [])
    if kind == "log":
        presets, rows = _from_log(args)
    else:
        rows = (read_deepspec(path, domains) if kind == "deepspec" else
                read_published(path, args.target, args.drafter, args.gamma, domains))
        source = {"kind": args.source_kind or ("deepspec-eval" if kind == "deepspec" else "published"),
                  "reference": args.source or str(path)}
        options = BuildOptions(source=source, shape_from=args.shape_from, name=args.name,
                               created=args.created or datetime.date.today().isoformat())
        presets = build_presets(rows, options)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for preset in presets:
        mine = [r for r in rows if (r.target, r.drafter) == (preset.target, preset.drafter)]
        check = check_preset(preset, mine, seed=args.seed, num_requests=args.requests)
        meta = dict(preset.metadata)
        meta["check"] = [{k: _plain(v) for k, v in rec.items()} for rec in check.to_dict("records")]
        final = AcceptancePreset(preset.name, preset.target, preset.drafter, preset.domains, preset.benchmarks,
                                 preset.fit_positions, preset.confidence_auc, meta)
        final.save(out_dir / f"{preset.name}.json")
        results.append((final, check))
    return results


def format_check(preset: AcceptancePreset, check: pd.DataFrame, path: Path) -> str:
    worst = float(check["error_pct"].abs().max())
    lines = [f"{path}: {preset.target} / {preset.drafter}, {len(preset.benchmarks)} benchmark and "
             f"{len(preset.domains)} domain curves (fit at gamma {preset.fit_positions})",
             check.to_string(index=False, float_format=lambda v: f"{v:.3f}", na_rep="-"),
             f"largest |simulated - input| / input: {worst:.2f}%"]
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="docs/acceptance.md: adding a drafter from a paper's table")
    p.add_argument("input", help="CSV of published numbers, a DeepSpec eval table (text), or an acceptance log")
    p.add_argument("--format", choices=FORMATS, default="auto")
    p.add_argument("--out-dir", default="presets", help="where preset files go (default: ./presets)")
    p.add_argument("--name", help="preset name (one target/drafter pair only); default <target>_<drafter>")
    p.add_argument("--target", help="target model, where the input has no target column (and for logs)")
    p.add_argument("--drafter", help="drafter, where the input has no drafter column (a log: which drafter)")
    p.add_argument("--gamma", type=int, help="block size of the numbers, where the input has no gamma column")
    p.add_argument("--domain", action="append", metavar="BENCHMARK=DOMAIN",
                   help="domain of a benchmark the paper's nine do not include (repeatable)")
    p.add_argument("--shape-from", help="preset whose curve shapes tau-only rows take (default: the drafter "
                                        "kind's Qwen3-4B preset, Figure 2)")
    p.add_argument("--source", help="where the numbers come from (paper, table, page), kept in the file")
    p.add_argument("--source-kind", help="what the numbers are: published (default for tables), deepspec-eval, "
                                         "assumed, ...")
    p.add_argument("--created", help="date written into the file (default: today)")
    p.add_argument("--requests", type=int, default=8000, help="requests per row in the simulated check")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        results = run(args)
    except (InputError, PresetError, LogError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for preset, check in results:
        print(format_check(preset, check, Path(args.out_dir) / f"{preset.name}.json"))
        print()
    print("use one with: python -m experiments.run drafter.acceptance=PATH (docs/acceptance.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
