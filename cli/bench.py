"""`kernelsight bench` (collect a sweep on this machine's GPU, or its CPU), `bench report` and `bench serve`.

bench: expand the grid (conf/sweep/<name>.yaml), pick the providers, skip what
a resumed sweep already holds, print the plan with its roofline-based time
estimate (microbench/planning.py), then measure kernels and collectives into
shard files under <out>/<device>/<sweep_id>/. dry_run=true stops after the
estimate and, on a machine without CUDA, plans for the `estimate_on` GPU.

Collectives across several processes started by torchrun (one per GPU, or
gloo processes on a CPU): `torchrun --nproc-per-node N -m kernelsight.cli.bench
<bench overrides>`; rank 0 composes the config, every rank runs the same list.
"""
from __future__ import annotations

import contextlib
import os
import shlex
import sys
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

from kernelsight.microbench import planning
from kernelsight.microbench.grid import TimingConfig
from kernelsight.microbench.serving import ServeWorkload, check_dtype, model_config
from kernelsight.predictor.errors import KernelsightError, check_seed, whole_number
from kernelsight.predictor.hardware import load_hardware
from kernelsight.predictor.outputs import ensure_dir, write_json, write_table
from kernelsight.predictor.paths import conf_dir, data_dir
from kernelsight.sim.workload import Workload, WorkloadConfig, trace_rows

from . import on_interrupt
from .config import container, flag, task_overrides


def plan(cfg, device):
    """The grid's measurements on `device` (microbench.grid.Plan)."""
    return planning.build_plan(container(cfg.sweep), [str(s) for s in cfg.providers], device)


def estimate(cfg, items: list, collective_rows: list, hardware) -> dict:
    """Roofline-based time estimate of measuring `items` and `collective_rows` under cfg's sweep policy."""
    return planning.estimate_seconds(container(cfg.sweep), items, collective_rows, hardware)


def _sweep_dir(cfg, device_key: str) -> tuple[Path, str, bool]:
    return planning.resolve_sweep_dir(cfg.out, cfg.resume, cfg.sweep_id, str(cfg.sweep.name), device_key)


def _format_counts(counts: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items())


def print_plan(plan, pending, pending_coll, done: int, estimate: dict, hw_key: str, world: int | None) -> None:
    from kernelsight.microbench.grid import ASSUMED_ETA, SETUP_S

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
    per = ", ".join(f"{f} {s / 60:.1f}" for f, s in estimate["per_family"].items())
    builds = {item.provider.build_s for item in plan.items if item.provider.build_s}
    build = f", {'/'.join(f'{b:g}' for b in sorted(builds))} s compiling per shape where a provider compiles" \
        if builds else ""
    print(f"  estimated time on {hw_key}: {estimate['total'] / 60:.1f} min ({per}) "
          f"[roofline x {ASSUMED_ETA:g} per call, {SETUP_S * 1e3:.0f} ms setup per measurement{build}]")


def check_settings(cfg) -> tuple[dict, TimingConfig]:
    """(the sweep as plain values, its timing policy), with every setting checked that can be without torch:
    a typo fails at once, before torch loads (seconds), and says so on a machine without torch too."""
    planning.check_device(str(cfg.device))
    for key in ("dry_run", "progress"):
        flag(cfg, key)
    check_seed(cfg.seed)
    whole_number(cfg.shard_rows, "shard_rows", hint="rows per shard file")
    planning.check_libraries(cfg.providers)
    if cfg.estimate_on:
        try:
            load_hardware(str(cfg.estimate_on))
        except KernelsightError as e:
            raise KernelsightError(f"estimate_on={cfg.estimate_on}: {e}") from None
    planning.resume_dir(cfg.resume)
    if cfg.out:
        ensure_dir(Path(str(cfg.out)), "out", create=False)
    sweep = container(cfg.sweep)
    return sweep, TimingConfig(**sweep["timing"])


def bench(cfg) -> None:
    """Collect (or resume) a sweep; see the module docstring."""
    sweep, timing = check_settings(cfg)
    if str(cfg.device) == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before any triton kernel module is imported
    from kernelsight.microbench.environment import device_identity
    from kernelsight.microbench.providers.base import PlannedDevice
    from kernelsight.microbench.runner import done_keys, item_key

    device = planning.torch_device(str(cfg.device), bool(cfg.dry_run), cfg.estimate_on)
    if device.type == "cpu":
        import torch
        torch.set_num_threads(1)
    energy_for = planning.energy_policy(sweep.get("energy") or {})
    energy_on = any(energy_for(f) for f in (sweep.get("families") or {}))
    if energy_on and device.type != "cuda":
        raise KernelsightError("sweep.energy.enabled=true needs NVML on a CUDA GPU; CPU mode has no energy counter")
    grid = plan(cfg, device)
    world = grid.collectives[0]["world_size"] if grid.collectives else None

    if isinstance(device, PlannedDevice):
        hw_key = str(cfg.estimate_on or planning.DEFAULT_ESTIMATE_GPU)
        print(f"kernelsight bench: dry run of grid '{sweep['name']}' planned for {hw_key} "
              f"(no CUDA here; every selected provider assumed installed)")
        est = estimate(cfg, grid.items, grid.collectives, load_hardware(hw_key))
        print_plan(grid, grid.items, grid.collectives, 0, est, hw_key, world)
        return

    key, name = device_identity(device)
    sweep_dir, sweep_id, resuming = _sweep_dir(cfg, key)
    done = done_keys(sweep_dir) if resuming else set()
    pending = [i for i in grid.items if item_key(i, timing.l2) not in done]
    pending_coll = planning.pending_collectives(grid.collectives, device, done)
    hw_key = str(cfg.estimate_on or (key if device.type == "cuda" else planning.DEFAULT_ESTIMATE_GPU))
    hardware = load_hardware(hw_key)
    est = estimate(cfg, pending, pending_coll, hardware)
    print(f"kernelsight bench: grid '{sweep['name']}' on {key} ({name}) -> {sweep_dir}")
    print_plan(grid, pending, pending_coll, len(done), est, hw_key, world)
    if cfg.dry_run:
        return
    base_row = {"device": key, "device_name": name, "source": "measured", "sweep_id": sweep_id}
    _measure(cfg, device, sweep, pending, pending_coll, world, sweep_dir, base_row, hardware, energy_for)


def _measure(cfg, device, sweep: dict, pending: list, pending_coll: list, world, sweep_dir: Path, base_row: dict,
             hardware, energy_for) -> None:
    """Measure the pending kernels (progress bar) and collectives into the sweep's shards."""
    from tqdm import tqdm

    from kernelsight.microbench.collectives import spawn
    from kernelsight.microbench.environment import capture_environment
    from kernelsight.microbench.nvml import GpuMonitor
    from kernelsight.microbench.runner import Context, ShardWriter, remove_stale_temp_files, run_items
    from kernelsight.microbench.timing import Clock
    from kernelsight.microbench.triton_kernels import interpreting

    monitor = GpuMonitor.open(device)
    if any(energy_for(f) for f in (sweep.get("families") or {})) and monitor is None:
        raise KernelsightError("sweep.energy.enabled=true needs NVML: pip install nvidia-ml-py")
    if device.type == "cuda" and monitor is None:
        print("  note: nvidia-ml-py not installed: no clock/throttle readings (pip install nvidia-ml-py)")
    environment = capture_environment(device, container(cfg), monitor)
    ensure_dir(sweep_dir, "out")
    remove_stale_temp_files(sweep_dir)
    ctx = Context(device=device, clock=Clock(device, TimingConfig(**sweep["timing"])),
                  rtol={k: float(v) for k, v in sweep["check"]["rtol"].items()},
                  seed=int(cfg.seed), base_row=base_row, monitor=monitor,
                  hardware=hardware if device.type == "cuda" else None, energy=energy_for,
                  interpreting=interpreting())
    writer = ShardWriter(sweep_dir, environment, int(cfg.shard_rows))
    start = time.perf_counter()
    counts: Counter = Counter()
    with on_interrupt(f"every finished measurement is saved in {sweep_dir}; continue with "
                      f"`{resume_command(sweep_dir)}`"):
        with tqdm(total=len(pending), unit="shape", disable=not cfg.progress, file=sys.stderr,
                  mininterval=1.0, dynamic_ncols=True) as bar:
            def progress(item):
                bar.set_postfix_str(f"{item.family} {item.provider.name}", refresh=False)
                bar.update(1)
            counts.update(run_items(pending, ctx, writer, progress))
        if pending_coll:
            spawn(planning.collective_job(sweep["collectives"], int(cfg.shard_rows), device, pending_coll, sweep_dir,
                                          environment, base_row), world)
            counts["collectives"] += len(pending_coll)
    elapsed = time.perf_counter() - start
    print(f"done in {elapsed / 60:.1f} min: {_format_counts(dict(counts)) or 'nothing to do'} -> {sweep_dir}")


def resume_command(sweep_dir: Path) -> str:
    """The command line that continues this sweep: every override given (device=, sweep=, providers=, ...)
    with resume= naming its directory (in place of resume= and sweep_id=)."""
    given = [o for o in task_overrides() if o.lstrip("+~").split("=", 1)[0] not in ("resume", "sweep_id")]
    return shlex.join(["kernelsight", "bench", *given, f"resume={sweep_dir}"])


def collectives_job_from_overrides(overrides: list[str]):
    """The collective part of `kernelsight bench <overrides>` for this torchrun rank (rank 0 decides, all run it).

    World size comes from torchrun; resume and sweep ids resolve on rank 0 and
    are broadcast, so every rank runs the same list.
    """
    import torch
    from hydra import compose, initialize_config_dir

    from kernelsight.microbench.environment import capture_environment, device_identity
    from kernelsight.microbench.nvml import GpuMonitor
    from kernelsight.microbench.runner import done_keys

    world = int(os.environ["WORLD_SIZE"])
    with initialize_config_dir(config_dir=str(Path(conf_dir()).resolve()), version_base="1.3"):
        cfg = compose(config_name="bench", overrides=[*overrides, f"sweep.collectives.world_size={world}"])
    device = (torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if str(cfg.device) == "cuda"
              else torch.device("cpu"))
    grid = plan(cfg, device)
    key, name = device_identity(device)
    sweep_dir, sweep_id, resuming = _sweep_dir(cfg, key)
    done = done_keys(sweep_dir) if resuming else set()
    environment = capture_environment(device, container(cfg), GpuMonitor.open(device))
    base_row = {"device": key, "device_name": name, "source": "measured", "sweep_id": sweep_id}
    return planning.collective_job(container(cfg.sweep.collectives), int(cfg.shard_rows), device,
                                   planning.pending_collectives(grid.collectives, device, done), sweep_dir,
                                   environment, base_row)


def torchrun_collectives(argv: list[str] | None = None) -> None:
    """torchrun entry: rank 0 composes the bench config from the overrides; every rank runs its collectives."""
    import torch
    import torch.distributed as dist

    from kernelsight.microbench.collectives import HEADER, run_job

    overrides = list(sys.argv[1:] if argv is None else argv)
    gpu = "device=cpu" not in overrides
    if gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if gpu else "gloo")
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        box = [collectives_job_from_overrides(overrides) if rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        if rank == 0:
            print(HEADER, flush=True)
        run_job(box[0], rank, world)
    finally:
        dist.destroy_process_group()


def bench_report(cfg) -> None:
    """`kernelsight bench report SWEEP`: roofline and η plots plus the η summary table of a sweep."""
    from kernelsight.microbench.report import write_report

    if not cfg.sweep_file:
        raise KernelsightError("sweep_file=PATH is required: a sweep file or directory")
    hardware = cfg.get("hardware")
    result = write_report(str(cfg.sweep_file), str(cfg.out), str(hardware.key) if hardware else None)
    table = result["table"]
    print(f"η = measured / roofline on {result['hardware']} ({int(table['rows'].sum())} ok rows)")
    print(table.to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    for name, path in result["paths"].items():
        print(f"{name}: {path}")


def serve_requests(workload: ServeWorkload, seed: int) -> list:
    """The simulator's request stream for a bench serve workload (sim.request.Request, in arrival order)."""
    config = WorkloadConfig.from_config(workload.workload_mapping())
    return list(Workload(config).requests(workload.num_requests, seed))


def bench_serve(cfg) -> None:
    """`kernelsight bench serve`: end-to-end serving runs of transformers' continuous batching (serving.py)."""
    workloads = serve_workloads(cfg)
    device = planning.torch_device(str(cfg.device))
    from kernelsight.microbench.environment import device_identity
    from kernelsight.microbench.serving import read_measured

    key, _ = device_identity(device)
    run_dir = ensure_dir(Path(cfg.out or data_dir() / "validation" / "transformers") / key / str(cfg.run_id), "out")
    measured = read_measured(run_dir)
    for w in workloads:  # resuming must not mix two definitions of one workload name in one run
        if w.name in measured and (run_dir / f"{w.name}.parquet").is_file() and \
                ServeWorkload.from_mapping(w.name, measured[w.name]["workload"]) != w:
            raise KernelsightError(f"workload {w.name}: {run_dir} holds it measured with other settings "
                                   f"({measured[w.name]['workload']}); choose another run_id or workload name")
    pending = [w for w in workloads if not (run_dir / f"{w.name}.parquet").is_file()]
    print(f"kernelsight bench serve: {cfg.model.name} on {key}, {len(workloads)} workloads "
          f"({len(workloads) - len(pending)} already measured in {run_dir})")
    if pending:
        with on_interrupt(f"every finished workload is saved in {run_dir}; run the same command again to "
                          f"measure the rest"):
            _serve(cfg, device, workloads, pending, run_dir, measured)
    _serve_summary(cfg, device, key, run_dir, measured)


def hf_model(cfg) -> tuple[Path, dict]:
    """The HF config.json of model= (conf/model/<hf_config>, or a path) and the model_overrides that are set."""
    return (conf_dir() / "model" / str(cfg.model.hf_config),
            {k: v for k, v in container(cfg.model_overrides).items() if v is not None})


def serve_workloads(cfg) -> list[ServeWorkload]:
    """The workloads to measure, with every setting checked that can be without torch and transformers
    (their import takes seconds, and a typo should not wait for it)."""
    specs = container(cfg.workloads) or {}
    only = list(cfg.only) if cfg.only else list(specs)
    unknown = [name for name in only if name not in specs]
    if unknown:
        raise KernelsightError(f"only: unknown workload(s) {', '.join(unknown)}; defined: {', '.join(specs) or 'none'}")
    workloads = [ServeWorkload.from_mapping(name, specs[name]) for name in only]
    if not workloads:
        raise KernelsightError("workloads: none given")
    planning.check_device(str(cfg.device))
    check_dtype(cfg.dtype)
    check_seed(cfg.seed)
    whole_number(cfg.warmup_requests, "warmup_requests", 0)
    if isinstance(cfg.timeout_s, bool) or not isinstance(cfg.timeout_s, (int, float)) or not cfg.timeout_s > 0:
        raise KernelsightError(f"timeout_s={cfg.timeout_s!r}: must be a positive number of seconds")
    if isinstance(cfg.idle_seconds, bool) or not isinstance(cfg.idle_seconds, (int, float)) or cfg.idle_seconds < 0:
        raise KernelsightError(f"idle_seconds={cfg.idle_seconds!r}: must be a number of seconds >= 0")
    engine = container(cfg.engine)
    for key in ("block_size", "num_blocks", "max_batch_tokens"):
        if engine.get(key) is not None:
            whole_number(engine[key], f"engine.{key}")
    model_config(*hf_model(cfg))
    if cfg.out:
        ensure_dir(Path(str(cfg.out)), "out", create=False)
    return workloads


def _serve(cfg, device, workloads: list, pending: list, run_dir: Path, measured: dict) -> None:
    """Start the engine, warm it up and measure the pending workloads, each written whole when it finishes."""
    import pandas as pd
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    from kernelsight.microbench.nvml import GpuMonitor, PowerMeter
    from kernelsight.microbench.serving import build_model, run_workload, workload_seed

    monitor = GpuMonitor.open(device)  # None on a CPU or without nvidia-ml-py: no energy recorded
    model = build_model(*hf_model(cfg), str(cfg.dtype), str(device), str(cfg.attn_implementation),
                        int(cfg.seed))
    engine = {k: v for k, v in container(cfg.engine).items() if v is not None}
    manager = model.init_continuous_batching(
        generation_config=GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=0),
        continuous_batching_config=ContinuousBatchingConfig(**engine))
    manager.warmup()  # sizes the cache (and captures CUDA graphs) before the clock starts
    resolved = {k: getattr(manager.continuous_batching_config, k, None)  # filled in once the cache exists
                for k in ("block_size", "num_blocks", "max_batch_tokens", "scheduler_type", "use_cuda_graph")}
    resolved = {k: v if isinstance(v, (int, float, str, bool, type(None))) else str(v) for k, v in resolved.items()}
    resolved["attn_implementation"] = model.config._attn_implementation
    write_json(run_dir / "engine.json", resolved, sort_keys=True)  # what the engine chose where the settings said null
    manager.start()
    try:
        vocab = int(model.config.vocab_size)
        if cfg.warmup_requests:  # first kernels, graph captures and allocator growth, not measured
            warm = ServeWorkload("warmup", "closed_loop", min(w.isl for w in workloads), 8,
                                 int(cfg.warmup_requests), concurrency=int(cfg.warmup_requests))
            run_workload(manager, warm, serve_requests(warm, int(cfg.seed)), vocab, int(cfg.seed))
        idle = None
        if monitor is not None and cfg.idle_seconds:  # the engine started, no request: the idle draw
            with PowerMeter(monitor) as meter:
                time.sleep(float(cfg.idle_seconds))
            idle = meter.reading()["mean_power_w"]
        for w in pending:
            start = time.perf_counter()
            seed = workload_seed(int(cfg.seed), w.name)
            requests = serve_requests(w, seed)
            meter = PowerMeter(monitor) if monitor is not None else None
            with meter or contextlib.nullcontext():
                rows = run_workload(manager, w, requests, vocab, seed, float(cfg.timeout_s))
            energy = {**meter.reading(), "idle_power_w": idle} if meter is not None else None
            write_table(pd.DataFrame(trace_rows(requests)), run_dir / f"{w.name}_trace.csv")
            write_table(pd.DataFrame(rows), run_dir / f"{w.name}.parquet")  # a workload whole or not at all
            spec = {k: v for k, v in asdict(w).items() if k != "name" and v is not None}
            measured[w.name] = {"workload": spec, "seed": seed, "engine": resolved,
                                "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            if energy is not None:
                measured[w.name]["energy"] = energy
            write_json(run_dir / "workloads.json", measured, sort_keys=True)
            print(f"  {w.name}: {len(rows)} requests in {time.perf_counter() - start:.1f} s" +
                  (f", {energy['energy_j'] / 1e3:.2f} kJ, mean {energy['mean_power_w']:.0f} W" if energy else ""))
    finally:
        manager.stop(block=True)


def _serve_summary(cfg, device, key: str, run_dir: Path, measured: dict) -> None:
    """summary.csv and run.json of every workload of the run (not only this call's), printed."""
    import json

    import pandas as pd

    from kernelsight.microbench.environment import capture_environment
    from kernelsight.microbench.serving import summarize

    done = [ServeWorkload.from_mapping(name, m["workload"]) for name, m in measured.items()
            if (run_dir / f"{name}.parquet").is_file()]
    rows = pd.concat([pd.read_parquet(run_dir / f"{w.name}.parquet") for w in done], ignore_index=True)
    summary = pd.DataFrame(summarize(rows.to_dict("records"), done,
                                     {name: m["energy"] for name, m in measured.items() if m.get("energy")}))
    summary.insert(0, "model", cfg.model.name)
    summary.insert(1, "device", key)
    write_table(summary, run_dir / "summary.csv")
    env = capture_environment(device, container(cfg))
    env["transformers"] = __import__("transformers").__version__
    engine_file = run_dir / "engine.json"
    env["engine_resolved"] = json.loads(engine_file.read_text(encoding="utf-8")) if engine_file.is_file() else None
    write_json(run_dir / "run.json", env, sort_keys=True)
    print(summary.round(2).to_string(index=False))
    print(f"wrote {run_dir}/summary.csv, run.json (engine.json: the cache and token budget the engine chose) "
          f"and one requests file per workload")


if __name__ == "__main__":
    torchrun_collectives()
