"""Sweeps beyond one process: Hydra's Ray launcher on a local Ray cluster (head and two worker nodes)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "cluster" / "ray_local.sh"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_sweep_through_the_ray_launcher_on_a_local_cluster(tmp_path):
    pytest.importorskip("ray", reason="pip install -e '.[ray]' installs Ray and Hydra's Ray launcher")
    pytest.importorskip("hydra_plugins.hydra_ray_launcher", reason="pip install -e '.[ray]'")
    env = dict(os.environ, RAY_PORT=str(_free_port()), SWEEP_DIR=str(tmp_path / "sweep"),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    proc = subprocess.run(["bash", str(SCRIPT), "policy=mtp1,dspark", "traffic.num_users=2,4", "duration_s=2",
                           "warmup_s=0.5"], cwd=SCRIPT.parents[2], env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "ray cluster: 3 nodes, 2 CPUs" in proc.stdout
    summaries = sorted((tmp_path / "sweep").glob("*/summary.json"))
    assert len(summaries) == 4  # every job of the 2 x 2 sweep ran on a worker node and wrote its summary
