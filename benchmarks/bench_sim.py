"""Simulator speed and memory: `python benchmarks/bench_sim.py` prints the figures.

Every speed figure is measured twice in the same run, with runs of decode steps fast-forwarded (the
default) and step by step (sim.run.run(fast_forward=False)), and printed with their ratio: on a shared
machine absolute times move with the load, ratios much less.

1. Whole process: `kernelsight simulate num_requests=10000` (the default workload: Poisson, 8 req/s,
   1024 prompt / 128 output tokens, Llama-3.1-8B on one H100 SXM) as its own process, start to exit
   (python calling kernelsight.cli.main, as the console script does, without a launcher shim's
   start-up; target <= 2 s), and the simulation's
   own wall time it prints, with the process's CPU time. kernelsight's sources are compiled to bytecode
   first, as a wheel install or any first run leaves them (an editable checkout on a machine that sets
   PYTHONDONTWRITEBYTECODE, as this one does, would otherwise compile them at every start: about 0.1-0.2 s).
   The command's default (conf/simulate.yaml
   `intervals: true`) runs the simulation three times (the kernels' central prices and both ends of
   their 80 % intervals, each end in a forked child beside the central run where 2 CPUs are usable:
   sim.run.interval_ends),
   so the command is also timed with intervals=false. The command has no
   fast-forward switch: the step-by-step process is the same command with its engine built with
   fast_forward=False.
2. Speed: 10,000 ShareGPT-like requests (conf/workload/sharegpt.yaml), same model and GPU, at 90% of
   the engine's capacity, where batches are large and queues build up: simulated requests per
   wall-second and wall time (target <= 1 s), from a fresh pricer (its memo tables are built during the
   run, as in a real run). Capacity is measured first: the request rate served when the same requests
   arrive at once. The process's CPU time and the machine's load average are printed too: on a shared
   machine wall time includes waiting for a core.
3. Memory: peak RSS of a 1,000,000-request run vs a 100,000-request run, each in a fresh
   process (short requests, 256 prompt / 16 output tokens, at 90% of capacity, so the long
   run stays minutes): the simulator streams requests and metrics, so the two must match.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
import warnings

SPEED_REQUESTS = 10_000
MEMORY_REQUESTS = (100_000, 1_000_000)
PACKAGES = ("cli", "sim", "predictor", "calibrate", "validate", "microbench")   # kernelsight's code subpackages
SHORT = ["workload=poisson", "workload.input.value=256", "workload.output.value=16"]
WHOLE = ["simulate", f"num_requests={SPEED_REQUESTS}", "quiet=true"]


def setup_for(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    from kernelsight.cli.config import container, typed_configs
    from kernelsight.predictor.paths import conf_dir
    from kernelsight.sim.run import build_setup
    from kernelsight.sim.workload import WorkloadConfig

    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose(config_name="simulate", overrides=overrides)
    model, hw, engine, parallel = typed_configs(cfg)
    predictor = container(cfg.predictor)
    return build_setup(model, hw, engine, parallel, WorkloadConfig.from_config(container(cfg.workload)),
                       tier=predictor["tier"], bundle=predictor["bundle"], max_model_len=cfg.max_model_len)


def capacity(overrides: list[str], n: int) -> float:
    """Requests/s the engine completes when n requests arrive at once (its saturation throughput)."""
    from kernelsight.sim.run import run

    result = run(setup_for([*overrides, "workload.request_rate=inf"]), n, seed=1, breakdown=False)
    return result.summary["request_throughput"]


def timed_run(overrides: list[str], n: int, fast_forward: bool = True) -> dict:
    from kernelsight.sim.run import run

    setup = setup_for(overrides)
    cpu = time.process_time()
    result = run(setup, n, seed=0, fast_forward=fast_forward)
    summary = result.summary
    summary["cpu_s"] = time.process_time() - cpu
    summary["fast_forwarded_steps"] = result.engine.fast_forwarded_steps
    return summary


def compile_sources() -> None:
    """Bytecode for every kernelsight module, next to its source (whatever the environment says about writing
    it), so that the whole-process timings start as an installed package does."""
    import compileall
    import importlib.util

    for name in ("kernelsight", *(f"kernelsight.{sub}" for sub in PACKAGES)):
        for folder in importlib.util.find_spec(name).submodule_search_locations:
            compileall.compile_dir(folder, quiet=1)


def whole_process(fast_forward: bool, intervals: bool = True) -> tuple[float, float, float]:
    """(wall time of the process start to exit, the simulation's wall time it printed, the process's CPU
    time) of `kernelsight simulate num_requests=10000` (with intervals=false unless `intervals`)."""
    args = WHOLE if intervals else [*WHOLE, "intervals=false"]
    if fast_forward:
        cmd = [sys.executable, "-c", "import sys; from kernelsight import cli; cli.main(sys.argv[1:])", *args]
    else:
        cmd = [sys.executable, __file__, "--step-by-step-cli", *args]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    found = re.search(r"simulated \d+ requests in ([\d.]+) s of wall time", out)
    return wall, float(found.group(1)) if found else float("nan"), cpu


def step_by_step_cli(argv: list[str]) -> None:
    """The command, with its engine simulating every step (the only change)."""
    from kernelsight import cli
    from kernelsight.sim.run import Setup

    new_engine = Setup.new_engine
    Setup.new_engine = lambda self, *args, **kwargs: new_engine(self, *args, **{**kwargs, "fast_forward": False})
    cli.main(argv)


def child(n: int, rate: float) -> None:
    """One memory run in this process; prints JSON with the peak RSS."""
    summary = timed_run([*SHORT, f"workload.request_rate={rate}"], n)
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    print(json.dumps({"requests": n, "peak_rss_mib": rss_mib, "wall_s": summary["wall_s"],
                      "completed": summary["completed"]}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-memory", action="store_true", help="only the speed benchmarks")
    parser.add_argument("--child", nargs=2, type=float, metavar=("N", "RATE"), help=argparse.SUPPRESS)
    parser.add_argument("--step-by-step-cli", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step_by_step_cli is not None:
        step_by_step_cli(args.step_by_step_cli)
        return
    warnings.filterwarnings("ignore", message=".*are plain roofline")   # η = 1 where no model: irrelevant to speed
    if args.child:
        child(int(args.child[0]), args.child[1])
        return

    print(f"whole process: `kernelsight simulate num_requests={SPEED_REQUESTS}` (Poisson 8 req/s, 1024/128 tokens, "
          f"Llama-3.1-8B, H100 SXM), start to exit, bytecode compiled; target <= 2 s")
    compile_sources()
    procs = {ff: whole_process(ff) for ff in (True, False)}
    for ff, (wall, sim, cpu) in procs.items():
        print(f"  {'fast-forward' if ff else 'step by step':<13} {wall:6.2f} s (simulation {sim:.2f} s; "
              f"CPU {cpu:.2f} s)")
    print(f"  ratio step by step / fast-forward: {procs[False][0] / procs[True][0]:.1f}x whole process, "
          f"{procs[False][1] / procs[True][1]:.1f}x simulation")
    wall, sim, cpu = whole_process(True, intervals=False)
    print(f"  intervals=false (one simulation instead of three): fast-forward {wall:.2f} s (simulation {sim:.2f} s; "
          f"CPU {cpu:.2f} s)")

    cap = capacity(["workload=sharegpt"], 2000)
    rate = round(0.9 * cap, 2)
    overrides = ["workload=sharegpt", f"workload.request_rate={rate}"]
    runs = {ff: timed_run(overrides, SPEED_REQUESTS, ff) for ff in (True, False)}
    fast = runs[True]
    print(f"speed: {SPEED_REQUESTS} ShareGPT-like requests, Llama-3.1-8B on H100 SXM, vllm_v1, "
          f"{rate} req/s (90% of the {cap:.1f} req/s capacity); target <= 1 s")
    for ff, summary in runs.items():
        wall = summary["wall_s"]
        share = f", {summary['fast_forwarded_steps'] / summary['num_steps']:.0%} fast-forwarded" if ff else ""
        print(f"  {'fast-forward' if ff else 'step by step':<13} wall {wall:.2f} s = {SPEED_REQUESTS / wall:,.0f} "
              f"requests per wall-second ({summary['num_steps']:,} engine steps{share}; CPU {summary['cpu_s']:.2f} s)")
    print(f"  ratio step by step / fast-forward: {runs[False]['wall_s'] / fast['wall_s']:.1f}x; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"  simulated: {fast['duration_s']:.0f} s, {fast['output_throughput']:.0f} output tok/s, "
          f"median TTFT {fast['median_ttft_ms']:.1f} ms, median TPOT {fast['median_tpot_ms']:.2f} ms, "
          f"mean {fast['mean_requests_in_system']:.0f} requests in the system")
    if args.skip_memory:
        return

    short_rate = round(0.9 * capacity(SHORT, 5000), 1)
    rows = []
    for n in MEMORY_REQUESTS:
        out = subprocess.run([sys.executable, __file__, "--child", str(n), str(short_rate)],
                             check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    print(f"memory: 256/16-token requests at {short_rate} req/s, each run in a fresh process")
    for r in rows:
        print(f"  {r['requests']:>9,} requests: peak RSS {r['peak_rss_mib']:.0f} MiB, wall {r['wall_s']:.1f} s "
              f"({r['requests'] / r['wall_s']:,.0f} requests/s)")
    print(f"  RSS ratio 1M / 100k: {rows[1]['peak_rss_mib'] / rows[0]['peak_rss_mib']:.2f}")


if __name__ == "__main__":
    main()
