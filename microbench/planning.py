"""Planning a sweep: the device, every (shape, provider) measurement and collective of a grid, where the sweep
goes, what a resumed sweep already holds, and the roofline-based time estimate.

A grid is conf/sweep/<name>.yaml as a plain dict (families with their grids and
providers, collectives, timing, energy). `kernelsight bench` (cli/bench.py)
prints the plan and runs it.
"""
from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Callable

from kernelsight.predictor.errors import KernelsightError, did_you_mean
from kernelsight.predictor.hardware import load_hardware
from kernelsight.predictor.paths import data_dir

DEFAULT_ESTIMATE_GPU = "h100_sxm"
COLLECTIVE_TIMING = "hot"  # collectives run back to back without an L2 flush, as nccl-tests times them
DEVICES = ("cuda", "cpu")
# The libraries of the providers (Provider.library, the first part of a provider's name), known without
# importing them or torch, so a mistyped selector fails before torch loads (a test keeps this list current).
LIBRARIES = ("torch", "triton", "inductor", "flash_attn", "flashinfer", "vllm")


def check_device(kind: str) -> str:
    """device= of bench and bench serve, checked without torch."""
    if kind not in DEVICES:
        raise KernelsightError(f"device={kind}: must be cuda or cpu")
    return kind


def check_libraries(selectors, where: str = "providers") -> None:
    """Each provider selector (a library, or a provider name: library.kernel...) names a known library; the
    full names are checked against the providers once torch is loaded (providers.check_selectors)."""
    for sel in map(str, selectors):
        library = sel.split(".")[0]
        if library not in LIBRARIES:
            raise KernelsightError(f"{where}: unknown provider {sel!r} for any family{did_you_mean(library, LIBRARIES)}"
                                   f"; libraries: {', '.join(LIBRARIES)}")


def resume_dir(resume) -> Path | None:
    """The sweep directory resume= names (None for true/false), which must exist."""
    if not isinstance(resume, str) or resume in ("true", "false"):
        return None
    path = Path(resume)
    if not path.is_dir():
        raise KernelsightError(f"resume={resume}: no such sweep directory")
    return path


def torch_device(kind: str, dry_run: bool | None = None, estimate_on: str | None = None):
    """The torch device to measure on (kind: cuda or cpu); a PlannedDevice for a dry run planned for an absent
    GPU (`estimate_on`). dry_run None: the command has no dry run (the error hint says so)."""
    check_device(kind)  # before importing torch: a typo fails at once, with or without torch
    import torch

    from .providers.base import PlannedDevice

    if kind == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if dry_run:
        hw = load_hardware(estimate_on or DEFAULT_ESTIMATE_GPU)
        return PlannedDevice(capability=tuple(int(x) for x in hw.compute_capability.split(".")))
    hint = "(with sweep=cpu), or dry_run=true to plan for a GPU" if dry_run is not None else \
        "(with a small model_overrides) to try the pipeline"
    raise KernelsightError(f"device=cuda but torch {torch.__version__} sees no CUDA GPU; use device=cpu {hint}")


def build_plan(sweep: dict, selectors: list[str], device):
    """Every (shape, provider) measurement and collective shape of the grid on `device`, and what was left out;
    `selectors` picks providers by name or library."""
    from .grid import Plan, collective_sizes, expand_grid
    from .providers import check_selectors, get_bench, select
    from .runner import WorkItem

    check_selectors(selectors, where="providers")
    items, dropped, unsupported, unavailable = [], Counter(), Counter(), {}
    for family, spec in (sweep.get("families") or {}).items():
        where = f"sweep.families.{family}"
        get_bench(family)
        if spec is None or "grid" not in spec:
            raise KernelsightError(f"{where}: missing 'grid'")
        unknown = [k for k in spec if k not in ("grid", "providers", "max_shape_bytes")]
        if unknown:
            raise KernelsightError(f"{where}: unknown key {unknown[0]!r}; expected grid, providers, max_shape_bytes")
        own = [str(s) for s in spec.get("providers") or []]
        check_selectors(own, family, where=f"{where}.providers")
        limit = float(spec.get("max_shape_bytes") or sweep["max_shape_bytes"])
        shapes = []
        for shape in expand_grid(family, spec["grid"], where=f"{where}.grid"):
            if shape.bytes > limit:
                dropped[family] += 1
            else:
                shapes.append(shape)
        providers, missing = select(family, selectors, device)
        unavailable.update(missing)
        for p in providers:
            if own and not any(s in (p.name, p.library) for s in own):
                continue
            for shape in shapes:
                why = p.supports(shape, device)
                if why:
                    unsupported[(p.name, why)] += 1
                else:
                    items.append(WorkItem(shape, p))
    coll = sweep.get("collectives") or {}
    coll_rows = []
    if coll.get("ops"):
        from .collectives import collective_rows

        world = world_size(coll, device)
        if world >= 2:
            coll_rows = collective_rows(list(coll["ops"]), collective_sizes(coll["sizes"]), world,
                                        _link(coll, device), str(coll["dtype"]))
        else:
            unavailable[backend(device)] = f"{world} GPU visible: collectives need >= 2"
    return Plan(items, coll_rows, dict(dropped), dict(unsupported), unavailable)


def world_size(coll: dict, device) -> int:
    """Ranks of the collectives: sweep.collectives.world_size, or every visible GPU."""
    import torch

    if coll.get("world_size"):
        world = int(coll["world_size"])
        if world < 2:
            raise KernelsightError(f"sweep.collectives.world_size = {world}: must be >= 2")
        if device.type == "cuda" and isinstance(device, torch.device) and world > torch.cuda.device_count():
            raise KernelsightError(f"sweep.collectives.world_size = {world} but {torch.cuda.device_count()} GPU(s) "
                                   f"are visible")
        return world
    if device.type == "cpu":
        raise KernelsightError("sweep.collectives.world_size: set it for CPU mode (gloo processes), e.g. 2")
    return torch.cuda.device_count() if isinstance(device, torch.device) else 8


def _link(coll: dict, device) -> str:
    link = str(coll.get("link") or "auto")
    if link != "auto":
        return link
    if device.type == "cpu":
        return "net"  # gloo over TCP sockets
    from .nvml import GpuMonitor
    from .providers.base import PlannedDevice

    if isinstance(device, PlannedDevice):
        return "nvlink"  # planning for an HGX-class node
    monitor = GpuMonitor.open(device)
    if monitor is None:
        raise KernelsightError("sweep.collectives.link=auto reads NVLink state through NVML: pip install "
                               "nvidia-ml-py, or set sweep.collectives.link=nvlink|pcie|net")
    return "nvlink" if monitor.has_nvlink() else "pcie"


def resolve_sweep_dir(out, resume, sweep_id, sweep_name: str, device_key: str) -> tuple[Path, str, bool]:
    """(directory, sweep_id, resuming) from out (None: data/sweeps), resume (bool or a sweep directory) and
    sweep_id (None: <grid name>-<UTC time>)."""
    root = Path(out) if out else data_dir() / "sweeps"
    path = resume_dir(resume)
    if path is not None:
        if path.parent.name != device_key:
            raise KernelsightError(f"resume={resume}: that sweep was taken on {path.parent.name!r}, "
                                   f"this machine is {device_key!r}")
        return path, path.name, True
    resume = resume in (True, "true")
    base = root / device_key
    if sweep_id:
        path = base / str(sweep_id)
        has_rows = path.is_dir() and any(path.glob("*.parquet"))
        if has_rows and not resume:
            raise KernelsightError(f"{path} already holds a sweep: pass resume=true to continue it, "
                                   f"or choose another sweep_id")
        if resume and not path.is_dir():
            raise KernelsightError(f"resume=true: {path} does not exist")
        return path, str(sweep_id), resume
    name = str(sweep_name)
    if resume:
        previous = sorted(p for p in base.glob(f"{name}-*") if p.is_dir()) if base.is_dir() else []
        if not previous:
            raise KernelsightError(f"resume=true: no earlier '{name}' sweep under {base}; pass resume=<directory>")
        return previous[-1], previous[-1].name, True
    sweep_id = f"{name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    return base / sweep_id, sweep_id, False


def estimate_seconds(sweep: dict, items: list, collective_rows: list, hardware) -> dict:
    """Roofline-based time estimate of measuring `items` and `collective_rows` under the sweep's policy."""
    from kernelsight.predictor.families import make_shape

    from .grid import TimingConfig, estimate

    coll = sweep.get("collectives") or {}
    shapes = [make_shape(r["family"], **{k: v for k, v in r.items() if k != "family"}) for r in collective_rows]
    return estimate(items, shapes, hardware, TimingConfig(**sweep["timing"]),
                    energy_policy(sweep.get("energy") or {}), int(coll.get("max_reps", 0)),
                    int(coll.get("warmup", 0)))


def energy_policy(energy: dict) -> Callable[[str], float]:
    """family -> seconds of NVML energy loop (0 = none), from sweep.energy {enabled, min_seconds, families}."""
    if not energy.get("enabled"):
        return lambda family: 0.0
    seconds = float(energy.get("min_seconds", 0.5))
    if seconds <= 0:
        raise KernelsightError(f"sweep.energy.min_seconds = {seconds}: must be > 0")
    families = energy.get("families")
    chosen = None if families is None else {str(f) for f in families}
    return lambda family: seconds if chosen is None or family in chosen else 0.0


def backend(device) -> str:
    """The collectives' process-group backend on `device`."""
    return "nccl" if device.type == "cuda" else "gloo"


def pending_collectives(rows: list, device, done: set) -> list:
    """Collective rows a resumed sweep does not hold yet."""
    from .runner import row_key

    return [r for r in rows if row_key({**r, "provider": backend(device), "timing": COLLECTIVE_TIMING}) not in done]


def collective_job(coll: dict, shard_rows: int, device, rows: list, sweep_dir: Path, environment: dict,
                   base_row: dict):
    """The CollectiveJob every rank runs: `rows` under sweep.collectives' timing budget."""
    from .collectives import CollectiveJob

    return CollectiveJob(rows=rows, backend=backend(device), warmup=int(coll["warmup"]),
                         min_reps=int(coll["min_reps"]), max_reps=int(coll["max_reps"]),
                         budget_ms=float(coll["budget_ms"]), sweep_dir=str(sweep_dir), environment=environment,
                         base_row={**base_row, "provider": backend(device), "timing": COLLECTIVE_TIMING},
                         shard_rows=int(shard_rows))
