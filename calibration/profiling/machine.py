"""What a measurement ran on, for its metadata: the device's name, the NVIDIA driver and the Python version (the
code's commit comes from :mod:`calibration.profiling.revision`)."""

from __future__ import annotations

import platform
import shutil
import subprocess

import torch


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    threads = torch.get_num_threads()
    return f"cpu ({platform.processor() or platform.machine()}, {threads} thread{'s' if threads > 1 else ''})"


def software(device: torch.device) -> dict[str, str | None]:
    """Python, torch and CUDA versions, and on CUDA the NVIDIA driver (from ``nvidia-smi``; None where it cannot
    be read)."""
    return {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "nvidia_driver": nvidia_driver() if device.type == "cuda" else None}


def nvidia_driver() -> str | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return out[0] if out else None
