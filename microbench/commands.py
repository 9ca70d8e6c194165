"""`kernelsight bench` (collect a sweep on this machine's GPU, or its CPU) and `kernelsight bench report`.

bench: expand the grid (conf/sweep/<name>.yaml), pick the providers, skip what
a resumed sweep already holds, print the plan with its roofline-based time
estimate, then measure kernels and collectives into shard files under
<out>/<device>/<sweep_id>/. dry_run=true stops after the estimate and, on a
machine without CUDA, plans for the `estimate_on` GPU.
"""
from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from omegaconf import DictConfig, OmegaConf

from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.hardware import load_hardware
from kernelsight.predictor.paths import data_dir
from kernelsight.sim.schema import plain

DEFAULT_ESTIMATE_GPU = "h100_sxm"


def _device(cfg: DictConfig):
    """The torch device to measure on; a PlannedDevice for a dry run planned for an absent GPU."""
    import torch

    from .providers.base import PlannedDevice

    kind = str(cfg.device)
    if kind == "cpu":
        return torch.device("cpu")
    if kind != "cuda":
        raise KernelsightError(f"device={kind}: must be cuda or cpu")
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if cfg.get("dry_run"):
        hw = load_hardware(cfg.estimate_on or DEFAULT_ESTIMATE_GPU)
        return PlannedDevice(capability=tuple(int(x) for x in hw.compute_capability.split(".")))
    hint = "(with sweep=cpu), or dry_run=true to plan for a GPU" if "dry_run" in cfg else \
        "(with a small model_overrides) to try the pipeline"
    raise KernelsightError(f"device=cuda but torch {torch.__version__} sees no CUDA GPU; use device=cpu {hint}")


def build_plan(cfg: DictConfig, device):
    """Every (shape, provider) measurement and collective shape of the grid on `device`, and what was left out."""
    from .grid import Plan, collective_sizes, expand_grid
    from .providers import check_selectors, get_bench, select
    from .runner import WorkItem

    sweep = cfg.sweep
    selectors = [str(s) for s in cfg.providers]
    check_selectors(selectors, where="providers")
    items, dropped, unsupported, unavailable = [], Counter(), Counter(), {}
    for family, spec in (sweep.families or {}).items():
        where = f"sweep.families.{family}"
        get_bench(family)
        if spec is None or "grid" not in spec:
            raise KernelsightError(f"{where}: missing 'grid'")
        unknown = [k for k in spec if k not in ("grid", "providers", "max_shape_bytes")]
        if unknown:
            raise KernelsightError(f"{where}: unknown key {unknown[0]!r}; expected grid, providers, max_shape_bytes")
        own = [str(s) for s in spec.get("providers") or []]
        check_selectors(own, family, where=f"{where}.providers")
        limit = float(spec.get("max_shape_bytes") or sweep.max_shape_bytes)
        shapes = []
        for shape in expand_grid(family, plain(spec.grid), where=f"{where}.grid"):
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

        world = _world_size(cfg, device)
        if world >= 2:
            coll_rows = collective_rows(list(coll.ops), collective_sizes(coll.sizes), world,
                                        _link(cfg, device), str(coll.dtype))
        else:
            unavailable[_backend(device)] = f"{world} GPU visible: collectives need >= 2"
    return Plan(items, coll_rows, dict(dropped), dict(unsupported), unavailable)


def _world_size(cfg: DictConfig, device) -> int:
    import torch

    coll = cfg.sweep.collectives
    if coll.get("world_size"):
        world = int(coll.world_size)
        if world < 2:
            raise KernelsightError(f"sweep.collectives.world_size = {world}: must be >= 2")
        if device.type == "cuda" and isinstance(device, torch.device) and world > torch.cuda.device_count():
            raise KernelsightError(f"sweep.collectives.world_size = {world} but {torch.cuda.device_count()} GPU(s) "
                                   f"are visible")
        return world
    if device.type == "cpu":
        raise KernelsightError("sweep.collectives.world_size: set it for CPU mode (gloo processes), e.g. 2")
    return torch.cuda.device_count() if isinstance(device, torch.device) else 8


def _link(cfg: DictConfig, device) -> str:
    link = str(cfg.sweep.collectives.get("link") or "auto")
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


def resolve_sweep_dir(cfg: DictConfig, device_key: str) -> tuple[Path, str, bool]:
    """(directory, sweep_id, resuming) from out, sweep_id and resume."""
    root = Path(cfg.out) if cfg.out else data_dir() / "sweeps"
    resume = cfg.resume
    if isinstance(resume, str) and resume not in ("true", "false"):
        path = Path(resume)
        if not path.is_dir():
            raise KernelsightError(f"resume={resume}: no such sweep directory")
        if path.parent.name != device_key:
            raise KernelsightError(f"resume={resume}: that sweep was taken on {path.parent.name!r}, "
                                   f"this machine is {device_key!r}")
        return path, path.name, True
    resume = resume in (True, "true")
    base = root / device_key
    if cfg.sweep_id:
        path = base / str(cfg.sweep_id)
        has_rows = path.is_dir() and any(path.glob("*.parquet"))
        if has_rows and not resume:
            raise KernelsightError(f"{path} already holds a sweep: pass resume=true to continue it, "
                                   f"or choose another sweep_id")
        if resume and not path.is_dir():
            raise KernelsightError(f"resume=true: {path} does not exist")
        return path, str(cfg.sweep_id), resume
    name = str(cfg.sweep.name)
    if resume:
        previous = sorted(p for p in base.glob(f"{name}-*") if p.is_dir()) if base.is_dir() else []
        if not previous:
            raise KernelsightError(f"resume=true: no earlier '{name}' sweep under {base}; pass resume=<directory>")
        return previous[-1], previous[-1].name, True
    sweep_id = f"{name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    return base / sweep_id, sweep_id, False


def _format_counts(counts: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items())


def print_plan(plan, pending, pending_coll, done: int, estimate: dict, hw_key: str, world: int | None) -> None:
    per_family = Counter(i.family for i in pending)
    print(f"  {len(pending)} kernel measurements ({_format_counts(per_family) or 'none'})")
    if plan.collectives:
        print(f"  {len(pending_coll)} collective measurements on {world} ranks")
    if done:
        print(f"  resuming: {done} measurements already in the sweep are skipped")
    if plan.dropped_large:
        print(f"  left out over max_shape_bytes: {_format_counts(plan.dropped_large)}")
    for name, why in sorted(plan.unavailable.items()):
        print(f"  provider {name} unavailable: {why}")
    for (name, why), n in sorted(plan.unsupported.items()):
        print(f"  provider {name} skips {n} shape(s): {why}")
    from .grid import ASSUMED_ETA, SETUP_S

    per = ", ".join(f"{f} {s / 60:.1f}" for f, s in estimate["per_family"].items())
    print(f"  estimated time on {hw_key}: {estimate['total'] / 60:.1f} min ({per}) "
          f"[roofline x {ASSUMED_ETA:g} per call, {SETUP_S * 1e3:.0f} ms setup per measurement]")


def bench(cfg: DictConfig) -> None:
    """Collect (or resume) a sweep; see the module docstring."""
    if str(cfg.device) == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before any triton kernel module is imported
    from tqdm import tqdm

    from .collectives import spawn
    from .environment import capture_environment, device_identity
    from .nvml import GpuMonitor
    from .providers.base import PlannedDevice
    from .runner import Context, ShardWriter, done_keys, item_key, remove_stale_temp_files, run_items
    from .timing import Clock, TimingConfig

    device = _device(cfg)
    if device.type == "cpu":
        import torch
        torch.set_num_threads(1)
    sweep = cfg.sweep
    timing = TimingConfig(**plain(sweep.timing))
    energy_for = energy_policy(sweep.get("energy") or {})
    energy_on = any(energy_for(f) for f in (sweep.families or {}))
    if energy_on and device.type != "cuda":
        raise KernelsightError("sweep.energy.enabled=true needs NVML on a CUDA GPU; CPU mode has no energy counter")
    plan = build_plan(cfg, device)
    world = plan.collectives[0]["world_size"] if plan.collectives else None

    if isinstance(device, PlannedDevice):
        hw_key = str(cfg.estimate_on or DEFAULT_ESTIMATE_GPU)
        print(f"kernelsight bench: dry run of grid '{sweep.name}' planned for {hw_key} "
              f"(no CUDA here; every selected provider assumed installed)")
        est = estimate_seconds(cfg, plan.items, plan.collectives, load_hardware(hw_key))
        print_plan(plan, plan.items, plan.collectives, 0, est, hw_key, world)
        return

    key, name = device_identity(device)
    sweep_dir, sweep_id, resuming = resolve_sweep_dir(cfg, key)
    done = done_keys(sweep_dir) if resuming else set()
    pending = [i for i in plan.items if item_key(i, timing.l2) not in done]
    pending_coll = pending_collectives(plan.collectives, device, done)
    hw_key = str(cfg.estimate_on or (key if device.type == "cuda" else DEFAULT_ESTIMATE_GPU))
    hardware = load_hardware(hw_key)
    est = estimate_seconds(cfg, pending, pending_coll, hardware)
    print(f"kernelsight bench: grid '{sweep.name}' on {key} ({name}) -> {sweep_dir}")
    print_plan(plan, pending, pending_coll, len(done), est, hw_key, world)
    if cfg.dry_run:
        return

    monitor = GpuMonitor.open(device)
    if energy_on and monitor is None:
        raise KernelsightError("sweep.energy.enabled=true needs NVML: pip install nvidia-ml-py")
    if device.type == "cuda" and monitor is None:
        print("  note: nvidia-ml-py not installed: no clock/throttle readings (pip install nvidia-ml-py)")
    config = OmegaConf.to_container(cfg, resolve=True)
    environment = capture_environment(device, config, monitor)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_temp_files(sweep_dir)
    base_row = {"device": key, "device_name": name, "source": "measured", "sweep_id": sweep_id}
    from .triton_kernels import interpreting

    ctx = Context(device=device, clock=Clock(device, timing), rtol={k: float(v) for k, v in sweep.check.rtol.items()},
                  seed=int(cfg.seed), base_row=base_row, monitor=monitor,
                  hardware=hardware if device.type == "cuda" else None, energy=energy_for,
                  interpreting=interpreting())
    writer = ShardWriter(sweep_dir, environment, int(cfg.shard_rows))
    start = time.perf_counter()
    counts: Counter = Counter()
    try:
        with tqdm(total=len(pending), unit="shape", disable=not cfg.progress, file=sys.stderr,
                  mininterval=1.0, dynamic_ncols=True) as bar:
            def progress(item):
                bar.set_postfix_str(f"{item.family} {item.provider.name}", refresh=False)
                bar.update(1)
            counts.update(run_items(pending, ctx, writer, progress))
        if pending_coll:
            spawn(collective_job(cfg, device, pending_coll, sweep_dir, environment, base_row), world)
            counts["collectives"] += len(pending_coll)
    except KeyboardInterrupt:
        print(f"\ninterrupted: every finished measurement is saved in {sweep_dir}; continue with "
              f"`kernelsight bench sweep={sweep.name} resume={sweep_dir}`", file=sys.stderr)
        sys.exit(130)
    elapsed = time.perf_counter() - start
    print(f"done in {elapsed / 60:.1f} min: {_format_counts(dict(counts)) or 'nothing to do'} -> {sweep_dir}")


def estimate_seconds(cfg: DictConfig, items: list, collective_rows: list, hardware) -> dict:
    """Roofline-based time estimate of measuring `items` and `collective_rows` under cfg's sweep policy."""
    from kernelsight.predictor.families import make_shape

    from .grid import estimate
    from .timing import TimingConfig

    sweep = cfg.sweep
    coll = sweep.get("collectives") or {}
    shapes = [make_shape(r["family"], **{k: v for k, v in r.items() if k != "family"}) for r in collective_rows]
    return estimate(items, shapes, hardware, TimingConfig(**plain(sweep.timing)),
                    energy_policy(sweep.get("energy") or {}), int(coll.get("max_reps", 0)),
                    int(coll.get("warmup", 0)))


def energy_policy(energy) -> Callable[[str], float]:
    """family -> seconds of NVML energy loop (0 = none), from sweep.energy {enabled, min_seconds, families}."""
    if not energy.get("enabled"):
        return lambda family: 0.0
    seconds = float(energy.get("min_seconds", 0.5))
    if seconds <= 0:
        raise KernelsightError(f"sweep.energy.min_seconds = {seconds}: must be > 0")
    families = energy.get("families")
    chosen = None if families is None else {str(f) for f in families}
    return lambda family: seconds if chosen is None or family in chosen else 0.0


def _backend(device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


COLLECTIVE_TIMING = "hot"  # collectives run back to back without an L2 flush, as nccl-tests times them


def pending_collectives(rows: list, device, done: set) -> list:
    from .runner import row_key

    return [r for r in rows if row_key({**r, "provider": _backend(device), "timing": COLLECTIVE_TIMING}) not in done]


def collective_job(cfg: DictConfig, device, rows: list, sweep_dir: Path, environment: dict, base_row: dict):
    from .collectives import CollectiveJob

    coll = cfg.sweep.collectives
    return CollectiveJob(rows=rows, backend=_backend(device), warmup=int(coll.warmup), min_reps=int(coll.min_reps),
                         max_reps=int(coll.max_reps), budget_ms=float(coll.budget_ms), sweep_dir=str(sweep_dir),
                         environment=environment,
                         base_row={**base_row, "provider": _backend(device), "timing": COLLECTIVE_TIMING},
                         shard_rows=int(cfg.shard_rows))


def collectives_job_from_overrides(overrides: list[str]):
    """The collective part of `kernelsight bench <overrides>` for this torchrun rank (rank 0 decides, all run it).

    World size comes from torchrun; resume and sweep ids resolve on rank 0 and
    are broadcast, so every rank runs the same list.
    """
    import torch
    from hydra import compose, initialize_config_dir

    from kernelsight.predictor.paths import conf_dir

    from .environment import capture_environment, device_identity
    from .nvml import GpuMonitor
    from .runner import done_keys

    world = int(os.environ["WORLD_SIZE"])
    with initialize_config_dir(config_dir=str(Path(conf_dir()).resolve()), version_base="1.3"):
        cfg = compose(config_name="bench", overrides=[*overrides, f"sweep.collectives.world_size={world}"])
    device = (torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if str(cfg.device) == "cuda"
              else torch.device("cpu"))
    plan = build_plan(cfg, device)
    key, name = device_identity(device)
    sweep_dir, sweep_id, resuming = resolve_sweep_dir(cfg, key)
    done = done_keys(sweep_dir) if resuming else set()
    environment = capture_environment(device, OmegaConf.to_container(cfg, resolve=True), GpuMonitor.open(device))
    base_row = {"device": key, "device_name": name, "source": "measured", "sweep_id": sweep_id}
    return collective_job(cfg, device, pending_collectives(plan.collectives, device, done), sweep_dir,
                          environment, base_row)


def bench_report(cfg: DictConfig) -> None:
    """`kernelsight bench report SWEEP`: roofline and η plots plus the η summary table of a sweep."""
    from .report import write_report

    if not cfg.sweep_file:
        raise KernelsightError("sweep_file=PATH is required: a sweep file or directory")
    hardware = cfg.get("hardware")
    result = write_report(str(cfg.sweep_file), str(cfg.out), str(hardware.key) if hardware else None)
    table = result["table"]
    print(f"η = measured / roofline on {result['hardware']} ({int(table['rows'].sum())} ok rows)")
    print(table.to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    for name, path in result["paths"].items():
        print(f"{name}: {path}")


def bench_serve(cfg: DictConfig) -> None:
    """`kernelsight bench serve`: end-to-end serving runs of transformers' continuous batching (serving.py)."""
    import pandas as pd
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    from kernelsight.predictor.paths import conf_dir
    from kernelsight.sim.commands import write_table

    from .environment import capture_environment, device_identity
    from .serving import ServeWorkload, build_model, run_workload, summarize, trace_rows

    device = _device(cfg)
    specs = OmegaConf.to_container(cfg.workloads) or {}
    only = list(cfg.only) if cfg.only else list(specs)
    unknown = [name for name in only if name not in specs]
    if unknown:
        raise KernelsightError(f"only: unknown workload(s) {', '.join(unknown)}; defined: {', '.join(specs) or 'none'}")
    workloads = [ServeWorkload.from_mapping(name, specs[name]) for name in only]
    if not workloads:
        raise KernelsightError("workloads: none given")
    hf_config = conf_dir() / "model" / str(cfg.model.hf_config)
    key, _ = device_identity(device)
    run_dir = Path(cfg.out or data_dir() / "validation" / "transformers") / key / str(cfg.run_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    measured = _read_measured(run_dir)
    for w in workloads:  # resuming must not mix two definitions of one workload name in one run
        if w.name in measured and (run_dir / f"{w.name}.parquet").is_file() and \
                ServeWorkload.from_mapping(w.name, measured[w.name]["workload"]) != w:
            raise KernelsightError(f"workload {w.name}: {run_dir} holds it measured with other settings "
                                   f"({measured[w.name]['workload']}); choose another run_id or workload name")
    pending = [w for w in workloads if not (run_dir / f"{w.name}.parquet").is_file()]
    print(f"kernelsight bench serve: {cfg.model.name} on {key}, {len(workloads)} workloads "
          f"({len(workloads) - len(pending)} already measured in {run_dir})")
    if pending:
        overrides = {k: v for k, v in OmegaConf.to_container(cfg.model_overrides).items() if v is not None}
        model = build_model(hf_config, overrides, str(cfg.dtype), str(device),
                            str(cfg.attn_implementation), int(cfg.seed))
        engine = {k: v for k, v in OmegaConf.to_container(cfg.engine).items() if v is not None}
        manager = model.init_continuous_batching(
            generation_config=GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=0),
            continuous_batching_config=ContinuousBatchingConfig(**engine))
        manager.warmup()  # sizes the cache (and captures CUDA graphs) before the clock starts
        resolved = {k: getattr(manager.continuous_batching_config, k, None)  # filled in once the cache exists
                    for k in ("block_size", "num_blocks", "max_batch_tokens", "scheduler_type", "use_cuda_graph")}
        resolved = {k: v if isinstance(v, (int, float, str, bool, type(None))) else str(v) for k, v in resolved.items()}
        resolved["attn_implementation"] = model.config._attn_implementation
        _write_json(run_dir / "engine.json", resolved)  # what the engine chose where the settings said null
        manager.start()
        try:
            vocab = int(model.config.vocab_size)
            if cfg.warmup_requests:  # first kernels, graph captures and allocator growth, not measured
                warm = ServeWorkload("warmup", "closed_loop", min(w.isl for w in workloads), 8,
                                     int(cfg.warmup_requests), concurrency=int(cfg.warmup_requests))
                run_workload(manager, warm, warm.requests(int(cfg.seed)), vocab, int(cfg.seed))
            for w in pending:
                start = time.perf_counter()
                seed = _workload_seed(int(cfg.seed), w.name)
                requests = w.requests(seed)
                rows = run_workload(manager, w, requests, vocab, seed, float(cfg.timeout_s))
                write_table(pd.DataFrame(trace_rows(requests)), run_dir / f"{w.name}_trace.csv")
                write_table(pd.DataFrame(rows), run_dir / f"{w.name}.parquet")  # a workload whole or not at all
                spec = {k: v for k, v in asdict(w).items() if k != "name" and v is not None}
                measured[w.name] = {"workload": spec, "seed": seed, "engine": resolved,
                                    "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
                _write_json(run_dir / "workloads.json", measured)
                print(f"  {w.name}: {len(rows)} requests in {time.perf_counter() - start:.1f} s")
        finally:
            manager.stop(block=True)
    done = [ServeWorkload.from_mapping(name, m["workload"]) for name, m in measured.items()
            if (run_dir / f"{name}.parquet").is_file()]  # every workload of the run, not only this call's
    rows = pd.concat([pd.read_parquet(run_dir / f"{w.name}.parquet") for w in done], ignore_index=True)
    summary = pd.DataFrame(summarize(rows.to_dict("records"), done))
    summary.insert(0, "model", cfg.model.name)
    summary.insert(1, "device", key)
    write_table(summary, run_dir / "summary.csv")
    env = capture_environment(device, OmegaConf.to_container(cfg, resolve=True))
    env["transformers"] = __import__("transformers").__version__
    engine_file = run_dir / "engine.json"
    env["engine_resolved"] = json.loads(engine_file.read_text(encoding="utf-8")) if engine_file.is_file() else None
    _write_json(run_dir / "run.json", env)
    print(summary.round(2).to_string(index=False))
    print(f"wrote {run_dir}/summary.csv, run.json (engine.json: the cache and token budget the engine chose) "
          f"and one requests file per workload")


def _read_measured(run_dir: Path) -> dict:
    """workloads.json of a run: per measured workload its settings, seed, engine settings and start time."""
    from .serving import ServeWorkload

    path = run_dir / "workloads.json"
    if not path.is_file():
        return {}
    try:
        measured = json.loads(path.read_text(encoding="utf-8"))
        for name, m in measured.items():
            ServeWorkload.from_mapping(name, m["workload"])
        return measured
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError, KernelsightError) as e:
        raise KernelsightError(f"{path}: not a workloads record of bench serve ({e})") from None


def _workload_seed(seed: int, name: str) -> int:
    """A workload's own seed (its requests do not change when other workloads are added or skipped)."""
    import zlib

    return seed * 1_000_003 + zlib.crc32(name.encode())


def _write_json(path: Path, obj) -> None:
    """JSON written whole or not at all (temp file + rename)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True, default=str) + "\n", encoding="utf-8")
    tmp.replace(path)
