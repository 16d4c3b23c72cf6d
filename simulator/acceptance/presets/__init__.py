"""Built-in acceptance presets (the JSON files in this folder) and how a run names one.

A preset is named by its file stem, ``<target>_<drafter>`` (``qwen3-8b_dspark``),
or given as a path to a preset file (:mod:`simulator.acceptance.preset_file`);
``python -m calibration.acceptance.fit_acceptance`` writes new ones. Built in:

* every target/drafter row of the DSpark paper's Table 1 (Qwen3-4B, Qwen3-8B,
  Qwen3-14B, Gemma4-12B x Eagle3, DFlash, DSpark), per benchmark and per
  domain, built from ``calibration/acceptance/paper/`` by that command; the
  Qwen3-4B domain curves also pass through the Figure 2 anchors (the other
  rows keep their shape, shifted to each benchmark's tau);
* ``assumed_mtp``: a DeepSeek-style MTP module, *assumed* (the paper has no
  MTP row).

A drafter kind (``drafter.kind``) picks its default preset here unless
``drafter.acceptance`` names another: the Qwen3-8B rows, the target of the
default hardware profile. Files are read when a run is built, never at import.
"""

from __future__ import annotations

from pathlib import Path

from simulator.acceptance.curves import PAPER_POSITIONS, AcceptanceCurve
from simulator.acceptance.paper import FIGURE2_ANCHORS, TABLE1_QWEN3_4B
from simulator.acceptance.preset_file import AcceptancePreset, PresetError, read_preset

BUILTIN_DIR = Path(__file__).parent
DEFAULT_PRESETS: dict[str, str] = {  # drafter kind -> its preset when drafter.acceptance is not set
    "dspark": "qwen3-8b_dspark",
    "dflash": "qwen3-8b_dflash",
    "eagle3": "qwen3-8b_eagle3",
    "mtp": "assumed_mtp",
}
DRAFTERS = tuple(DEFAULT_PRESETS)  # drafter kinds with a default preset (and a latency table in the profiles)
REFERENCE_TARGET = "qwen3-4b"  # Figure 2's curves are measured on it: the reference shapes

# Presets registered in memory (e.g. fitted to a log by calibration.acceptance.fit_preset), by name.
PRESETS: dict[str, AcceptancePreset] = {}

__all__ = ["AcceptanceCurve", "AcceptancePreset", "BUILTIN_DIR", "DEFAULT_PRESETS", "DRAFTERS", "FIGURE2_ANCHORS",
           "PAPER_POSITIONS", "PRESETS", "PresetError", "TABLE1_QWEN3_4B", "builtin_presets", "default_preset",
           "install", "load_preset", "preset", "reference_preset"]


def builtin_presets() -> list[str]:
    """Names of the shipped presets."""
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.json"))


def default_preset(kind: str) -> str:
    """The preset a drafter kind runs with unless ``drafter.acceptance`` says otherwise (a kind that is itself the
    name of an installed or built-in preset runs with that one)."""
    if kind in PRESETS or kind in builtin_presets():
        return kind
    if kind not in DEFAULT_PRESETS:
        raise PresetError(f"drafter.kind={kind} has no default acceptance preset; set drafter.acceptance to a preset "
                          f"name or file (built in: {', '.join(builtin_presets())}), or use a kind of "
                          f"{', '.join(DRAFTERS)}")
    return DEFAULT_PRESETS[kind]


def load_preset(name_or_path: str | Path) -> AcceptancePreset:
    """A preset by name (installed in memory, or shipped), by path to a preset file, or by drafter kind (its
    default preset)."""
    key = str(name_or_path)
    key = DEFAULT_PRESETS.get(key, key)
    if key in PRESETS:
        return PRESETS[key]
    builtin = BUILTIN_DIR / f"{key}.json"
    if builtin.is_file():
        return read_preset(builtin)
    path = Path(key).expanduser()
    if path.suffix == ".json" or path.exists():
        return read_preset(path)
    raise PresetError(f"drafter.acceptance={key}: not a built-in preset ({', '.join(builtin_presets())}), an "
                      "installed one, nor a preset file (a .json path)")


def install(preset: AcceptancePreset) -> str:
    """Register ``preset`` in memory under its name (refusing to replace a different one) and return the name."""
    if preset.name in builtin_presets():
        raise PresetError(f"preset name {preset.name!r} is a built-in preset; choose another name")
    old = PRESETS.get(preset.name)
    if old is not None and (old.domains, old.benchmarks) != (preset.domains, preset.benchmarks):
        raise PresetError(f"preset {preset.name!r} is already installed with other curves; choose a new name")
    PRESETS[preset.name] = preset
    return preset.name


def reference_preset(kind: str) -> AcceptancePreset:
    """The Qwen3-4B preset of a drafter kind (Figure 2's curves), or the kind's default when 4B has none (mtp)."""
    name = f"{REFERENCE_TARGET}_{kind}"
    return load_preset(name if name in builtin_presets() else default_preset(kind))


def preset(drafter: str, domain: str) -> AcceptanceCurve:
    """The domain curve of a drafter kind's reference preset (:func:`reference_preset`) or of a named preset."""
    found = reference_preset(drafter) if drafter in DEFAULT_PRESETS else load_preset(drafter)
    return found.curve(domain)
