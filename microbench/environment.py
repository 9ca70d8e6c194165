"""What a sweep was measured on, stored in every shard's file metadata.

GPU: name, catalog key, a UUID-free id (PCI device/subsystem ids: the SKU, not
the card), SMs, L2, memory, clocks, power limit, ECC, driver, CUDA, torch,
triton and NCCL versions. CPU: model name and core count. Always: the git
commit of the code and the exact resolved configuration (the grid).
"""
from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path

import torch

from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.hardware import resolve_device

CPU_DEVICE = "cpu"  # device key of CPU-mode sweeps (not a GPU catalog entry)


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_commit() -> str | None:
    """HEAD of the checkout the code runs from, '+dirty' with uncommitted changes; None outside git."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_identity(device: torch.device) -> tuple[str, str]:
    """(catalog key, name as the driver reports it); CPU mode uses the key 'cpu'."""
    if device.type == "cpu":
        return CPU_DEVICE, cpu_model()
    name = torch.cuda.get_device_name(device)
    try:
        return resolve_device(name), name
    except KernelsightError as e:
        raise KernelsightError(f"{e}; add the GPU to conf/hardware/ (or an alias for {name!r}) "
                               f"so its sweep can be keyed") from None


def capture_environment(device: torch.device, config: dict, monitor=None) -> dict:
    key, name = device_identity(device)
    env = {
        "device": key, "device_name": name, "host_cpu": cpu_model(), "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__, "triton": _version("triton"), "python": platform.python_version(),
        "kernelsight": _version("kernelsight"), "git_commit": git_commit(),
        "triton_interpret": os.environ.get("TRITON_INTERPRET", "0"), "config": config,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update({
            "sm_count": props.multi_processor_count, "l2_bytes": props.L2_cache_size,
            "memory_bytes": props.total_memory, "compute_capability": f"{props.major}.{props.minor}",
            "cuda": torch.version.cuda,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if torch.distributed.is_nccl_available() else None,
        })
        if monitor is not None:
            env.update(monitor.facts())
    return env
