"""``python -m experiments.run policy=dspark traffic=chat``: one simulation (Hydra app).

Writes ``summary.json``, ``requests.parquet`` and ``steps.parquet`` into the
Hydra run directory and prints a summary. ``run(cfg)`` is the plain function
tests call.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from tqdm import tqdm

from experiments.config import build_spec
from experiments.report import format_summary
from simulator import Results, simulate

log = logging.getLogger(__name__)


def run(cfg: DictConfig, out_dir: Path | None = None) -> Results:
    """Simulate ``cfg``; write tables and summary into ``out_dir`` when given."""
    spec = build_spec(cfg)
    total = spec.duration_s
    with tqdm(total=total, unit="sim s", disable=not cfg.progress, leave=False,
              bar_format="{l_bar}{bar}| {n:.1f}/{total_fmt} sim s [{elapsed}]") as bar:
        results = simulate(spec, progress=lambda now: bar.update(now - bar.n))
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "summary.json").write_text(json.dumps(results.summary, indent=1, default=str) + "\n")
        if cfg.write_tables:
            results.requests.to_parquet(out_dir / "requests.parquet")
            results.steps.to_parquet(out_dir / "steps.parquet")
    return results


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    results = run(cfg, out_dir)
    print(format_summary(results.summary))
    print(f"tables and summary.json in {out_dir}")
    return float(results.summary["output_tokens_per_s"])


if __name__ == "__main__":
    main()
