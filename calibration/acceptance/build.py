"""Published rows -> acceptance presets, and the fit's own check.

Per (target, drafter) pair, every row becomes one curve:

* a row with per-position values (q1.. or s1..) is used as given, positions
  1..K; past K the tail decays by ``tail_decay`` (the row's, else the shape
  reference's, else 1.0: flat);
* a row with tau only takes its shape from a *reference* curve of the same
  domain (a per-position domain row of the same pair in the input, else
  ``--shape-from``, else the drafter kind's Qwen3-4B preset, whose curves pass
  through the paper's Figure 2) and shifts it on the logit scale,
  ``q_k = sigmoid(logit(ref_k) + delta)``, with delta solved so that tau over
  the row's gamma positions equals the row's tau exactly.

A domain without a row of its own gets the mean of its benchmarks' prefix
survival curves, so its tau is the mean of theirs (the paper's domain
figure). The check runs each curve through the offline protocol
(:func:`simulator.acceptance.offline.run_offline`: every draft verified, whole
requests) with the parametric model and compares tau with the input.
"""

from __future__ import annotations

import datetime
import re
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.optimize import brentq
from scipy.special import expit, logit

from calibration.acceptance.inputs import InputError, Row
from simulator.acceptance.curves import PAPER_POSITIONS, AcceptanceCurve
from simulator.acceptance.offline import run_offline
from simulator.acceptance.parametric import AcceptanceModel
from simulator.acceptance.preset_file import AcceptancePreset
from simulator.acceptance.presets import DEFAULT_PRESETS, REFERENCE_TARGET, builtin_presets, default_preset, load_preset
from traces.workload import DOMAINS

TOOL = "calibration.acceptance.fit_acceptance"


@dataclass(frozen=True)
class BuildOptions:
    source: dict[str, str]  # kind, reference, ... (recorded in every preset)
    shape_from: str | None = None  # reference preset for tau-only rows (default: by drafter kind)
    name: str | None = None  # preset name when the input holds one pair (default: <target>_<drafter>)
    created: str = ""  # YYYY-MM-DD (default: today)


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.strip().lower()).strip("-")


def shift_to_tau(reference: AcceptanceCurve, tau: float, gamma: int, where: str) -> AcceptanceCurve:
    """``reference`` shifted on the logit scale so that its tau over ``gamma`` positions is ``tau``."""
    if not 1.0 < tau < 1.0 + gamma:
        raise InputError(f"{where}: tau={tau} is impossible with gamma={gamma} (it lies between 1 and {1 + gamma})")
    positions = max(gamma, reference.num_positions, PAPER_POSITIONS)
    base = logit(reference.conditional(positions))

    def gap(delta: float) -> float:
        return float(1.0 + np.cumprod(expit(base + delta))[:gamma].sum()) - tau

    delta = brentq(gap, -30.0, 30.0, xtol=1e-12)
    return AcceptanceCurve(tuple(expit(base + delta)), reference.tail_decay)


def _reference(kind: str, shape_from: str | None, where: str,
               built: dict[str, AcceptancePreset]) -> AcceptancePreset:
    """The preset shapes come from: ``shape_from``, else the kind's Qwen3-4B preset (its default where 4B has
    none); presets built earlier in the same run come first."""
    if shape_from is None:
        if kind not in DEFAULT_PRESETS:
            raise InputError(f"{where}: tau alone needs a curve shape, and drafter {kind!r} has no built-in "
                             "reference; pass --shape-from PRESET (e.g. qwen3-4b_dspark) or give per-position "
                             "values")
        shape_from = f"{REFERENCE_TARGET}_{kind}"
        if shape_from not in built and shape_from not in builtin_presets():
            shape_from = default_preset(kind)
    return built[shape_from] if shape_from in built else load_preset(shape_from)


def row_curve(row: Row, shape_from: str | None, own: dict[str, AcceptanceCurve],
              built: dict[str, AcceptancePreset]) -> tuple[AcceptanceCurve, str]:
    """The curve of one row and a note on how it was made; ``own``: the pair's per-position domain curves."""
    kind = row.drafter.lower()
    given = row.conditional or row.survival
    if given is not None:
        tail = row.tail_decay
        note = "per-position values as given"
        if tail is None:
            known = shape_from is not None or kind in DEFAULT_PRESETS
            ref = _reference(kind, shape_from, row.where, built) if known else None
            tail = ref.curve(row.domain).tail_decay if ref is not None else 1.0
            note += f"; tail past position {len(given)} {'from ' + ref.name if ref else 'assumed flat'}"
        make = AcceptanceCurve if row.conditional is not None else AcceptanceCurve.from_survival
        try:
            return make(given, tail), note
        except ValueError as err:
            raise InputError(f"{row.where}: {err}") from None
    if row.domain in own:
        shape, shape_name = own[row.domain], f"this input's {row.domain} curve"
    else:
        ref = _reference(kind, shape_from, row.where, built)
        shape, shape_name = ref.curve(row.domain), f"{ref.name}/{row.domain}"
    curve = shift_to_tau(shape, float(row.tau), row.gamma, row.where)  # type: ignore[arg-type]
    return curve, f"shape of {shape_name} shifted to tau {row.tau} at gamma {row.gamma}"


def mean_survival(curves: list[AcceptanceCurve], positions: int) -> AcceptanceCurve:
    """The curve whose prefix survival is the mean of ``curves``' (tau = mean of their taus)."""
    survival = np.mean([c.survival(positions) for c in curves], axis=0)
    return AcceptanceCurve.from_survival(survival, float(np.mean([c.tail_decay for c in curves])))


def build_preset(rows: list[Row], options: BuildOptions, name: str,
                 built: dict[str, AcceptancePreset] | None = None) -> AcceptancePreset:
    """One preset from the rows of one (target, drafter) pair (see the module docstring); ``built``: presets
    made earlier in the same run, by name (their curves can shape this one's)."""
    gammas = sorted({r.gamma for r in rows})
    if len(gammas) > 1:
        raise InputError(f"{rows[0].target}/{rows[0].drafter}: rows measured at different block sizes {gammas}; "
                         "fit one preset per block size")
    seen: set[str] = set()
    domains, benchmarks, notes = {}, {}, {}
    # Per-position domain rows first: the pair's tau-only rows of that domain take their shape.
    for row in sorted(rows, key=lambda r: not (r.is_domain and (r.conditional or r.survival))):
        if row.name in seen:
            raise InputError(f"{row.where}: {row.name} appears twice for {row.target}/{row.drafter}")
        seen.add(row.name)
        curve, how = row_curve(row, options.shape_from, domains, built or {})
        notes[row.name] = "; ".join(n for n in (row.note, how) if n)
        if row.is_domain:
            domains[row.domain] = curve
        else:
            benchmarks[row.name] = (row.domain, curve)
    for domain in DOMAINS:
        members = [c for d, c in benchmarks.values() if d == domain]
        if domain not in domains and members:
            positions = max(max(c.num_positions for c in members), gammas[0])
            domains[domain] = mean_survival(members, positions)
            names = [b for b, (d, _) in benchmarks.items() if d == domain]
            notes[domain] = f"mean prefix survival of {', '.join(names)}"
    if not domains:
        raise InputError(f"{rows[0].where}: no rows for {rows[0].target}/{rows[0].drafter}")
    inputs = [{"class": r.name, "domain": r.domain, "gamma": r.gamma, "row": r.where,
               **({"tau": r.tau} if r.tau is not None else {}),
               **({"q": list(r.conditional)} if r.conditional else {}),
               **({"s": list(r.survival)} if r.survival else {}), **r.extra} for r in rows]
    created = options.created or datetime.date.today().isoformat()
    return AcceptancePreset(name=name, target=rows[0].target, drafter=rows[0].drafter, domains=domains,
                            benchmarks=benchmarks, fit_positions=gammas[0],
                            metadata={"created": created, "tool": TOOL, "source": options.source,
                                      "inputs": inputs, "notes": notes})


def build_presets(rows: list[Row], options: BuildOptions) -> list[AcceptancePreset]:
    """One preset per (target, drafter) pair in ``rows``, in order of appearance."""
    groups: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for row in rows:
        groups[row.target, row.drafter].append(row)
    if options.name is not None and len(groups) > 1:
        raise InputError(f"--name names one preset, but the input holds {len(groups)} target/drafter pairs: "
                         f"{', '.join(f'{t}/{d}' for t, d in groups)}")
    built: dict[str, AcceptancePreset] = {}
    for (target, drafter), group in groups.items():
        name = options.name or f"{slug(target)}_{slug(drafter)}"
        built[name] = build_preset(group, options, name, built)
    return list(built.values())


CHECK_OUTPUT_TOKENS = 64  # short requests, many of them: request-to-request spread dominates the check's error


def check_preset(preset: AcceptancePreset, rows: list[Row], seed: int = 0, num_requests: int = 8000) -> pd.DataFrame:
    """Per row: the input tau, the curve's exact tau and the simulated tau of the offline protocol."""
    records = []
    for row in rows:
        model = AcceptanceModel(preset, row.gamma, benchmark_mix=None if row.is_domain else {row.name: 1.0})
        simulated = run_offline(model, row.domain, row.gamma, np.random.default_rng(seed), num_requests,
                                CHECK_OUTPUT_TOKENS)
        curve = preset.domains[row.domain] if row.is_domain else preset.benchmarks[row.name][1]
        given = row.tau if row.tau is not None else curve.tau(row.gamma)
        records.append({"class": row.name, "domain": row.domain, "gamma": row.gamma, "tau_input": given,
                        "tau_preset": curve.tau(row.gamma), "tau_simulated": simulated.tau,
                        "error_pct": 100.0 * (simulated.tau / given - 1.0),
                        "q1_input": (row.conditional or row.survival or (np.nan,))[0],
                        "q1_simulated": float(simulated.conditional[0])})
    return pd.DataFrame(records)
