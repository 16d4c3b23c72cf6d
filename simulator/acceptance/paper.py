"""The DSpark paper's offline acceptance figures, as published (for presets, checks and reports).

Source: "DSpark" (DeepSeek, 2026), the PDF in the MIT-licensed DeepSpec
repository (``reference/DSpark_paper.txt`` is its text). Every figure counts
the bonus token (the paper's footnote 3, page 10): tau is the accepted length
per decoding round, an acceptance rate is tau / (1 + l) for l verified drafts.
Offline protocol (section 4.1): temperature 1.0, chain drafting, block size 7,
every draft verified (no confidence scheduler).
"""

from __future__ import annotations

import numpy as np

PAPER = "DSpark paper (DeepSeek, 2026; DeepSpec repository, MIT)"

# Benchmarks of Table 1 and their domain (section 4.1, page 10). Names are ours: lower case, "_" for "-".
BENCHMARK_DOMAINS: dict[str, str] = {
    "gsm8k": "math", "math500": "math", "aime25": "math",
    "mbpp": "code", "humaneval": "code", "livecodebench": "code",
    "mt_bench": "chat", "alpaca": "chat", "arena_hard": "chat",
}
BENCHMARKS = tuple(BENCHMARK_DOMAINS)

# Table 1 (page 11): tau per benchmark, in BENCHMARKS order, per target and drafter.
TABLE1_SOURCE = f"{PAPER}, Table 1, page 11"
TABLE1: dict[str, dict[str, tuple[float, ...]]] = {
    "Qwen3-4B": {
        "Eagle3": (5.14, 4.62, 3.92, 3.69, 4.16, 3.77, 2.39, 2.26, 2.55),
        "DFlash": (5.40, 4.85, 4.15, 4.40, 4.74, 4.18, 3.07, 2.96, 2.83),
        "DSpark": (6.11, 5.70, 4.89, 5.13, 5.38, 4.86, 3.64, 3.54, 3.29),
    },
    "Qwen3-8B": {
        "Eagle3": (5.30, 4.77, 3.91, 3.96, 4.33, 4.17, 2.66, 2.54, 2.54),
        "DFlash": (5.33, 4.91, 4.07, 4.36, 4.64, 4.39, 3.11, 2.98, 2.81),
        "DSpark": (6.17, 5.78, 5.01, 5.16, 5.52, 5.17, 3.72, 3.58, 3.21),
    },
    "Qwen3-14B": {
        "Eagle3": (5.24, 4.60, 3.71, 3.81, 4.14, 4.01, 2.62, 2.47, 2.48),
        "DFlash": (5.41, 4.84, 3.98, 4.44, 4.59, 4.33, 3.10, 2.94, 2.72),
        "DSpark": (6.21, 5.74, 4.94, 5.26, 5.43, 5.02, 3.70, 3.58, 3.13),
    },
    "Gemma4-12B": {
        "Eagle3": (5.87, 5.46, 4.83, 4.72, 5.37, 4.16, 3.19, 3.06, 2.72),
        "DFlash": (5.45, 5.04, 4.22, 4.39, 4.95, 3.70, 2.98, 2.84, 2.59),
        "DSpark": (6.05, 5.78, 5.12, 5.11, 5.64, 4.51, 3.49, 3.35, 2.92),
    },
}
TABLE1_POSITIONS = 7  # block size of Table 1

# Figure 2 (page 12; values quoted in the text of section 4.3.1): Qwen3-4B, conditional acceptance q_k.
FIGURE2_ANCHORS: dict[tuple[str, str, int], float] = {  # (drafter kind, domain, position) -> q
    ("dflash", "math", 1): 0.88,
    ("dflash", "chat", 1): 0.72,
    ("dflash", "chat", 7): 0.63,
    ("dflash", "code", 1): 0.87,
    ("dflash", "code", 7): 0.78,
    ("eagle3", "math", 1): 0.81,
    ("eagle3", "chat", 1): 0.53,
    ("eagle3", "chat", 7): 0.74,
    ("dspark", "math", 1): 0.93,
}

# Figure 5 (page 15): Qwen3-4B DSpark, threshold sweep; acceptance rate (bonus included) at threshold 0 and at
# the largest threshold drawn (0.8).
FIGURE5_ACCEPTANCE_RATE: dict[str, tuple[float, float]] = {"math": (0.769, 0.925), "code": (0.676, 0.920),
                                                            "chat": (0.457, 0.957)}
FIGURE5_THRESHOLD = 0.8

# Figure 6 (page 15): reliability of the prefix survival a_k on Alpaca (Qwen3-4B DSpark): AUC of a_k against
# the survival of positions 1..k, and its ECE before and after STS, at positions 1, 3, 5, 7.
FIGURE6_POSITIONS = (1, 3, 5, 7)
FIGURE6_AUC = (0.818, 0.812, 0.864, 0.907)
FIGURE6_ECE_RAW = (0.057, 0.082, 0.058, 0.033)
FIGURE6_ECE_STS = (0.020, 0.017, 0.008, 0.004)


def drafter_kind(drafter: str) -> str:
    """The paper's drafter name as a drafter kind: ``DSpark`` -> ``dspark``."""
    return drafter.lower()


def table1_tau(target: str, drafter: str) -> dict[str, float]:
    """benchmark -> tau of one Table 1 row."""
    return dict(zip(BENCHMARKS, TABLE1[target][drafter], strict=True))


def table1_domain_means(target: str, drafter: str) -> dict[str, float]:
    """domain -> mean tau of its three benchmarks (the paper's domain figure, e.g. 5.57 for Qwen3-4B DSpark math)."""
    tau = table1_tau(target, drafter)
    domains = dict.fromkeys(BENCHMARK_DOMAINS.values())
    return {d: float(np.mean([t for b, t in tau.items() if BENCHMARK_DOMAINS[b] == d])) for d in domains}


# The Qwen3-4B row per drafter kind and domain: the three benchmarks' tau (kept for older callers).
TABLE1_QWEN3_4B: dict[str, dict[str, tuple[float, float, float]]] = {
    drafter_kind(drafter): {domain: tuple(t for b, t in zip(BENCHMARKS, row, strict=True)  # type: ignore[misc]
                                          if BENCHMARK_DOMAINS[b] == domain)
                            for domain in ("math", "code", "chat")}
    for drafter, row in TABLE1["Qwen3-4B"].items()
}
